"""``plansim calibrate``: launch the ranks, collect their rows, fit, merge, write (torch).

The existing profile and its raw CSV are replaced only at the very end, each atomically
(temp file + ``os.replace``): an interrupted or failed run leaves them as they were. The
merged profile keeps every entry the run did not measure, with its provenance; the raw CSV
keeps the rows of earlier runs that the profile still cites.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from plansim.calibrate import CalibrationError
from plansim.calibrate.bench import RankConfig, rank_main
from plansim.calibrate.build import Built, build_update
from plansim.calibrate.host_memory import host_memory
from plansim.calibrate.launch import launch
from plansim.calibrate.plan import Plan, build_plan
from plansim.calibrate.progress import Progress
from plansim.calibrate.raw import frame, merge_raw, raw_path, read_raw, write_raw
from plansim.calibrate.run_info import RunInfo
from plansim.io.profiles import merge_profile, profile_to_yaml, write_profile
from plansim.specs.hardware import HardwareProfile

_RUN_ID = re.compile(r"\brun (\d{8}T\d{6}(?:\.\d{3})?Z)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A validated ``plansim calibrate`` command line."""

    backend: str
    device: str
    nproc: int
    quick: bool
    out: Path
    name: str
    description: str | None
    dry_run: bool
    timeout_s: float
    pg_timeout_s: float = 60.0
    progress: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """What a run produced (the profile is written unless ``dry_run``)."""

    profile: HardwareProfile
    built: Built
    raw: pd.DataFrame
    yaml_text: str
    wall_s: float
    plan: Plan
    info: RunInfo


def max_ranks(device: str) -> int:
    """Ranks this machine allows: CPU cores available to this process, or visible GPUs."""
    if device == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_backend(backend: str, device: str, nproc: int) -> None:
    """Raise CalibrationError unless ``backend`` runs on ``device`` with ``nproc`` ranks here."""
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}
    if not available.get(backend, False):
        raise CalibrationError(f"--backend {backend}: this torch build has no {backend} support")
    allowed = max_ranks(device)
    if device == "cuda" and allowed == 0:
        raise CalibrationError("--device cuda: no CUDA device is visible to torch")
    if nproc > allowed:
        what = "GPUs visible" if device == "cuda" else "CPU cores available (one rank per core)"
        raise CalibrationError(f"--nproc {nproc} is larger than the {allowed} {what}")


def _load_average() -> float:
    """1-minute load average, or -1 where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return -1.0


def calibrate(request: Request, *, base: HardwareProfile | None) -> Result:
    """Measure, fit and merge; write the profile and raw CSV unless ``request.dry_run``.

    Raises:
        CalibrationError: a rank failed or timed out, or the backend/device is unusable.
        InputFileError: the merged profile would be invalid.
    """
    started = time.monotonic()
    check_backend(request.backend, request.device, request.nproc)
    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = now.strftime("%Y%m%dT%H%M%S.") + f"{now.microsecond // 1000:03d}Z"
    total, available = host_memory()
    fp8 = request.device == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9)
    plan = build_plan(nproc=request.nproc, device=request.device, quick=request.quick, fp8=fp8)
    load_before = _load_average()
    rows, env = _measure(request, plan)
    load = (load_before, _load_average())
    raw = frame(rows, run_id=run_id)
    info = RunInfo(
        run_id=run_id,
        date=now.strftime("%Y-%m-%d"),
        backend=request.backend,
        device=request.device,
        nproc=request.nproc,
        quick=request.quick,
        raw_file=raw_path(request.out).name,
        env=env,
        host_memory_total_bytes=total,
        host_memory_available_bytes=available,
        load_average=load if load_before >= 0 else None,
    )
    built = build_update(raw, info, base=base, name=request.name, description=request.description)
    profile = merge_profile(base, built.update)
    yaml_text = profile_to_yaml(profile)  # validates before anything is written
    if not request.dry_run:
        cited = set(_RUN_ID.findall(" ".join(profile.provenance.values())))
        table = merge_raw(read_raw(raw_path(request.out)), raw, keep_runs=cited)
        write_raw(table, raw_path(request.out))
        write_profile(profile, request.out)
    return Result(
        profile=profile,
        built=built,
        raw=raw,
        yaml_text=yaml_text,
        wall_s=time.monotonic() - started,
        plan=plan,
        info=info,
    )


def _measure(request: Request, plan: Plan) -> tuple[list[dict[str, object]], dict[str, str]]:
    return run_items(
        plan,
        backend=request.backend,
        device=request.device,
        nproc=request.nproc,
        timeout_s=request.timeout_s,
        pg_timeout_s=request.pg_timeout_s,
        progress=request.progress,
    )


def run_items(
    plan: Plan,
    *,
    backend: str,
    device: str,
    nproc: int,
    timeout_s: float,
    pg_timeout_s: float = 60.0,
    progress: bool | None = None,
) -> tuple[list[dict[str, object]], dict[str, str]]:
    """Launch ``nproc`` ranks that measure ``plan``; every rank's rows and rank 0's environment.

    Raises:
        CalibrationError: a rank failed, timed out, or wrote no results.
    """
    with tempfile.TemporaryDirectory(prefix="plansim-calibrate-") as workdir:
        config = RankConfig(
            backend=backend,
            device=device,
            plan=plan,
            workdir=workdir,
            pg_timeout_s=pg_timeout_s,
        )
        env_vars = {"GLOO_SOCKET_IFNAME": "lo"} if _loopback_ok(backend) else {}
        with Progress(len(plan.items), enabled=progress) as bar, _environ(env_vars):
            update: Callable[[int, str], None] = bar.update
            launch(
                rank_main,
                nproc=nproc,
                args=(config,),
                timeout_s=timeout_s,
                on_progress=update,
                cleanup=Path(workdir),
            )
        rows: list[dict[str, object]] = []
        env: dict[str, str] = {}
        for rank in range(nproc):
            path = Path(workdir, f"rank{rank}.json")
            if not path.exists():
                raise CalibrationError(f"rank {rank} finished without writing its results")
            data = json.loads(path.read_text(encoding="utf-8"))
            rows += data["rows"]
            env = data["env"] or env
    return rows, env


def _loopback_ok(backend: str) -> bool:
    """Gloo on one host: pin its sockets to loopback unless the user chose an interface."""
    return (
        backend == "gloo"
        and "GLOO_SOCKET_IFNAME" not in os.environ
        and Path("/sys/class/net/lo").exists()
    )


class _environ:
    """Set environment variables for the children, restore them afterwards."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
