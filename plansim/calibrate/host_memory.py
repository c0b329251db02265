"""The host's memory as the kernel reports it (``/proc/meminfo``). Pure: no torch."""

from __future__ import annotations

from pathlib import Path


def host_memory() -> tuple[float, float]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo; (0, 0) where unavailable."""
    values: dict[str, float] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values[key] = float(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    return values.get("MemTotal", 0.0), values.get("MemAvailable", 0.0)
