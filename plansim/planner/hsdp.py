"""Which hybrid-sharding (HSDP) variants the planner tries for a layout (pure).

Hybrid sharding (``ParallelPlan.dp_shard``) shards ZeRO states over a group of
dp_shard * cp ranks and replicates them over dp / dp_shard such groups. Users size the
shard group to one node (PyTorch FSDP ``HYBRID_SHARD``: "shard within a node, replicate
across nodes"; torchtitan's ``data_parallel_shard_degree`` set to a node's GPUs; for
ZeRO-1/2 Megatron-core's ``--num-distributed-optimizer-instances``), so the parameter
gathers stay on the scale-up fabric and only the gradient shards cross nodes.
"""

from __future__ import annotations

from plansim.specs.plan import OffloadDevice, Zero3ParamFetch
from plansim.specs.sharding import hsdp_problems


def dp_shard_options(
    shard_gpus: int | None,
    *,
    tp: int,
    cp: int,
    dp: int,
    zero_stage: int,
    offload: tuple[OffloadDevice, OffloadDevice],
    fetch: Zero3ParamFetch,
    only: bool = False,
) -> tuple[int | None, ...]:
    """``dp_shard`` values to try: None (shard over all dp * cp ranks) and, when
    ``shard_gpus`` is given (e.g. the GPUs of one node), the hybrid sharding whose shard
    group spans that many GPUs, dp_shard = shard_gpus / (tp * cp), where the plan checks
    allow it (``sharding.hsdp_problems``: ZeRO 1-3, a divisor of dp below it, a shard
    group of at least 2 ranks, no offload or per-tensor-sync fetch; for ZeRO-1/2 it is
    Megatron-core's partial distributed optimizer). ``only``: the hybrid value alone where
    it fits (a run stated as hybrid-sharded), else None alone.

    Example: shard_gpus 8, tp 2, cp 1, dp 32 -> (None, 4): shards over the 4 DP ranks of a
    node, 8 replicas.
    """
    if shard_gpus is None or shard_gpus % (tp * cp):
        return (None,)
    shard = shard_gpus // (tp * cp)
    if hsdp_problems(
        dp=dp, cp=cp, dp_shard=shard, zero_stage=zero_stage, offload=offload, fetch=fetch
    ):
        return (None,)
    return (shard,) if only else (None, shard)
