"""The overlap-slowdown item of ``plansim calibrate`` (imports torch; run by ``bench``).

Compute slows down while a collective runs beside it on the same device: on a GPU the
communication kernels take SMs and memory bandwidth (Lee et al. 2025, arXiv:2507.03114,
measured 18.9% on average); on a CPU the transport's threads (gloo's worker threads) take
cores and memory bandwidth. Every rank times one GEMM (``plansim.calibrate.plan.
OVERLAP_SHAPES``) in a loop of ~:data:`LOOP_TARGET_S` seconds, alternately alone and while a
chain of asynchronous all_reduces over all ranks is in flight, so that slow drift of the
machine affects both timings alike. The chain is sized (agreed by all ranks) to outlast the
loop: when on some rank it had already finished as the loop ended, the slowdown would be
diluted, so that repetition is discarded and the chain doubled (up to :data:`MAX_CHAIN`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from plansim.calibrate.plan import Item
from plansim.calibrate.timing import Timing

#: Seconds of GEMM calls per timed loop (tens of ms: far above timer resolution and launch
#: overheads, short enough to keep ``--quick`` quick).
LOOP_TARGET_S = 0.03
#: The most all_reduces chained in one repetition.
MAX_CHAIN = 256
#: The chain is sized for this multiple of the loop's time alone (the collective itself also
#: slows down while compute runs beside it).
CHAIN_MARGIN = 2.0
#: The item gives up (keeps no overlapped timing) once more than this many repetitions were
#: discarded (the chain ended early; each discard doubles it).
EXTRA_REPS = 3

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

Fn = Callable[[], object]
Row = dict[str, Any]


@dataclass(slots=True, kw_only=True)
class OverlapTiming:
    """One rank's timings of the overlap item.

    Attributes:
        alone_s: seconds per GEMM call, per repetition, with nothing beside it.
        beside_s: seconds per GEMM call, per kept repetition, with the all_reduce chain in
            flight for the whole loop.
        inner: GEMM calls per loop.
        num_chained: all_reduces in the last repetition's chain.
        note: how the chain went (message, length, repetitions discarded).
    """

    alone_s: list[float]
    beside_s: list[float]
    inner: int
    num_chained: int
    note: str


class OverlapUnsupported(RuntimeError):
    """The item could not run on some rank (every rank raises it, in step)."""


def overlap_rows(
    item: Item,
    *,
    device: torch.device,
    timing: Timing,
    timer: Callable[[Fn, int], float],
    agree_max: Callable[[float], float],
    row: Callable[[Item, list[float], int, float], Row],
    note: Callable[[Item, str, str], list[Row]],
) -> list[Row]:
    """This rank's raw rows of ``item``: op ``gemm_alone`` and ``item.op`` (seconds per GEMM
    call alone / beside the all_reduce chain; the latter's note says how the chain went), or
    rank 0's note when the item could not run or no repetition kept the chain running.

    Args:
        item, device, timing, timer, agree_max: as :func:`time_overlap`.
        row: the bench's timing row (item, samples, inner calls, CPU share).
        note: the bench's rank-0 note row (item, status, note).
    """
    try:
        timed = time_overlap(item, device=device, timing=timing, timer=timer, agree_max=agree_max)
    except OverlapUnsupported as exc:
        return note(item, "unsupported", str(exc))
    # CPU share is not recorded: the transport's threads run in the same process
    alone = row(dataclasses.replace(item, op="gemm_alone"), timed.alone_s, timed.inner, math.nan)
    if not timed.beside_s:
        return [alone, *note(item, "skipped", timed.note)]
    return [alone, {**row(item, timed.beside_s, timed.inner, math.nan), "note": timed.note}]


def time_overlap(
    item: Item,
    *,
    device: torch.device,
    timing: Timing,
    timer: Callable[[Fn, int], float],
    agree_max: Callable[[float], float],
) -> OverlapTiming:
    """Time ``item`` (kind ``overlap``) on this rank; every rank of the world calls it together.

    Sizing (the same on every rank: each figure is the largest over ranks): ``inner`` GEMM
    calls make a loop of ~:data:`LOOP_TARGET_S`; repetitions as the plan's timing asks for a
    pair of loops; the chain has :data:`CHAIN_MARGIN` x the loop's time alone / the time of
    one blocking all_reduce of the message, at most :data:`MAX_CHAIN`.

    Args:
        item: shape (m, n, k, all_reduce message bytes), ``group_size`` the world.
        device: this rank's device.
        timing: the plan's timing (``warmup``, ``min_reps``, ``max_reps``, ``target_s``).
        timer: seconds per call of a function over a number of back-to-back calls (CUDA
            events on a GPU: the compute stream's time).
        agree_max: the largest value over all ranks (a collective).

    Raises:
        OverlapUnsupported: building or warming up failed on some rank.
    """
    message_bytes = item.shape[3]
    gemm, buffer, call_s, error = _build(item, device=device, timing=timing, timer=timer)
    call_s = agree_max(call_s)
    if gemm is None or buffer is None or math.isinf(call_s):
        raise OverlapUnsupported(error or "failed on another rank")
    all_reduce_s = math.inf
    for _ in range(max(1, timing.warmup)):
        dist.barrier()
        all_reduce_s = timer(lambda: dist.all_reduce(buffer), 1)
    all_reduce_s = agree_max(all_reduce_s)
    inner = max(1, round(LOOP_TARGET_S / max(call_s, 1e-9)))
    reps = max(timing.min_reps, min(timing.max_reps, int(timing.target_s / (2 * inner * call_s))))
    chained = math.ceil(CHAIN_MARGIN * inner * call_s / max(all_reduce_s, 1e-9))
    out = OverlapTiming(
        alone_s=[], beside_s=[], inner=inner, num_chained=min(MAX_CHAIN, chained), note=""
    )
    num_discarded = 0
    while len(out.beside_s) < reps and num_discarded <= EXTRA_REPS:
        dist.barrier()
        out.alone_s.append(timer(gemm, inner))
        beside_s, running = _beside(
            gemm, buffer=buffer, inner=inner, num_chained=out.num_chained, timer=timer
        )
        if agree_max(0.0 if running else 1.0) > 0:  # the chain ended early on some rank
            num_discarded += 1
            out.num_chained = min(MAX_CHAIN, 2 * out.num_chained)
        else:
            out.beside_s.append(beside_s)
    out.note = (
        f"GEMM loop of {inner} calls beside a chain of {out.num_chained} async all_reduce of "
        f"{message_bytes} bytes over {item.group_size} ranks; {num_discarded} repetitions "
        "discarded "
        "(the chain ended before the loop)"
        + ("" if out.beside_s else "; none kept: the chain always ended early")
    )
    return out


def _beside(
    gemm: Fn,
    *,
    buffer: torch.Tensor,
    inner: int,
    num_chained: int,
    timer: Callable[[Fn, int], float],
) -> tuple[float, bool]:
    """(seconds per GEMM call over ``inner`` calls while ``num_chained`` async all_reduces of
    ``buffer`` are in flight, whether one was still running when the loop ended).

    The ranks start together (barrier), issue the chain, then loop; every all_reduce is
    waited for before returning, so the next repetition starts with nothing in flight.
    """
    dist.barrier()
    works = [dist.all_reduce(buffer, async_op=True) for _ in range(num_chained)]
    seconds = timer(gemm, inner)  # on a GPU the timer synchronizes with the loop's end
    running = not all(work is None or work.is_completed() for work in works)
    for work in works:
        if work is not None:
            work.wait()
    return seconds, running


def _build(
    item: Item, *, device: torch.device, timing: Timing, timer: Callable[[Fn, int], float]
) -> tuple[Fn | None, torch.Tensor | None, float, str]:
    """(the GEMM call, the all_reduce buffer, seconds per call after warm-up, the error text)
    for this rank; (None, None, inf, error) when building or warming up the GEMM failed.

    The buffer holds fp32 zeros (the item's message bytes): the chain's all_reduces share it,
    and sums of zeros stay finite whatever order they run in.
    """
    m, n, k, message_bytes = item.shape
    gemm, call_s, error = random_gemm(
        (m, n, k), item.dtype, device=device, timing=timing, timer=timer
    )
    if gemm is None:
        return None, None, call_s, error
    try:
        buffer = torch.zeros(message_bytes // 4, device=device)
    except RuntimeError as exc:
        return None, None, math.inf, f"unsupported: {str(exc).splitlines()[0][:200]}"
    return gemm, buffer, call_s, ""


def random_gemm(
    shape: tuple[int, int, int],
    dtype: str,
    *,
    device: torch.device,
    timing: Timing,
    timer: Callable[[Fn, int], float],
) -> tuple[Fn | None, float, str]:
    """(a GEMM call (m, k) x (k, n) on normal random operands of ``dtype``, seconds per call
    after ``timing.warmup`` warm-up calls, the error text); (None, inf, error) when building
    or warming up failed. Random operands: a GEMM's power draw depends on its data."""
    m, n, k = shape
    try:
        torch_dtype = DTYPES[dtype]
        a = torch.randn(m, k, device=device).to(torch_dtype)
        b = torch.randn(k, n, device=device).to(torch_dtype)
        out = torch.empty(m, n, device=device, dtype=torch_dtype)

        def gemm() -> object:
            return torch.matmul(a, b, out=out)

        for _ in range(max(1, timing.warmup)):
            gemm()
        call_s = timer(gemm, 2)  # warm: the first call pays one-time costs
    except (RuntimeError, NotImplementedError, TypeError, KeyError, ValueError) as exc:
        return None, math.inf, f"unsupported: {str(exc).splitlines()[0][:200]}"
    return gemm, call_s, ""
