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

NO_OFFLOAD = (OffloadDevice.NONE, OffloadDevice.NONE)


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
    group spans that many GPUs, dp_shard = shard_gpus / (tp * cp), if it divides dp, is below
    it and gives a shard group of at least 2 ranks. ZeRO 1-3 without offload or
    per-tensor-sync fetch have it (``plan_checks.check_hsdp``; for ZeRO-1/2 it is
    Megatron-core's partial distributed optimizer). ``only``: the hybrid value
    alone where it fits (a run stated as hybrid-sharded), else None alone.

    Example: shard_gpus 8, tp 2, cp 1, dp 32 -> (None, 4): shards over the 4 DP ranks of a
    node, 8 replicas.
    """
    if (
        shard_gpus is None
        or zero_stage == 0
        or offload != NO_OFFLOAD
        or fetch is Zero3ParamFetch.PER_TENSOR_SYNC
        or shard_gpus % (tp * cp)
    ):
        return (None,)
    shard = shard_gpus // (tp * cp)
    if shard >= dp or dp % shard or shard * cp < 2:
        return (None,)
    return (shard,) if only else (None, shard)
