"""Seconds per operation: turn (model, plan, profile) into the PipelineWork the engine runs.

Pure. Each piece prices a mechanism with the profile's curves:

* Per-layer passes (GEMMs, memory-bound kernels, TP collectives) and the embedding/logits
  work of the edge stages: ``plansim.analytic.layer_cost``, with the GEMM and attention rates
  the whole job sustains (power limit, slowest of its GPUs: ``plansim.analytic.sustained``).
* PP send/recv of b*s*h 16-bit activations per micro-batch: split over the tp ranks
  by sequence parallelism or by Megatron's scatter/gather (Narayanan et al. SC21 §4.1, whose
  receiver all-gathers the slices over its TP group), else whole on every TP rank (Megatron
  2020, ``plan.scatter_gather_p2p`` off; ``plansim.analytic.pipeline_send``); synchronous
  (the sender waits) unless ``plan.overlap_p2p_comm``. With context parallelism each cp
  rank sends its s/cp tokens to the same cp rank of the next stage.
* Context-parallel ring attention: the exposed part of each layer's K/V ring transfers
  (``ring_attention.ring_attention_times``) as ``cp_comm`` segments that hold the compute stream
  (recorded on stream ``tp``, like the other blocking collectives), in forward, in the
  input-gradient backward and in full recompute.
* DP (over the dp * cp ranks holding the same weights: Megatron-LM reduces gradients over
  the data-parallel group with context parallelism, ``plansim.analytic.ranks``):
  gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1, Megatron distributed optimizer)
  once per step, then the all-gather of the 16-bit params (ZeRO 1/2); ZeRO-2's
  reduce-scatter of every micro-batch's gradients (sharded gradients cannot accumulate
  whole), and ZeRO-3's per-micro-batch parameter all-gathers in forward and backward plus
  gradient reduce-scatter (ZeRO paper §7), their exposed part after per-layer prefetch
  (ZeRO-2: with ``plan.overlap_grad_reduce``) or synchronous fetching
  (``plansim.analytic.zero3``).
  Tied embeddings with pp > 1: all-reduce of the embedding gradient between first and last
  stage (Megatron ``_allreduce_word_embedding_grads``, after the DP reduction).
  With ``plan.overlap_grad_reduce`` (Megatron-LM ``--overlap-grad-reduce``) the ZeRO-0/1
  gradient reduction moves from the rank's tail into per-stage buckets
  (``StageWork.grad_buckets``, ``plansim.analytic.grad_buckets``) that the engine starts
  while backward still runs; the ZeRO-1/2 parameter all-gather stays after the optimizer, or
  with ``plan.overlap_param_gather`` (Megatron's ``--overlap-param-gather``) only its part
  that the next step's forward does not hide (``plansim.analytic.rank_work``).
  With ``plan.dp_sync`` parameter-server the DP sync is a push to the servers, their update
  and a pull instead (``plansim.analytic.param_server``).
* Optimizer: fused Adam over the local shard, HBM-bound (``adam_step_bytes``); with
  ``plan.offload_optimizer`` / ``offload_param`` the ZeRO-Offload / ZeRO-Infinity host step
  and parameter fetches instead (``plansim.analytic.offload``).
* Links (``plansim.sim.links``, ``plansim.analytic.link_tags``): each communication segment and P2P
  names the link it loads on its rank, from the tier its group spans (NVLink inside a node,
  the NIC across nodes): PP sends by the pp group, DP/ZeRO collectives by the dp (x cp)
  group, TP by the tp group, CP ring transfers by the cp group, the tied-embedding
  all-reduce by the first/last stage pair; and the latency (alpha) the engine never
  stretches when transfers share a link. The durations are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from plansim.analytic.grad_buckets import grad_buckets
from plansim.analytic.layer_cost import PassTimes
from plansim.analytic.link_tags import with_links
from plansim.analytic.memo import Memo, fields_getter, memoised
from plansim.analytic.offload_microbatch import with_host_grad_accumulation, with_param_fetch
from plansim.analytic.pipeline_send import pipeline_send
from plansim.analytic.rank_work import ParamGatherCover, gather_cover, rank_work, segments
from plansim.analytic.ranks import LayoutGroups
from plansim.analytic.stage_compute import PassInputs, pass_inputs
from plansim.analytic.stage_seconds import StageSeconds
from plansim.analytic.stored_activations import stage_activation_bytes
from plansim.analytic.zero3 import (
    Zero3Traffic,
)
from plansim.analytic.zero_segments import sharded_traffic, with_per_step_traffic, zero_segments
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import stage_layer_counts
from plansim.specs.model import ModelSpec
from plansim.specs.plan import PLAN_FIELDS, ParallelPlan, Zero3ParamFetch
from plansim.specs.stage_placement import StagePlacement
from plansim.specs.work import P2P, GradBucket, PipelineWork, RankWork, StageWork


def _stage_work(
    stage: int,
    *,
    num_layers: int,
    plan: ParallelPlan,
    layer: PassTimes,
    sec: StageSeconds,
    zero3: tuple[Zero3Traffic, Zero3Traffic],
    p2p: P2P,
    activation_bytes: float,
    buckets: tuple[GradBucket, ...],
    overlap_slowdown: float,
) -> StageWork:
    """StageWork of pipeline stage ``stage``, a model chunk of ``num_layers`` layers
    (``plansim.specs.layer_split.stage_layer_counts``) whose kernels and TP collectives take
    ``sec`` (``plansim.analytic.stage_seconds``); ``layer``'s per-layer ZeRO-3 and
    context-parallel terms come on top."""
    n = num_layers
    first, last = stage == 0, stage == plan.num_stages - 1
    bwd_in, bwd_w, tp_bwd = sec.backward_input_s, sec.backward_weight_s, sec.tp_backward_s
    z3 = zero_segments(
        n, plan=plan, layer=layer, unit=zero3[0], edge=zero3[1], slowdown=overlap_slowdown
    )
    cp_fwd = ("cp_comm", "tp", n * layer.cp_forward_s, n * layer.cp_forward_bytes)
    cp_bwd = ("cp_comm", "tp", n * layer.cp_backward_s, n * layer.cp_backward_bytes)
    r = sec.recomputed_layers
    cp_rec = ("cp_comm", "tp", r * layer.cp_recompute_s, r * layer.cp_forward_bytes)
    ep_fwd = ("ep_comm", "tp", sec.ep_forward_s, sec.ep_forward_bytes)
    ep_bwd = ("ep_comm", "tp", sec.ep_backward_s, sec.ep_backward_bytes)
    recompute = (
        z3["gather_b"],
        ("recompute", "compute", sec.recompute_s, 0.0),
        cp_rec,
        ("tp_comm", "tp", sec.tp_recompute_s, 0.0),
        ("ep_comm", "tp", sec.ep_recompute_s, sec.ep_forward_bytes if sec.ep_recompute_s else 0.0),
    )
    return StageWork(
        forward=segments(
            z3["forward"],
            ("forward", "compute", sec.forward_s, 0.0),
            cp_fwd,
            ("tp_comm", "tp", sec.tp_forward_s, 0.0),
            ep_fwd,
        ),
        backward=segments(
            *recompute,
            ("backward", "compute", bwd_in + bwd_w, 0.0),
            cp_bwd,
            ("tp_comm", "tp", tp_bwd, 0.0),
            ep_bwd,
            z3["scatter_b"],
        ),
        backward_input=segments(
            *recompute,
            ("backward_input", "compute", bwd_in, 0.0),
            cp_bwd,
            ("tp_comm", "tp", tp_bwd, 0.0),
            ep_bwd,
        ),
        backward_weight=segments(
            ("backward_weight", "compute", bwd_w, 0.0),
            z3["scatter_w"],
        ),
        send_forward=P2P(duration_s=0.0, num_bytes=0.0) if last else p2p,
        send_backward=P2P(duration_s=0.0, num_bytes=0.0) if first else p2p,
        activation_bytes=activation_bytes,
        grad_buckets=buckets,
        num_layers=max(1, n),
    )


#: Plan fields the work does not depend on: the schedule only orders the actions, and
#: overlap_p2p_comm only sets ``PipelineWork.blocking_p2p``.
_NOT_IN_WORK = ("schedule", "overlap_p2p_comm")
_WORK_FIELDS = tuple(f for f in PLAN_FIELDS if f not in _NOT_IN_WORK)
#: Plan fields of one stage's gradient buckets (``grad_buckets``), besides first/last; the
#: gradient dtype sets their bytes. ``tests/unit/test_work_memo.py`` checks these keys.
_BUCKET_FIELDS = (
    "tp", "cp", "dp", "dp_shard", "pp", "vpp", "zero_stage", "precision",
    "grad_reduce_in_bf16", "dp_sync", "ps_servers",
)  # fmt: skip


_work_key = fields_getter(_WORK_FIELDS)
_bucket_key = fields_getter(_BUCKET_FIELDS)


def build_pipeline_work(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    memo: Memo | None = None,
    links: bool = True,
) -> PipelineWork:
    """The work of one representative pipeline replica (one DP rank, TP folded in).

    Args:
        memo: optional cache for a search (one model and one profile only): plans that
            differ only in schedule or P2P overlap share one costing, and the per-layer
            pass times and gradient buckets are costed once per distinct input. Results
            are identical with or without it.
        links: tag transfers with their links and latencies (``plansim.analytic.link_tags``). False
            gives the same durations untagged (and no ``rank_nodes``): enough for
            analytic bounds, cheaper, but not for the engine's link sharing.

    Raises:
        SpecError: the profile lacks the plan's precision, or the plan does not split the model.
    """
    if memo is None:
        return _build(model, plan, profile, None, links=links)
    key = ("work", links, plan.schedule.placement, *_work_key(plan))
    work = memo.get(key)
    if work is None:
        work = memo[key] = _build(model, plan, profile, memo, links=links)
    assert isinstance(work, PipelineWork)
    blocking = not plan.overlap_p2p_comm
    return work if work.blocking_p2p == blocking else replace(work, blocking_p2p=blocking)


def _build(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    memo: Memo | None,
    *,
    links: bool = True,
) -> PipelineWork:
    inputs = pass_inputs(model, plan, profile, memo)
    stages = _stages(model, plan, profile, memo, inputs)
    stages = with_param_fetch(stages, model=model, plan=plan, profile=profile)
    stages = with_host_grad_accumulation(stages, model=model, plan=plan, profile=profile)
    groups = inputs.groups
    ranks = _ranks(stages, model=model, plan=plan, profile=profile, groups=groups)
    if plan.zero_stage == 3 and plan.zero3_param_fetch is Zero3ParamFetch.PER_STEP:
        ranks = with_per_step_traffic(ranks, model, plan, profile, groups, inputs.layer, memo)
    placement = plan.schedule.placement
    copies = 2 if placement is StagePlacement.DUAL else 1  # DualPipe: copy 1 = copy 0's work
    work = PipelineWork(
        stages=tuple(stages) * copies,
        ranks=tuple(ranks),
        num_microbatches=plan.num_microbatches,
        blocking_p2p=not plan.overlap_p2p_comm,
        overlap_grad_reduce=plan.overlap_grad_reduce,
        overlap_slowdown=profile.overlap_compute_slowdown_fraction,
        placement=placement,
    )
    if not links:
        return work
    return with_links(work, plan=plan, profile=profile, groups=groups, memo=memo)


def _stages(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    memo: Memo | None,
    inputs: PassInputs,
) -> list[StageWork]:
    """Every model chunk's work, in stage order.

    A stage's work depends on its index only through first/last, whether it sits on rank 0
    (embedding activations), its layer count (uneven splits) and its bf16 edge layers. Each
    kind is costed once: O(1) costings per plan instead of O(pp * vpp), with bit-identical
    results."""
    groups, layer, bf16_ends = inputs.groups, inputs.layer, inputs.bf16_ends
    bucket_key = _bucket_key(plan)
    p2p = pipeline_send(model, plan, profile, groups)
    stage_kinds: dict[tuple[object, ...], StageWork] = {}
    stages = []
    for s, layers in enumerate(stage_layer_counts(model.num_layers, plan)):
        key: tuple[object, ...] = (s == 0, s == plan.num_stages - 1, plan.rank_holds_stage(0, s))
        key += (layers,)
        key += (bf16_ends[s], *inputs.stage_key(s))
        if key not in stage_kinds:
            sec = inputs.stage_seconds(s, num_layers=layers, plan=plan)
            stage_kinds[key] = _stage_work(
                s,
                num_layers=layers,
                plan=plan,
                layer=layer,
                sec=sec,
                zero3=sharded_traffic(
                    model,
                    plan,
                    profile,
                    groups,
                    first=s == 0,
                    last=s == plan.num_stages - 1,
                    memo=memo,
                ),
                p2p=p2p,
                overlap_slowdown=profile.overlap_compute_slowdown_fraction,
                activation_bytes=stage_activation_bytes(model, plan, stage=s),
                buckets=memoised(
                    memo,
                    ("buckets", *key, *bucket_key),
                    lambda s=s: grad_buckets(model, plan, profile, groups, stage=s),  # type: ignore[misc]
                )
                if plan.overlap_grad_reduce
                else (),
            )
        stages.append(stage_kinds[key])
    return stages


def _ranks(
    stages: list[StageWork],
    *,
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
) -> list[RankWork]:
    """Every pipeline rank's own work (``rank_work``), costed once per kind: first, last and
    the parameter-gather cover of its stages."""
    rank_kinds: dict[tuple[bool, bool, ParamGatherCover | None], RankWork] = {}
    ranks = []
    for r in range(plan.pp):
        mine = [stages[s] for s in plan.stages_of_rank(r)]
        cover = gather_cover(mine) if plan.overlap_param_gather else None
        edge = (plan.rank_holds_stage(r, 0), plan.rank_holds_stage(r, plan.num_stages - 1), cover)
        if edge not in rank_kinds:
            rank_kinds[edge] = rank_work(
                r, model=model, plan=plan, profile=profile, groups=groups, cover=cover
            )
        ranks.append(rank_kinds[edge])
    return ranks
