"""benchmarks/bench_gemm_shapes.py: the layer shapes it times and one small CPU run."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gemm_shapes.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gemm_shapes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_pass_is_the_forward_gemm_transposed_with_the_same_flops() -> None:
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
    items = bench.sweep_items((("x", 64, 1),), tokens=32, dtype="fp32")
    assert len(items) == 4 * 3
    for _, _, _, (fm, fn, fk), item in items:
        assert item.work == 2.0 * fm * fn * fk  # every pass does the forward's FLOPs


def test_a_small_cpu_run_writes_one_row_per_pass_with_both_profiles(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "shapes.csv"
    argv = ["--device", "cpu", "--profile", "cpu-2core-gloo", "--profile", "a100-sxm4-80gb"]
    argv += ["--dtype", "bf16", "--tokens", "64", "--hidden", "64", "--out", str(out)]
    assert _module().main([*argv, "--timeout", "120"]) == 0
    table = pd.read_csv(out)
    assert len(table) == 4 * 3 and set(table["pass"]) == {"fwd", "dgrad", "wgrad"}
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
