"""Fused-attention efficiency: profile key, cost model, calibration fit, offline rebuild.

Hand-worked numbers on the round-number profile (100 TFLOP/s flat GEMM curve, 1000 GB/s,
no launch cost) and the tiny model (h 64, 4 heads of d 16, s 32, b 1): each attention-core
GEMM (``attn_scores`` 32x32x16 and ``attn_over_v`` 32x16x32, 4 heads) moves
2 B x 4 x 2048 = 16384 B, so is HBM-bound at 16.384 ns; unfused, the core costs 32.768 ns
forward and 2 x that backward on the GEMM pricing. The fused call's forward FLOPs are
(131072 + 131072) / 2 = 131072 (causal half). Fused without a curve
(``flash_core_times``): Q, K, V, O are 4 x 32 x 16 x 2 B = 4096 B each, 16384 B forward
(16.384 ns) and 32768 B backward (32.768 ns), more than the FLOPs at 0.575 x 100 TFLOP/s
(2.28 and 5.70 ns): HBM-bound.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import pytest

from plansim.analytic import flops as fl
from plansim.analytic.layer_cost import layer_gemms, layer_pass_times
from plansim.analytic.op_overheads import (
    FLASH_FRACTION_OF_GEMM,
    attention_call_flops,
    attention_core_times,
    flash_core_times,
)
from plansim.analytic.ranks import layout_groups
from plansim.analytic.sustained import job_compute_profile, sustained_pace_fraction
from plansim.calibrate.build_terms import attention_terms
from plansim.calibrate.fit import FitError, fit_attention
from plansim.calibrate.rebuild import main as rebuild_main
from plansim.calibrate.rebuild import rebuild
from plansim.errors import InputFileError, SpecError
from plansim.io.profiles import load_profile, profile_from_dict, profile_to_dict, write_profile
from plansim.specs.compute_terms import AttentionEfficiency
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import AttentionKernel, ParallelPlan, Precision, plan_from_fields
from tests.unit.synthetic import TINY_MODEL, round_profile

MODEL = TINY_MODEL
PLAN = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
CORE_GEMM_S = 2 * 16384 / 1000e9  # the two HBM-bound core GEMMs, forward
FLASH_FWD_S, FLASH_BWD_S = 16384 / 1000e9, 32768 / 1000e9  # fused, no curve: Q K V O traffic
CALL_FLOPS = 131072.0


def with_attention(profile: HardwareProfile, *, fwd: float, bwd: float) -> HardwareProfile:
    """``profile`` with flat bf16 attention fractions ``fwd`` / ``bwd``."""
    curves = AttentionEfficiency(
        forward=Curve(x=(1.0,), y=(fwd,)), backward=Curve(x=(1.0,), y=(bwd,)), source="test"
    )
    return dataclasses.replace(profile, attention_efficiency={"bf16": curves})


def passes(profile: HardwareProfile, plan: ParallelPlan = PLAN):  # type: ignore[no-untyped-def]
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    return layer_pass_times(MODEL, plan, profile, groups)


def test_call_flops_are_the_causal_half_of_the_core_gemms() -> None:
    from plansim.analytic.layer_cost import layer_gemms

    assert attention_call_flops(layer_gemms(MODEL, PLAN)) == CALL_FLOPS
    tp2 = PLAN.with_fields(tp=2, dp=1)
    assert attention_call_flops(layer_gemms(MODEL, tp2)) == CALL_FLOPS / 2


def test_curve_prices_the_attention_core_forward_and_backward() -> None:
    base = round_profile()
    fused = with_attention(base, fwd=0.25, bwd=0.2)
    fwd_s = CALL_FLOPS / (0.25 * 100e12)  # 5.24288 ns
    bwd_s = 2 * CALL_FLOPS / (0.2 * 100e12)  # 13.1072 ns
    old, new = passes(base), passes(fused)
    assert new.forward_s - old.forward_s == pytest.approx(fwd_s - FLASH_FWD_S, rel=1e-9)
    assert new.backward_input_s - old.backward_input_s == pytest.approx(
        bwd_s - FLASH_BWD_S, rel=1e-9
    )
    assert new.backward_weight_s == old.backward_weight_s


def test_absent_key_unfused_kernel_and_other_dtype_keep_the_gemm_pricing() -> None:
    base = round_profile()
    assert passes(dataclasses.replace(base, attention_efficiency={})) == passes(base)
    unfused = PLAN.with_fields(attention=AttentionKernel.UNFUSED)
    fused = with_attention(base, fwd=0.25, bwd=0.2)
    assert passes(fused, unfused) == passes(base, unfused)
    fp16 = PLAN.with_fields(precision=Precision.FP16)
    assert passes(fused, fp16) == passes(base, fp16)  # the curve is for bf16 only
    core = attention_core_times((), unfused, base, dtype="bf16", gemm_forward_s=1.0)
    assert (core.forward_s, core.backward_s) == (1.0, 2.0)
    fused_core = attention_core_times(
        layer_gemms(MODEL, PLAN), PLAN, base, dtype="bf16", gemm_forward_s=CORE_GEMM_S
    )
    assert (fused_core.forward_s, fused_core.backward_s) == pytest.approx(
        (FLASH_FWD_S, FLASH_BWD_S), rel=1e-12
    )


def test_fused_attention_without_a_curve_runs_at_a_share_of_the_gemm_rate() -> None:
    """A long-sequence call: the causal FLOPs at FLASH_FRACTION_OF_GEMM x the GEMM curve's
    rate for the call (FlashAttention-2's 50% of an A100's peak over cuBLAS's 87%), backward
    2.5x; the s x s scores never cross HBM; a job's sustained pace slows it like a GEMM."""
    assert pytest.approx(0.50 / 0.8692, abs=1e-4) == FLASH_FRACTION_OF_GEMM
    h100 = load_profile("h100-sxm5-80gb")
    s, d, heads = 8192, 128, 8
    scores = fl.Gemm(name="attn_scores", m=s, n=s, k=d, count=heads, has_weight=False)
    over_v = fl.Gemm(name="attn_over_v", m=s, n=d, k=s, count=heads, has_weight=False)
    core = flash_core_times((scores, over_v), h100, dtype="bf16")
    call = 4 * heads * s * s * d / 2
    rate = FLASH_FRACTION_OF_GEMM * h100.matmul_flops_per_s("bf16", call)
    assert core.forward_s == pytest.approx(call / rate, rel=1e-12)
    assert core.backward_s == pytest.approx(2.5 * call / rate, rel=1e-12)
    job = job_compute_profile(h100, 64)
    paced = flash_core_times((scores, over_v), job, dtype="bf16")
    assert paced.forward_s == pytest.approx(
        core.forward_s / sustained_pace_fraction(h100, 64), rel=1e-9
    )


def test_gpu_profile_without_the_key_is_unchanged() -> None:
    h100 = load_profile("h100-sxm5-80gb")
    assert h100.attention_efficiency == {} and h100.host_overhead is None
    assert passes(h100) == passes(dataclasses.replace(h100, attention_efficiency={}))


def _yaml_with_attention() -> dict[str, object]:
    profile = load_profile("cpu-2core-gloo")
    curves = AttentionEfficiency(
        forward=Curve(x=(1e6, 1e9), y=(0.2, 0.4)), backward=Curve(x=(1e6, 1e9), y=(0.1, 1.5))
    )
    return profile_to_dict(
        dataclasses.replace(
            profile,
            attention_efficiency={"fp32": curves},
            provenance={
                **{
                    k: v
                    for k, v in profile.provenance.items()
                    if not k.startswith("attention_efficiency.")
                },
                "attention_efficiency.fp32": "measured: test",
            },
        )
    )


def test_schema_round_trip(tmp_path: Path) -> None:
    data = _yaml_with_attention()
    assert data["attention_efficiency"] == {
        "fp32": {
            "attention_flops": [1000000, 1000000000],
            "forward_fraction_of_peak": [0.2, 0.4],
            "backward_fraction_of_peak": [0.1, 1.5],
        }
    }
    profile = profile_from_dict(data, source="t.yaml")
    write_profile(profile, tmp_path / "p.yaml")
    back = load_profile(str(tmp_path / "p.yaml"))
    assert back.attention_efficiency["fp32"].backward.y == (0.1, 1.5)
    assert back.provenance["attention_efficiency.fp32"] == "measured: test"
    assert back.attention_flops_per_s("fp32", 1e9, backward=True) == pytest.approx(
        1.5 * back.peak_flops_per_s["fp32"]
    )
    with pytest.raises(SpecError, match="no attention_efficiency for dtype 'bf16'"):
        back.attention_flops_per_s("bf16", 1e9, backward=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(forward_fraction_of_peak=[0.2]), "different lengths"),
        (lambda a: a.update(backward_fraction_of_peak=[0.1, -1.0]), "values must be positive"),
        (lambda a: a.update(extra=[1]), "unknown key"),
        (lambda a: a.pop("attention_flops"), "attention_flops: missing required key"),
        (lambda a: a.update(attention_flops=[1e9, 1e6]), "strictly increasing"),
    ],
)
def test_schema_errors_name_the_key(change, message: str) -> None:  # type: ignore[no-untyped-def]
    data = _yaml_with_attention()
    change(data["attention_efficiency"]["fp32"])  # type: ignore[index]
    with pytest.raises(InputFileError, match=message):
        profile_from_dict(data, source="t.yaml")


