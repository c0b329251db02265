"""benchmarks/fuzz_backtest.py: a few drawn rows pass, and what counts as a failure does."""

from __future__ import annotations

import time

import pytest

from tests.unit.benchmark_scripts import load_benchmark

fuzz = load_benchmark("fuzz_backtest")


def test_a_few_drawn_rows_are_predicted_or_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz.main(["--rows", "6", "--seed", "3000", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "fuzz: 6 rows (seeds 3000-3005)" in out and "0 failed" in out


def test_draws_are_repeatable_and_stay_in_the_schema() -> None:
    rows = fuzz.load_rows()
    assert fuzz.draw(rows, 7) == fuzz.draw(rows, 7)
    for seed in range(50):
        _, cells, what = fuzz.draw(rows, seed)
        changed = [part.split("=")[0] for part in what.split(" with ")[1].split(", ")]
        assert 1 <= len(changed) <= 3
        assert all(cells[c] in fuzz.VALUES[c] for c in changed)


def test_an_exception_a_bad_status_or_the_time_limit_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = fuzz.load_rows()
    line, cells, what = fuzz.draw(rows, 0)

    def boom(*_: object, **__: object) -> None:
        raise ValueError("a plansim bug")

    monkeypatch.setattr(fuzz, "predict_row", boom)
    status, failure = fuzz.check((line, cells, what, 5.0))
    assert status == "exception" and "a plansim bug" in failure

    def slow(*_: object, **__: object) -> None:
        time.sleep(2.0)

    monkeypatch.setattr(fuzz, "predict_row", slow)
    status, failure = fuzz.check((line, cells, what, 0.2))
    assert status == "exception" and "time limit" in failure

    class Failed:
        status, note, predicted_step_time_s, layer = "failed", "KeyError", None, None

    monkeypatch.setattr(fuzz, "predict_row", lambda *_, **__: Failed())
    assert fuzz.check((line, cells, what, 5.0)) == ("failed", f"{what}: status failed: KeyError")
