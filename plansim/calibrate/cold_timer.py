"""Timing a compute call with cold caches, as training meets it.

Back-to-back calls of one GEMM keep its operands in the caches (a GPU's L2, a CPU's L2/L3), so
the loop measures a rate training does not get: there, each layer's weights were last touched
one step earlier and its activations are evicted by the layers in between. Measured on the
2-core CI VM (issue 6): the validate model's QKV GEMM (256 x 256 x 768, fp32) ran at 126 GFLOP/s
back to back and 92 GFLOP/s after a 64 MiB write (-27%), and profiles built from back-to-back
timings predicted the CPU validation runs 27-52% too fast.

So calibration times GEMM and attention calls one at a time, each after a write to a buffer
at least twice the largest cache (the method of ``triton.testing.do_bench``, which clears the
L2 cache before each timed call by writing a 256 MB buffer; ``python/triton/testing.py`` in
triton-lang/triton). The write is outside the timed interval. Imports torch (runs on the
calibration ranks only).

On a GPU the profile's curves are device time: plansim adds the host's per-op time on its own
(``HostOverhead``, measured by the ``host_op`` items) and takes the larger of the two per pass.
A call timed alone with CUDA events also holds the host's time to queue it when that is the
longer one: the start event fires as soon as the stream reaches it, and the device then
waits for the host. Measured on an H100 (benchmarks/gpu_runs/h100-2026-11-27-nemo-layers):
causal attention forward + backward of 1 x 4 x 1024 x 128 took 0.36 ms a call, a floor that
smaller calls did not go below, where its kernels run for tens of microseconds. So each timed
GPU call is queued behind a device-side wait (``torch.cuda._sleep``) that outlasts the host's
time to queue the call (:data:`HOLD_FACTOR` times it, at least :data:`MIN_HOLD_S`): the start
event fires only once the whole call is queued. This is NVIDIA nvbench's ``blocking_kernel``
(``nvbench/blocking_kernel.cuh``: "prevent the start_event from being recorded until all work
is queued"), with a timed wait in place of a host-released flag, so it cannot deadlock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

Fn = Callable[[], object]

#: Flush size on a GPU: triton.testing.do_bench's 256 MB (2 x L2 when that is larger).
GPU_FLUSH_BYTES = 256 * 2**20
#: Smallest flush on a CPU, when the cache sizes cannot be read.
MIN_CPU_FLUSH_BYTES = 64 * 2**20
#: The row note of a cold timing starts with this (``aggregate.cache_note`` looks for it).
COLD_NOTE = "each call timed alone after a cache-evicting write"
#: The device-side wait before a timed GPU call lasts this many times the host's time to
#: queue the call (module docstring), and at least MIN_HOLD_S.
HOLD_FACTOR = 4.0
MIN_HOLD_S = 1e-3
#: Cycles of the one wait timed to learn the device's wait rate (cycles per second).
SPIN_PROBE_CYCLES = 1_000_000


def hold_cycles(host_s: float, cycles_per_s: float) -> int:
    """Cycles of the device-side wait that outlasts ``host_s`` seconds of host queueing:
    ``HOLD_FACTOR * max(host_s, MIN_HOLD_S) * cycles_per_s``, 0 without a measured rate."""
    if not cycles_per_s > 0:
        return 0
    return int(HOLD_FACTOR * max(host_s, MIN_HOLD_S) * cycles_per_s)


def _size_bytes(text: str) -> int:
    """``'35840K'`` / ``'2 MiB'`` / ``'512'`` (sysfs cache size) -> bytes; 0 when unreadable."""
    text = text.strip().upper().replace("IB", "").replace(" ", "")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else 0


def largest_cpu_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of the largest cache of CPU 0 (Linux sysfs), or 0 when it cannot be read."""
    sizes = []
    for size_file in sorted(root.glob("index*/size")):
        try:
            sizes.append(_size_bytes(size_file.read_text(encoding="ascii")))
        except (OSError, UnicodeDecodeError):
            continue
    return max(sizes, default=0)


def flush_bytes(device: torch.device) -> int:
    """Bytes to write before each timed call on ``device``: 2 x its largest cache, at least
    :data:`GPU_FLUSH_BYTES` on a GPU and :data:`MIN_CPU_FLUSH_BYTES` on a CPU."""
    if device.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
        return max(GPU_FLUSH_BYTES, 2 * l2)
    return max(MIN_CPU_FLUSH_BYTES, 2 * largest_cpu_cache_bytes())


class ColdTimer:
    """Seconds per call of a function, each call timed alone after evicting the caches."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flush_bytes = flush_bytes(device)
        self._buffer: torch.Tensor | None = None
        self._cycles_per_s: float | None = None
        #: The last call's wait: (the function, its cycles); a reference, so never a reuse.
        self._last_hold: tuple[Fn, int] | None = None

    @property
    def note(self) -> str:
        """What the raw row's ``note`` says about how the call was timed."""
        text = f"{COLD_NOTE} of {self.flush_bytes / 2**20:.0f} MiB"
        if self.device.type == "cuda" and _can_wait():
            text += " behind a device-side wait that outlasts its queueing (device time)"
        return text

    def _wait_rate(self) -> float:
        """Cycles per second of ``torch.cuda._sleep`` on this device (timed once)."""
        if self._cycles_per_s is None:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(SPIN_PROBE_CYCLES)
            end.record()
            end.synchronize()
            seconds = float(start.elapsed_time(end)) * 1e-3
            self._cycles_per_s = SPIN_PROBE_CYCLES / seconds if seconds > 0 else 0.0
        return self._cycles_per_s

    def _hold(self, fn: Fn) -> int:
        """Cycles of the wait to queue before each timed call of ``fn``: one untimed call
        gives the host's time to queue it, once per function (0 where torch has no
        device-side wait)."""
        if not _can_wait():
            return 0
        if self._last_hold is not None and self._last_hold[0] is fn:
            return self._last_hold[1]
        torch.cuda.synchronize(self.device)
        begin = time.perf_counter()
        fn()
        host_s = time.perf_counter() - begin
        torch.cuda.synchronize(self.device)
        cycles = hold_cycles(host_s, self._wait_rate())
        self._last_hold = (fn, cycles)
        return cycles

    def _flush(self) -> None:
        if self._buffer is None:
            self._buffer = torch.zeros(self.flush_bytes, dtype=torch.uint8, device=self.device)
        if self.device.type == "cuda":
            self._buffer.zero_()
        else:  # read-modify-write: a large memset may bypass the caches with streaming stores
            self._buffer.add_(1)

    def __call__(self, fn: Fn, inner: int) -> float:
        """Mean seconds of ``inner`` calls of ``fn``, each after a flush (not timed)."""
        if self.device.type == "cuda":
            hold = self._hold(fn)
            events = []
            for _ in range(inner):
                self._flush()
                if hold:
                    torch.cuda._sleep(hold)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                events.append((start, end))
            torch.cuda.synchronize(self.device)
            return sum(float(s.elapsed_time(e)) for s, e in events) * 1e-3 / inner
        total = 0.0
        for _ in range(inner):
            self._flush()
            begin = time.perf_counter()
            fn()
            total += time.perf_counter() - begin
        return total / inner


def _can_wait() -> bool:
    """Whether this torch has the device-side wait (``torch.cuda._sleep``)."""
    return callable(getattr(torch.cuda, "_sleep", None))
