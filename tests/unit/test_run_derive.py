"""Blank cells that other cells of a published run settle are derived, not skipped."""

from __future__ import annotations

import pytest

from plansim.io.runs import RunRow
from plansim.planner.backtest import Prediction, predict_row
from tests.unit.test_backtest_rows import ROW as BASE

#: test_backtest_rows' row with a stated dp, gradient accumulation, ZeRO-1 and fp16.
ROW = {
    **BASE,
    "tp": "2",
    "dp": "4",
    "grad_accum_steps": "4",
    "zero_stage": "1",
    "precision": "fp16",
}


def _predict(**cells: str) -> Prediction:
    return predict_row(RunRow(path="runs.csv", line=2, cells={**ROW, **cells}), simulate_top=2)


def test_num_gpus_and_global_batch_come_from_the_layout_cells() -> None:
    stated = _predict()
    assert stated.status == "ok"
    derived = _predict(num_gpus="", global_batch_size_seqs="")
    assert derived.status == "ok"
    assert derived.predicted_step_time_s == stated.predicted_step_time_s
    assert derived.plan_label == stated.plan_label
    assert "num_gpus blank: 8 = tp 2 x pp 1 x dp 4 x cp 1" in derived.note
    assert "global_batch_size_seqs blank: 64 = mbs 4 x grad_accum_steps 4 x dp 4" in derived.note
    # dp blank too: it follows from the GPUs over tp x pp x cp
    no_dp = _predict(dp="", global_batch_size_seqs="")
    assert no_dp.predicted_step_time_s == stated.predicted_step_time_s


@pytest.mark.parametrize(
    "cells",
    [
        {"num_gpus": "", "dp": ""},  # nothing says how many GPUs
        {"global_batch_size_seqs": "", "grad_accum_steps": ""},  # nor the batch
        {"num_gpus": "", "seq_len_tokens": "32768"},  # a blank cp is searched there
    ],
)
def test_without_the_cells_that_settle_them_the_row_is_skipped(cells: dict[str, str]) -> None:
    got = _predict(**cells)
    assert (got.status, got.note) == ("skipped", "num_gpus or global_batch_size_seqs blank")


def test_a_blank_precision_is_searched_over_the_16_bit_formats() -> None:
    by_precision = {p: _predict(precision=p) for p in ("bf16", "fp16")}
    times = {p: pred.predicted_step_time_s for p, pred in by_precision.items()}
    assert None not in times.values() and times["bf16"] != times["fp16"]
    blank = _predict(precision="")
    fastest = min(times, key=lambda p: times[p] or 0.0)
    assert blank.predicted_step_time_s == times[fastest]
    assert f"precision blank: {fastest} (searched bf16, fp16)" in blank.note
    # a stated precision is not searched
    assert "precision blank" not in by_precision["bf16"].note