def test_attention_needs_provenance_and_a_peak() -> None:
    data = _yaml_with_attention()
    del data["provenance"]["attention_efficiency.fp32"]  # type: ignore[attr-defined]
    with pytest.raises(InputFileError, match=r"no source given for: attention_efficiency\.fp32"):
        profile_from_dict(data, source="t.yaml")
    base = round_profile()
    curves = with_attention(base, fwd=0.5, bwd=0.5).attention_efficiency["bf16"]
    with pytest.raises(SpecError, match=r"attention_efficiency\[fp8\] has no peak"):
        dataclasses.replace(base, attention_efficiency={"fp8": curves})


def test_fit_attention_rates_and_dropped_sizes() -> None:
    fit = fit_attention([1e9, 4e9], [0.01, 0.02], [0.05, 0.01], peak_per_s=1e12)
    # 4e9: forward + backward (0.01) not longer than forward (0.02): dropped
    assert fit.efficiency.forward.x == (1e9,)
    assert fit.efficiency.forward.y == pytest.approx((0.1,))  # 1e9 / 0.01 / 1e12
    assert fit.efficiency.backward.y == pytest.approx((0.05,))  # 2e9 / 0.04 / 1e12
    with pytest.raises(FitError, match="no size"):
        fit_attention([1e9], [0.02], [0.01], peak_per_s=1e12)
    with pytest.raises(FitError, match="peak"):
        fit_attention([1e9], [0.01], [0.02], peak_per_s=0.0)


