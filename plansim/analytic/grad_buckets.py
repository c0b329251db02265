"""DP gradient-reduction buckets of a pipeline stage, for overlapped reduction (pure).

Megatron-LM ``--overlap-grad-reduce`` (PyTorch DDP-style buckets, Li et al. VLDB 2020): the
gradients of a stage are reduced in buckets that start while backward still runs. The
reduction runs over the dp * cp ranks that hold the same weights (Megatron-LM
``DistributedDataParallel`` allocates its gradient buffers on the data-parallel group with
context parallelism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.analytic.comm import Collective, collective_time_s, sharded_reduce_time_s
from plansim.analytic.memory import plan_state_bytes
from plansim.analytic.moe_counts import count_moe_parameters
from plansim.analytic.moe_layer import rank_parameter_split
from plansim.analytic.param_server import PUSH_KIND, ps_transfer, uses_parameter_server
from plansim.analytic.params import EdgeCounts, count_parameters, edge_parameters
from plansim.analytic.ranks import LayoutGroups, dp_cp_size
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import pipeline_layer_counts, stage_num_layers
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import GradBucket, Segment

#: Megatron-LM's default DDP bucket: max(40M, 1M x data-parallel size) parameters
#: (``DistributedDataParallelConfig.bucket_size``; larger DP groups get larger buckets so the
#: collectives stay bandwidth-bound).
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters of one pipeline stage (model chunk) on one TP rank, in backward order.

    Attributes:
        head: produced first by backward: final norm and output layer (or its tied copy of
            the word embedding when pp > 1) on the last stage; 0 elsewhere.
        per_layer: one transformer layer (linear weights / tp + replicated norms).
        num_layers: layers in the stage (``plansim.specs.layer_split.stage_num_layers``).
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
    ``plansim.analytic.memory.rank_parameters`` (same sharding rules). A model with experts
    or MLA: its dense part only (``moe_layer.RankParameters.dense``: the routed experts'
    gradients are reduced over edp apart, ``rank_work.expert_grad_reduce_s``), the rank's
    layers taken alike."""
    if not is_dense(model):
        return _moe_stage_parameters(model, plan, stage=stage)
    counts = count_parameters(model)
    head, tail = _edges(counts, plan, stage=stage)
    per_layer = (counts.attention_per_layer + counts.mlp_per_layer) / plan.tp
    return StageParams(
        head=head,
        per_layer=per_layer + counts.norms_per_layer,
        num_layers=stage_num_layers(model.num_layers, plan, stage),
        tail=tail,
    )


def _edges(counts: EdgeCounts, plan: ParallelPlan, *, stage: int) -> tuple[float, float]:
    """(head, tail) of ``stage`` on one TP rank: its final norm and output layer, produced
    first in backward, and its embedding, produced last (``params.edge_parameters``)."""
    last = edge_parameters(counts, plan, first=False, last=stage == plan.num_stages - 1)
    first = edge_parameters(counts, plan, first=stage == 0, last=False)
    return last.sharded / plan.tp + last.replicated, first.sharded / plan.tp + first.replicated


def _moe_stage_parameters(model: ModelSpec, plan: ParallelPlan, *, stage: int) -> StageParams:
    """:func:`stage_parameters` of a model with experts or MLA (dense part)."""
    counts = count_moe_parameters(model)
    rank = plan.rank_of_stage(stage)
    split = rank_parameter_split(model, plan, rank=rank)
    head, tail = _edges(counts, plan, stage=stage)
    rank_layers = pipeline_layer_counts(model.num_layers, plan)[rank]
    last = plan.num_stages - 1
    edges_on_rank = (tail if plan.rank_holds_stage(rank, 0) else 0.0) + (
        head if plan.rank_holds_stage(rank, last) else 0.0
    )
    per_layer = max(0.0, split.dense - edges_on_rank) / max(1, rank_layers)
    return StageParams(
        head=head,
        per_layer=per_layer,
        num_layers=stage_num_layers(model.num_layers, plan, stage),
        tail=tail,
    )


