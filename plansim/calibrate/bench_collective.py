"""The ``collective`` calibration items: the call each member rank times (imports torch).

Message sizes are nccl-tests' (``plansim.specs.hardware``): the all-reduce buffer, the
gathered output, the reduce-scatter input, the bytes each rank sends (send/recv), the whole
per-rank send buffer (all_to_all, as nccl-tests' ``alltoall_perf`` size); fp32 elements.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from plansim.calibrate.plan import Item


def collective_call(
    item: Item, *, group: Any, rank: int, device: torch.device
) -> Callable[[], object]:
    """One ``item.op`` (all_reduce, all_gather, reduce_scatter, sendrecv: a send to the next
    member and a receive from the previous one, or all_to_all: ``all_to_all_single`` of the
    whole buffer, 1/n of it to each member) over ``group`` of ``item.group_size`` ranks.

    ``all_to_all_single`` runs on gloo (CPU tensors) and NCCL alike (checked on torch 2.13
    gloo with two ranks: each rank receives its 1/n slice of every rank's buffer)."""
    n = item.group_size
    elements = item.shape[0] // 4

    def make(count: int) -> torch.Tensor:
        return torch.ones(count, device=device)

    if item.op == "all_reduce":
        buffer = make(elements)
        return lambda: dist.all_reduce(buffer, group=group)
    if item.op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        part, whole = make(elements // n), make(elements)
        return lambda: gather(whole, part, group=group)
    if item.op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        whole, part = make(elements), make(elements // n)
        return lambda: scatter(part, whole, group=group)
    if item.op == "all_to_all":
        source, target = make(elements), make(elements)
        return lambda: dist.all_to_all_single(target, source, group=group)
    send, recv = make(elements), make(elements)
    nxt, prev = (rank + 1) % n, (rank - 1) % n

    def sendrecv() -> None:
        ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prev, group)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    return sendrecv
