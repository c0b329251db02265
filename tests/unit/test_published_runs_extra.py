"""The extra published-runs files in benchmarks/ stay readable and self-consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.analytic.params import count_parameters
from plansim.cli import main
from plansim.io.runs import read_runs
from plansim.planner.run_model import row_model

EXTRA = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs"


@pytest.mark.parametrize(
    ("name", "count", "throughput"),
    [("nemo_performance.csv", 36, "tokens_per_s_per_gpu"), ("mosaic_llm_foundry.csv", 191, "")],
)
def test_rows_build_models_and_their_step_times_follow_from_throughput(
    name: str, count: int, throughput: str
) -> None:
    _, rows = read_runs(EXTRA / name)
    assert len(rows) == count
    for row in rows:
        model = row_model(row, [])
        gpus = row.integer("num_gpus")
        tokens = row.integer("global_batch_size_seqs") * model.seq_length
        if throughput:
            step = tokens / (row.number(throughput) * gpus)
        else:
            step = tokens / row.number("tokens_per_s_total")
        assert row.number("step_time_s") == pytest.approx(step, abs=6e-5), row.row_id
        layout = row.integer("tp") * row.integer("pp") * row.integer("cp") * row.integer("dp")
        assert layout == gpus, row.row_id


def test_the_mosaic_rows_agree_with_their_published_mfu() -> None:
    """llm-foundry's MFU (benchmarking README): (6 N + 12 L h s) x tokens/s over GPUs x peak
    (312 TFLOP/s A100 bf16, 989 H100 bf16), N the table's parameter count (learned
    positions, biases, tied embeddings); a mistyped throughput, GPU count or sequence length
    breaks the agreement, and micro-batch x accumulation x GPUs must be the global batch."""
    _, rows = read_runs(EXTRA / "mosaic_llm_foundry.csv")
    peak = {"a100-sxm4-80gb": 312e12, "a100-sxm4-40gb": 312e12, "h100-sxm5-80gb": 989e12}
    for row in rows:
        model = row_model(row, [])
        layers, hidden, seq = model.num_layers, model.hidden_size, model.seq_length
        params = layers * (12 * hidden**2 + 13 * hidden) + (model.vocab_size + seq + 2) * hidden
        assert row.number("params_billion") == pytest.approx(params / 1e9, abs=6e-4)
        flops = (6 * params + 12 * layers * hidden * seq) * row.number("tokens_per_s_total")
        mfu = 100 * flops / (row.integer("num_gpus") * peak[row.choice("gpu_type") or ""])
        assert mfu == pytest.approx(row.number("mfu_pct"), rel=1e-3), row.row_id
        batch = row.integer("micro_batch_size_seqs") * row.integer("grad_accum_steps")
        assert batch * row.integer("num_gpus") == row.integer("global_batch_size_seqs")


def test_the_other_frameworks_rows_follow_from_their_sources_figures() -> None:
    """other_frameworks.csv: each step time is the source's own figure or follows from the
    throughput it gives (tokens/s per GPU; for Llama 3, TFLOP/s per GPU over 6N + 6Lhs FLOPs
    per token, N from the shape), and every stated layout multiplies to the GPU count."""
    _, rows = read_runs(EXTRA / "other_frameworks.csv")
    assert [row.row_id for row in rows] == [f"X{i:04d}" for i in range(1, 15)]
    stated = {"X0001": 60.1, "X0002": 50.2, "X0003": 44.4, "X0004": 105.0}
    for row in rows:
        model = row_model(row, [])
        gpus = row.integer("num_gpus")
        tokens = row.integer("global_batch_size_seqs") * model.seq_length
        if row.row_id in stated:
            step = stated[row.row_id]
        elif row.text("tokens_per_s_per_gpu"):
            step = tokens / (row.number("tokens_per_s_per_gpu") * gpus)
        else:
            h, layers, seq = model.hidden_size, model.num_layers, model.seq_length
            flops = 6 * count_parameters(model).total + 6 * layers * h * seq
            step = tokens * flops / (row.number("tflops_per_gpu") * 1e12 * gpus)
        assert row.number("step_time_s") == pytest.approx(step, abs=6e-5), row.row_id
        if row.text("tp"):
            layout = row.integer("tp") * row.integer("pp") * row.integer("cp") * row.integer("dp")
            assert layout == gpus, row.row_id


def test_the_bloom_search_rows_agree_with_their_published_tflops() -> None:
    """bloom_layout_search.csv: each row's TFLOPs (the source's Megatron-DeepSpeed formula,
    96 B s L h^2 (1 + s / 6h + V / 16 L h) per iteration over GPUs x seconds, recompute
    counted) follows from its step time, so shape, vocabulary, batch, GPUs and full recompute
    are transcribed as the search ran them; every layout multiplies to the GPU count."""
    _, rows = read_runs(EXTRA / "bloom_layout_search.csv")
    assert [row.row_id for row in rows] == [f"B{i:04d}" for i in range(1, 99)]
    for row in rows:
        model = row_model(row, [])
        h, layers, seq = model.hidden_size, model.num_layers, model.seq_length
        batch, gpus = row.integer("global_batch_size_seqs"), row.integer("num_gpus")
        flops = 96 * batch * seq * layers * h**2 * (1 + seq / (6 * h))
        flops += 96 * batch * seq * layers * h**2 * model.vocab_size / (16 * layers * h)
        tflops = flops / (gpus * row.number("step_time_s")) / 1e12
        assert tflops == pytest.approx(row.number("tflops_per_gpu"), rel=1e-3), row.row_id
        assert row.text("recompute") == "full"
        layout = row.integer("tp") * row.integer("pp") * row.integer("cp") * row.integer("dp")
        assert layout == gpus == 384, row.row_id


def test_backtest_groups_the_errors_by_a_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--group-by prints one summary row per value, computed from the per-row errors."""
    lines = (EXTRA / "mosaic_llm_foundry.csv").read_text(encoding="utf-8").splitlines()
    picked = [lines[0], lines[1], lines[2], lines[141], lines[142], lines[143]]  # A100-80, H100
    runs = tmp_path / "runs.csv"
    runs.write_text("\n".join(picked) + "\n", encoding="utf-8")
    assert main(["backtest", str(runs), "--group-by", "gpu_type"]) == 0
    out = capsys.readouterr().out
    per_row: dict[str, list[float]] = {}
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("M0"):
            gpu = "h100-sxm5-80gb" if int(cells[0][1:]) > 139 else "a100-sxm4-80gb"
            per_row.setdefault(gpu, []).append(float(cells[5]))
    assert {k: len(v) for k, v in per_row.items()} == {"a100-sxm4-80gb": 2, "h100-sxm5-80gb": 3}
    for gpu, errors in per_row.items():
        row = next(line.split() for line in out.splitlines() if line.startswith(gpu))
        assert int(row[1]) == len(errors)
        # the per-row errors and the mean are printed to 0.1: each rounds by up to 0.05
        assert float(row[2]) == pytest.approx(sum(abs(e) for e in errors) / len(errors), abs=0.1)
        assert float(row[4]) == pytest.approx(sum(errors) / len(errors), abs=0.1)
    assert main(["backtest", str(runs), "--group-by", "nope"]) == 2
    assert "--group-by 'nope' is not a column" in capsys.readouterr().err