def test_attention_terms_pair_forward_and_backward_rows() -> None:
    rows = [
        ("sdpa_fwd", "1x8x256x64", 6.0e7, 0.002),
        ("sdpa_fwd_bwd", "1x8x256x64", 1.8e8, 0.008),
        ("sdpa_fwd", "1x8x1024x64", 9.6e8, 0.01),
        ("sdpa_fwd_bwd", "1x8x1024x64", 2.88e9, 0.03),
        ("sdpa_fwd", "1x8x512x64", 2.4e8, 0.006),  # no backward row: not in the curve
    ]
    terms = attention_terms(_attention_table(rows), source="measured: test", peaks={"fp32": 1e11})
    curves = terms.attention["fp32"]
    assert curves.forward.x == (6.0e7, 9.6e8)
    assert curves.forward.y == pytest.approx((6.0e7 / 0.002 / 1e11, 9.6e8 / 0.01 / 1e11))
    assert curves.backward.y == pytest.approx((1.2e8 / 0.006 / 1e11, 1.92e9 / 0.02 / 1e11))
    assert terms.provenance["attention_efficiency.fp32"].startswith("measured: test; causal")
    assert attention_terms(_attention_table(rows), source="x", peaks={}).attention == {}


def _attention_table(rows: list[tuple[str, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"kind": "attention", "op": o, "dtype": "fp32", "shape": s, "work": w, "time_s": t}
            for o, s, w, t in rows
        ]
    )


def test_attention_measured_at_one_size_is_not_written() -> None:
    """A curve is read clamped beyond its ends: one launch-bound call would stand for every
    attention call (an H100 calibration timed 1 x 4 x 256 x 64 at 0.4% of peak)."""
    rows = [("sdpa_fwd", "1x4x256x64", 3.4e7, 8.9e-6), ("sdpa_fwd_bwd", "1x4x256x64", 1e8, 2e-4)]
    terms = attention_terms(_attention_table(rows), source="measured: t", peaks={"fp32": 1e12})
    assert terms.attention == {} and "attention_efficiency.fp32" not in terms.provenance
    assert dict(terms.summary)["attention fp32"].startswith("not written: measured at 1 size")


#: The calibration run the committed CPU profile and its raw CSV come from.
RUN = "20261122T124837.456Z"


def _copy_cpu_profile(tmp_path: Path) -> Path:
    folder = Path(__file__).resolve().parents[2] / "hardware_profiles"
    for name in ("cpu-2core-gloo.yaml", "cpu-2core-gloo.raw.csv"):
        shutil.copy(folder / name, tmp_path / name)
    return tmp_path / "cpu-2core-gloo.yaml"


def test_rebuild_from_the_raw_csv_adds_the_attention_curves(tmp_path: Path) -> None:
    path = _copy_cpu_profile(tmp_path)
    before = load_profile(str(path))
    result = rebuild(path)
    assert result.run_id == RUN
    profile = result.profile
    assert set(profile.attention_efficiency) == {"bf16", "fp16", "fp32"}
    # first fp32 size: 67108864 FLOPs, the two ranks' medians 2.293 and 2.295 ms (median
    # over ranks 2.294 ms), over the fp32 GEMM peak the same run measured
    peak = profile.peak_flops_per_s["fp32"]
    expected = 67108864 / ((0.00229264500376 + 0.00229472199862) / 2) / peak
    assert profile.attention_efficiency["fp32"].forward.y[0] == pytest.approx(expected)
    assert profile.host_overhead is not None and before.host_overhead is not None
    assert dataclasses.astuple(profile.host_overhead) == pytest.approx(
        dataclasses.astuple(before.host_overhead), rel=1e-9
    )
    assert profile.matmul_efficiency["fp32"].y == pytest.approx(
        before.matmul_efficiency["fp32"].y, rel=1e-9
    )
    cited = profile.provenance["attention_efficiency.fp32"]
    assert cited.startswith("measured: ") and f"run {RUN}" in cited
    assert "cache-evicting write" in cited


def test_rebuild_command_writes_in_place_and_reports_bad_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy_cpu_profile(tmp_path)
    assert rebuild_main([str(path), "--run", "20990101T000000.000Z"]) == 2
    assert "no rows of run 20990101T000000.000Z" in capsys.readouterr().err
    assert rebuild_main([str(path)]) == 0
    assert "fp32" in load_profile(str(path)).attention_efficiency
