"""What machine and software a calibration ran on: versions, device names, process memory.

For provenance (no paths are recorded). Imports torch; used by the calibration ranks and,
through ``plansim.calibrate.bench``, by the validator's ranks.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; else the peak from getrusage)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak * (1 if platform.system() == "Darwin" else 1024))


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo`` ``model name``; else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str:
    """NVIDIA driver version from nvidia-smi, or '' when unavailable."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""


def environment(device: torch.device) -> dict[str, str]:
    """Versions and device names for provenance (no paths)."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_name(),
        "cpu_count": str(os.cpu_count() or 0),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = str(torch.version.cuda)
        env["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        env["driver"] = _driver_version()
    else:
        env["device_name"] = env["cpu"]
    return env
