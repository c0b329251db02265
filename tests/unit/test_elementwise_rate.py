"""Measured rate of a layer's memory-bound kernels: the profile keys, the cost model's use of
them, the calibration items and their fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from plansim.analytic.elementwise import gelu_layer_bytes, layer_elementwise_traffic
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.calibrate.build_elementwise import elementwise_term
from plansim.calibrate.plan import build_plan
from plansim.errors import SpecError
from plansim.io.profiles import load_profile, write_profile
from plansim.specs.model import Activation
from plansim.specs.plan import plan_from_fields
from tests.unit.synthetic import TINY_MODEL, round_profile

PLAN = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=2, global_batch_size=2)


def test_calibration_bytes_are_the_cost_models_count_for_a_gelu_layer() -> None:
    model = dataclasses.replace(TINY_MODEL, activation=Activation.GELU)
    traffic = layer_elementwise_traffic(
        model, micro_batch_size=2, tp=1, sequence_parallel=False, unfused_attention=False
    )
    fwd, bwd = gelu_layer_bytes(
        tokens=2 * model.seq_length,
        hidden=model.hidden_size,
        ffn=model.ffn_hidden_size,
        element_bytes=2,
    )
    assert (fwd, bwd) == (traffic.forward_bytes, traffic.backward_bytes)
    fwd32, bwd32 = gelu_layer_bytes(tokens=8, hidden=4, ffn=16, element_bytes=4)
    assert (fwd32, bwd32) == (8 * (22 * 4 + 4 * 16) * 2, 8 * (38 * 4 + 8 * 16) * 2)


def test_the_layer_moves_its_bytes_at_the_measured_rate() -> None:
    base = round_profile()
    groups = layout_groups(PLAN, gpus_per_node=base.gpus_per_node)
    before = layer_pass_times(TINY_MODEL, PLAN, base, groups)
    stream = base.streaming_bytes_per_s()
    slow = dataclasses.replace(
        base,
        elementwise_forward_bytes_per_s=stream / 4,
        elementwise_backward_bytes_per_s=stream / 2,
    )
    after = layer_pass_times(TINY_MODEL, PLAN, slow, groups)
    traffic = layer_elementwise_traffic(
        TINY_MODEL, micro_batch_size=2, tp=1, sequence_parallel=False, unfused_attention=False
    )
    # 16-bit plan: the counted bytes as they are; 4x and 2x the streaming time
    assert after.forward_s - before.forward_s == pytest.approx(3 * traffic.forward_bytes / stream)
    assert after.backward_input_s - before.backward_input_s == pytest.approx(
        traffic.backward_bytes / stream
    )
    assert base.elementwise_bytes_per_s(backward=True) == stream  # absent: streaming


def test_profile_keys_round_trip_and_are_checked(tmp_path: Path) -> None:
    base = load_profile("a100-sxm4-80gb")
    assert "elementwise_forward_gb_per_s" not in Path(_path(base.name)).read_text("utf-8")
    profile = dataclasses.replace(
        base,
        elementwise_forward_bytes_per_s=7.5e9,
        elementwise_backward_bytes_per_s=6e9,
        provenance={
            **base.provenance,
            "elementwise_forward_gb_per_s": "test",
            "elementwise_backward_gb_per_s": "test",
        },
    )
    path = tmp_path / "p.yaml"
    write_profile(profile, path)
    text = path.read_text(encoding="utf-8")
    assert "elementwise_forward_gb_per_s: 7.5" in text
    loaded = load_profile(str(path))
    assert loaded.elementwise_forward_bytes_per_s == pytest.approx(7.5e9)
    assert loaded.elementwise_backward_bytes_per_s == pytest.approx(6e9)
    with pytest.raises(SpecError, match="elementwise_backward_bytes_per_s must be >= 0"):
        dataclasses.replace(profile, elementwise_backward_bytes_per_s=-1.0)


def _path(name: str) -> Path:
    return Path(__file__).parents[2] / "hardware_profiles" / f"{name}.yaml"


def _table(t_fwd: float, t_both: float) -> pd.DataFrame:
    rows = []
    for tokens, hidden in ((256, 256), (512, 512)):
        fwd, bwd = gelu_layer_bytes(tokens=tokens, hidden=hidden, ffn=4 * hidden, element_bytes=4)
        scale = tokens / 256
        for op, work, time_s in (
            ("layer_fwd", fwd, t_fwd * scale**2),
            ("layer_fwd_bwd", fwd + bwd, t_both * scale**2),
        ):
            rows.append(
                {
                    "kind": "elementwise",
                    "op": op,
                    "dtype": "fp32",
                    "shape": f"{tokens}x{hidden}",
                    "work": work,
                    "time_s": time_s,
                }
            )
    rows.append({"kind": "gemm", "op": "qkv", "dtype": "fp32", "shape": "1x1x1", "work": 2.0})
    return pd.DataFrame(rows)


def test_fit_gives_forward_and_backward_rates_with_provenance() -> None:
    fwd, bwd = gelu_layer_bytes(tokens=256, hidden=256, ffn=1024, element_bytes=4)
    terms = elementwise_term(_table(1e-3, 3e-3), source="measured: x", streaming_bytes_per_s=1e10)
    assert terms.scalars["elementwise_forward_bytes_per_s"] == pytest.approx(fwd / 1e-3)
    assert terms.scalars["elementwise_backward_bytes_per_s"] == pytest.approx(bwd / 2e-3)
    assert terms.provenance["elementwise_forward_gb_per_s"].startswith("measured: x; ")
    assert "256x256, 512x512" in terms.provenance["elementwise_backward_gb_per_s"]
    assert elementwise_term(_table(1e-3, 0.5e-3), source="s", streaming_bytes_per_s=0).scalars == {}
    no_rows = _table(1e-3, 3e-3).query("kind != 'elementwise'")
    assert elementwise_term(no_rows, source="s", streaming_bytes_per_s=0).scalars == {}


def test_plan_measures_the_layer_on_both_devices() -> None:
    for device, dtype in (("cpu", "fp32"), ("cuda", "bf16")):
        items = [i for i in build_plan(nproc=1, device=device, quick=False).items]
        ew = [i for i in items if i.kind == "elementwise"]
        assert {i.op for i in ew} == {"layer_fwd", "layer_fwd_bwd"}
        assert {i.dtype for i in ew} == {dtype} and len(ew) == 6


#: Host dispatch of one eager op on a GPU, s (the H100 profile's host_overhead.forward_op_us
#: measured 18.6-24.7 us), and the forward item's ops (2 layer norms, 2 adds, GELU).
HOST_OP_S, FORWARD_OPS = 20e-6, 5


def test_gpu_items_time_the_device_not_the_hosts_dispatch() -> None:
    """Every GPU elementwise item, quick or full, keeps the device busy 3x longer than the
    host takes to dispatch its forward ops, even at the fastest HBM of the shipped profiles
    (at 2048 x 2048 an H100 timed the host: 1.2 TB/s where the kernels run at 2-3.5)."""
    gpus = ("h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "mi300x-192gb")
    fastest = max(load_profile(name).hbm_bytes_per_s for name in gpus)
    for quick in (True, False):
        items = build_plan(nproc=1, device="cuda", quick=quick).items
        forward = [i for i in items if i.kind == "elementwise" and i.op == "layer_fwd"]
        assert forward
        for item in forward:
            assert item.work / fastest >= 3 * FORWARD_OPS * HOST_OP_S, item.shape


def test_bench_chain_runs_forward_and_backward() -> None:
    torch = pytest.importorskip("torch")
    from plansim.calibrate.bench_elementwise import elementwise_layer

    cpu = torch.device("cpu")
    forward = elementwise_layer((8, 4), dtype=torch.float32, device=cpu, backward=False)
    both = elementwise_layer((8, 4), dtype=torch.float32, device=cpu, backward=True)
    forward()
    both()
    both()  # leaves' grads are cleared after each call, so repeated calls do not accumulate
