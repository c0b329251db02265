"""No cell value makes the back-test fail: every mutation of a published row is predicted or
skipped with a reason naming what is wrong (never status ``failed``, never an exception)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from plansim.io.runs import RunRow
from plansim.planner.backtest import predict_row

RUNS = Path(__file__).resolve().parents[2].parent / "shared/reference/published_runs.csv"
#: Rows of the sample: 22B on 8 GPUs (every knob stated), a per-layer-only row, 175B
#: interleaved over 8 stages, and a DeepSpeed ZeRO-3 row (knobs blank).
ROW_IDS = ("T0024", "T0035", "T0026", "T0011")
#: Cells and the values written into them: blank, zero, negative, fractional, non-numeric,
#: non-finite, too large to divide anything, and enumerated cells' unknown words.
MUTATIONS = {
    "tp": ("", "0", "-8", "2.5", "x", "inf", "1024"),
    "pp": ("0", "nan", "7"),
    "dp": ("0", "3"),
    "cp": ("0", "3", "64"),
    "virtual_pipeline_size": ("0", "5"),
    "micro_batch_size_seqs": ("0", "1e9"),
    "global_batch_size_seqs": ("0", "3"),
    "num_gpus": ("", "0", "7"),
    "num_kv_heads": ("0", "5"),
    "ffn_hidden_size": ("0",),
    "seq_len_tokens": ("0", "3"),
    "recompute": ("", "partial"),
    "sequence_parallel": ("maybe",),
    "zero_stage": ("-1", "4"),
    "precision": ("", "int8"),
    "ffn_activation": ("geglu",),
    "gpu_type": ("tpu-v5p",),
    "step_time_s": ("-1", "inf"),
    "per_layer_fwd_ms": ("-2", "x"),
    "measured_peak_mem_gb": ("0",),
    "framework": ("DeepSpeed (2021)", "PyTorch FSDP"),
}
CASES = [
    (row_id, column, value)
    for row_id in ROW_IDS
    for column, values in MUTATIONS.items()
    for value in values
]


def _rows() -> dict[str, RunRow]:
    with RUNS.open(newline="") as fh:
        return {
            r["row_id"]: RunRow(path="runs.csv", line=line, cells=r)
            for line, r in enumerate(csv.DictReader(fh), start=2)
            if r["row_id"] in ROW_IDS
        }


ROWS = _rows()


@pytest.mark.parametrize(("row_id", "column", "value"), CASES)
def test_a_mutated_row_is_predicted_or_skipped_with_a_reason(
    row_id: str, column: str, value: str
) -> None:
    row = ROWS[row_id]
    got = predict_row(
        RunRow(path=row.path, line=row.line, cells={**row.cells, column: value}), simulate_top=2
    )
    assert got.status in ("ok", "skipped", "per-layer", "over-memory"), got.note
    if got.status == "skipped":
        assert got.note  # the reason is said
    else:
        assert got.predicted_step_time_s is not None or got.layer is not None
