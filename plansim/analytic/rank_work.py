"""Once-per-step work of one pipeline rank: DP gradient sync, the optimizer step and the
ZeRO-1/2 parameter all-gather (pure).

The gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1) runs after the rank's last
backward unless ``plan.overlap_grad_reduce`` moves it into the stages' buckets (ZeRO-2 and
ZeRO-3 reduce-scatter every micro-batch's gradients inside its backward instead,
``plansim.analytic.zero3``); tied
embeddings with pp > 1 add the all-reduce of the embedding gradient between the first and
last stage (Megatron ``_allreduce_word_embedding_grads``). The optimizer is fused Adam over
the local shard, HBM-bound (``elementwise.adam_step_bytes``), with the data-parallel
wrapper's gradient-average passes over the rank's gradient buffer
(``elementwise.grad_average_bytes``, ``plan.ddp_impl``: in the real step they run before the
reduction, or per bucket during backward; as compute-stream work on the step's tail the
step is as long), or the ZeRO-Offload /
ZeRO-Infinity host step (``offload``); a parameter server replaces the sync
(``param_server``). ZeRO 1/2 then all-gather the updated 16-bit parameters over the dp * cp
ranks.

``plan.overlap_param_gather`` (Megatron-LM ``--overlap-param-gather``, distributed optimizer
with ``--overlap-grad-reduce``; ``DistributedDataParallel`` starts bucket i + 1's parameter
all-gather from bucket i's forward pre-hook): the all-gather runs in the same buckets as the
gradients and hides behind the next step's forward, one bucket ahead. With k buckets, the
gather t and the forward compute c of one micro-batch through the rank's layers (the cover:
bucket i's gather runs beside bucket i - 1's forward):

    exposed = t/k + (k - 1) * excess(t/k, c/k)

(``zero3.exposed_gather_s``; excess includes the compute slowdown beside a transfer). In the
one-step simulation the exposed part stays where the whole gather was, after the optimizer:
in steady state the step period is the same. Later micro-batches and, with interleaving, the
other model chunks' first forwards give the gathers more cover than this counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.comm import Collective, collective_time_s
from plansim.analytic.elementwise import adam_step_bytes, grad_average_bytes
from plansim.analytic.grad_buckets import dp_grad_reduce_s
from plansim.analytic.memory import (
    plan_state_bytes,
    rank_memory,
    rank_parameters,
)
from plansim.analytic.moe_counts import count_moe_parameters
from plansim.analytic.moe_layer import RankParameters, rank_parameter_split
from plansim.analytic.offload import with_offload
from plansim.analytic.param_server import ps_rank_work, uses_parameter_server
from plansim.analytic.params import count_parameters
from plansim.analytic.ranks import LayoutGroups, dp_cp_size, zero_shard_size
from plansim.analytic.zero3 import exposed_gather_s
from plansim.errors import SpecError
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import ParallelPlan, Schedule
from plansim.specs.work import RankWork, Segment, StageWork


def _split_parameters(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> RankParameters:
    """The rank's parameters by sharding group: all of a dense model's are reduced over
    dp x cp (``RankParameters.dense``); a MoE model's routed experts over edp."""
    if is_dense(model):
        return RankParameters(dense=rank_parameters(model, plan, rank=rank), expert=0.0)
    return rank_parameter_split(model, plan, rank=rank)


def _output_and_embedding(model: ModelSpec) -> tuple[int, int]:
    """(output layer, word embedding) parameters: the output layer 0 when tied."""
    if is_dense(model):
        counts = count_parameters(model)
        return counts.output_layer, counts.embedding
    moe_counts = count_moe_parameters(model)
    return moe_counts.output_layer, moe_counts.embedding


def expert_grad_reduce_s(
    plan: ParallelPlan, *, profile: HardwareProfile, groups: LayoutGroups, message_bytes: float
) -> float:
    """Seconds of one reduction of the routed experts' gradients over the expert
    data-parallel group (edp ranks, stride etp x ep): an all-reduce with ZeRO-0, else a
    reduce-scatter to the shard owners (Megatron-Core's distributed optimizer over the
    expert data-parallel group). Kept after the backward even with overlapped dense
    buckets (a modelling limit: Megatron-Core buckets them too)."""
    kind = Collective.ALL_REDUCE if plan.zero_stage == 0 else Collective.REDUCE_SCATTER
    return collective_time_s(profile, collective=kind, message_bytes=message_bytes, span=groups.edp)


