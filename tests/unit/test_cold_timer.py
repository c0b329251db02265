"""Cold-cache timing of calibration GEMM / attention calls (plansim.calibrate.cold_timer)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from plansim.calibrate import aggregate
from plansim.calibrate.timing import FULL, MAX_COLD_REPS, QUICK

torch = pytest.importorskip("torch")
cold_timer = pytest.importorskip("plansim.calibrate.cold_timer")


def _cache(root: Path, index: int, size: str) -> None:
    folder = root / f"index{index}"
    folder.mkdir(parents=True)
    (folder / "size").write_text(size + "\n", encoding="ascii")


def test_largest_cache_is_read_from_sysfs(tmp_path: Path) -> None:
    _cache(tmp_path, 0, "48K")
    _cache(tmp_path, 2, "2048K")
    _cache(tmp_path, 3, "36608K")
    assert cold_timer.largest_cpu_cache_bytes(tmp_path) == 36608 * 1024
    assert cold_timer.largest_cpu_cache_bytes(tmp_path / "missing") == 0
    assert cold_timer._size_bytes("2 MiB") == 2 * 2**20
    assert cold_timer._size_bytes("garbage") == 0


def test_cpu_flush_is_twice_the_largest_cache_and_at_least_64_mib() -> None:
    cpu = torch.device("cpu")
    largest = cold_timer.largest_cpu_cache_bytes()
    assert cold_timer.flush_bytes(cpu) == max(64 * 2**20, 2 * largest)


def test_every_timed_call_follows_its_own_flush() -> None:
    timer = cold_timer.ColdTimer(torch.device("cpu"))
    timer.flush_bytes = 4096  # small: the test checks the order, not the eviction
    seen: list[int] = []

    def call() -> None:
        assert timer._buffer is not None
        seen.append(int(timer._buffer[0]))

    seconds = timer(call, 3)
    assert seen == [1, 2, 3]  # one read-modify-write of the buffer before each call
    assert seconds > 0.0
    assert timer.note == f"{aggregate.COLD_NOTE} of 0 MiB"


def test_cold_repetitions_are_single_calls_and_bounded() -> None:
    for timing in (QUICK, FULL):
        inner, reps = timing.repetitions(1e-6, cold=True)
        assert inner == 1 and reps == min(timing.max_reps, MAX_COLD_REPS)
        inner, reps = timing.repetitions(10.0, cold=True)
        assert (inner, reps) == (1, timing.min_reps)
    inner, _ = FULL.repetitions(1e-6)
    assert inner > 1  # warm timing still loops to beat the timer's resolution


def test_the_note_prefix_is_the_one_aggregate_looks_for() -> None:
    assert cold_timer.COLD_NOTE == aggregate.COLD_NOTE


def test_cache_note_names_cold_timings_and_flags_back_to_back_runs() -> None:
    cold = f"{aggregate.COLD_NOTE} of 72 MiB"
    rows = pd.DataFrame(
        {
            "kind": ["gemm", "gemm", "attention", "stream"],
            "status": ["ok", "ok", "ok", "ok"],
            "note": ["", f"{cold}; timed 2 times (a rank had < 90% of a core)", "", cold],
        }
    )
    assert aggregate.cache_note(rows, "gemm") == cold
    assert aggregate.cache_note(rows, "attention").startswith("calls timed back to back")


def test_the_device_wait_outlasts_the_host_queueing_it_hides() -> None:
    rate = 1.8e9  # cycles per second
    assert cold_timer.hold_cycles(0.3e-3, rate) == int(cold_timer.HOLD_FACTOR * 1e-3 * rate)
    long_host_s = 5e-3  # above MIN_HOLD_S: the wait follows the host's time
    cycles = cold_timer.hold_cycles(long_host_s, rate)
    assert cycles / rate == pytest.approx(cold_timer.HOLD_FACTOR * long_host_s)
    assert cycles / rate > long_host_s
    assert cold_timer.hold_cycles(long_host_s, 0.0) == 0  # no measured rate: no wait


def test_a_cpu_timing_queues_no_device_wait() -> None:
    timer = cold_timer.ColdTimer(torch.device("cpu"))
    assert "device-side wait" not in timer.note
    assert timer._last_hold is None
