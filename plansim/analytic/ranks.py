"""Rank groups of a layout and the network tiers they span (pure).

Rank order is tp -> cp -> dp -> pp (Megatron-LM ``RankGenerator`` with order "tp-cp-dp-pp"):
global rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).

Worked example: tp=2, dp=2, pp=2 on nodes of 4 GPUs. TP groups {0,1} {2,3} {4,5} {6,7};
DP groups {0,2} {1,3} {4,6} {5,7} (stride tp = 2, both members in one node);
PP groups {0,4} {1,5} {2,6} {3,7} (stride tp*dp = 4: each hop crosses a node).

With context parallelism: tp=2, cp=2, dp=2, pp=2 on nodes of 4 GPUs (16 GPUs, 4 nodes).
TP groups {0,1} {2,3} ... {14,15}; CP groups {0,2} {1,3} {4,6} {5,7} {8,10} ... (stride tp = 2,
inside a node since tp*cp <= 4); DP groups {0,4} {1,5} {2,6} {3,7} {8,12} ... (stride
tp*cp = 4: crosses a node); DP x CP groups {0,2,4,6} {1,3,5,7} {8,10,12,14} {9,11,13,15}
(stride tp = 2, two members in each of two nodes); PP groups {0,8} {1,9} ... {7,15} (stride
tp*cp*dp = 8). The DP x CP group (ranks with the same tp and pp rank) is Megatron-LM's
``get_data_parallel_group(with_context_parallel=True)``: the cp ranks of a replica hold the
same weights and see different tokens, so gradients are reduced, and the distributed
optimizer shards its states, over dp * cp ranks (``DistributedDataParallel`` allocates the
gradient buffers on ``intra_dp_cp_group``).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.specs.hardware import LinkTier
from plansim.specs.plan import ParallelPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSpan:
    """Where a process group's members sit.

    Attributes:
        size: members in the group.
        members_per_node: members sharing one node (one scale-up domain).
        num_nodes: nodes the group spans.
    """

    size: int
    members_per_node: int
    num_nodes: int

    @property
    def tier(self) -> LinkTier:
        """Slowest tier the group crosses."""
        return LinkTier.INTRA_NODE if self.num_nodes == 1 else LinkTier.INTER_NODE


def group_span(*, size: int, stride: int, gpus_per_node: int) -> GroupSpan:
    """Span of a group of ``size`` ranks spaced ``stride`` apart, from rank 0 of a node.

    Members i * stride for i < size; nodes hold ``gpus_per_node`` consecutive ranks.
    """
    if size == 1:
        return GroupSpan(size=1, members_per_node=1, num_nodes=1)
    if stride >= gpus_per_node:
        return GroupSpan(size=size, members_per_node=1, num_nodes=size)
    per_node = min(size, max(1, gpus_per_node // stride))
    num_nodes = -(-size // per_node)
    return GroupSpan(size=size, members_per_node=per_node, num_nodes=num_nodes)


def dp_cp_size(plan: ParallelPlan) -> int:
    """Ranks that hold the same weights and reduce their gradients together: dp * cp
    (Megatron-LM's data-parallel group with context parallelism; ZeRO shards over it)."""
    return plan.dp * plan.cp


def zero_shard_size(plan: ParallelPlan) -> int:
    """Ranks one ZeRO shard group spans: dp_shard * cp with hybrid sharding (HSDP,
    ``plan.dp_shard``), else dp * cp."""
    return (plan.dp_shard or plan.dp) * plan.cp


def zero_replicate_size(plan: ParallelPlan) -> int:
    """Shard groups holding the same shards (HSDP replicas): dp / dp_shard, else 1."""
    return plan.dp // (plan.dp_shard or plan.dp)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutGroups:
    """Spans of the process groups of a plan (all groups of a kind are alike).

    Attributes:
        tp: tensor-parallel group (stride 1).
        cp: context-parallel ring (stride tp); the KV chunks of ring attention travel on it.
        dp: data-parallel group without cp (stride tp * cp).
        dp_cp: data-parallel group with cp (dp * cp ranks, stride tp): gradient reduction,
            ZeRO sharding and the ZeRO-1/2/3 parameter all-gathers run over it.
        pp: pipeline group (stride tp * cp * dp).
        shard: ZeRO shard group (``zero_shard_size`` ranks, stride tp): dp_cp, or with hybrid
            sharding its first dp_shard * cp members.
        replicate: the HSDP replicas of one shard (``zero_replicate_size`` ranks, stride
            tp * cp * dp_shard); one rank without hybrid sharding.
        ep: expert-parallel group of the expert layers (ep ranks, stride etp: Megatron-Core's
            expert rank order etp -> ep -> edp folded over the tp * cp * dp ranks of a stage,
            ``plansim.specs.parallel_dims.EXPERT_RANK_ORDER``); the token dispatch and
            combine all-to-alls run over it. One rank for a dense plan.
        edp: expert data-parallel group (edp ranks, stride etp * ep): the expert weights'
            gradient reduction and optimizer-state sharding run over it.
    """

    tp: GroupSpan
    cp: GroupSpan
    dp: GroupSpan
    dp_cp: GroupSpan
    pp: GroupSpan
    shard: GroupSpan
    replicate: GroupSpan
    ep: GroupSpan = GroupSpan(size=1, members_per_node=1, num_nodes=1)
    edp: GroupSpan = GroupSpan(size=1, members_per_node=1, num_nodes=1)

    @property
    def pp_hop_tier(self) -> LinkTier:
        """Tier of a send between neighbouring pipeline stages (the slowest hop)."""
        return self.pp.tier


def layout_groups(plan: ParallelPlan, *, gpus_per_node: int) -> LayoutGroups:
    """TP, CP, DP, DP x CP, PP and ZeRO shard / replica group spans for ``plan`` with rank
    order tp -> cp -> dp -> pp.

    The cp ring stays inside a node when tp * cp <= gpus_per_node; the DP x CP group is
    contiguous in (cp, dp), so its stride is tp.
    """
    etp = plan.dims.expert_tensor_parallel_size
    return LayoutGroups(
        tp=group_span(size=plan.tp, stride=1, gpus_per_node=gpus_per_node),
        cp=group_span(size=plan.cp, stride=plan.tp, gpus_per_node=gpus_per_node),
        dp=group_span(size=plan.dp, stride=plan.tp * plan.cp, gpus_per_node=gpus_per_node),
        dp_cp=group_span(size=dp_cp_size(plan), stride=plan.tp, gpus_per_node=gpus_per_node),
        pp=group_span(
            size=plan.pp, stride=plan.tp * plan.cp * plan.dp, gpus_per_node=gpus_per_node
        ),
        shard=group_span(size=zero_shard_size(plan), stride=plan.tp, gpus_per_node=gpus_per_node),
        replicate=group_span(
            size=zero_replicate_size(plan),
            stride=plan.tp * zero_shard_size(plan),
            gpus_per_node=gpus_per_node,
        ),
        ep=group_span(size=plan.ep, stride=etp, gpus_per_node=gpus_per_node),
        edp=group_span(size=plan.dims.edp, stride=etp * plan.ep, gpus_per_node=gpus_per_node),
    )
