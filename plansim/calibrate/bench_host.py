"""The host-overhead chain items of ``plansim calibrate`` (imports torch; run by ``bench``).

A chain of tiny ops (pairs of ``nn.Linear(8, 8)`` and GELU on a 2 x 8 input that requires
grad) is so small that its time is the eager dispatch and autograd bookkeeping
(``plansim.calibrate.plan.HOST_OP_OPS``); its ``dtensor_`` twin makes the linears
tensor-parallel on a one-rank mesh, so the DTensor dispatch is timed without communication;
its ``sac_`` twin runs the chain as one region checkpointed with torchtitan's per-op policy
(``plansim.calibrate.op_sac``), so every op of the forward passes through torch's selective
checkpointing dispatch mode and the backward recomputes the ops the policy does not save.
With more than one rank two more twins run over all ranks (``WORLD_HOST_OP_OPS``):
``dtensor_world_`` (the same tensor parallelism on a mesh of every rank: each
column/row-parallel pair adds one all-reduce in forward and one in backward, issued by
DTensor's redistribution) and ``fsdp_`` (each Linear + GELU pair one FSDP2 ``fully_shard``
unit over every rank, resharded after forward: an all-gather per unit in forward and in
backward, a reduce-scatter in backward). Their messages are a few hundred bytes, so what
they add over the plain chains is each collective's latency and the framework's host work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from plansim.calibrate.plan import Item


def host_op_chain(
    item: Item, *, device: torch.device, world: int, meshes: dict[str, Any]
) -> Callable[[], object]:
    """The call to time for a ``host_op`` item.

    The call is the chain's forward (the autograd graph is recorded, then dropped; the
    ``fsdp_`` chain's forward runs without grad, as FSDP2 expects a backward after a forward
    with grad), or for ``*_fwd_bwd`` forward + backward (gradients accumulate, as between
    micro-batches). On a GPU the CUDA-event time of such a chain is the host's issue time
    (the kernels are far shorter). ``meshes`` caches the device meshes (``"own"``: this
    rank alone, ``"world"``: every rank), each built on first use by every rank together.

    Raises:
        RuntimeError: the torch build has no DTensor tensor parallelism or FSDP2 (the item is
            then recorded as unsupported).
    """
    (num_ops,) = item.shape
    layers: list[torch.nn.Module] = []
    for _ in range(num_ops // 2):
        layers.append(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()))
    chain = torch.nn.Sequential(*layers).to(device)
    if item.op.startswith("dtensor_world_"):
        _tensor_parallel(chain, _mesh(meshes, "world", device=device, world=world))
    elif item.op.startswith("dtensor_"):
        _tensor_parallel(chain, _mesh(meshes, "own", device=device, world=world))
    elif item.op.startswith("fsdp_"):
        _fully_shard(chain, _mesh(meshes, "world", device=device, world=world))
    model: torch.nn.Module = chain
    if item.op.startswith("sac_"):
        from plansim.calibrate.op_sac import op_selective_checkpoint

        model = op_selective_checkpoint(chain)
    x = torch.randn(2, 8, device=device, requires_grad=True)
    if item.op.endswith("_fwd_bwd"):
        return lambda: model(x).sum().backward()
    if item.op.startswith("fsdp_"):

        def forward_no_grad() -> None:
            with torch.no_grad():
                chain(x)

        return forward_no_grad
    return lambda: model(x)


def _mesh(meshes: dict[str, Any], name: str, *, device: torch.device, world: int) -> Any:
    """The cached mesh ``name``: ``own`` (a (world, 1) mesh's one-rank "tp" dimension) or
    ``world`` (all ranks in one dimension)."""
    if name not in meshes:
        try:
            from torch.distributed.device_mesh import init_device_mesh
        except ImportError as exc:
            raise RuntimeError(f"no DeviceMesh in this torch: {exc}") from None
        if name == "own":
            meshes[name] = init_device_mesh(device.type, (world, 1), mesh_dim_names=("r", "tp"))[
                "tp"
            ]
        else:
            meshes[name] = init_device_mesh(device.type, (world,), mesh_dim_names=("world",))
    return meshes[name]


def _tensor_parallel(chain: torch.nn.Sequential, mesh: Any) -> None:
    """Make the chain's linears DTensor ops on ``mesh``: alternately ``ColwiseParallel`` and
    ``RowwiseParallel``."""
    try:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            ParallelStyle,
            RowwiseParallel,
            parallelize_module,
        )
    except ImportError as exc:
        raise RuntimeError(f"no DTensor tensor parallelism in this torch: {exc}") from None
    layout: dict[str, ParallelStyle] = {
        f"{i}.0": ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(len(chain))
    }
    parallelize_module(chain, mesh, layout)


def _fully_shard(chain: torch.nn.Sequential, mesh: Any) -> None:
    """One FSDP2 unit per Linear + GELU pair, then the root, resharded after forward."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:
        raise RuntimeError(f"no FSDP2 in this torch: {exc}") from None
    for pair in chain:
        fully_shard(pair, mesh=mesh, reshard_after_forward=True)
    fully_shard(chain, mesh=mesh, reshard_after_forward=True)
