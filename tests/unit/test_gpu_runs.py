"""The saved GPU runs stay a check on the model: the one-H100 validations re-simulated with
today's code (benchmarks/resimulate_validation.py), and the mechanism benchmark's CPU path."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from plansim.analytic.flops import Gemm
from plansim.analytic.op_overheads import attention_call_flops
from plansim.io.profiles import load_profile
from tests.unit.benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "benchmarks" / "gpu_runs" / "h100-2026-11-27"
BF16_RUNS = ROOT / "benchmarks" / "gpu_runs" / "h100-2026-11-27-bf16"
THIRD_RUNS = ROOT / "benchmarks" / "gpu_runs" / "h100-2026-11-27-nemo-layers"
PROFILE = str(ROOT / "hardware_profiles" / "h100-sxm5-80gb-1gpu.yaml")


_module = load_benchmark


VALIDATIONS = ["validate_none", "validate_full", "validate_h4096_none", "validate_h4096_full"]


@pytest.mark.parametrize("run", VALIDATIONS)
def test_the_h100_validations_stay_within_ten_percent(run: str) -> None:
    """Measured 572.4 / 677.9 ms; simulated +0.8% / +1.4% on the profile recalibrated with
    device-bound elementwise items (+5.6% / +5.9% on the first H100 profile, +17.2% / +24.6%
    before fp32 GEMMs left the power-limit factor and the validator priced early stop). The
    h4096 runs (534.2 / 629.4 ms: +1.4% / +1.5%) were measured after those changes, as a
    check nothing was fitted to."""
    tool = _module("resimulate_validation")
    row = tool.resimulate(RUNS / run, PROFILE)
    assert abs(row["step now error %"]) < 10.0
    assert abs(row["forward now error %"]) < 10.0 and abs(row["backward now error %"]) < 10.0


@pytest.mark.parametrize("run", VALIDATIONS)
def test_the_h100_validations_peak_memory_within_five_percent(run: str) -> None:
    """Measured 15.07 / 11.04 GB; simulated -0.7% / +1.5% with the runner's loss (three fp32
    logits-sized tensors, plansim.validate.executed_loss); -9.7% / -13.1% before. h4096:
    -0.7% / -4.6%."""
    tool = _module("resimulate_validation")
    row = tool.resimulate(RUNS / run, PROFILE)
    assert abs(row["peak memory now error % (worst rank)"]) < 5.0


#: bf16 mixed-precision validations (plansim.validate.mixed_precision) of the second lent H100
#: (``h100-2026-11-27-bf16``): measured ms, and the simulated error on the recalibrated profile.
BF16_VALIDATIONS = {
    "validate_bf16_gpt-h2048-none": (69.1, 6.2),
    "validate_bf16_gpt-h2048-full": (85.5, -0.2),
    "validate_bf16_gpt-h4096-none": (123.3, 2.2),
    "validate_bf16_llama3-8b-l4-none": (185.2, -5.2),
}


@pytest.mark.parametrize("run", sorted(BF16_VALIDATIONS))
def test_the_h100_bf16_validations_stay_within_fifteen_percent(run: str) -> None:
    """On the first H100 profile these were +14..+32% slow: its elementwise rates came from
    host-bound calibration items (1.2 / 0.7 TB/s where the kernels stream at 2.8). Recalibrated
    with device-bound items, the runner's loss priced as torch runs it and the eager layer's
    extra host time hidden behind the device: -5.2..+6.2%. The GPT runs' rest is mostly the
    soak's power-limit factor (0.864): their GEMMs ran at the burst rate, at a GEMM share of
    the device time of about 45% (``duty.csv``: no slowdown up to a 50% share, 0.93 at 75%,
    0.88 at 100%) and in under a second of measured steps; plansim models neither. The Llama
    run's forward idles the device for about 5 ms a micro-batch for reasons not known
    (RoPE's 30 small ops in a row? the allocator and 2.1 GB logits copies?). Memory within
    2.0%."""
    measured_ms, _error_pct = BF16_VALIDATIONS[run]
    tool = _module("resimulate_validation")
    row = tool.resimulate(BF16_RUNS / run, PROFILE)
    assert row["step measured ms"] == pytest.approx(measured_ms, abs=0.05)
    assert abs(row["step now error %"]) < 15.0
    assert abs(row["peak memory now error % (worst rank)"]) < 3.0


#: The validations of the third lent H100 (``h100-2026-11-27-nemo-layers``: the same runs
#: again, on that run's code): measured ms. ``devtime/`` ran after the calibration timed GPU
#: calls behind a device-side wait, with its profile (now
#: ``hardware_profiles/h100-sxm5-80gb-1gpu.yaml``); its full-recompute run's forward measured
#: 32.8 ms where the same run measured 18.9 ms an hour before and 26.0 ms on the second H100
#: (the backward 49.6, 51.0 and 50.1 ms): the measurement moves, not the model.
THIRD_VALIDATIONS = {
    "validate_fp32_gpt-h2048-none": 571.9,
    "validate_fp32_gpt-h2048-full": 676.5,
    "validate_bf16_gpt-h2048-none": 69.0,
    "validate_bf16_gpt-h2048-full": 79.4,
    "validate_bf16_gpt-h4096-none": 124.1,
    "validate_bf16_llama3-8b-l4-none": 185.9,
    "devtime/validate_bf16_gpt-h2048-none": 68.6,
    "devtime/validate_bf16_gpt-h2048-full": 92.0,
    "devtime/validate_bf16_gpt-h4096-none": 122.4,
}


@pytest.mark.parametrize("run", sorted(THIRD_VALIDATIONS))
def test_the_third_h100_validations_stay_within_fifteen_percent(run: str) -> None:
    """Re-simulated on the committed profile: fp32 +0.8 / +1.2%, bf16 +5.2 / +7.3 / +0.9 /
    -6.0%, devtime +5.9 / -7.4 / +2.4% (the second H100's wall-time profile,
    ``h100-2026-11-27-bf16``: +0.9 / +1.6, +6.3 / +7.4 / +1.5 / -5.6, +6.9 / -7.3 / +3.0%)."""
    tool = _module("resimulate_validation")
    row = tool.resimulate(THIRD_RUNS / run, PROFILE)
    assert row["step measured ms"] == pytest.approx(THIRD_VALIDATIONS[run], abs=0.05)
    assert abs(row["step now error %"]) < 15.0
    assert abs(row["peak memory now error % (worst rank)"]) < 3.0


def test_the_measured_profile_prices_attention_at_its_kernels_device_time() -> None:
    """The bf16 validate GPT's attention call (batch 2 x 16 heads, sequence 2048, head 128):
    its cuDNN kernels ran 0.221 ms backward and 0.082 ms forward a call on the device
    (``kernels_gpt.csv``, torch.profiler). The committed profile prices 0.265 and 0.093 ms.
    The profile calibrated before GPU calls were timed behind a device-side wait priced the
    backward at 0.372 ms: its curve held the host's time to queue autograd's backward, which
    plansim adds again as host per-op time."""
    kernels = pd.read_csv(BF16_RUNS / "kernels_gpt.csv")
    bf16 = kernels[(kernels["dtype"] == "bf16") & (kernels["category"] == "attention")]
    per_call = {r["pass"]: r["kernel_s"] / r["kernels"] for _, r in bf16.iterrows()}
    scores = Gemm(name="attn_scores", m=2048, n=2048, k=128, count=32, has_weight=False)
    over_v = Gemm(name="attn_over_v", m=2048, n=128, k=2048, count=32, has_weight=False)
    call = attention_call_flops((scores, over_v))
    assert call == 2 * 2 * 16 * 2048**2 * 128
    profile = load_profile(PROFILE)
    backward_s = 2 * call / profile.attention_flops_per_s("bf16", call, backward=True)
    forward_s = call / profile.attention_flops_per_s("bf16", call, backward=False)
    assert backward_s / per_call["backward"] == pytest.approx(1.0, abs=0.25)
    assert forward_s / per_call["forward"] == pytest.approx(1.0, abs=0.25)


def test_the_mechanism_benchmark_runs_on_a_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    bench = _module("bench_gpu_mechanisms")
    out = tmp_path / "m.csv"
    args = [
        "--device",
        "cpu",
        "--part",
        "recompute",
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-heads",
        "4",
        "--seq-len",
        "64",
        "--vocab-size",
        "256",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--out",
        str(out),
    ]
    assert bench.main(args) == 0
    table = pd.read_csv(out)
    assert list(table["case"]) == [
        "none",
        "non-reentrant early-stop",
        "non-reentrant full",
        "reentrant",
    ]
    assert (table["seconds"] > 0).all()


def test_the_duty_cycle_benchmark_runs_on_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--part duty``: the burst row and one row per (filler, share) with a positive rate."""
    pytest.importorskip("torch")
    bench = _module("bench_gpu_mechanisms")
    monkeypatch.setattr(bench, "IDLE_S", 0.0)  # the GPU's cool-down pauses
    out = tmp_path / "d.csv"
    args = ["--device", "cpu", "--part", "duty", "--gemm-n", "64", "--duty-soak-s", "0.05"]
    assert bench.main([*args, "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert table["case"].iloc[0] == "burst"
    shares = len(bench.DUTY_SHARES)
    assert len(table) == 1 + shares + (shares - 1)  # copy at every share, idle below 100%
    assert (table["tflops_per_s"] > 0).all()


def test_the_kernel_profile_runs_on_a_cpu(tmp_path: Path) -> None:
    """``profile_validate_kernels.py``: per (dtype, pass) the categories' op times, GEMMs
    among them, and each pass's wall time; kernel names sort into their categories."""
    pytest.importorskip("torch")
    tool = _module("profile_validate_kernels")
    out, names = tmp_path / "k.csv", tmp_path / "n.csv"
    small = ["--num-layers", "1", "--hidden-size", "64", "--num-heads", "4", "--seq-len", "32"]
    args = [*small, "--vocab-size", "128", "--mbs", "1", "--dtype", "fp32"]
    assert tool.main([*args, "--out", str(out), "--kernels-out", str(names)]) == 0
    table = pd.read_csv(out)
    assert set(table["pass"]) == {"forward", "backward"}
    assert "gemm" in set(table["category"]) and (table["pass_wall_s"] > 0).all()
    assert len(pd.read_csv(names)) >= len(table)
    assert tool.category("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    assert tool.category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert tool.category("GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16>") == "norm"
    assert tool.category("cunn_SoftMaxForward<4, float>") == "softmax_loss"
    assert tool.category("vectorized_elementwise_kernel<GeluCUDAKernelImpl>") == (
        "elementwise_other"
    )


def test_terms_from_swaps_exactly_the_other_profiles_figures() -> None:
    """``resimulate_validation --terms-from``: with the profile's own figures every column is
    its error; with the measured profile's, all groups together give the measured profile's
    error (no figure that prices these runs is left out of the groups), and the sustained
    rate alone moves the datasheet profile's error towards it (9.4 points on this run)."""
    tool = _module("resimulate_validation")
    run = BF16_RUNS / "validate_bf16_gpt-h2048-none"
    own = tool.term_errors(run, PROFILE, PROFILE)
    values = [v for k, v in own.items() if k != "run"]
    assert max(values) - min(values) < 1e-9
    swapped = tool.term_errors(run, "h100-sxm5-80gb", PROFILE)
    measured = tool.resimulate(run, PROFILE)["step now error %"]
    assert swapped[f"all of {PROFILE}"] == pytest.approx(measured, abs=1e-9)
    assert swapped["+sustained"] - swapped["h100-sxm5-80gb"] > 5.0
