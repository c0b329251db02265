"""The data-parallel traffic the validate run executes for ZeRO 0 and 1 (pure).

plansim's cost model prices Megatron-LM (``plansim.analytic.cost``): gradients reduced in a
contiguous buffer, an all-reduce for ZeRO-0, a reduce-scatter and, after the sharded
optimizer step, an all-gather of the parameters for ZeRO-1 (the distributed optimizer).
The validate runner executes instead (``plansim.validate.worker``, ``parallelize``):

* gradients: one flat all-reduce over dp of every gradient of the rank
  (``parallelize.all_reduce_grads``): ``torch.cat`` copies the gradients into a new flat
  buffer and each is copied back out of it, a read and a write of the gradient bytes each
  way besides the all-reduce; ZeRO-0 and ZeRO-1 alike;
* ZeRO-1: torch's ``ZeroRedundancyOptimizer``. Each rank steps the parameter tensors it
  owns (assigned largest first to the least-loaded rank), then ``_sync_params`` broadcasts
  every parameter tensor from its owner to the others, one broadcast per tensor (the default
  ``parameters_as_bucket_view=False``), waited for in order.

Priced here: the all-reduce with the profile's curve, the copies at the streaming
bandwidth, and a broadcast of B bytes as one send/recv of B bytes between the group's
ranks (``comm.p2p_time_s``): a broadcast's bus bandwidth is its algorithm bandwidth, one
link's rate, as for send/recv (nccl-tests' ``PERFORMANCE.md``), and with two ranks a
broadcast is exactly one send/recv.
"""

from __future__ import annotations

import dataclasses

from plansim.analytic.comm import (
    Collective,
    collective_latency_s,
    collective_time_s,
    p2p_latency_s,
    p2p_time_s,
)
from plansim.analytic.memory import plan_state_bytes
from plansim.analytic.ranks import layout_groups
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import stage_num_layers
from plansim.specs.model import ModelSpec, Normalization, PositionEmbedding
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import PipelineWork, Segment

#: Reads and writes of the gradient bytes around the flat all-reduce: the cat into the flat
#: buffer (read + write) and the copy back (read + write).
FLAT_COPY_ACCESSES = 4


