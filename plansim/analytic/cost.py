"""Seconds per operation: turn (model, plan, profile) into the PipelineWork the engine runs.

Pure. Each piece prices a mechanism with the profile's curves:

* GEMMs (``plansim.analytic.flops``): roofline per GEMM, max(FLOPs / achievable FLOP/s at that
  GEMM's size (launch overhead included in the curve), bytes of A, B and C / streaming HBM
  bandwidth). Backward:
  input-grad and weight-grad GEMMs each cost one forward (2x forward in all).
  FlashAttention's backward runs five GEMMs to the forward's two (Dao 2023, FlashAttention-2
  §3.1.2): 2.5x the forward attention-core GEMMs, the recompute included.
* Memory-bound kernels (``plansim.analytic.elementwise``): bytes / streaming HBM bandwidth.
* TP collectives per layer (Megatron-LM, Shoeybi et al. 2019 §3; Korthikanti §4.2.2):
  forward 2 all-reduces of b*s*h 16-bit values (with SP: 2 all-gathers + 2 reduce-scatters);
  backward the same, plus with SP 2 all-gathers re-forming the inputs of the column-parallel
  weight gradients; full recompute repeats the forward ones. TP is blocking (on the critical
  path).
* PP send/recv of b*s*h 16-bit activations per micro-batch, split over the tp ranks (Megatron
  scatter/gather optimisation, Narayanan et al. SC21 §4.1); synchronous (the sender waits)
  unless ``plan.overlap_p2p_comm``.
* DP: gradient all-reduce (ZeRO 0), reduce-scatter of gradients + all-gather of 16-bit params
  (ZeRO 1/2, Megatron distributed optimizer), and ZeRO-3's per-micro-batch parameter
  all-gathers in forward and backward plus gradient reduce-scatter (ZeRO paper §7).
  Tied embeddings with pp > 1: all-reduce of the embedding gradient between first and last
  stage (Megatron ``_allreduce_word_embedding_grads``, after the DP reduction).
  With ``plan.overlap_grad_reduce`` (Megatron-LM ``--overlap-grad-reduce``) the ZeRO-0/1/2
  gradient reduction moves from the rank's tail into per-stage buckets
  (``StageWork.grad_buckets``, :func:`grad_buckets`) that the engine starts while backward
  still runs; the ZeRO-1/2 parameter all-gather stays after the optimizer (Megatron's
  ``--overlap-param-gather``, which hides it behind the next step's forward, is not modelled).
* Optimizer: fused Adam over the local shard, HBM-bound (``adam_step_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.analytic import flops as fl
from plansim.analytic.comm import collective_time_s, p2p_time_s
from plansim.analytic.elementwise import adam_step_bytes, layer_elementwise_traffic
from plansim.analytic.memory import (
    microbatch_activation_bytes,
    rank_memory,
    rank_parameters,
    state_bytes_per_param,
)
from plansim.analytic.params import count_parameters
from plansim.analytic.ranks import LayoutGroups, layout_groups
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import AttentionKernel, ParallelPlan, Recompute
from plansim.specs.work import P2P, GradBucket, PipelineWork, RankWork, Segment, StageWork

#: Megatron-LM's default DDP bucket: max(40M, 1M x data-parallel size) parameters
#: (``DistributedDataParallelConfig.bucket_size``; larger DP groups get larger buckets so the
#: collectives stay bandwidth-bound).
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTimes:
    """Seconds of one layer for one micro-batch on one GPU, by part."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    tp_forward_s: float
    tp_backward_s: float
    tp_recompute_s: float


def gemm_time_s(gemm: fl.Gemm, profile: HardwareProfile, *, dtype: str) -> float:
    """Roofline time of ``gemm`` (all ``count`` instances): compute- or HBM-bound."""
    single_flops = 2.0 * gemm.m * gemm.n * gemm.k
    compute_s = gemm.flops / profile.matmul_flops_per_s(dtype, single_flops)
    moved = 2.0 * gemm.count * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
    # The profile's efficiency curve already includes the launch overhead (roofline + launch).
    return max(compute_s, moved / profile.streaming_bytes_per_s())


def _matmul_dtype(plan: ParallelPlan) -> str:
    return plan.precision.value


