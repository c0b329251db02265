"""First and last layers kept in bf16 under fp8 / fp4 (Megatron-LM --first-last-layers-bf16)."""

from __future__ import annotations

import argparse
import json

import pytest

from plansim.analytic.activations import layer_activations
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.memory import rank_memory
from plansim.analytic.ranks import layout_groups
from plansim.analytic.stored_activations import microbatch_activation_bytes
from plansim.analytic.sustained import job_compute_profile
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.commands.common import add_bf16_layer_args, bf16_layers_from_args
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.layer_split import stage_bf16_layers
from plansim.specs.plan import ParallelPlan, Precision, Recompute, Schedule, plan_from_fields

H100 = load_profile("h100-sxm5-80gb")
MODEL = resolve_model("megatron-1.7b")  # 24 layers
FP8 = plan_from_fields(
    dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=4, precision=Precision.FP8
)


def _interleaved(start: int, end: int) -> ParallelPlan:
    return plan_from_fields(
        dp=1,
        tp=1,
        pp=4,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=8,
        schedule=Schedule.INTERLEAVED_1F1B,
        precision=Precision.FP8,
        num_layers_at_start_in_bf16=start,
        num_layers_at_end_in_bf16=end,
    )


def test_the_bf16_layers_are_the_models_first_and_last_in_stage_order() -> None:
    # 24 layers over 8 chunks of 3: the first 5 fill chunk 0 and two of chunk 1 (rank 1);
    # the last one is the last layer of chunk 7 (rank 3).
    ends = stage_bf16_layers(24, _interleaved(5, 1))
    assert ends == ((3, 0), (2, 0), (0, 0), (0, 0), (0, 0), (0, 0), (0, 0), (0, 1))
    assert stage_bf16_layers(24, FP8.with_fields(num_layers_at_start_in_bf16=1)) == ((1, 0),)
    with pytest.raises(SpecError, match=r"num_layers_at_start_in_bf16\(20\) \+ .*> num_layers"):
        stage_bf16_layers(24, _interleaved(20, 5))


def test_plan_checks_and_label() -> None:
    plan = FP8.with_fields(num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=4)
    assert plan.label().endswith("bf16-layers-1-4")
    with pytest.raises(SpecError, match=r"need precision fp8 or fp4 \(got bf16\)"):
        plan.with_fields(precision=Precision.BF16)
    with pytest.raises(SpecError, match="num_layers_at_end_in_bf16 must be an integer >= 0"):
        FP8.with_fields(num_layers_at_end_in_bf16=-1)


@pytest.mark.parametrize("precision", [Precision.FP8, Precision.FP4])
def test_each_bf16_layer_costs_a_bf16_layers_time(precision: Precision) -> None:
    profile = load_profile("b200-sxm-180gb")
    model = resolve_model("llama3-8b")
    base = FP8.with_fields(dp=8, global_batch_size=8, precision=precision)
    mixed = base.with_fields(num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=2)
    groups = layout_groups(base, gpus_per_node=profile.gpus_per_node)
    job = job_compute_profile(profile, base.num_gpus)
    quantized = layer_pass_times(model, base, job, groups)
    bf16 = layer_pass_times(model, base.with_fields(precision=Precision.BF16), job, groups)
    assert bf16.forward_s > quantized.forward_s  # the bf16 GEMMs are slower
    old, new = (build_pipeline_work(model, p, profile).stages[0] for p in (base, mixed))
    for phase, attr in (("forward", "forward_s"), ("backward", None)):
        before = sum(s.duration_s for s in getattr(old, phase) if s.kind == phase)
        after = sum(s.duration_s for s in getattr(new, phase) if s.kind == phase)
        if attr is None:
            per_layer = sum(
                getattr(bf16, f) - getattr(quantized, f)
                for f in ("backward_input_s", "backward_weight_s")
            )
        else:
            per_layer = getattr(bf16, attr) - getattr(quantized, attr)
        assert after - before == pytest.approx(3 * per_layer, rel=1e-9)


def test_a_bf16_layer_stores_16_bit_gemm_inputs() -> None:
    mixed = FP8.with_fields(num_layers_at_end_in_bf16=2)

    def stored(gemm_input_bytes: float) -> float:
        return layer_activations(
            MODEL,
            micro_batch_size=1,
            tp=1,
            sequence_parallel=False,
            recompute=Recompute.NONE,
            flash=True,
            gemm_input_bytes=gemm_input_bytes,
            cp=1,
        ).stored_bytes

    extra = microbatch_activation_bytes(MODEL, mixed, rank=0) - microbatch_activation_bytes(
        MODEL, FP8, rank=0
    )
    assert extra == pytest.approx(2 * (stored(2.0) - stored(1.0)), rel=1e-12)
    assert extra > 0
    # Full recompute keeps only each layer's input, the same in bf16 and fp8.
    full = FP8.with_fields(recompute=Recompute.FULL)
    assert microbatch_activation_bytes(
        MODEL, full.with_fields(num_layers_at_end_in_bf16=2), rank=0
    ) == microbatch_activation_bytes(MODEL, full, rank=0)


def test_engine_peak_memory_equals_analytic_with_bf16_layers() -> None:
    # Chunks of unequal bytes (rank 0's first chunk and rank 3's last hold bf16 layers): the
    # engine, fed per-chunk bytes, reaches rank_memory's total on every rank.
    plan = _interleaved(4, 1)
    ev = evaluate(MODEL, plan, H100)
    assert isinstance(ev, Evaluation)
    for rank in range(plan.pp):
        total = rank_memory(MODEL, plan, H100, rank=rank).total_bytes
        assert ev.result.peak_memory_bytes[rank] == pytest.approx(total, rel=1e-12)
    plain = evaluate(MODEL, _interleaved(0, 0), H100)
    assert isinstance(plain, Evaluation)
    assert ev.result.peak_memory_bytes[0] > plain.result.peak_memory_bytes[0]
    assert ev.result.step_time_s > plain.result.step_time_s


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bf16_layer_args(parser)
    return parser.parse_args(list(argv))


def test_cli_flags_follow_megatron() -> None:
    assert bf16_layers_from_args(_args()) == (0, 0)
    assert bf16_layers_from_args(_args("--first-last-layers-bf16")) == (1, 1)
    flags = ("--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "0")
    assert bf16_layers_from_args(_args(*flags, "--num-layers-at-end-in-bf16", "4")) == (0, 4)
    with pytest.raises(SpecError, match="needs --first-last-layers-bf16"):
        bf16_layers_from_args(_args("--num-layers-at-end-in-bf16", "4"))


def test_plan_keeps_the_bf16_layers_fixed_and_refuses_them_without_fp8(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    args += ["--gbs", "16", "--top", "2", "--simulate-top", "2", "--format", "json"]
    flags = ["--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "3"]
    assert main([*args, "--precision", "fp8", *flags]) == 0
    plans = [p["plan"] for p in json.loads(capsys.readouterr().out)["plans"]]
    assert plans and all(
        (p["num_layers_at_start_in_bf16"], p["num_layers_at_end_in_bf16"]) == (1, 3) for p in plans
    )
    assert main([*args, *flags]) == 2  # bf16 precision
    assert "--first-last-layers-bf16 needs --precision fp8 or fp4" in capsys.readouterr().err
    assert main([*args, "--precision", "fp8", *flags[:2], "30"]) == 2
    assert "> megatron-1.7b's 24 layers" in capsys.readouterr().err
