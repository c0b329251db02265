"""The Triton FlashAttention of 2022 (``AttentionKernel.FLASH_TRITON``, llm-foundry's
``attn_impl: triton``): fused like FlashAttention (no s x s scores stored), its calls priced
FLASH2_OVER_TRITON_SPEEDUP = 1.3x slower (Dao 2023, arXiv:2307.08691 §4.1: FlashAttention-2
is 1.3-2.5x faster than FlashAttention in Triton), and chosen by the back-test for
llm-foundry rows dated before 2024."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plansim.analytic.layer_cost import layer_gemms
from plansim.analytic.memory import rank_memory
from plansim.analytic.op_overheads import (
    FLASH2_OVER_TRITON_SPEEDUP,
    attention_core_times,
    layer_ops,
)
from plansim.cli import main
from plansim.io.runs import RunRow
from plansim.planner.run_space import row_space
from plansim.specs.plan import AttentionKernel, ParallelPlan, plan_from_fields
from tests.unit.synthetic import TINY_MODEL, round_profile
from tests.unit.test_attention_efficiency import with_attention

FLASH = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
TRITON = FLASH.with_fields(attention=AttentionKernel.FLASH_TRITON)


def _core(plan: ParallelPlan, profile=None):  # type: ignore[no-untyped-def]
    gemms = layer_gemms(TINY_MODEL, plan)
    return attention_core_times(
        gemms, plan, profile or round_profile(), dtype="bf16", gemm_forward_s=1.0
    )


@pytest.mark.parametrize("curve", [False, True])
def test_a_triton_call_takes_1_3_times_a_flashattention_2_call(curve: bool) -> None:
    profile = with_attention(round_profile(), fwd=0.25, bwd=0.2) if curve else round_profile()
    flash, triton = _core(FLASH, profile), _core(TRITON, profile)
    assert FLASH2_OVER_TRITON_SPEEDUP == 1.3
    assert triton.forward_s == pytest.approx(1.3 * flash.forward_s, rel=1e-12)
    assert triton.backward_s == pytest.approx(1.3 * flash.backward_s, rel=1e-12)
    assert flash.forward_s != 1.0  # fused, not the GEMM pricing the unfused core takes


def test_fused_like_flashattention_in_memory_and_op_count() -> None:
    assert AttentionKernel.FLASH_TRITON.fused and AttentionKernel.FLASH.fused
    assert not AttentionKernel.UNFUSED.fused
    profile = round_profile()
    flash = rank_memory(TINY_MODEL, FLASH, profile, rank=0)
    assert rank_memory(TINY_MODEL, TRITON, profile, rank=0) == flash
    unfused = FLASH.with_fields(attention=AttentionKernel.UNFUSED)
    assert rank_memory(TINY_MODEL, unfused, profile, rank=0).total_bytes > flash.total_bytes
    gemms = layer_gemms(TINY_MODEL, FLASH)
    assert layer_ops(gemms, TRITON, num_kernels=5) == layer_ops(gemms, FLASH, num_kernels=5)
    assert TRITON.label().endswith("triton-attn")
    assert "attn" not in FLASH.label()


def _row(framework: str) -> RunRow:
    cells = {"row_id": "Z1", "precision": "bf16", "num_gpus": "8", "framework": framework}
    return RunRow(path="runs.csv", line=2, cells=cells)


@pytest.mark.parametrize(
    ("framework", "kernel"),
    [
        ("llm-foundry (Composer, PyTorch FSDP, 2023)", AttentionKernel.FLASH_TRITON),
        ("llm-foundry (2024)", AttentionKernel.FLASH),
        ("llm-foundry", AttentionKernel.FLASH),  # undated: today's default
        ("torchtitan (2023)", AttentionKernel.FLASH),
        ("Megatron-LM (2022)", AttentionKernel.UNFUSED),
    ],
)
def test_the_backtest_picks_the_kernel_by_framework_and_date(
    framework: str, kernel: AttentionKernel
) -> None:
    notes: list[str] = []
    assert row_space(_row(framework), notes).execution.attention is kernel
    assert any("Triton FlashAttention" in n for n in notes) is (
        kernel is AttentionKernel.FLASH_TRITON
    )


def test_simulate_takes_the_triton_kernel_and_is_slower(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def step_s(kernel: str) -> float:
        args = ["simulate", "--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
        args += ["--gbs", "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--zero", "3"]
        args += ["--recompute", "full", "--attention", kernel, "--format", "json"]
        assert main(args) == 0
        return float(json.loads(capsys.readouterr().out)["step_time_s"])

    assert step_s("flash-triton") > step_s("flash")


def test_an_ampere_kernel_cap_slows_only_the_triton_kernel() -> None:
    """A profile with ``ampere_attention_fraction_of_peak`` c: a Triton call takes at least
    F / (c x peak) forward and 2.5 F / (c x peak) backward before the 1.3x; FlashAttention
    (FLASH, FlashAttention-3 / cuDNN class on Hopper) is not capped."""
    base = with_attention(round_profile(), fwd=0.25, bwd=0.2)  # 100 TFLOP/s bf16 peak
    capped = dataclasses.replace(base, ampere_attention_fraction_of_peak=0.05)
    call = 131072.0  # the tiny model's causal call FLOPs (test_attention_efficiency)
    want_fwd, want_bwd = call / (0.05 * 100e12), 2.5 * call / (0.05 * 100e12)
    got = _core(TRITON, capped)
    assert got.forward_s == pytest.approx(1.3 * want_fwd, rel=1e-12)
    assert got.backward_s == pytest.approx(1.3 * want_bwd, rel=1e-12)
    assert _core(FLASH, capped) == _core(FLASH, base)
    # a cap above what the kernel reaches anyway changes nothing
    loose = dataclasses.replace(base, ampere_attention_fraction_of_peak=1.0)
    assert _core(TRITON, loose) == _core(TRITON, base)


def test_the_hopper_profiles_carry_the_cap_and_bad_values_are_refused() -> None:
    from plansim.errors import SpecError
    from plansim.io.profiles import load_profile, profile_from_dict, profile_to_dict

    for name in ("h100-sxm5-80gb", "h200-sxm-141gb"):
        profile = load_profile(name)
        assert profile.ampere_attention_fraction_of_peak == 0.35
        assert "arXiv:2407.08608" in profile.provenance["ampere_attention_fraction_of_peak"]
        again = profile_from_dict(profile_to_dict(profile), source=name)
        assert again.ampere_attention_fraction_of_peak == 0.35
    assert load_profile("a100-sxm4-80gb").ampere_attention_fraction_of_peak is None
    for bad in (0.0, 1.5):
        with pytest.raises(SpecError, match="ampere_attention_fraction_of_peak must be in"):
            dataclasses.replace(round_profile(), ampere_attention_fraction_of_peak=bad)


def test_the_job_pace_scales_the_cap_like_the_gemm_curves() -> None:
    from plansim.analytic.sustained import job_compute_profile, sustained_pace_fraction
    from plansim.io.profiles import load_profile

    h100 = load_profile("h100-sxm5-80gb")
    pace = sustained_pace_fraction(h100, 1024)
    assert pace < 1.0
    job = job_compute_profile(h100, 1024)
    assert job.ampere_attention_fraction_of_peak == pytest.approx(0.35 * pace, rel=1e-12)


def test_the_plan_header_names_a_kernel_other_than_flash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def header(kernel: str) -> str:
        args = ["plan", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
        assert main([*args, "--gbs", "16", "--attention", kernel, "--top", "1"]) == 0
        return capsys.readouterr().out.splitlines()[0]

    assert ", flash-triton attention;" in header("flash-triton")
    assert ", unfused attention;" in header("unfused")
    assert "attention" not in header("flash")
