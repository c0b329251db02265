"""Killing a launcher leaves no rank running and no temporary folder behind: SIGTERM is
turned into an exception that stops the ranks; after SIGKILL the reaper process kills the
ranks and removes the run folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from plansim.calibrate.orphans import LauncherTerminated, terminate_as_interrupt


def test_sigterm_inside_the_block_raises_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(LauncherTerminated) as exc, terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the handler raises before this ends
    assert exc.value.exit_status == 128 + signal.SIGTERM
    assert "SIGTERM" in str(exc.value)
    assert signal.getsignal(signal.SIGTERM) == before


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_reaper_kills_the_ranks_and_removes_the_folder_when_the_launcher_dies(
    tmp_path: Path,
) -> None:
    """A "launcher" process starts a "rank" that ignores everything but SIGKILL (as a rank
    blocked in C++ does) and the reaper; killing the launcher with SIGKILL ends the rank and
    removes the run folder."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "store").write_text("x")
    pid_file = tmp_path / "rank.pid"
    launcher = textwrap.dedent(
        f"""
        import os, signal, subprocess, sys, time
        from pathlib import Path
        from plansim.calibrate.orphans import start_reaper
        rank = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
        start_reaper(os.getpid(), [rank.pid], cleanup=Path({str(folder)!r}))
        Path({str(pid_file)!r}).write_text(str(rank.pid))
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rank_pid = int(pid_file.read_text())
    proc.kill()  # SIGKILL: nothing runs in the launcher
    proc.wait()
    assert _wait_gone(rank_pid, timeout_s=5.0)
    assert not folder.exists()


def test_a_stopped_reaper_leaves_the_ranks_alone(tmp_path: Path) -> None:
    from plansim.calibrate.orphans import start_reaper, stop_reaper

    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    folder = tmp_path / "run"
    folder.mkdir()
    reaper = start_reaper(os.getpid(), [rank.pid], cleanup=folder)
    stop_reaper(reaper)
    time.sleep(0.5)
    assert rank.poll() is None and folder.exists()
    rank.kill()
    rank.wait()


def _tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the launcher and every rank it spawned)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"PLANSIM_TEST_TAG={tag}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc to find the ranks")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_calibrate_leaves_no_rank_and_no_temp_folder(tmp_path: Path, sig: int) -> None:
    tag = uuid.uuid4().hex
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PLANSIM_TEST_TAG": tag}
    argv = [sys.executable, "-m", "plansim", "calibrate", "--backend", "gloo", "--nproc", "2"]
    argv += ["--quick", "--out", str(tmp_path / "p.yaml"), "--timeout", "300"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    # wait until both ranks run (3 tagged processes: the launcher and two ranks)
    while time.monotonic() < deadline and (
        len(_tagged_pids(tag)) < 3 or not any(tmp.glob("plansim-calibrate-*"))
    ):
        time.sleep(0.2)
    assert any(tmp.glob("plansim-calibrate-*")), "calibrate never started its ranks"
    time.sleep(2.0)  # the ranks are measuring
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err.decode()
        assert b"terminated by SIGTERM; the launched ranks were stopped" in err
    end = time.monotonic() + 15
    while time.monotonic() < end and (_tagged_pids(tag) or any(tmp.glob("plansim-calibrate-*"))):
        time.sleep(0.2)
    assert _tagged_pids(tag) == []
    assert list(tmp.glob("plansim-calibrate-*")) == []


def test_a_rank_killed_by_sigkill_is_reported_as_most_likely_out_of_memory() -> None:
    from plansim.validate.runner import _death_cause

    assert "out-of-memory killer" in _death_cause(-9)
    assert _death_cause(3) == "" and _death_cause(None) == ""
