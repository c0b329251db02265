"""Checks of a validation run before any rank starts: is there a GPU for an NCCL run, and
will a CPU run's ranks fit this host's memory?

A run whose ranks together need more memory than the host has is killed by the kernel's
out-of-memory killer part-way (the launcher then sees a rank die with exit status -9). On a
CPU run every rank lives in host memory, so the ranks' simulated peaks (plansim's memory
model of the run as it executes: ``plansim.validate.simulated.simulate_plan``) are added up,
each pipeline stage's peak once per rank that holds that stage, and compared with the
kernel's ``MemAvailable``. GPU runs keep their states in GPU memory, which the simulation
already checks against the profile; they are not checked here.
"""

from __future__ import annotations

from plansim.calibrate.host_memory import host_memory
from plansim.planner.evaluate import Evaluation
from plansim.units import bytes_to_gib
from plansim.validate.result import ValidateError


def ranks_peak_bytes(ev: Evaluation, *, num_processes: int, pp: int) -> float:
    """Bytes all ``num_processes`` ranks need at once: each pipeline stage's simulated peak
    (``SimResult.peak_memory_bytes``) times the num_processes / pp ranks that run it."""
    per_stage = ev.result.peak_memory_bytes
    return sum(per_stage) * (num_processes // pp) * pp / len(per_stage)


def check_host_memory(
    ev: Evaluation, *, num_processes: int, pp: int, available_bytes: float | None = None
) -> None:
    """Refuse a CPU run whose ranks need more than the host's available memory.

    Args:
        available_bytes: the host's available memory; default ``MemAvailable`` (no check
            where the kernel does not report it).

    Raises:
        ValidateError: with both figures in GiB and what to change.
    """
    if available_bytes is None:
        available_bytes = host_memory()[1]
    if available_bytes <= 0:
        return
    need = ranks_peak_bytes(ev, num_processes=num_processes, pp=pp)
    if need > available_bytes:
        raise ValidateError(
            f"the {num_processes} ranks need about {bytes_to_gib(need):.1f} GiB of host memory "
            f"together (plansim's memory model of the run), the host has "
            f"{bytes_to_gib(available_bytes):.1f} GiB available: the kernel would kill them. "
            "Use a shorter --seq-len, a smaller --mbs or model, or fewer --nproc"
        )


def require_devices(device: str) -> None:
    """Refuse a ``cuda`` run on a machine where torch sees no CUDA device (torch is imported
    here, when the run is about to start, not when the command module is).

    Raises:
        ValidateError: no CUDA device, naming the backend to use instead.
    """
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise ValidateError(
            "--backend nccl needs a CUDA device and torch sees none on this machine; "
            "use --backend gloo (CPU) or run where GPUs are visible"
        )
