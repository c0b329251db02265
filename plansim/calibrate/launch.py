"""Launch ranks with ``torch.multiprocessing`` (start method ``spawn``), bounded in time.

Every launch has a deadline: the parent joins with a short timeout in a loop, forwards the
progress messages rank 0 puts on a queue, and on overrun kills every rank still alive and
raises :class:`plansim.calibrate.CalibrationError` naming the ranks (and the item rank 0 was
measuring). A rank that raises or dies ends the launch with an error naming it. Interrupting
the parent (Ctrl-C) also kills the ranks, and so do SIGTERM and SIGHUP
(``orphans.terminate_as_interrupt``: the launch ends with ``LauncherTerminated``).
"""

from __future__ import annotations

import os
import queue as queue_module
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from plansim.calibrate import CalibrationError
from plansim.calibrate.orphans import start_reaper, stop_reaper, terminate_as_interrupt

#: Progress callback: (index of the item rank 0 started, its label).
OnProgress = Callable[[int, str], None]


def launch(
    fn: Callable[..., None],
    *,
    nproc: int,
    args: tuple[Any, ...],
    timeout_s: float,
    on_progress: OnProgress | None = None,
    poll_s: float = 0.2,
    cleanup: Path | None = None,
) -> None:
    """Run ``fn(rank, nproc, *args, queue)`` in ``nproc`` spawned processes and wait.

    ``fn`` must be importable by the children (a module-level function). ``cleanup``: the
    run's temporary folder, removed with the ranks if this process is killed
    (``orphans.start_reaper``).

    Raises:
        CalibrationError: a rank raised, exited with a non-zero status, or was still running
            after ``timeout_s`` seconds (then every live rank is killed first).
    """
    with terminate_as_interrupt():
        _launch(
            fn,
            nproc=nproc,
            args=args,
            timeout_s=timeout_s,
            on_progress=on_progress,
            poll_s=poll_s,
            cleanup=cleanup,
        )


def _launch(
    fn: Callable[..., None],
    *,
    nproc: int,
    args: tuple[Any, ...],
    timeout_s: float,
    on_progress: OnProgress | None,
    poll_s: float,
    cleanup: Path | None,
) -> None:
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    context = mp.start_processes(
        fn, args=(nproc, *args, messages), nprocs=nproc, join=False, start_method="spawn"
    )
    reaper = start_reaper(os.getpid(), [p.pid for p in context.processes], cleanup=cleanup)
    deadline = time.monotonic() + timeout_s
    last = "starting the ranks"
    try:
        while True:
            last = _drain(messages, on_progress, last)
            if _joined(context, poll_s):
                _drain(messages, on_progress, last)
                return
            if time.monotonic() > deadline:
                alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
                raise CalibrationError(
                    f"rank(s) {', '.join(map(str, alive))} still running after {timeout_s:g} s "
                    f"(rank 0 was at: {last}); killed them. Use --quick or a larger --timeout"
                )
    finally:
        _kill(context)
        messages.close()
        stop_reaper(reaper)


def _joined(context: Any, poll_s: float) -> bool:
    """True when every rank finished; CalibrationError naming a rank that failed."""
    try:
        return bool(context.join(timeout=poll_s))
    except mp.ProcessRaisedException as exc:
        detail = str(exc).strip().splitlines()
        raise CalibrationError(
            f"rank {exc.error_index} failed: {detail[-1] if detail else 'unknown error'}"
        ) from None
    except mp.ProcessExitedException as exc:
        raise CalibrationError(
            f"rank {exc.error_index} exited with status {exc.exit_code} (signal {exc.signal_name})"
            if exc.signal_name
            else f"rank {exc.error_index} exited with status {exc.exit_code}"
        ) from None


def _drain(messages: Any, on_progress: OnProgress | None, last: str) -> str:
    """Forward queued (index, label) messages; returns the latest label."""
    while True:
        try:
            index, label = messages.get_nowait()
        except queue_module.Empty:
            return last
        except (OSError, ValueError, EOFError):
            return last
        last = label
        if on_progress is not None:
            on_progress(int(index), str(label))


def _kill(context: Any) -> None:
    """Kill every rank still alive (only the processes this launch started)."""
    for process in context.processes:
        if process.is_alive():
            process.kill()
    for process in context.processes:
        process.join(timeout=5)