def _ready_fraction(params: StageParams, done: float) -> float:
    """Fraction of the stage's last backward after which its first ``done`` parameters (in
    backward order) have gradients: the backward split evenly over the stage's layers, the
    head counted with the first layer it meets and the tail with the last. A stage without
    layers (the embedding or the loss alone, ``account_for_*_in_pipeline_split``) has all
    its gradients at the end of its backward."""
    n = params.num_layers
    if n == 0:
        return 1.0
    layers = math.ceil((done - params.head) / params.per_layer - 1e-9)
    return min(n, max(1, layers)) / n


def dp_grad_reduce_s(
    plan: ParallelPlan, *, profile: HardwareProfile, groups: LayoutGroups, message_bytes: float
) -> float:
    """Seconds of one ZeRO 0-2 DP gradient reduction of ``message_bytes``: an all-reduce over
    dp * cp (ZeRO-0), else a reduce-scatter to the shard owners, all-reduced over the replicas
    with hybrid sharding (``comm.sharded_reduce_time_s``)."""
    if plan.zero_stage == 0:
        return collective_time_s(
            profile,
            collective=Collective.ALL_REDUCE,
            message_bytes=message_bytes,
            span=groups.dp_cp,
        )
    return sharded_reduce_time_s(
        profile, message_bytes=message_bytes, shard=groups.shard, replicate=groups.replicate
    )


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
    all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1, distributed optimizer) starts once all
    its gradients of the last micro-batch exist. Megatron buckets only pipeline rank 0's
    first model chunk (stage 0): other ranks' reductions are off the critical path, later
    chunks overlap anyway (``DistributedDataParallel``: bucket_size = None when pp rank > 0;
    ``training.get_model``: ``disable_bucketing=(model_chunk_idx > 0)``); every other stage
    is one bucket, ready at the end of its last backward. Approximations: buckets hold
    exactly bucket_size parameters (Megatron closes a bucket at the first whole tensor past
    it) and a bucket is ready at the end of the layer holding its last parameter
    (:func:`_ready_fraction`). Empty for ZeRO-2 and ZeRO-3 (per micro-batch
    reduce-scatters, ``plansim.analytic.zero3``) or dp * cp == 1. The collectives span the
    dp * cp group (:func:`dp_grad_reduce_s`: with hybrid sharding the shard group and its
    replicas); the bucket size uses dp alone, as
    Megatron's default does (``get_data_parallel_world_size()`` without context parallelism).
    With ``plan.dp_sync`` parameter-server each bucket is a ``ps_push`` of its gradients
    (``plansim.analytic.param_server.ps_transfer``), also with dp * cp == 1 when the servers
    are dedicated.
    """
    ps = uses_parameter_server(plan)
    if plan.zero_stage >= 2 or (dp_cp_size(plan) == 1 and not ps):
        return ()
    params = stage_parameters(model, plan, stage=stage)
    total = params.total
    size = max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * plan.dp) if stage == 0 else total
    count = max(1, math.ceil(total / size - 1e-9))
    grad_bytes = plan_state_bytes(plan).grad
    buckets = []
    for k in range(count):
        done = total if k == count - 1 else (k + 1) * size
        num_params = done - k * size
        message = num_params * grad_bytes
        if ps:
            segment = ps_transfer(plan, profile, groups, message_bytes=message).segment(PUSH_KIND)
        else:
            seconds = dp_grad_reduce_s(plan, profile=profile, groups=groups, message_bytes=message)
            segment = Segment(kind="dp_comm", stream="dp", duration_s=seconds, num_bytes=message)
        buckets.append(
            GradBucket(
                segment=segment,
                ready_fraction=_ready_fraction(params, done),
                num_params=num_params,
            )
        )
    return tuple(buckets)
