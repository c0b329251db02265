"""The back-test reads every row it can and skips, with the reason, the rows it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.cli import main
from plansim.io.runs import RunRow
from plansim.planner.backtest import Prediction, predict_row
from plansim.planner.run_model import row_model
from plansim.specs.model import PositionEmbedding

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
            "row not usable: runs.csv: row R1 (line 2): column tp: expected a positive "
            "integer, got '8.5'",
        ),
        (
            {"ffn_hidden_size": "0"},
            "row not usable: runs.csv: row R1 (line 2): column ffn_hidden_size: expected a "
            "positive integer, got '0'",
        ),
        (
            {"tp": "0"},
            "row not usable: runs.csv: row R1 (line 2): column tp: expected a positive "
            "integer, got '0'",
        ),
        (
            {"pp": "inf"},
            "row not usable: runs.csv: row R1 (line 2): column pp: expected a positive "
            "integer, got 'inf'",
        ),
        (
            {"zero_stage": "-1"},
            "row not usable: runs.csv: row R1 (line 2): column zero_stage: expected a "
            "non-negative integer, got '-1'",
        ),
        ({"step_time_s": "0"}, "step_time_s 0.0 is not a positive number of seconds"),
        ({"step_time_s": "-1"}, "step_time_s -1.0 is not a positive number of seconds"),
        ({"step_time_s": "nan"}, "step_time_s nan is not a positive number of seconds"),
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
        ("FSDP HYBRID_SHARD", 3),
        ("none", 0),
    ],
)
def test_a_blank_zero_stage_is_read_from_the_sharding_text(text: str, stage: int) -> None:
    got = _predict(zero_stage_or_sharding=text)
    assert got.status == "ok", got.note
    assert f"zero_stage {stage} from zero_stage_or_sharding {text!r}" in got.note
    assert f"zero{stage}" in got.plan_label
    searched = _predict(zero_stage_or_sharding="MiCS")  # not a stage plansim can name
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


def test_stated_selective_recompute_with_flash_attention_is_predicted() -> None:
    # 2023+: FlashAttention; Megatron-core checkpoints the fused attention call
    got = _predict(recompute="selective")
    assert got.status == "ok", got.note
    assert "selective" in got.plan_label and "unfused-attn" not in got.plan_label
    none = _predict(recompute="none")
    assert none.predicted_step_time_s is not None and got.predicted_step_time_s is not None
    assert got.predicted_step_time_s > none.predicted_step_time_s  # the attention re-run


def test_sequence_parallel_at_tp1_is_off_as_in_megatron() -> None:
    got = _predict(sequence_parallel="yes")  # tp 1
    assert got.status == "ok", got.note
    assert " sp" not in got.plan_label


def test_interleaving_without_a_pipeline_says_why() -> None:
    got = _predict(virtual_pipeline_size="2")
    assert got.status == "skipped"
    assert got.note.endswith("(a virtual pipeline size > 1 needs pp > 1)")


def test_deepspeed_forks_are_searched_with_what_they_had() -> None:
    fork = {"framework": "Megatron-DeepSpeed (2022)", "recompute": "", "sequence_parallel": ""}
    got = _predict(**fork, tp="2", pp="2")
    assert got.status == "ok", got.note
    # BLOOM's fork predates Korthikanti et al.'s SP and selective recompute
    assert "sp" not in got.plan_label.split() and "selective" not in got.plan_label
    # DeepSpeed's pipeline engine refuses ZeRO-2/3 with pp > 1
    assert "ZeRO 0 or 1 (DeepSpeed's pipeline engine refuses ZeRO-2/3)" in got.note
    nvidia = _predict(**{**fork, "framework": "Megatron-LM (2022)"}, tp="2", pp="2")
    assert "DeepSpeed's pipeline engine" not in nvidia.note


def test_megatron_lm_rows_are_offered_only_its_distributed_optimizer() -> None:
    got = _predict(tp="2", pp="2")  # Megatron-LM (2023), zero_stage blank
    assert "ZeRO 0 or 1 (Megatron shards only the optimizer without FSDP)" in got.note
    assert {"zero0", "zero1"} & set(got.plan_label.split()), got.plan_label
    old = _predict(framework="Megatron-LM (2021)", tp="2", pp="2")
    assert "ZeRO 0 (Megatron-LM before its distributed optimizer, run 2021)" in old.note
    for name in ("NeMo 24.07 (Megatron-core, 2024)", "Megatron-Bridge 25.11", "Megatron-Core"):
        family = _predict(framework=name, tp="2", pp="2")
        assert "ZeRO 0 or 1 (Megatron shards only the optimizer" in family.note, name
    # FSDP named in the sharding cell is ZeRO-3, stated rather than searched
    fsdp = _predict(framework="Megatron-Bridge 25.11", zero_stage_or_sharding="FSDP", tp="2")
    assert "zero_stage 3 from zero_stage_or_sharding 'FSDP'" in fsdp.note
    assert "zero3" in fsdp.plan_label.split()


def test_deepspeed_pipeline_rows_run_1f1b_only() -> None:
    got = _predict(framework="Megatron-DeepSpeed (2022)", tp="2", pp="2")
    assert "1F1B (DeepSpeed's pipeline engine has no other training schedule)" in got.note
    assert got.plan_label.split()[-2:] != ["interleaved-1f1b"] and " 1f1b" in got.plan_label
    assert "vpp" not in got.plan_label
    # a row naming NVIDIA's Megatron-LM keeps its schedules (SC21's PTD-P rows)
    ptdp = _predict(framework="Megatron-LM (PTD-P) / DeepSpeed ZeRO-3", tp="2", pp="2")
    assert "no other training schedule" not in ptdp.note


def test_enumerated_cells_are_case_insensitive() -> None:
    upper = _predict(
        precision="BF16", gpu_type="A100-SXM4-80GB", recompute="None", ffn_activation="GeLU"
    )
    lower = _predict(ffn_activation="gelu")
    assert upper.status == "ok", upper.note
    assert upper.predicted_step_time_s == lower.predicted_step_time_s


def test_a_runs_file_without_rows_prints_only_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text(",".join(ROW) + "\n")
    assert main(["backtest", str(runs)]) == 0
    assert capsys.readouterr().out == "backtest: 0 runs, 0 skipped, no run predicted\n"


@pytest.mark.parametrize(
    ("activation", "style", "dropout", "positions"),
    [
        ("gelu", "gpt-style model", True, PositionEmbedding.LEARNED),
        ("swiglu", "llama-style model", False, PositionEmbedding.ROPE),
        ("squared_relu", "nemotron-style model", False, PositionEmbedding.ROPE),
    ],
)
def test_the_activation_names_the_family(
    activation: str, style: str, dropout: bool, positions: PositionEmbedding
) -> None:
    notes: list[str] = []
    row = RunRow(path="runs.csv", line=2, cells={**ROW, "ffn_activation": activation})
    model = row_model(row, notes)
    assert any(note.startswith(style) for note in notes), notes
    assert model.dropout is dropout
    assert model.position_embedding is positions
    assert model.add_bias_linear is (activation == "gelu")


@pytest.mark.parametrize(
    ("name", "dropout"), [("MPT-7b", False), ("mpt 30B", False), ("GPT-3 175B", True)]
)
def test_an_mpt_row_is_gpt_style_without_dropout(name: str, dropout: bool) -> None:
    notes: list[str] = []
    cells = {**ROW, "ffn_activation": "gelu", "model_name": name}
    model = row_model(RunRow(path="runs.csv", line=2, cells=cells), notes)
    assert model.dropout is dropout
    assert model.add_bias_linear and model.tied_embeddings
    assert model.position_embedding is PositionEmbedding.LEARNED
    assert any(("(MPT)" in note) is not dropout for note in notes), notes
