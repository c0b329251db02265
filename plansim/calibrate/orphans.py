"""No orphaned ranks, no stale temp folders: launched ranks and their launcher end together.

``plansim calibrate`` and ``plansim validate`` launch ranks as child processes (spawn, or a
fork server whose children are not the launcher's). Whatever ends the launcher:

* SIGTERM or SIGHUP (``timeout``, Slurm, a closed terminal): :func:`terminate_as_interrupt`
  turns the signal into :class:`LauncherTerminated`, an exception, so the launcher's
  ``finally`` kills and reaps every rank and its temporary folder is removed, and the
  command ends with status 128 + the signal number, as a shell reports a killed process;
* SIGKILL (nothing runs in the launcher): :func:`start_reaper` starts a small watcher
  process (setsid: outside the launcher's process group) beside the ranks, which checks
  every :data:`POLL_S` that the launcher still runs (exists and is not a zombie) and
  otherwise kills the ranks and removes the run's temporary folder. A separate process, not
  a thread in the ranks: a rank blocked in C++ (a store or collective wait that holds the
  GIL) runs no Python, a separate process still does. The launcher stops the reaper when the
  launch ends (:func:`stop_reaper`).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

#: Seconds between the reaper's checks that the launcher is alive.
POLL_S = 0.2
#: Signals the launcher turns into :class:`LauncherTerminated`.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

#: The reaper: argv = launcher pid, folder ('' for none), rank pids. Standard library only.
_REAPER = """
import os, shutil, signal, sys, time
launcher, folder, ranks = int(sys.argv[1]), sys.argv[2], [int(p) for p in sys.argv[3:]]
def alive(pid):
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True
while alive(launcher):
    time.sleep(POLL_S)
for pid in ranks:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
if folder:
    shutil.rmtree(folder, ignore_errors=True)
"""


class LauncherTerminated(Exception):
    """The launcher received SIGTERM or SIGHUP; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 + the signal number (what a shell reports for a process killed by it)."""
        return 128 + self.signum


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise :class:`LauncherTerminated` in the main
    thread; the previous handlers are restored after it. Outside the main thread (where
    Python cannot install handlers) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise LauncherTerminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def start_reaper(
    launcher_pid: int, rank_pids: Sequence[int], *, cleanup: Path | None
) -> subprocess.Popen[bytes]:
    """Start the reaper of ``rank_pids`` (module docstring) for the launcher
    ``launcher_pid``; ``cleanup``: the folder it removes if the launcher dies first."""
    code = _REAPER.replace("POLL_S", repr(POLL_S))
    argv = [sys.executable, "-c", code, str(launcher_pid), str(cleanup or "")]
    return subprocess.Popen(
        [*argv, *map(str, rank_pids)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outside the launcher's process group: a group kill spares it
    )


def stop_reaper(reaper: subprocess.Popen[bytes]) -> None:
    """End the reaper (the launch ended with the launcher alive) and reap it."""
    reaper.kill()
    reaper.wait()
