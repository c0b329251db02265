"""No orphaned ranks, no stale temp folders: how launched ranks and their launcher end together.

``plansim calibrate`` and ``plansim validate`` launch ranks as child processes (spawn, or a
fork server whose children are not the launcher's). Whatever ends the launcher:

* SIGTERM or SIGHUP (``timeout``, Slurm, a closed terminal): :func:`terminate_as_interrupt`
  turns the signal into :class:`LauncherTerminated`, an exception, so the launcher's
  ``finally`` kills and reaps every rank and its temporary folder is removed, and the
  command ends with status 128 + the signal number, as a shell reports a killed process;
* SIGKILL (nothing runs in the launcher): each rank runs :func:`watch_launcher`, a daemon
  thread that checks every :data:`POLL_S` whether the launcher still runs (exists, not a
  zombie) and the rank still has the parent it started with (a fork server exits with its
  launcher; the rank is then reparented), and otherwise
  removes the run's temporary folder and ends the rank at once (``os._exit``: a rank blocked
  in a collective's C++ wait cannot run Python handlers, a thread can, since those waits
  release the GIL).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

#: Seconds between a rank's checks that its launcher is alive.
POLL_S = 0.25
#: Exit status of a rank that ended because its launcher was gone.
ORPHANED_EXIT_STATUS = 70
#: Signals the launcher turns into :class:`LauncherTerminated`.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


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


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists, is ours and is not a zombie (a killed launcher stays
    one until its own parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (a reused pid): not ours
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: existence is all there is to know
    return stat.rpartition(")")[2].split()[0] != "Z"


def watch_launcher(launcher_pid: int, *, cleanup: Path | None) -> threading.Thread | None:
    """Start the rank's watch on its launcher (module docstring); None when ``launcher_pid``
    is 0 (not launched by plansim). ``cleanup``: the folder to remove when the launcher is
    gone (rank 0's job; None on the other ranks)."""
    if launcher_pid <= 0:
        return None

    parent = os.getppid()

    def watch() -> None:  # the launcher, or the fork server it started, gone: orphaned
        while _alive(launcher_pid) and os.getppid() == parent:
            time.sleep(POLL_S)
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        os._exit(ORPHANED_EXIT_STATUS)

    thread = threading.Thread(target=watch, name="plansim-launcher-watch", daemon=True)
    thread.start()
    return thread