def layer_pass_times(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> PassTimes:
    """Forward, backward (input/weight), recompute and TP-collective seconds of one layer."""
    b, tp = plan.micro_batch_size, plan.tp
    dtype = _matmul_dtype(plan)
    unfused = plan.attention is AttentionKernel.UNFUSED
    fwd_gemm = wgrad = core_fwd = 0.0
    for gemm in fl.layer_forward_gemms(model, micro_batch_size=b, tp=tp):
        is_core = gemm.name in fl.ATTENTION_CORE_GEMMS
        t = gemm_time_s(gemm, profile, dtype="bf16" if is_core and dtype == "fp8" else dtype)
        fwd_gemm += t
        if is_core:
            core_fwd += t
        else:
            wgrad += t
    # Input-grad GEMMs: one forward each; attention core: 2x (unfused) or 2.5x (flash,
    # recompute of the scores included).
    core_bwd = (2.0 if unfused else 2.5) * core_fwd
    dgrad = (fwd_gemm - core_fwd) + core_bwd
    traffic = layer_elementwise_traffic(
        model,
        micro_batch_size=b,
        tp=tp,
        sequence_parallel=plan.sequence_parallel,
        unfused_attention=unfused,
    )
    hbm = profile.streaming_bytes_per_s()
    ew_fwd = traffic.forward_bytes / hbm + traffic.num_kernels * profile.kernel_launch_s
    ew_bwd = traffic.backward_bytes / hbm + traffic.num_kernels * profile.kernel_launch_s
    forward_s = fwd_gemm + ew_fwd
    tp_pass = _tp_layer_pass_s(model, plan, profile, groups)
    tp_backward = tp_pass + _sp_wgrad_gather_s(model, plan, profile, groups)
    recompute_s, tp_recompute = 0.0, 0.0
    if plan.recompute is Recompute.FULL:
        recompute_s, tp_recompute = forward_s, tp_pass
    elif plan.recompute is Recompute.SELECTIVE and unfused:
        softmax_bytes = 9.0 * model.num_attention_heads * model.seq_length * model.seq_length * b
        recompute_s = core_fwd + softmax_bytes / tp / hbm
    return PassTimes(
        forward_s=forward_s,
        backward_input_s=dgrad + ew_bwd,
        backward_weight_s=wgrad,
        recompute_s=recompute_s,
        tp_forward_s=tp_pass,
        tp_backward_s=tp_backward,
        tp_recompute_s=tp_recompute,
    )


def _sp_wgrad_gather_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> float:
    """Sequence parallelism's backward re-gather of the sharded inputs of the two
    column-parallel linears (QKV, FC1), needed for their weight gradients (Korthikanti et
    al. 2022 §4.2.2; Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication``).
    Counted on the critical path: Megatron issues it beside the input-gradient GEMM, but it
    shares the GPU with it."""
    if plan.tp == 1 or not plan.sequence_parallel:
        return 0.0
    message = 2.0 * model.seq_length * plan.micro_batch_size * model.hidden_size
    return 2.0 * collective_time_s(
        profile, collective="all_gather", message_bytes=message, span=groups.tp
    )


def _tp_layer_pass_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> float:
    """TP collectives of one layer in one pass (forward or backward)."""
    if plan.tp == 1:
        return 0.0
    message = 2.0 * model.seq_length * plan.micro_batch_size * model.hidden_size
    if plan.sequence_parallel:
        ag = collective_time_s(
            profile, collective="all_gather", message_bytes=message, span=groups.tp
        )
        rs = collective_time_s(
            profile, collective="reduce_scatter", message_bytes=message, span=groups.tp
        )
        return 2.0 * (ag + rs)
    ar = collective_time_s(profile, collective="all_reduce", message_bytes=message, span=groups.tp)
    return 2.0 * ar


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeTimes:
    """Extra per-micro-batch seconds of the first stage (embedding) and last stage (logits)."""

    first_forward_s: float
    first_backward_s: float
    first_tp_s: float
    last_forward_s: float
    last_backward_input_s: float
    last_backward_weight_s: float
    last_tp_s: float


def edge_times(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> EdgeTimes:
    """Embedding lookup (first stage) and final norm + logits + cross-entropy (last stage).

    Vocab-parallel embedding ends in an all-reduce (reduce-scatter with SP) of b*s*h 16-bit
    values; vocab-parallel cross-entropy all-reduces three fp32 values per token (max,
    sum of exponentials, target logit) (Megatron-LM ``VocabParallelEmbedding`` and
    ``vocab_parallel_cross_entropy``). Cross-entropy traffic: read 16-bit logits, write fp32,
    softmax read and write fp32 (14 B per logit forward); backward 8 B per logit.
    """
    b, tp = plan.micro_batch_size, plan.tp
    tokens = model.seq_length * b
    hbm = profile.streaming_bytes_per_s()
    launch = profile.kernel_launch_s
    act_bytes = 2.0 * tokens * model.hidden_size
    emb_tp = 0.0
    ce_tp = 0.0
    if tp > 1:
        kind = "reduce_scatter" if plan.sequence_parallel else "all_reduce"
        emb_tp = collective_time_s(
            profile, collective=kind, message_bytes=act_bytes, span=groups.tp
        )
        ce_tp = 3 * collective_time_s(
            profile, collective="all_reduce", message_bytes=4.0 * tokens, span=groups.tp
        )
    logits = fl.logits_forward_gemm(model, micro_batch_size=b, tp=tp)
    logits_s = gemm_time_s(logits, profile, dtype=_matmul_dtype(plan))
    num_logits = tokens * model.vocab_size / tp
    norm_s = 4.0 * model.hidden_size * tokens / hbm + launch
    return EdgeTimes(
        first_forward_s=act_bytes / hbm + launch,
        first_backward_s=3.0 * act_bytes / hbm + launch,
        first_tp_s=emb_tp,
        last_forward_s=logits_s + norm_s + 14.0 * num_logits / hbm + 2 * launch,
        last_backward_input_s=logits_s + 2.0 * norm_s + 8.0 * num_logits / hbm + launch,
        last_backward_weight_s=logits_s,
        last_tp_s=ce_tp,
    )


def _segments(*parts: tuple[str, str, float, float]) -> tuple[Segment, ...]:
    """Segments from (kind, stream, seconds, bytes), dropping empty ones."""
    return tuple(
        Segment(kind=k, stream=st, duration_s=d, num_bytes=n) for k, st, d, n in parts if d > 0
    )


def _zero3_microbatch_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> tuple[float, float, float]:
    """ZeRO-3 per micro-batch: (forward all-gather, backward all-gather, grad reduce-scatter).

    Message = the stage's 16-bit parameters (all-gather output) and its gradients
    (reduce-scatter input); ZeRO paper §7.2: 3 x Psi per step instead of 2 x Psi.
    """
    if plan.zero_stage != 3 or plan.dp == 1:
        return 0.0, 0.0, 0.0
    per_param = state_bytes_per_param(plan.precision)
    params = rank_parameters(model, plan, rank=0)
    gather = collective_time_s(
        profile, collective="all_gather", message_bytes=params * per_param.param, span=groups.dp
    )
    scatter = collective_time_s(
        profile, collective="reduce_scatter", message_bytes=params * per_param.param, span=groups.dp
    )
    return gather, gather, scatter


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters of one pipeline stage (model chunk) on one TP rank, in backward order.

    Attributes:
        head: produced first by backward: final norm and output layer (or its tied copy of
            the word embedding when pp > 1) on the last stage; 0 elsewhere.
        per_layer: one transformer layer (linear weights / tp + replicated norms).
        num_layers: layers in the stage, L / (pp * vpp).
        tail: produced last: word embedding / tp + position embedding on the first stage.
    """

    head: float
    per_layer: float
    num_layers: int
    tail: float

    @property
    def total(self) -> float:
        """All parameters of the stage."""
        return self.head + self.per_layer * self.num_layers + self.tail


def stage_parameters(model: ModelSpec, plan: ParallelPlan, *, stage: int) -> StageParams:
    """Parameters of ``stage`` on one TP rank; over a rank's stages they sum to
    ``plansim.analytic.memory.rank_parameters`` (same sharding rules)."""
    counts = count_parameters(model)
    last = stage == plan.num_stages - 1
    head = tail = 0.0
    if stage == 0:
        tail = counts.embedding / plan.tp + counts.position_embedding
    if last:
        head = float(counts.final_norm)
        if counts.output_layer:
            head += counts.output_layer / plan.tp
        elif plan.pp > 1:
            head += counts.embedding / plan.tp
    per_layer = (counts.attention_per_layer + counts.mlp_per_layer) / plan.tp
    return StageParams(
        head=head,
        per_layer=per_layer + counts.norms_per_layer,
        num_layers=model.num_layers // plan.num_stages,
        tail=tail,
    )


def _ready_fraction(params: StageParams, done: float) -> float:
    """Fraction of the stage's last backward after which its first ``done`` parameters (in
    backward order) have gradients: the backward split evenly over the stage's layers, the
    head counted with the first layer it meets and the tail with the last."""
    n = params.num_layers
    layers = math.ceil((done - params.head) / params.per_layer - 1e-9)
    return min(n, max(1, layers)) / n


def grad_buckets(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    stage: int,
) -> tuple[GradBucket, ...]:
    """The DP gradient reduction of ``stage`` as buckets, for ``plan.overlap_grad_reduce``.

    Megatron-LM DDP: parameters fill buckets in reverse order (the order backward produces
    their gradients) up to ``bucket_size`` = max(40M, 1M x dp) parameters; each bucket's
    all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2, distributed optimizer) starts once all
    its gradients of the last micro-batch exist. Megatron buckets only pipeline rank 0's
    first model chunk (stage 0): other ranks' reductions are off the critical path, later
    chunks overlap anyway (``DistributedDataParallel``: bucket_size = None when pp rank > 0;
    ``training.get_model``: ``disable_bucketing=(model_chunk_idx > 0)``); every other stage
    is one bucket, ready at the end of its last backward. Approximations: buckets hold
    exactly bucket_size parameters (Megatron closes a bucket at the first whole tensor past
    it) and a bucket is ready at the end of the layer holding its last parameter
    (:func:`_ready_fraction`). Empty for ZeRO-3 (per micro-batch reduce-scatters) or dp == 1.
    """
    if plan.zero_stage == 3 or plan.dp == 1:
        return ()
    params = stage_parameters(model, plan, stage=stage)
    total = params.total
    size = max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * plan.dp) if stage == 0 else total
    count = max(1, math.ceil(total / size - 1e-9))
    grad_bytes = state_bytes_per_param(plan.precision).grad
    collective = "all_reduce" if plan.zero_stage == 0 else "reduce_scatter"
    buckets = []
    for k in range(count):
        done = total if k == count - 1 else (k + 1) * size
        num_params = done - k * size
        message = num_params * grad_bytes
        seconds = collective_time_s(
            profile, collective=collective, message_bytes=message, span=groups.dp
        )
        segment = Segment(kind="dp_comm", stream="dp", duration_s=seconds, num_bytes=message)
        buckets.append(
            GradBucket(
                segment=segment,
                ready_fraction=_ready_fraction(params, done),
                num_params=num_params,
            )
        )
    return tuple(buckets)


def _stage_work(
    stage: int,
    *,
    model: ModelSpec,
    plan: ParallelPlan,
    layer: PassTimes,
    edges: EdgeTimes,
    zero3: tuple[float, float, float],
    p2p: P2P,
    activation_bytes: float,
    buckets: tuple[GradBucket, ...],
) -> StageWork:
    """StageWork of pipeline stage ``stage`` (a chunk of L / (pp * vpp) layers)."""
    n = model.num_layers // plan.num_stages
    first, last = stage == 0, stage == plan.num_stages - 1
    fwd = n * layer.forward_s + (edges.first_forward_s if first else 0.0)
    fwd += edges.last_forward_s if last else 0.0
    tp_fwd = n * layer.tp_forward_s + (edges.first_tp_s if first else 0.0)
    tp_fwd += edges.last_tp_s if last else 0.0
    bwd_in = n * layer.backward_input_s + (edges.first_backward_s if first else 0.0)
    bwd_in += edges.last_backward_input_s if last else 0.0
    bwd_w = n * layer.backward_weight_s + (edges.last_backward_weight_s if last else 0.0)
    tp_bwd = n * layer.tp_backward_s + (edges.first_tp_s if first else 0.0)
    tp_bwd += edges.last_tp_s if last else 0.0
    gather_f, gather_b, scatter = zero3
    recompute = (
        ("dp_comm", "dp", gather_b, 0.0),
        ("recompute", "compute", n * layer.recompute_s, 0.0),
        ("tp_comm", "tp", n * layer.tp_recompute_s, 0.0),
    )
    return StageWork(
        forward=_segments(
            ("dp_comm", "dp", gather_f, 0.0),
            ("forward", "compute", fwd, 0.0),
            ("tp_comm", "tp", tp_fwd, 0.0),
        ),
        backward=_segments(
            *recompute,
            ("backward", "compute", bwd_in + bwd_w, 0.0),
            ("tp_comm", "tp", tp_bwd, 0.0),
            ("dp_comm", "dp", scatter, 0.0),
        ),
        backward_input=_segments(
            *recompute,
            ("backward_input", "compute", bwd_in, 0.0),
            ("tp_comm", "tp", tp_bwd, 0.0),
        ),
        backward_weight=_segments(
            ("backward_weight", "compute", bwd_w, 0.0),
            ("dp_comm", "dp", scatter, 0.0),
        ),
        send_forward=P2P(duration_s=0.0, num_bytes=0.0) if last else p2p,
        send_backward=P2P(duration_s=0.0, num_bytes=0.0) if first else p2p,
        activation_bytes=activation_bytes,
        grad_buckets=buckets,
    )


def _rank_work(
    rank: int,
    *,
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
) -> RankWork:
    """Once-per-step work of pipeline rank ``rank``: DP gradient sync and the optimizer.

    With ``plan.overlap_grad_reduce`` the DP reduction is in the stages' grad buckets
    instead (:func:`grad_buckets`); the tied-embedding all-reduce stays here."""
    per_param = state_bytes_per_param(plan.precision)
    params = rank_parameters(model, plan, rank=rank)
    grad_bytes = params * per_param.grad
    sync: list[tuple[str, str, float, float]] = []
    if plan.zero_stage in (0, 1, 2) and not plan.overlap_grad_reduce:
        kind = "all_reduce" if plan.zero_stage == 0 else "reduce_scatter"
        t = collective_time_s(profile, collective=kind, message_bytes=grad_bytes, span=groups.dp)
        sync.append(("dp_comm", "dp", t, grad_bytes))
    counts = count_parameters(model)
    if plan.pp > 1 and counts.output_layer == 0 and rank in (0, plan.pp - 1):
        emb_bytes = counts.embedding / plan.tp * per_param.grad
        pair = type(groups.pp)(size=2, members_per_node=1, num_nodes=min(2, groups.pp.num_nodes))
        t = collective_time_s(profile, collective="all_reduce", message_bytes=emb_bytes, span=pair)
        sync.append(("embedding_grad_comm", "dp", t, emb_bytes))
    local = params / plan.dp if plan.zero_stage >= 1 else params
    opt: list[tuple[str, str, float, float]] = [
        ("optimizer", "compute", adam_step_bytes(local) / profile.streaming_bytes_per_s(), 0.0)
    ]
    if plan.zero_stage in (1, 2) and plan.dp > 1:
        weight_bytes = params * per_param.param
        t = collective_time_s(
            profile, collective="all_gather", message_bytes=weight_bytes, span=groups.dp
        )
        opt.append(("dp_comm", "dp", t, weight_bytes))
    return RankWork(
        static_bytes=rank_memory(model, plan, profile, rank=rank).static_bytes,
        grad_sync=_segments(*sync),
        optimizer=_segments(*opt),
    )


def build_pipeline_work(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> PipelineWork:
    """The work of one representative pipeline replica (one DP rank, TP folded in).

    Raises:
        SpecError: the profile lacks the plan's precision, or the plan does not split the model.
    """
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    layer = layer_pass_times(model, plan, profile, groups)
    edges = edge_times(model, plan, profile, groups)
    zero3 = _zero3_microbatch_s(model, plan, profile, groups)
    p2p_bytes = 2.0 * model.seq_length * plan.micro_batch_size * model.hidden_size / plan.tp
    p2p = P2P(
        duration_s=p2p_time_s(profile, message_bytes=p2p_bytes, inter_node=groups.pp.num_nodes > 1),
        num_bytes=p2p_bytes,
    )
    # A stage's work depends on its index only through first/last and whether it sits on
    # rank 0 (embedding activations); a rank's only through first/last. Each kind is costed
    # once: O(1) costings per plan instead of O(pp * vpp), with bit-identical results.
    stage_kinds: dict[tuple[bool, bool, bool], StageWork] = {}
    stages = []
    for s in range(plan.num_stages):
        key = (s == 0, s == plan.num_stages - 1, s % plan.pp == 0)
        if key not in stage_kinds:
            rank_bytes = microbatch_activation_bytes(model, plan, rank=s % plan.pp)
            stage_kinds[key] = _stage_work(
                s,
                model=model,
                plan=plan,
                layer=layer,
                edges=edges,
                zero3=zero3,
                p2p=p2p,
                activation_bytes=rank_bytes / plan.vpp,
                buckets=grad_buckets(model, plan, profile, groups, stage=s)
                if plan.overlap_grad_reduce
                else (),
            )
        stages.append(stage_kinds[key])
    rank_kinds: dict[tuple[bool, bool], RankWork] = {}
    ranks = []
    for r in range(plan.pp):
        edge = (r == 0, r == plan.pp - 1)
        if edge not in rank_kinds:
            rank_kinds[edge] = _rank_work(r, model=model, plan=plan, profile=profile, groups=groups)
        ranks.append(rank_kinds[edge])
    return PipelineWork(
        stages=tuple(stages),
        ranks=tuple(ranks),
        num_microbatches=plan.num_microbatches,
        blocking_p2p=not plan.overlap_p2p_comm,
        overlap_grad_reduce=plan.overlap_grad_reduce,
    )
