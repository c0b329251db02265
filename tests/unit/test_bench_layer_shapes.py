"""benchmarks/bench_layer_shapes.py: the layer shapes it times, what it predicts, and one
small CPU run."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from plansim.analytic.op_overheads import FLASH_FRACTION_OF_GEMM
from plansim.io.profiles import load_profile
from tests.unit.benchmark_scripts import load_benchmark


def _module() -> ModuleType:
    return load_benchmark("bench_layer_shapes")


def test_each_pass_is_the_forward_gemm_transposed_and_priced_as_the_forward() -> None:
    bench = _module()
    shapes = bench.layer_gemms(6144, 8, 8192)  # Korthikanti 22B at tp 8, mbs 4 x 2048 tokens
    assert shapes == {
        "qkv": (8192, 2304, 6144),
        "attn_out": (8192, 6144, 768),
        "mlp_up": (8192, 3072, 6144),
        "mlp_down": (8192, 6144, 3072),
    }
    m, n, k = shapes["mlp_up"]
    assert bench.pass_shape("dgrad", m, n, k) == (8192, 6144, 3072)  # dY W^T
    assert bench.pass_shape("wgrad", m, n, k) == (6144, 3072, 8192)  # X^T dY
    probes = bench.gemm_probes((("x", 512, 1),), tokens=1024, dtype="bf16")
    assert len(probes) == 4 * 3
    profile = load_profile("a100-sxm4-80gb")
    for probe in probes:
        forward = next(p for p in probes if p.op == probe.op and p.pass_name == "fwd")
        assert probe.item.work == forward.item.work  # every pass does the forward's FLOPs
        assert probe.predict(profile) == forward.predict(profile)


def test_attention_is_priced_by_the_flash_mechanism_on_a_datasheet_profile() -> None:
    bench = _module()
    profile = load_profile("a100-sxm4-80gb")
    shape = (1, 32, 8192, 128)  # compute-bound at this size: FLOPs over the flash rate
    forward_s, backward_s = bench.attention_seconds(profile, shape=shape, dtype="bf16")
    flops = 2.0 * 32 * 8192 * 8192 * 128
    rate = FLASH_FRACTION_OF_GEMM * profile.matmul_flops_per_s("bf16", flops)
    assert forward_s == pytest.approx(flops / rate)
    assert backward_s == pytest.approx(2.5 * flops / rate)
    probes = bench.attention_probes((("a", *shape),), dtype="bf16")
    assert [p.pass_name for p in probes] == ["fwd", "fwd_bwd"]
    assert [p.item.work for p in probes] == [flops, 3.0 * flops]  # as calibration counts
    assert probes[1].predict(profile) == pytest.approx(forward_s + backward_s)


def test_a_small_cpu_run_writes_one_row_per_call_with_both_profiles(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "shapes.csv"
    argv = ["--device", "cpu", "--profile", "cpu-2core-gloo", "--profile", "a100-sxm4-80gb"]
    argv += ["--dtype", "bf16", "--tokens", "64", "--hidden", "64", "--out", str(out)]
    assert _module().main([*argv, "--timeout", "120"]) == 0
    table = pd.read_csv(out)
    assert len(table) == 4 * 3 + 2
    assert set(table["pass"]) == {"fwd", "dgrad", "wgrad", "fwd_bwd"}
    assert list(table[table["kind"] == "attention"]["shape"]) == ["1x2x64x32"] * 2
    for name in ("cpu-2core-gloo", "a100-sxm4-80gb"):
        ratios = table[f"{name}_predicted_over_measured"]
        assert all(math.isfinite(v) and v > 0 for v in ratios)
    # an A100 is priced far faster than this CPU measures
    assert table["a100-sxm4-80gb_predicted_over_measured"].max() < 0.1


def test_a_profile_without_the_dtype_is_refused_before_measuring(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _module().main(["--device", "cpu", "--profile", "a100-sxm4-80gb", "--dtype", "fp32"])
    assert exit_info.value.code == 2
    assert "a100-sxm4-80gb has no fp32 GEMM curve (has: bf16, fp16)" in capsys.readouterr().err


NEMO = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs" / "nemo_performance.csv"
)


def test_runs_layers_are_plansims_own_gemms_of_each_row() -> None:
    """``--runs``: one layer per distinct shape of the GPU's rows, with GQA, SwiGLU's gate,
    tp and cp as plansim builds them; rows with equal shapes share a layer."""
    bench = _module()
    layers = {layer.label: layer for layer in bench.run_layers(str(NEMO), "h100-sxm5-80gb")}
    llama = layers["LLAMA3-8B/tp1/t4096"]  # N0010: sequence 8192 over cp 2, mbs 1
    assert llama.rows == ("N0010",)
    assert llama.attention is None  # ring attention under cp is not one SDPA call
    shapes = {g.name: (g.m, g.n, g.k) for g in llama.gemms}
    assert shapes == {
        "qkv": (4096, 4096 + 2 * 8 * 128, 4096),  # 32 query heads, 8 KV heads of 128
        "attn_out": (4096, 4096, 4096),
        "mlp_up": (4096, 14336, 4096),
        "mlp_gate": (4096, 14336, 4096),
        "mlp_down": (4096, 4096, 14336),
    }
    shared = layers["LLAMA3-70B/tp4/t8192"]
    assert shared.rows == ("N0021", "N0029")
    assert shared.attention == (1, 16, 8192, 128)  # 64 heads over tp 4
    assert all(not label.startswith(("LLAMA3-8B/tp1/t16384",)) for label in layers)  # B200
    assert bench.run_layers(str(NEMO), "no-such-gpu") == []


def test_fp8_runs_time_their_attention_in_bf16_and_total_each_layer() -> None:
    bench = _module()
    probes = bench.runs_probes(str(NEMO), "h100-sxm5-80gb", dtype="fp8")
    kinds = {(p.kind, p.item.dtype) for p in probes}
    assert kinds == {("gemm", "fp8"), ("attention", "bf16")}
    result = pd.DataFrame(
        {
            "model": ["a", "a", "a", "a"],
            "kind": ["gemm", "gemm", "attention", "attention"],
            "pass": ["fwd", "wgrad", "fwd", "fwd_bwd"],
            "measured_s": [1.0, 3.0, 2.0, 4.0],
            "p": [0.5, 1.0, 9.0, 0.5],
        }
    )
    totals = bench.layer_totals(result, "p")
    assert totals.loc["a", "gemm"] == pytest.approx((0.5 + 3.0) / 4.0)
    assert totals.loc["a", "attention"] == pytest.approx(0.5)  # forward + backward call only
