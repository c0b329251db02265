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

    @property
    def note(self) -> str:
        """What the raw row's ``note`` says about how the call was timed."""
        return f"{COLD_NOTE} of {self.flush_bytes / 2**20:.0f} MiB"

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
            events = []
            for _ in range(inner):
                self._flush()
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
