"""Run a plan for real with torch.distributed and return what was measured.

:func:`run_plan` starts ``num_processes`` ranks (``torch.multiprocessing``, start method
``forkserver`` with the worker module preloaded, a free TCP port on 127.0.0.1), or, when
the process was launched by ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set), runs this
process's rank in place and gathers the results with ``all_gather_object``. Each rank runs
``plansim.validate.worker``.

Faults: the launcher polls the ranks' result, error and progress files. A rank that raises
or exits before writing its result ends the run at once; a run that is not finished after
``timeout_s`` seconds ends then. Either way every rank is killed and :class:`ValidateError`
names the rank(s), the error (traceback summary) or the last progress of each rank; no
partial result is returned. Success is judged by the result files, not exit codes.

Importing this module does not import torch (the CLI imports it).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.sim.timeline import make_timeline
from plansim.validate.result import MeasuredRun, RunFailed, ValidateError
from plansim.validate.run_config import RunConfig

#: ``RunConfig`` is named here too: callers build it for :func:`run_plan`.
__all__ = ["RunConfig", "RunOutcome", "execute", "measured_run", "run_plan", "under_torchrun"]

_POLL_S = 0.1
_WORKER_MODULE = "plansim.validate.worker"


def under_torchrun() -> bool:
    """True when launched by torchrun (RANK and WORLD_SIZE in the environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RunOutcome:
    """A measured run and the runner's notes on it.

    Attributes:
        measured: what was measured.
        schedule_check: per pipeline rank, torch's schedule class for the plan and whether
            its compute order equals ours (``{"schedule", "matches", "note"?}``).
    """

    measured: MeasuredRun
    schedule_check: tuple[dict[str, Any], ...]


def run_plan(config: RunConfig) -> MeasuredRun:
    """Run ``config.plan`` on ``config.model`` for real; the measured run.

    Raises:
        ValidateError: the plan cannot run (names the field), or a rank failed, died or hung
            (names the rank and its error or last progress).
    """
    return execute(config).measured


def execute(config: RunConfig) -> RunOutcome:
    """:func:`run_plan` with the runner's notes (see :class:`RunOutcome`)."""
    from plansim.validate.parallelize import check_supported

    check_supported(config.model, config.plan)
    if under_torchrun():
        results = _run_torchrun(config)
    else:
        with tempfile.TemporaryDirectory(prefix="plansim-validate-") as tmp:
            run_dir = Path(tmp)
            _launch(config, run_dir)
            results = [
                json.loads((run_dir / f"rank-{r}.json").read_text())
                for r in range(config.num_processes)
            ]
    rep = sorted(
        (r for r in results if r["intervals"] is not None), key=lambda r: r["coords"]["pp"]
    )
    return RunOutcome(
        measured=measured_run(config, results),
        schedule_check=tuple(r["torch_order"] for r in rep),
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(config: RunConfig, run_dir: Path) -> None:
    """Spawn the ranks and wait for every result file (see module docstring)."""
    import torch.multiprocessing as mp

    from plansim.calibrate.orphans import start_reaper, stop_reaper, terminate_as_interrupt
    from plansim.validate.worker import FAULT_ENV, spawned_main

    world = config.num_processes
    init = f"tcp://127.0.0.1:{_free_port()}"
    deadline = time.monotonic() + config.timeout_s
    # forkserver: one server process imports torch and the worker once, every rank is a fork
    # of it (spawn would re-import torch in every rank, ~3 s each on a 2-core machine)
    mp.get_context("forkserver").set_forkserver_preload([_WORKER_MODULE])
    with terminate_as_interrupt():
        context = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            spawned_main,
            args=(config, world, str(run_dir), init, os.environ.get(FAULT_ENV, "")),
            nprocs=world,
            join=False,
            start_method="forkserver",
        )
        pids = [p.pid for p in context.processes]
        reaper = start_reaper(os.getpid(), pids, cleanup=run_dir)
        try:
            _wait(context, config, run_dir, deadline, world)
        finally:
            stop_reaper(reaper)


def _wait(context: Any, config: RunConfig, run_dir: Path, deadline: float, world: int) -> None:
    """Wait for every result file; stop the ranks whatever ends the wait."""
    try:
        while not all((run_dir / f"rank-{r}.json").exists() for r in range(world)):
            _check_ranks(context.processes, run_dir)
            if time.monotonic() > deadline:
                raise RunFailed(
                    _timeout_message(config, run_dir),
                    ranks=_rank_reports(context.processes, run_dir),
                )
            time.sleep(_POLL_S)
    finally:
        _stop(context.processes)


def _check_ranks(processes: list[Any], run_dir: Path) -> None:
    """ValidateError when a rank reported an error or exited without a result.

    Ranks that died come first (their peers then fail with connection errors): the message
    names them, then the ranks that raised, each with the last lines of its traceback.
    """
    if not _failures(processes, run_dir):
        return
    time.sleep(3 * _POLL_S)  # let the other ranks' exits and error files land
    raise RunFailed(
        "\n".join(_failures(processes, run_dir)), ranks=_rank_reports(processes, run_dir)
    )


#: Exit status of a process killed by SIGKILL (multiprocessing reports -signal).
_SIGKILL_EXIT = -9


def _death_cause(exit_status: int | None) -> str:
    """What a rank's exit status says of its death ('' for nothing known)."""
    if exit_status == _SIGKILL_EXIT:
        return (
            "killed by SIGKILL: most likely the kernel's out-of-memory killer (the ranks "
            "together needed more memory than the host had)"
        )
    return ""


def _rank_reports(processes: list[Any], run_dir: Path) -> tuple[dict[str, object], ...]:
    """Each rank's status, exit status, last progress and error, for ``failure.json``."""
    reports = []
    for rank, proc in enumerate(processes):
        error = run_dir / f"error-{rank}.txt"
        done = (run_dir / f"rank-{rank}.json").exists()
        if error.exists():
            status, text = "raised", error.read_text().strip().splitlines()[-1:]
        elif done:
            status, text = "ok", []
        elif proc.exitcode is not None:
            status, text = "died", [_death_cause(proc.exitcode)]
        else:
            status, text = "no result", []
        reports.append(
            {
                "rank": rank,
                "status": status,
                "exit_status": proc.exitcode,
                "last_progress": _progress(run_dir, rank)[1],
                "error": " ".join(t for t in text if t),
            }
        )
    return tuple(reports)


def _failures(processes: list[Any], run_dir: Path) -> list[str]:
    died, raised = [], []
    for rank, proc in enumerate(processes):
        error = run_dir / f"error-{rank}.txt"
        if error.exists():
            raised.append(f"rank {rank} failed: {error.read_text().strip()}")
        elif proc.exitcode is not None and not (run_dir / f"rank-{rank}.json").exists():
            cause = _death_cause(proc.exitcode)
            died.append(
                f"rank {rank} died (exit status {proc.exitcode}) without a result; "
                f"last progress: '{_progress(run_dir, rank)[1]}'" + (f"; {cause}" if cause else "")
            )
    if died and raised:
        raised = ["the other ranks then failed:", *(r.splitlines()[0] for r in raised)]
    return died + raised


def _progress(run_dir: Path, rank: int) -> tuple[int, str]:
    path = run_dir / f"progress-{rank}.txt"
    try:
        count, _, label = path.read_text().strip().partition(" ")
        return int(count), label
    except (OSError, ValueError):
        return 0, "not started"


def _timeout_message(config: RunConfig, run_dir: Path) -> str:
    """Which ranks had no result, how far each got, and which lag behind the others."""
    world = config.num_processes
    missing = [r for r in range(world) if not (run_dir / f"rank-{r}.json").exists()]
    progress = {r: _progress(run_dir, r) for r in range(world)}
    least = min(count for count, _ in progress.values())
    behind = [r for r in missing if progress[r][0] == least]
    lines = [
        f"run timed out after {config.timeout_s:g} s (per-rank timeout); killed all ranks. "
        f"No result from rank(s) {', '.join(map(str, missing))}."
    ]
    if len(behind) < len(missing):
        lines.append(f"Hung rank(s): {', '.join(map(str, behind))} (furthest behind).")
    lines += [f"  rank {r}: last progress '{label}'" for r, (_, label) in progress.items()]
    return "\n".join(lines)


def _stop(processes: list[Any]) -> None:
    """Kill every rank still alive (only the processes this launch started), then reap."""
    for proc in processes:
        if proc.is_alive():
            proc.join(timeout=_POLL_S)
    for proc in processes:
        if proc.is_alive():
            proc.kill()
    for proc in processes:
        proc.join(timeout=5)


def _run_torchrun(config: RunConfig) -> list[dict[str, Any]]:
    """Run this process's rank under torchrun; every rank gets every rank's result."""
    import torch
    import torch.distributed as dist

    from plansim.validate.worker import Progress, init_process_group, run_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.num_processes:
        raise ValidateError(f"WORLD_SIZE({world}) != num_processes({config.num_processes})")
    if config.device == "cpu":
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init_process_group(
        backend=config.backend,
        rank=rank,
        world=world,
        init_method="env://",
        timeout_s=config.timeout_s,
    )
    try:
        result = run_rank(config, Progress(None, rank))
        results: list[Any] = [None] * world
        dist.all_gather_object(results, result)
    finally:
        dist.destroy_process_group()
    return results


#: The sender stage's post marker for a receive: recv kind -> (marker kind, stage offset).
_POSTED_BY = {"recv_forward": ("post_send_forward", -1), "recv_backward": ("post_send_backward", 1)}


def _cut_waits(rows: list[tuple[Any, ...]], posts: dict[tuple[str, int, int], float]) -> None:
    """Start each receive's wait no earlier than its send was posted (in place): the rest of
    the wait was the sender computing, not the transfer. Ranks' clocks are aligned by the
    per-step barrier (same host: one clock)."""
    for i, (rank, stream, kind, stage, mb, start, end, nbytes) in enumerate(rows):
        if stream != "pp_recv" or kind not in _POSTED_BY:
            continue
        marker, offset = _POSTED_BY[kind]
        posted = posts.get((marker, stage + offset, mb))
        if posted is not None:
            start = min(max(start, posted), end)
        rows[i] = (rank, stream, kind, stage, mb, start, end, nbytes)


def _step_timeline(results: list[dict[str, Any]], step: int) -> pd.DataFrame:
    """Timeline of one measured step from the representative ranks' intervals: compute rows
    of one key merged (forward + loss), receive waits cut at the send's post, times shifted
    so the step's first event is at 0."""
    merged: dict[tuple[Any, ...], list[float]] = {}
    posts: dict[tuple[str, int, int], float] = {}
    rows = []
    for res in results:
        if res["intervals"] is None:
            continue
        rank = res["coords"]["pp"]
        for stream, kind, stage, mb, start, end, nbytes in res["intervals"][step]:
            if kind.startswith("post_send_"):
                posts[(kind, stage, mb)] = start
            elif stream == "compute" and stage >= 0:
                key = (rank, stream, kind, stage, mb)
                span = merged.setdefault(key, [start, end, nbytes])
                span[0], span[1] = min(span[0], start), max(span[1], end)
            else:
                rows.append((rank, stream, kind, stage, mb, start, end, nbytes))
    rows += [(*key, *span) for key, span in merged.items()]
    _cut_waits(rows, posts)
    origin = min((r[5] for r in rows), default=0.0)
    return make_timeline(
        (r, s, k, st, mb, a - origin, b - origin, float(n)) for r, s, k, st, mb, a, b, n in rows
    )


def measured_run(config: RunConfig, results: list[dict[str, Any]]) -> MeasuredRun:
    """Assemble the per-rank results into a :class:`MeasuredRun`."""
    plan = config.plan
    per_replica = [r["losses"] for r in results if r["losses"] is not None]
    losses = tuple(
        sum(rep[i] for rep in per_replica) / len(per_replica)
        for i in range(config.num_warmup_steps + config.num_steps)
    )
    step_times = tuple(max(r["step_times_s"][i] for r in results) for i in range(config.num_steps))
    waits = [r["run_queue_fractions"] for r in results]
    complete = all(len(w) == config.num_steps for w in waits)
    run_queue = tuple(max(w[i] for w in waits) for i in range(config.num_steps)) if complete else ()
    rep = sorted(
        (r for r in results if r["intervals"] is not None), key=lambda r: r["coords"]["pp"]
    )
    return MeasuredRun(
        model=config.model,
        plan=plan,
        backend=config.backend,
        device=config.device,
        num_processes=config.num_processes,
        num_warmup_steps=config.num_warmup_steps,
        step_times_s=step_times,
        run_queue_fractions=run_queue,
        losses=losses,
        timelines=tuple(_step_timeline(rep, i) for i in range(config.num_steps)),
        peak_memory_bytes=tuple(int(r["peak_memory_bytes"]) for r in rep),
        versions=dict(results[0]["versions"]),
    )
