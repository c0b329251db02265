"""Full recompute through torch's non-reentrant checkpoint with early stop
(``ParallelPlan.recompute_early_stop``): the recompute ends once every tensor the backward
saved is back, so a layer's MLP down projection (and the TP collective after it) is not
rerun. Measured on an H100 (benchmarks/gpu_runs/h100-2026-11-27/mechanisms.csv): recompute
52.7 ms with early stop against 74.3 ms without, on a model whose down projection is 1/3 of
its weight FLOPs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plansim.analytic.layer_cost import gemm_time_s, layer_gemms, layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.specs.plan import ParallelPlan, Recompute, plan_from_fields
from plansim.validate.simulated import executed_model, run_plan

PROFILE = load_profile("h100-sxm5-80gb")


def _plan(**changes: object) -> ParallelPlan:
    base = plan_from_fields(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=4)
    return base.with_fields(recompute=Recompute.FULL, **changes)


def _passes(model, plan):  # type: ignore[no-untyped-def]
    groups = layout_groups(plan, gpus_per_node=PROFILE.gpus_per_node)
    return layer_pass_times(model, plan, PROFILE, groups)


def test_early_stop_skips_the_down_projection() -> None:
    model = resolve_model("llama3-8b")
    assert not model.dropout
    plain, early = _passes(model, _plan()), _passes(model, _plan(recompute_early_stop=True))
    down = next(g for g in layer_gemms(model, _plan()) if g.name == "mlp_down")
    assert plain.recompute_s == plain.forward_s
    assert early.recompute_s == pytest.approx(
        plain.forward_s - gemm_time_s(down, PROFILE, dtype="bf16")
    )
    assert early.forward_s == plain.forward_s and early.backward_input_s == plain.backward_input_s


@pytest.mark.parametrize(("sequence_parallel", "kept"), [(False, 0.5), (True, 0.75)])
def test_early_stop_skips_the_collective_after_the_down_projection(
    sequence_parallel: bool, kept: float
) -> None:
    model = resolve_model("llama3-8b")
    plan = _plan(tp=4, micro_batch_size=1, sequence_parallel=sequence_parallel)
    plain, early = (
        _passes(model, plan),
        _passes(model, plan.with_fields(recompute_early_stop=True)),
    )
    assert plain.tp_recompute_s == plain.tp_forward_s > 0
    assert early.tp_recompute_s == pytest.approx(kept * plain.tp_forward_s)


def test_a_model_with_dropout_recomputes_to_the_end() -> None:
    """The hidden dropout after the down projection saves its mask: nothing stops early."""
    model = resolve_model("gpt3-175b")
    small = dataclasses.replace(
        model,
        num_layers=2,
        hidden_size=2048,
        ffn_hidden_size=8192,
        num_attention_heads=16,
        num_query_groups=16,
    )
    assert small.dropout
    early = _passes(small, _plan(recompute_early_stop=True))
    assert early.recompute_s == early.forward_s


def test_early_stop_needs_full_recompute_and_labels_it() -> None:
    with pytest.raises(SpecError, match="recompute_early_stop needs recompute full"):
        plan_from_fields(
            tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=4, recompute_early_stop=True
        )
    assert _plan(recompute_early_stop=True).recompute_label == "full-early-stop"
    assert _plan(recompute_num_layers=2, recompute_early_stop=True).recompute_label == (
        "full-block2-early-stop"
    )


def test_the_validator_prices_its_runner() -> None:
    """plansim validate checkpoints with torch's checkpoint_wrapper (non-reentrant) and its
    model has no dropout module."""
    profile = load_profile("h100-sxm5-80gb-1gpu")
    assert run_plan(_plan(), profile, dtype="fp32").recompute_early_stop
    none = _plan().with_fields(recompute=Recompute.NONE)
    assert not run_plan(none, profile, dtype="fp32").recompute_early_stop
    assert not executed_model(resolve_model("gpt3-175b")).dropout


def test_simulate_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm5-80gb",
        "--gpus",
        "8",
        "--gbs",
        "16",
        "--tp",
        "2",
        "--pp",
        "1",
        "--mbs",
        "1",
        "--recompute",
        "full",
        "--format",
        "json",
    ]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--recompute-early-stop"]) == 0
    early = json.loads(capsys.readouterr().out)
    assert early["step_time_s"] < plain["step_time_s"]
    assert main([*args[:-4], "--recompute-early-stop"]) == 2
    assert "needs recompute full" in capsys.readouterr().err


def test_a_torchtitan_rows_full_recompute_stops_early() -> None:
    """torchtitan wraps each block in checkpoint_wrapper (non-reentrant): its full recompute
    stops early; Megatron-LM's own checkpoint reruns the whole forward."""
    from plansim.planner.backtest import predict_row
    from tests.unit.test_op_selective_recompute import _row

    titan = predict_row(_row(recompute="full"), simulate_top=2)
    assert titan.status == "ok" and "full-early-stop" in titan.plan_label
    assert "torch's checkpoint stops early" in titan.note
    megatron = predict_row(_row(recompute="full", framework="Megatron-LM (2024)"), simulate_top=2)
    assert "early-stop" not in megatron.plan_label
    plain = predict_row(_row(recompute="none"), simulate_top=2)
    assert plain.predicted_step_time_s is not None and titan.predicted_step_time_s is not None
    assert plain.predicted_step_time_s < titan.predicted_step_time_s


def test_an_llm_foundry_rows_full_recompute_stops_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """llm-foundry checkpoints through Composer's non-reentrant checkpoint_wrapper
    (activation_checkpointing_reentrant: false): an MPT row's full recompute stops early and
    costs less than rerunning the whole forward; its rows without recompute are unchanged."""
    from pathlib import Path

    from plansim.io.runs import read_runs
    from plansim.planner import run_space
    from plansim.planner.backtest import predict_row

    path = Path(__file__).parents[2] / "benchmarks" / "published_runs" / "mosaic_llm_foundry.csv"
    rows = {r.text("row_id"): r for r in read_runs(path)[1]}
    full = rows["M0017"]  # MPT-7B, 8 A100 80GB, sequence 8192, recompute full
    assert full.text("recompute") == "full"
    early = predict_row(full)
    assert early.status == "ok" and "full-early-stop" in early.plan_label
    assert "activation_checkpointing_reentrant: false" in early.note
    monkeypatch.setattr(run_space, "recompute_early_stop", lambda row, recompute, notes: False)
    whole = predict_row(full)
    monkeypatch.undo()
    assert whole.plan_label == early.plan_label.replace("full-early-stop", "full")
    assert early.predicted_step_time_s is not None and whole.predicted_step_time_s is not None
    assert early.predicted_step_time_s < 0.97 * whole.predicted_step_time_s
    none = predict_row(rows["M0019"])  # MPT-7B without recompute
    assert "early-stop" not in none.plan_label and "stops early" not in none.note
