"""The only place with unit conversions between SI base units and edge units.

Internally plansim uses bytes, seconds, FLOPs (a count), FLOP/s and bytes/s. Scaled units
(GiB, ms, TFLOP/s, GB/s) appear only at the edges: CLI, reports, YAML keys that say so.
"""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2
KIB = 1024
GB = 1e9
TERA = 1e12


def bytes_to_gib(num_bytes: float) -> float:
    """Bytes -> GiB (2**30 bytes)."""
    return num_bytes / GIB


def gib_to_bytes(gib: float) -> float:
    """GiB (2**30 bytes) -> bytes."""
    return gib * GIB


def gb_to_bytes(gb: float) -> float:
    """GB (10**9 bytes, as datasheets give HBM capacity) -> bytes."""
    return gb * GB


def tflops_to_flops_per_s(tflops: float) -> float:
    """TFLOP/s -> FLOP/s."""
    return tflops * TERA


def flops_per_s_to_tflops(flops_per_s: float) -> float:
    """FLOP/s -> TFLOP/s."""
    return flops_per_s / TERA


def gb_per_s_to_bytes_per_s(gb_per_s: float) -> float:
    """GB/s (10**9 bytes per second, as nccl-tests and datasheets report) -> bytes/s."""
    return gb_per_s * GB


def bytes_per_s_to_gb_per_s(bytes_per_s: float) -> float:
    """bytes/s -> GB/s (10**9)."""
    return bytes_per_s / GB


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Gbit/s (NIC line rates) -> bytes/s."""
    return gbit_per_s * 1e9 / 8


def us_to_s(us: float) -> float:
    """Microseconds -> seconds."""
    return us * 1e-6


def s_to_us(seconds: float) -> float:
    """Seconds -> microseconds (Chrome trace timestamps)."""
    return seconds * 1e6


def s_to_ms(seconds: float) -> float:
    """Seconds -> milliseconds."""
    return seconds * 1e3
