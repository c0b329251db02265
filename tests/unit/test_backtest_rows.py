"""The back-test reads every row it can and skips, with the reason, the rows it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.cli import main
from plansim.io.runs import RunRow
from plansim.planner.backtest import Prediction, predict_row

ROW = {
    "row_id": "R1",
    "model_name": "gpt-1.3b",
    "num_layers": "24",
    "hidden_size": "2048",
    "num_attention_heads": "16",
    "seq_len_tokens": "2048",
    "vocab_size": "51200",
    "gpu_type": "a100-sxm4-80gb",
    "num_gpus": "8",
    "tp": "1",
    "pp": "1",
    "micro_batch_size_seqs": "4",
    "global_batch_size_seqs": "64",
    "recompute": "none",
    "sequence_parallel": "no",
    "precision": "bf16",
    "step_time_s": "2.0",
    "framework": "Megatron-LM (2023)",
}


def _predict(**cells: str) -> Prediction:
    return predict_row(RunRow(path="runs.csv", line=2, cells={**ROW, **cells}))


@pytest.mark.parametrize(
    ("cells", "reason"),
    [
        (
            {"num_attention_heads": "3"},
            "row not usable: model.hidden_size(2048) is not divisible by "
            "model.num_attention_heads(3)",
        ),
        (
            {"tp": "8.5"},
            "row not usable: runs.csv: row R1 (line 2): column tp: expected a non-negative "
            "integer, got '8.5'",
        ),
        (
            {"ffn_hidden_size": "0"},
            "ffn_hidden_size 0: expected a positive width or a blank cell (4 x hidden)",
        ),
        (
            {"dp": "3"},
            "no feasible layout: no layout with tp 1, pp 1, dp 3, mbs 4 splits 8 GPUs, the "
            "model's heads and layers, and a global batch of 64",
        ),
    ],
)
def test_a_row_that_cannot_be_modelled_is_skipped_with_its_reason(
    cells: dict[str, str], reason: str
) -> None:
    got = _predict(**cells)
    assert (got.status, got.note) == ("skipped", reason)


@pytest.mark.parametrize(
    ("text", "stage"),
    [
        ("ZeRO-3", 3),
        ("zero stage 2", 2),
        ("FSDP (full shard)", 3),
        ("FSDP SHARD_GRAD_OP", 2),
        ("Megatron distributed optimizer", 1),
        ("none", 0),
    ],
)
def test_a_blank_zero_stage_is_read_from_the_sharding_text(text: str, stage: int) -> None:
    got = _predict(zero_stage_or_sharding=text)
    assert got.status == "ok", got.note
    assert f"zero_stage {stage} from zero_stage_or_sharding {text!r}" in got.note
    assert f"zero{stage}" in got.plan_label
    searched = _predict(zero_stage_or_sharding="HSDP")  # not a stage plansim can name
    assert "zero_stage searched" in searched.note


def test_one_bad_row_does_not_stop_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = list(ROW)
    good = [ROW[c] for c in header]
    bad = [{"row_id": "R2", "num_attention_heads": "3"}.get(c, ROW[c]) for c in header]
    runs = tmp_path / "runs.csv"
    runs.write_text("\n".join(",".join(r) for r in (header, good, bad)) + "\n")
    assert main(["backtest", str(runs), "--out", str(tmp_path / "pred.csv")]) == 0
    out = capsys.readouterr().out
    assert "backtest: 2 runs, 1 skipped" in out
    assert "row not usable: model.hidden_size(2048) is not divisible" in out
    assert "R2" in (tmp_path / "pred.csv").read_text()