def segments(*parts: tuple[str, str, float, float]) -> tuple[Segment, ...]:
    """Segments from (kind, stream, seconds, bytes), dropping empty ones."""
    return tuple(
        Segment(kind=k, stream=st, duration_s=d, num_bytes=n) for k, st, d, n in parts if d > 0
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamGatherCover:
    """What hides a rank's overlapped parameter all-gather.

    Attributes:
        num_buckets: the rank's gradient (= parameter) buckets, at least 1.
        forward_s: seconds of one micro-batch's forward actions through the rank's stages
            (compute and the TP collectives that hold it; the gathers run on the dp stream).
    """

    num_buckets: int
    forward_s: float


def gather_cover(stages: list[StageWork] | tuple[StageWork, ...]) -> ParamGatherCover:
    """The cover of a rank holding ``stages`` (its model chunks)."""
    compute = sum(seg.duration_s for stage in stages for seg in stage.forward)
    buckets = sum(len(stage.grad_buckets) for stage in stages)
    return ParamGatherCover(num_buckets=max(1, buckets), forward_s=compute)


def param_gather_exposed_s(gather_s: float, *, cover: ParamGatherCover, slowdown: float) -> float:
    """Exposed seconds of a parameter all-gather of ``gather_s`` overlapped bucket by bucket
    with the next step's forward (module docstring)."""
    k = cover.num_buckets
    return exposed_gather_s(
        k, gather_s=gather_s / k, compute_s=cover.forward_s / k, slowdown=slowdown
    )


def rank_work(
    rank: int,
    *,
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    cover: ParamGatherCover | None = None,
) -> RankWork:
    """Once-per-step work of pipeline rank ``rank``: DP gradient sync and the optimizer.

    With ``plan.overlap_grad_reduce`` the DP reduction is in the stages' grad buckets
    instead (``grad_buckets``); the tied-embedding all-reduce stays here, as does DualPipe's
    all-reduce of the two model copies' gradients between ranks r and pp - 1 - r (they hold
    the same chunks; DeepSeek-V3 report §3.2.1). DP traffic and
    the optimizer shard are over the dp * cp ranks (with hybrid sharding, ``plan.dp_shard``,
    the shard group, the gradient shards all-reduced over its replicas). With
    ``plan.overlap_param_gather`` the ZeRO-1/2 parameter all-gather keeps only its exposed
    part (:func:`param_gather_exposed_s` with ``cover``, from :func:`gather_cover`; required
    then).

    Raises:
        SpecError: overlap_param_gather without ``cover``.
    """
    per_param = plan_state_bytes(plan)
    split = _split_parameters(model, plan, rank=rank)
    params = split.dense
    grad_bytes = params * per_param.grad
    dp_cp = dp_cp_size(plan)
    sync: list[tuple[str, str, float, float]] = []
    ps = uses_parameter_server(plan)
    if plan.zero_stage in (0, 1) and not plan.overlap_grad_reduce and not ps:
        t = dp_grad_reduce_s(plan, profile=profile, groups=groups, message_bytes=grad_bytes)
        sync.append(("dp_comm", "dp", t, grad_bytes))
    expert_grad_bytes = split.expert * per_param.grad
    if expert_grad_bytes:  # reduced over edp, after the dense buckets (expert_grad_reduce_s)
        t = expert_grad_reduce_s(
            plan, profile=profile, groups=groups, message_bytes=expert_grad_bytes
        )
        sync.append(("dp_comm", "dp", t, expert_grad_bytes))
    output_layer, embedding = _output_and_embedding(model)
    ends = (plan.rank_holds_stage(rank, 0), plan.rank_holds_stage(rank, plan.num_stages - 1))
    pair = type(groups.pp)(size=2, members_per_node=1, num_nodes=min(2, groups.pp.num_nodes))
    if plan.schedule is Schedule.DUALPIPE:  # ranks r and pp - 1 - r hold the same chunks
        copies_bytes = grad_bytes + expert_grad_bytes
        t = collective_time_s(
            profile, collective=Collective.ALL_REDUCE, message_bytes=copies_bytes, span=pair
        )
        sync.append(("dp_comm", "dp", t, copies_bytes))
    if plan.pp > 1 and output_layer == 0 and any(ends) and not all(ends):
        emb_bytes = embedding / plan.tp * per_param.grad
        t = collective_time_s(
            profile, collective=Collective.ALL_REDUCE, message_bytes=emb_bytes, span=pair
        )
        sync.append(("embedding_grad_comm", "dp", t, emb_bytes))
    local = params / zero_shard_size(plan) if plan.zero_stage >= 1 else params
    local += split.expert / plan.dims.edp if plan.zero_stage >= 1 else split.expert
    all_grads = grad_bytes + expert_grad_bytes
    step_bytes = adam_step_bytes(local, precision=plan.precision) + grad_average_bytes(
        plan, grad_buffer_bytes=all_grads
    )
    adam_s = step_bytes / profile.streaming_bytes_per_s()
    opt: list[tuple[str, str, float, float]] = [("optimizer", "compute", adam_s, 0.0)]
    if plan.zero_stage in (1, 2) and dp_cp > 1:
        weight_bytes = params * per_param.param
        t = collective_time_s(
            profile, collective=Collective.ALL_GATHER, message_bytes=weight_bytes, span=groups.shard
        )
        expert_bytes = split.expert * per_param.param
        t += collective_time_s(
            profile, collective=Collective.ALL_GATHER, message_bytes=expert_bytes, span=groups.edp
        )
        if plan.overlap_param_gather:
            if cover is None:
                raise SpecError("overlap_param_gather needs the rank's cover (gather_cover)")
            slowdown = profile.overlap_compute_slowdown_fraction
            t = param_gather_exposed_s(t, cover=cover, slowdown=slowdown)
        opt.append(("dp_comm", "dp", t, weight_bytes + expert_bytes))
    grad_sync, optimizer = segments(*sync), segments(*opt)
    if ps:  # push after the tied-embedding all-reduce, so both copies push the same sum
        ps_work = ps_rank_work(model, plan, profile, groups, rank=rank)
        grad_sync, optimizer = grad_sync + ps_work.push, ps_work.optimizer
    optimizer = with_offload(optimizer, plan=plan, profile=profile, local_params=local)
    return RankWork(
        static_bytes=rank_memory(model, plan, profile, rank=rank).static_bytes,
        grad_sync=grad_sync,
        optimizer=optimizer,
    )
