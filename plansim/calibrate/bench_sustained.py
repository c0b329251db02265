"""The sustained-rate item of ``plansim calibrate`` (imports torch; run by ``bench``).

A GEMM timed in a short loop after a pause (how MAMF, and this tool's GEMM items, time it)
runs at the boost clock; a GPU that keeps computing reaches its power limit and lowers its
clock (S. Bekman's ``mamf-finder`` MSMF against MAMF: 15-16% lower on H200 and B200;
Horace He 2024: A100 cuBLAS 257 TFLOP/s on random operands at 400 W). Every rank at once
(every GPU of the node busy, as in training): after :data:`IDLE_S` of sleep one short burst
of ~:data:`BURST_S` is timed (op ``gemm_burst``), then the GEMM loops for the item's soak
seconds in windows of ~:data:`WINDOW_S`, and the last quarter of the windows is the
sustained rate (op ``gemm_sustained``, one sample per window). Seconds per GEMM call in both.
``plansim.calibrate.build_terms.sustained_term`` turns them into the profile's
``sustained_matmul_fraction`` and, with enough ranks, ``gpu_matmul_spread_fraction``.

On a GPU whose power reading works (``torch.cuda.power_draw``: NVML's power usage, the
reading ``nvidia-smi`` shows, in mW), a thread reads it every :data:`POWER_PERIOD_S` through
the item: the mean over the idle sleep (after :data:`POWER_SETTLE_S`) is op ``power_idle``,
the mean over the soak's kept windows op ``power_gemm`` (rows with ``work`` = watts,
``work_unit`` ``W``, ``median_s`` = the seconds sampled, ``reps`` = readings);
``build_terms.power_term`` makes them ``idle_power_w`` and ``max_power_w``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from plansim.calibrate.bench_overlap import random_gemm
from plansim.calibrate.plan import Item
from plansim.calibrate.timing import Timing

#: Seconds of sleep before the burst, so that the device starts from idle clocks and power.
IDLE_S = 1.0
#: Seconds of GEMM calls in the timed burst.
BURST_S = 0.05
#: Seconds of GEMM calls per timed window of the soak.
WINDOW_S = 0.25
#: Seconds between power readings (NVML refreshes its reading about every 20-100 ms).
POWER_PERIOD_S = 0.05
#: Seconds of the idle sleep left out of the idle power (the GPU leaves its busy clocks).
POWER_SETTLE_S = 0.3

Fn = Callable[[], object]
Row = dict[str, Any]


def sustained_rows(
    item: Item,
    *,
    device: torch.device,
    timing: Timing,
    timer: Callable[[Fn, int], float],
    agree_max: Callable[[float], float],
    row: Callable[[Item, list[float], int, float], Row],
    note: Callable[[Item, str, str], list[Row]],
) -> list[Row]:
    """This rank's raw rows of ``item`` (shape (m, n, k, soak milliseconds)): op
    ``gemm_burst`` (one sample: seconds per call of the burst) and ``gemm_sustained`` (one
    sample per window of the soak's last quarter), or rank 0's note when the GEMM could not
    run on some rank. Every rank of the world calls it together.

    Args:
        timer: seconds per call of a function over a number of back-to-back calls (CUDA
            events on a GPU: the compute stream's time).
        agree_max: the largest value over all ranks (a collective).
        row, note: the bench's timing row and rank-0 note row.
    """
    soak_ms = item.shape[3]
    m, n, k = item.shape[:3]
    gemm, call_s, error = random_gemm(
        (m, n, k), item.dtype, device=device, timing=timing, timer=timer
    )
    call_s = agree_max(call_s)
    if gemm is None or math.isinf(call_s):
        return note(item, "unsupported", error or "failed on another rank")
    burst_inner = max(1, round(BURST_S / max(call_s, 1e-9)))
    window_inner = max(1, round(WINDOW_S / max(call_s, 1e-9)))
    sampler = PowerSampler.start(power_reader(device))
    dist.barrier()
    idle_start = time.perf_counter()
    time.sleep(IDLE_S)
    idle_end = time.perf_counter()
    burst_s = timer(gemm, burst_inner)
    windows: list[float] = []
    starts: list[float] = []
    deadline = time.perf_counter() + soak_ms / 1000.0
    while time.perf_counter() < deadline or len(windows) < 4:
        starts.append(time.perf_counter())
        windows.append(timer(gemm, window_inner))
    soak_end = time.perf_counter()
    readings = sampler.stop()
    kept = windows[-max(1, len(windows) // 4) :]
    text = (
        f"every rank at once: a burst of {burst_inner} calls after {IDLE_S:g} s idle, then "
        f"{len(windows)} windows of {window_inner} calls over {soak_ms / 1000:g} s; the last "
        f"{len(kept)} windows are the sustained rate"
    )
    burst = row(dataclasses.replace(item, op="gemm_burst"), [burst_s], burst_inner, math.nan)
    out = [burst, {**row(item, kept, window_inner, math.nan), "note": text}]
    spans = {
        "power_idle": (idle_start + POWER_SETTLE_S, idle_end),
        "power_gemm": (starts[-len(kept)], soak_end),
    }
    for op, (start, end) in spans.items():
        watts = [w for t, w in readings if start <= t <= end]
        if watts:
            power = dataclasses.replace(item, op=op, work=sum(watts) / len(watts), work_unit="W")
            out.append(row(power, [end - start], len(watts), math.nan))
    return out


def power_reader(device: torch.device) -> Callable[[], float] | None:
    """Watts of ``device`` now (``torch.cuda.power_draw``, mW), or None off a GPU or where
    the reading fails (no NVML, a GPU without a power sensor)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.power_draw(device)
    except Exception:  # pynvml missing, an NVMLError, a GPU without a sensor: no power rows
        return None
    return lambda: torch.cuda.power_draw(device) / 1000.0


@dataclasses.dataclass(slots=True)
class PowerSampler:
    """Readings of a power reader every :data:`POWER_PERIOD_S` on a thread, as
    (``time.perf_counter()``, watts) pairs; nothing with no reader."""

    reader: Callable[[], float] | None
    readings: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @classmethod
    def start(cls, reader: Callable[[], float] | None) -> PowerSampler:
        """A sampler already reading (when ``reader`` is not None)."""
        sampler = cls(reader=reader)
        if reader is not None:
            sampler.thread = threading.Thread(target=sampler._run, daemon=True)
            sampler.thread.start()
        return sampler

    def _run(self) -> None:
        assert self.reader is not None
        while not self.done.wait(POWER_PERIOD_S):
            self.readings.append((time.perf_counter(), self.reader()))

    def stop(self) -> list[tuple[float, float]]:
        """Stop reading; the readings taken."""
        self.done.set()
        if self.thread is not None:
            self.thread.join()
        return list(self.readings)
