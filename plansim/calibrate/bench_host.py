"""The host-overhead chain items of ``plansim calibrate`` (imports torch; run by ``bench``).

A chain of tiny ops (pairs of ``nn.Linear(8, 8)`` and GELU on a 2 x 8 input that requires
grad) is so small that its time is the eager dispatch and autograd bookkeeping
(``plansim.calibrate.plan.HOST_OP_OPS``); its ``dtensor_`` twin makes the linears
tensor-parallel on a one-rank mesh, so the DTensor dispatch is timed without communication.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from plansim.calibrate.plan import Item


def host_op_chain(
    item: Item, *, device: torch.device, world: int, own_mesh: Any
) -> tuple[Callable[[], object], Any]:
    """(the call to time, this rank's one-rank mesh) for a ``host_op`` item.

    The call is the chain's forward (the autograd graph is recorded, then dropped), or for
    ``*_fwd_bwd`` forward + backward (gradients accumulate, as between micro-batches). On a
    GPU the CUDA-event time of such a chain is the host's issue time (the kernels are far
    shorter). ``own_mesh`` is built on first use (every rank takes part) and returned for
    reuse.

    Raises:
        RuntimeError: the torch build has no DTensor tensor parallelism (the item is then
            recorded as unsupported).
    """
    (num_ops,) = item.shape
    layers: list[torch.nn.Module] = []
    for _ in range(num_ops // 2):
        layers += [torch.nn.Linear(8, 8), torch.nn.GELU()]
    chain = torch.nn.Sequential(*layers).to(device)
    if item.op.startswith("dtensor_"):
        own_mesh = _tensor_parallel(chain, device=device, world=world, own_mesh=own_mesh)
    x = torch.randn(2, 8, device=device, requires_grad=True)
    if item.op.endswith("_fwd_bwd"):
        return (lambda: chain(x).sum().backward()), own_mesh
    return (lambda: chain(x)), own_mesh


def _tensor_parallel(
    chain: torch.nn.Sequential, *, device: torch.device, world: int, own_mesh: Any
) -> Any:
    """Make the chain's linears DTensor ops (alternately ``ColwiseParallel`` and
    ``RowwiseParallel``) on this rank's one-rank mesh; returns the mesh."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            ParallelStyle,
            RowwiseParallel,
            parallelize_module,
        )
    except ImportError as exc:
        raise RuntimeError(f"no DTensor tensor parallelism in this torch: {exc}") from None
    if own_mesh is None:  # every rank builds the (world, 1) mesh together, once
        mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("r", "tp"))
        own_mesh = mesh["tp"]
    layout: dict[str, ParallelStyle] = {
        str(i): ColwiseParallel() if (i // 2) % 2 == 0 else RowwiseParallel()
        for i in range(0, len(chain), 2)
    }
    parallelize_module(chain, own_mesh, layout)
    return own_mesh
