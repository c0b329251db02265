"""The back-test checks per-layer timings and measured peak memory where a row gives them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from plansim.analytic.layer_timing import layer_wall_times
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.backtest import Prediction, predict_row
from plansim.planner.run_checks import PER_LAYER
from plansim.planner.run_model import row_model
from plansim.specs.model import ModelSpec
from plansim.specs.plan import AttentionKernel, ParallelPlan, Recompute, plan_from_fields

# A 22B-style layer on 8 GPUs with tp 8, as Korthikanti et al. 2022 Table 4 times it.
LAYER_ROW = {
    "row_id": "L1",
    "model_name": "gpt-22b",
    "num_layers": "48",
    "hidden_size": "6144",
    "num_attention_heads": "64",
    "seq_len_tokens": "2048",
    "vocab_size": "51200",
    "gpu_type": "a100-sxm4-80gb",
    "num_gpus": "8",
    "tp": "8",
    "pp": "1",
    "micro_batch_size_seqs": "4",
    "global_batch_size_seqs": "4",
    "recompute": "none",
    "sequence_parallel": "no",
    "precision": "bf16",
    "step_time_s": "",
    "per_layer_fwd_ms": "7.7",
    "per_layer_bwd_ms": "11.9",
    "framework": "Megatron-LM (2022)",
}


def _predict(**cells: str) -> Prediction:
    return predict_row(RunRow(path="runs.csv", line=2, cells={**LAYER_ROW, **cells}))


def _plan(recompute: Recompute, *, sp: bool = False) -> ParallelPlan:
    return plan_from_fields(
        dp=1,
        tp=8,
        pp=1,
        micro_batch_size=4,
        global_batch_size=4,
        recompute=recompute,
        sequence_parallel=sp,
        attention=AttentionKernel.UNFUSED,
    )


def _model() -> ModelSpec:
    return row_model(RunRow(path="runs.csv", line=2, cells=LAYER_ROW), [])


def test_full_recompute_adds_one_forward_to_the_backward() -> None:
    model, profile = _model(), load_profile("a100-sxm4-80gb")
    none = layer_wall_times(model, _plan(Recompute.NONE), profile)
    full = layer_wall_times(model, _plan(Recompute.FULL), profile)
    selective = layer_wall_times(model, _plan(Recompute.SELECTIVE), profile)
    assert full.forward_s == none.forward_s == selective.forward_s
    assert full.backward_s == pytest.approx(none.backward_s + none.forward_s, rel=1e-12)
    # selective re-runs only the attention core: more than nothing, less than the layer
    assert none.backward_s < selective.backward_s < full.backward_s


def test_a_layer_pays_its_blocking_tp_collectives() -> None:
    model, profile = _model(), load_profile("a100-sxm4-80gb")
    tp8 = layer_wall_times(model, _plan(Recompute.NONE), profile)
    one_gpu = plan_from_fields(
        dp=8, tp=1, pp=1, micro_batch_size=4, global_batch_size=32,
        attention=AttentionKernel.UNFUSED,
    )  # fmt: skip
    tp1 = layer_wall_times(model, one_gpu, profile)
    # eight ranks share the layer's work, but not perfectly: the all-reduces stay
    assert tp1.forward_s / 8 < tp8.forward_s < tp1.forward_s / 4


def test_a_row_with_only_per_layer_times_is_predicted_on_its_stated_layout() -> None:
    got = _predict()
    assert got.status == PER_LAYER
    assert got.plan_label.startswith("tp8 pp1 dp1 mbs4 zero0 none")
    assert got.predicted_step_time_s is None and got.step_time_error_pct is None
    layer = got.layer
    assert layer is not None and layer.forward_error_pct is not None
    assert layer.forward_error_pct == pytest.approx(100 * (layer.forward_ms - 7.7) / 7.7)
    assert layer.backward_error_pct == pytest.approx(100 * (layer.backward_ms - 11.9) / 11.9)
    # the row's layer, not a toy: within a fifth of what A100s measured
    assert abs(layer.forward_error_pct) < 20 and abs(layer.backward_error_pct) < 20


def test_the_stated_recompute_and_sp_change_the_predicted_layer() -> None:
    base = _predict().layer
    full = _predict(recompute="full", per_layer_bwd_ms="19.5").layer
    sp = _predict(sequence_parallel="yes").layer
    assert base is not None and full is not None and sp is not None
    assert full.backward_ms == pytest.approx(base.backward_ms + base.forward_ms)
    assert sp.forward_ms < base.forward_ms  # layer norms and dropout split over tp ranks


@pytest.mark.parametrize(
    ("cells", "reason"),
    [
        (
            {"micro_batch_size_seqs": "", "recompute": ""},
            "per-layer times without a step time need a stated micro_batch_size_seqs, recompute",
        ),
        (
            {"sequence_parallel": ""},
            "per-layer times without a step time need a stated sequence_parallel",
        ),
        (
            {"per_layer_fwd_ms": "", "per_layer_bwd_ms": ""},
            "no measured step_time_s or per-layer times",
        ),
        (
            {"per_layer_bwd_ms": "0"},
            "per_layer_bwd_ms 0.0 is not a positive number of milliseconds",
        ),
        (
            {"step_time_s": "1.4", "recompute": "full", "measured_peak_mem_gb": "-3"},
            "measured_peak_mem_gb -3.0 is not a positive number of GB",
        ),
        ({"num_gpus": "12"}, "num_gpus 12 is not a multiple of tp x cp x pp = 8"),
    ],
)
def test_a_per_layer_row_that_leaves_out_a_knob_says_which(
    cells: dict[str, str], reason: str
) -> None:
    got = _predict(**cells)
    assert (got.status, got.note) == ("skipped", reason)


def test_a_per_layer_row_before_sequence_parallelism_needs_no_sp_cell() -> None:
    got = _predict(sequence_parallel="", framework="Megatron-LM (2021)")
    assert got.status == PER_LAYER and " sp " not in f" {got.plan_label} "


def test_a_row_with_a_step_time_is_also_checked_on_its_layer_and_memory() -> None:
    stepped = _predict(
        step_time_s="1.4", recompute="full", per_layer_bwd_ms="19.5", measured_peak_mem_gb="40"
    )
    assert stepped.status == "ok" and stepped.step_time_error_pct is not None
    assert stepped.layer is not None and stepped.layer.forward_error_pct is not None
    assert stepped.predicted_peak_memory_gib is not None
    predicted_bytes = stepped.predicted_peak_memory_gib * 2**30
    want = 100 * (predicted_bytes - 40e9) / 40e9  # the column is in GB (1e9 bytes)
    assert stepped.peak_memory_error_pct == pytest.approx(want, rel=1e-9)
    unmeasured = _predict(
        step_time_s="1.4", recompute="full", per_layer_fwd_ms="", per_layer_bwd_ms=""
    )
    assert unmeasured.layer is None and unmeasured.peak_memory_error_pct is None


def test_the_cli_summarises_layer_and_memory_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    no_layer = {"per_layer_fwd_ms": "", "per_layer_bwd_ms": ""}
    rows = [
        LAYER_ROW,
        {**LAYER_ROW, "row_id": "L2", "recompute": "full", "per_layer_bwd_ms": "19.5"},
        {**LAYER_ROW, **no_layer, "row_id": "S1", "step_time_s": "1.4", "recompute": "full",
         "measured_peak_mem_gb": "40"},
        {**LAYER_ROW, **no_layer, "row_id": "X1"},
    ]  # fmt: skip
    runs, out = tmp_path / "runs.csv", tmp_path / "pred.csv"
    with runs.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*LAYER_ROW, "measured_peak_mem_gb"])
        writer.writeheader()
        writer.writerows(rows)
    assert main(["backtest", str(runs), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-4].startswith("backtest: 4 runs, 2 per-layer only, 1 skipped, mean |error| ")
    assert lines[-3].startswith("backtest per-layer forward times: 2 runs, mean |error| ")
    assert lines[-2].startswith("backtest per-layer backward times: 2 runs, mean |error| ")
    assert lines[-1].startswith("backtest peak memory: 1 runs measured, mean |error| ")
    with out.open() as fh:
        written = {r["row_id"]: r for r in csv.DictReader(fh)}
    assert written["L1"]["status"] == PER_LAYER
    assert float(written["L2"]["predicted_layer_backward_ms"]) > float(
        written["L1"]["predicted_layer_backward_ms"]
    )
    assert written["S1"]["peak_memory_error_pct"] != ""
    assert written["S1"]["layer_forward_error_pct"] == ""
    assert written["X1"]["status"] == "skipped"


def test_simulate_prints_one_layers_times(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "korthikanti-22b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    args += ["--gbs", "4", "--tp", "8", "--pp", "1", "--mbs", "4", "--recompute", "full"]
    args += ["--attention", "unfused"]
    assert main(args) == 0
    text = capsys.readouterr().out
    want = layer_wall_times(_model(), _plan(Recompute.FULL), load_profile("a100-sxm4-80gb"))
    line = (
        f"one layer, one micro-batch: forward {1e3 * want.forward_s:.2f} ms, "
        f"backward {1e3 * want.backward_s:.2f} ms"
    )
    assert line in text
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layer_forward_ms"] == pytest.approx(1e3 * want.forward_s)
    assert doc["layer_backward_ms"] == pytest.approx(1e3 * want.backward_s)
