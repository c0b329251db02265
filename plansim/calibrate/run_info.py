"""Facts about one calibration run: when, where, how, for provenance. Pure (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """Facts about one calibration run, for provenance and the CPU/GPU mapping."""

    run_id: str
    date: str
    backend: str
    device: str
    nproc: int
    quick: bool
    raw_file: str
    env: Mapping[str, str] = field(default_factory=dict)
    host_memory_total_bytes: float = 0.0
    host_memory_available_bytes: float = 0.0
    load_average: tuple[float, float] | None = None
    #: the ``source()`` text recorded by the run itself (``plansim.calibrate.rebuild``
    #: rebuilding a profile from its raw CSV offline, where the environment is not at hand)
    recorded_source: str = ""

    @property
    def busy(self) -> bool:
        """True when other work competed for the CPUs (1-min load average above 0.5 per CPU
        beyond this run's own ranks, before or after)."""
        if self.load_average is None:
            return False
        cpus = float(self.env.get("cpu_count") or 0) or float(self.nproc)
        before, after = self.load_average
        return before > 0.5 * cpus or after > self.nproc + 0.5 * cpus

    def source(self) -> str:
        """``measured: <device>, <date>, <versions>, <ranks>; raw: <file> run <id>``."""
        if self.recorded_source:
            return self.recorded_source
        env = self.env
        versions = [f"torch {env.get('torch', '?')}", self.backend]
        if self.device == "cuda":
            versions += [
                f"NCCL {env.get('nccl', '?')}",
                f"CUDA {env.get('cuda', '?')}",
                f"driver {env.get('driver') or '?'}",
            ]
        unit = "GPU" if self.device == "cuda" else "core"
        load = ""
        if self.load_average is not None:
            load = (
                f", 1-min load average {self.load_average[0]:.2f} before / "
                f"{self.load_average[1]:.2f} after on {env.get('cpu_count', '?')} CPUs"
            )
        return (
            f"measured: {env.get('device_name', '?')}, {self.date}, {', '.join(versions)}, "
            f"{self.nproc} ranks x 1 {unit} (1 thread each), plansim calibrate"
            f"{' --quick' if self.quick else ''}{load}; raw: {self.raw_file} run {self.run_id}"
        )