def layer_tensors(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """Elements of each parameter tensor of one validate layer on one TP rank, in module
    order (``plansim.validate.model.Block``): the two norms (weight, and bias for
    LayerNorm), q, k, v and o, the MLP's up (gate) and down, each linear's bias when the
    model has them. q, k, v, up and gate are column-parallel (weights and biases split over
    tp), o and down row-parallel (weights split, biases whole); norms are whole."""
    h, f, kv, tp = model.hidden_size, model.ffn_hidden_size, model.kv_size, plan.tp
    norm = _norm_tensors(model)
    bias = model.add_bias_linear

    def linear(n_in: int, n_out: int, *, column: bool) -> tuple[int, ...]:
        weight = n_in * n_out // tp
        if not bias:
            return (weight,)
        return (weight, n_out // tp if column else n_out)

    gate = linear(h, f, column=True) * (model.activation.num_ffn_matrices - 2)
    return (
        norm
        + linear(h, h, column=True)
        + linear(h, kv, column=True)
        + linear(h, kv, column=True)
        + linear(h, h, column=False)
        + norm
        + linear(h, f, column=True)
        + gate
        + linear(f, h, column=False)
    )


def _norm_tensors(model: ModelSpec) -> tuple[int, ...]:
    """A norm's tensors: LayerNorm weight and bias, RMSNorm weight."""
    h = model.hidden_size
    return (h, h) if model.normalization is Normalization.LAYERNORM else (h,)


def stage_tensors(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[int, ...]:
    """Elements of each parameter tensor of validate pipeline ``stage`` on one TP rank: the
    embedding (tokens, learned positions) on stage 0, its layers, and the final norm and
    output layer on the last stage (replicated over TP; a tied output layer is the
    embedding's tensor with one stage, its own copy with more,
    ``plansim.validate.model.split_stage``)."""
    h, v = model.hidden_size, model.vocab_size
    last = plan.num_stages - 1
    out: tuple[int, ...] = ()
    if stage == 0:
        out += (v * h,)
        if model.position_embedding is PositionEmbedding.LEARNED:
            out += (model.seq_length * h,)
    out += layer_tensors(model, plan) * stage_num_layers(model.num_layers, plan, stage)
    if stage == last:
        out += _norm_tensors(model)
        if not (model.tied_embeddings and plan.num_stages == 1):
            out += (v * h,)
    return out


def rank_tensors(model: ModelSpec, plan: ParallelPlan, *, pp_rank: int) -> tuple[int, ...]:
    """Parameter tensors of pipeline rank ``pp_rank``: its stages
    (``ParallelPlan.stages_of_rank``: pp_rank, pp_rank + pp, ... looped; pp_rank and
    2 pp - 1 - pp_rank under the V placement)."""
    out: tuple[int, ...] = ()
    for stage in plan.stages_of_rank(pp_rank):
        out += stage_tensors(model, plan, stage)
    return out


def executes_flat_all_reduce(plan: ParallelPlan) -> bool:
    """True when the validate run reduces gradients with :func:`flat_all_reduce_s`'s
    all-reduce (dp > 1 with ZeRO 0 or 1; ZeRO 2 and 3 reduce inside FSDP2)."""
    return plan.dp > 1 and plan.zero_stage < 2


def flat_all_reduce_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, pp_rank: int
) -> tuple[float, float, float]:
    """(seconds, bytes, latency seconds) of the rank's gradient all-reduce with its flat
    copies; latency = the all-reduce's alpha plus the copies (not link time)."""
    per_param = plan_state_bytes(plan).grad
    grad_bytes = sum(rank_tensors(model, plan, pp_rank=pp_rank)) * per_param
    span = layout_groups(plan, gpus_per_node=profile.gpus_per_node).dp_cp
    reduce_s = collective_time_s(
        profile, collective=Collective.ALL_REDUCE, message_bytes=grad_bytes, span=span
    )
    copies_s = FLAT_COPY_ACCESSES * grad_bytes / profile.streaming_bytes_per_s()
    alpha = collective_latency_s(profile, collective=Collective.ALL_REDUCE, span=span)
    return reduce_s + copies_s, grad_bytes, min(reduce_s, alpha) + copies_s


def broadcasts_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, pp_rank: int
) -> tuple[float, float, float]:
    """(seconds, bytes, latency seconds) of ``ZeroRedundancyOptimizer._sync_params`` on the
    rank: one broadcast per parameter tensor over dp, each priced as a send/recv of its
    bytes; latency = the tensors' send/recv latencies."""
    across = layout_groups(plan, gpus_per_node=profile.gpus_per_node).dp_cp.num_nodes > 1
    param_bytes = plan_state_bytes(plan).param
    sizes = [n * param_bytes for n in rank_tensors(model, plan, pp_rank=pp_rank)]
    seconds = sum(p2p_time_s(profile, message_bytes=b, inter_node=across) for b in sizes)
    alpha = p2p_latency_s(profile, inter_node=across)
    return seconds, float(sum(sizes)), len(sizes) * alpha


def with_executed_dp(
    work: PipelineWork, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> PipelineWork:
    """``work`` with each rank's DP segments as the validate run executes them (unchanged
    unless :func:`executes_flat_all_reduce`): the gradient segment (``dp_comm`` of
    ``grad_sync``; the run does not overlap it with backward) becomes the flat all-reduce
    with its copies, and for ZeRO-1 the parameter all-gather after the optimizer becomes the
    per-tensor broadcasts."""
    if not executes_flat_all_reduce(plan):
        return work
    ranks = []
    for pp_rank, rank in enumerate(work.ranks):
        seconds, nbytes, latency = flat_all_reduce_s(model, plan, profile, pp_rank=pp_rank)
        grad_sync = _replace_first_dp(rank.grad_sync, seconds, nbytes, latency)
        optimizer = rank.optimizer
        if plan.zero_stage == 1:
            b_s, b_bytes, b_latency = broadcasts_s(model, plan, profile, pp_rank=pp_rank)
            optimizer = _replace_first_dp(optimizer, b_s, b_bytes, b_latency)
        ranks.append(dataclasses.replace(rank, grad_sync=grad_sync, optimizer=optimizer))
    return dataclasses.replace(work, ranks=tuple(ranks))


def _replace_first_dp(
    segments: tuple[Segment, ...], seconds: float, nbytes: float, latency_s: float
) -> tuple[Segment, ...]:
    out, done = [], False
    for seg in segments:
        if not done and seg.kind == "dp_comm":
            seg = dataclasses.replace(
                seg, duration_s=seconds, num_bytes=nbytes, latency_s=min(latency_s, seconds)
            )
            done = True
        out.append(seg)
    return tuple(out)
