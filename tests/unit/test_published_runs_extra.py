"""The extra published-runs files in benchmarks/ stay readable and self-consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.io.runs import read_runs
from plansim.planner.run_model import row_model

EXTRA = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs"


@pytest.mark.parametrize("name", ["nemo_performance.csv"])
def test_rows_build_models_and_their_step_times_follow_from_throughput(name: str) -> None:
    _, rows = read_runs(EXTRA / name)
    assert len(rows) == 36
    for row in rows:
        model = row_model(row, [])
        gpus = row.integer("num_gpus")
        tokens = row.integer("global_batch_size_seqs") * model.seq_length
        step = tokens / (row.number("tokens_per_s_per_gpu") * gpus)
        assert row.number("step_time_s") == pytest.approx(step, abs=6e-5), row.row_id
        layout = row.integer("tp") * row.integer("pp") * row.integer("cp") * row.integer("dp")
        assert layout == gpus, row.row_id
