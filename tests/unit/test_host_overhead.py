"""Host per-op overhead: spec, op counting, pass pricing, schema, calibration fit, refit.

Op counts of the tiny GPT layer (GELU, LayerNorm, learned positions) from the cost model's
own lists: weight GEMMs qkv, attn_out, mlp_up, mlp_down (4) + one fused attention call + the
5 memory-bound kernels (2 layer norms, 2 bias-dropout-adds, bias-GELU) = 10 ops; unfused
attention: 4 + 2 batched GEMMs + 8 kernels (softmax, dropout, permute added) = 14. The
round-number profile has no launch cost, so a serial host adds ops x per-op seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from plansim.analytic.edge_cost import edge_times
from plansim.analytic.layer_cost import layer_gemms, layer_pass_times
from plansim.analytic.op_overheads import PassOps, edge_ops, layer_ops, with_host_s
from plansim.analytic.ranks import layout_groups
from plansim.calibrate.build_host import host_overhead_term
from plansim.calibrate.fit import FitError, fit_host_ops
from plansim.calibrate.plan import (
    PIPELINE_MICROBATCHES,
    PIPELINE_OPS,
    PIPELINE_STAGE_OPS,
    Item,
    build_plan,
)
from plansim.errors import InputFileError, SpecError
from plansim.io.profile_schema import HOST_OVERHEAD_KEYS
from plansim.io.profiles import load_profile, profile_from_dict, profile_to_dict, write_profile
from plansim.specs.compute_terms import HostOverhead
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import PositionEmbedding
from plansim.specs.plan import AttentionKernel, ParallelPlan, Recompute, plan_from_fields
from plansim.validate.refit import (
    PassTotals,
    fit_dtensor,
    fit_host_scale,
    refit,
    scale_host,
    without_host,
)
from plansim.validate.simulated import simulate_plan
from tests.unit.synthetic import round_profile
from tests.unit.test_attention_efficiency import MODEL, PLAN
from tests.unit.test_validate_compare import measured_run, profile_with_fp32

US = 1e-6


def host(*, serial: bool = True, dtensor: bool = False) -> HostOverhead:
    return HostOverhead(
        serial=serial,
        forward_op_s=20 * US,
        backward_op_s=40 * US,
        dtensor_forward_op_s=100 * US if dtensor else None,
        dtensor_backward_op_s=300 * US if dtensor else None,
    )


def passes(profile: HardwareProfile, plan: ParallelPlan = PLAN):  # type: ignore[no-untyped-def]
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    return layer_pass_times(MODEL, plan, profile, groups)


def test_pass_combination_serial_and_asynchronous() -> None:
    serial, gpu = host(), host(serial=False)
    # serial: device + host - one bare dispatch (10 us) per op
    assert serial.pass_s(1e-3, host_s=5e-4, num_ops=10, dispatch_s=10 * US) == pytest.approx(
        1e-3 + 5e-4 - 1e-4
    )
    assert serial.pass_s(1e-3, host_s=5e-5, num_ops=10, dispatch_s=10 * US) == 1e-3
    assert gpu.pass_s(1e-3, host_s=5e-4, num_ops=10, dispatch_s=10 * US) == 1e-3
    assert gpu.pass_s(1e-4, host_s=5e-4, num_ops=10, dispatch_s=10 * US) == 5e-4


def test_spec_validation() -> None:
    with pytest.raises(SpecError, match="serial must be true or false"):
        HostOverhead(serial=1, forward_op_s=0.0, backward_op_s=0.0)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="forward_op_s must be a number >= 0"):
        HostOverhead(serial=True, forward_op_s=-1.0, backward_op_s=0.0)
    with pytest.raises(SpecError, match="go together"):
        HostOverhead(serial=True, forward_op_s=0.0, backward_op_s=0.0, dtensor_forward_op_s=1.0)


def test_ops_are_counted_from_the_cost_model_lists() -> None:
    assert layer_ops(layer_gemms(MODEL, PLAN), PLAN, num_kernels=5) == PassOps(num_ops=10)
    unfused = PLAN.with_fields(attention=AttentionKernel.UNFUSED)
    assert layer_ops(layer_gemms(MODEL, unfused), unfused, num_kernels=8).num_ops == 14
    tp2 = PLAN.with_fields(tp=2)
    assert layer_ops(layer_gemms(MODEL, tp2), tp2, num_kernels=5) == PassOps(
        num_ops=10, num_dtensor_ops=4
    )
    assert edge_ops(PositionEmbedding.LEARNED) == (PassOps(num_ops=3), PassOps(num_ops=4))
    assert edge_ops(PositionEmbedding.ROPE)[0] == PassOps(num_ops=1)


def test_serial_host_adds_ops_times_per_op_to_each_pass() -> None:
    base = round_profile()
    old = passes(base)
    new = passes(dataclasses.replace(base, host_overhead=host()))
    assert new.forward_s - old.forward_s == pytest.approx(10 * 20 * US)
    assert new.backward_input_s - old.backward_input_s == pytest.approx(10 * 40 * US)
    assert new.backward_weight_s == old.backward_weight_s
    # with a 2 us bare dispatch in the profile, only the excess counts
    launch = dataclasses.replace(base, kernel_launch_s=2 * US)
    lnew = passes(dataclasses.replace(launch, host_overhead=host()))
    assert lnew.forward_s - passes(launch).forward_s == pytest.approx(10 * 18 * US)


def test_dtensor_extra_with_tensor_parallelism() -> None:
    base = round_profile()
    tp2 = PLAN.with_fields(tp=2)
    old = passes(base, tp2)
    new = passes(dataclasses.replace(base, host_overhead=host(dtensor=True)), tp2)
    assert new.forward_s - old.forward_s == pytest.approx(10 * 20 * US + 4 * 100 * US)
    assert new.backward_input_s - old.backward_input_s == pytest.approx(10 * 40 * US + 4 * 300 * US)
    tp1 = passes(dataclasses.replace(base, host_overhead=host(dtensor=True)))
    assert tp1.forward_s - passes(base).forward_s == pytest.approx(10 * 20 * US)


def test_per_op_selective_checkpoint_extra_only_under_that_recompute() -> None:
    sac = dataclasses.replace(host(), sac_forward_op_s=60 * US, sac_backward_op_s=70 * US)
    base = round_profile()
    for recompute in (Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE_OP):
        plan = PLAN.with_fields(recompute=recompute)
        plain = passes(dataclasses.replace(base, host_overhead=host()), plan)
        new = passes(dataclasses.replace(base, host_overhead=sac), plan)
        ops = 10 if recompute is Recompute.SELECTIVE_OP else 0  # every op is in the region
        assert new.forward_s - plain.forward_s == pytest.approx(ops * 60 * US)
        assert new.backward_input_s - plain.backward_input_s == pytest.approx(ops * 70 * US)
        assert new.recompute_s == plain.recompute_s  # its host time is in the backward figure


def test_asynchronous_host_hides_behind_device_or_bounds_it() -> None:
    base = round_profile()
    tiny = passes(dataclasses.replace(base, host_overhead=host(serial=False)))
    assert tiny.forward_s == pytest.approx(10 * 20 * US)  # microsecond GEMMs: host-bound
    slow = dataclasses.replace(
        base, host_overhead=HostOverhead(serial=False, forward_op_s=1e-12, backward_op_s=1e-12)
    )
    assert passes(slow) == passes(base)  # host far shorter: device time unchanged
    assert with_host_s(1.0, PassOps(num_ops=0), slow, backward=False) == 1.0


def test_edges_pay_their_ops() -> None:
    base = round_profile()
    groups = layout_groups(PLAN, gpus_per_node=8)
    old = edge_times(MODEL, PLAN, base, groups)
    new = edge_times(MODEL, PLAN, dataclasses.replace(base, host_overhead=host()), groups)
    assert new.first_forward_s - old.first_forward_s == pytest.approx(3 * 20 * US)
    assert new.last_forward_s - old.last_forward_s == pytest.approx(4 * 20 * US)
    assert new.last_backward_input_s - old.last_backward_input_s == pytest.approx(4 * 40 * US)
    assert new.last_backward_weight_s == old.last_backward_weight_s


def test_absent_key_is_unchanged_on_the_shipped_profiles() -> None:
    gpu = load_profile("a100-sxm4-80gb")  # datasheet profiles have no host_overhead
    assert gpu.host_overhead is None
    assert passes(dataclasses.replace(gpu, host_overhead=None)) == passes(gpu)
    assert passes(dataclasses.replace(gpu, host_overhead=host())) != passes(gpu)
    cpu = load_profile("cpu-2core-gloo")  # measured: has it, and it counts
    assert cpu.host_overhead is not None
    assert passes(dataclasses.replace(cpu, host_overhead=None)) != passes(cpu)


def _yaml(section: Mapping[str, object]) -> dict[str, Any]:
    data = profile_to_dict(load_profile("cpu-2core-gloo"))
    data["host_overhead"] = dict(section)
    data["provenance"] = {
        k: v for k, v in data["provenance"].items() if not k.startswith("host_overhead.")
    }
    data["provenance"].update(
        {f"host_overhead.{k}": "measured: test" for k in section if k in HOST_OVERHEAD_KEYS}
    )
    return data


def test_schema_round_trip(tmp_path: Path) -> None:
    section = {"serial": True, "forward_op_us": 20, "backward_op_us": 40.5}
    profile = profile_from_dict(_yaml(section), source="t.yaml")
    assert profile.host_overhead == HostOverhead(
        serial=True, forward_op_s=20 * US, backward_op_s=40.5 * US
    )
    write_profile(profile, tmp_path / "p.yaml")
    back = load_profile(str(tmp_path / "p.yaml"))
    assert back.host_overhead == profile.host_overhead
    assert profile_to_dict(back)["host_overhead"] == section
    full = {**section, "dtensor_forward_op_us": 100, "dtensor_backward_op_us": 300}
    assert profile_from_dict(_yaml(full), source="t").host_overhead == HostOverhead(
        serial=True,
        forward_op_s=20 * US,
        backward_op_s=40.5 * US,
        dtensor_forward_op_s=100 * US,
        dtensor_backward_op_s=300 * US,
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"serial": "yes", "forward_op_us": 1, "backward_op_us": 1}, "expected true or false"),
        ({"serial": True, "forward_op_us": 1}, "backward_op_us: missing required key"),
        ({"serial": True, "forward_op_us": -1, "backward_op_us": 1}, ">= 0"),
        ({"serial": True, "forward_op_us": 1, "backward_op_us": 1, "x": 1}, "unknown key"),
        (
            {"serial": True, "forward_op_us": 1, "backward_op_us": 1, "dtensor_forward_op_us": 1},
            "go together",
        ),
    ],
)
def test_schema_errors(section: Mapping[str, object], message: str) -> None:
    with pytest.raises(InputFileError, match=message):
        profile_from_dict(_yaml(section), source="t.yaml")


def _chain_table(times: Mapping[str, float]) -> pd.DataFrame:
    """Aggregated host_op rows: 64-op chains, and 8-op x 8 micro-batch pipelines on 2 ranks."""
    rows = []
    for op, t in times.items():
        pipeline = op.startswith("pipeline_")
        shape, work = ("8x8", 9.0) if pipeline else ("64", 64.0)
        rows.append({"kind": "host_op", "op": op, "shape": shape, "work": work, "time_s": t})
    return pd.DataFrame(rows)


def test_chain_fit_and_terms() -> None:
    fit = fit_host_ops(64, forward_s=1.28e-3, forward_backward_s=3.84e-3)
    assert (fit.forward_op_s, fit.backward_op_s) == pytest.approx((20 * US, 40 * US))
    with pytest.raises(FitError):
        fit_host_ops(0, forward_s=1.0, forward_backward_s=1.0)
    times = {
        "chain_fwd": 1.28e-3,
        "chain_fwd_bwd": 3.84e-3,
        "dtensor_chain_fwd": 6.4e-3,  # 100 us per op: (100 - 20) x 2 = 160 us per linear
        "dtensor_chain_fwd_bwd": 25.6e-3,  # backward 300 us per op: (300 - 40) x 2 = 520
        "sac_chain_fwd": 5.12e-3,  # 80 us per op: 60 more than plain
        "sac_chain_fwd_bwd": 12.16e-3,  # backward 110 us per op: 70 more than plain
    }
    table = _chain_table(times)
    terms = host_overhead_term(table, source="measured: test", serial=True)
    assert terms.host_overhead is not None
    got = terms.host_overhead
    assert got.serial
    assert (got.forward_op_s, got.backward_op_s) == pytest.approx((20 * US, 40 * US))
    assert got.dtensor_forward_op_s == pytest.approx(160 * US)
    assert got.dtensor_backward_op_s == pytest.approx(520 * US)
    assert (got.sac_forward_op_s, got.sac_backward_op_s) == pytest.approx((60 * US, 70 * US))
    world = ("dtensor_all_reduce", "fsdp_unit", "pipeline_action")
    assert set(terms.provenance) == {
        f"host_overhead.{k}" for k in HOST_OVERHEAD_KEYS if not k.startswith(world)
    }
    assert got.dtensor_all_reduce_forward_s is None and got.fsdp_unit_forward_s is None
    assert got.pipeline_action_forward_s is None
    # the chains over every rank: 16 column/row pairs (one all-reduce each way), 32 FSDP units
    times |= {
        "dtensor_world_chain_fwd": 6.4e-3 + 16 * 1e-3,  # 1 ms per forward all-reduce
        "dtensor_world_chain_fwd_bwd": 25.6e-3 + 16 * 1e-3 + 16 * 2e-3,  # 2 ms backward
        "fsdp_chain_fwd": 1.28e-3 + 32 * 1.5e-3,
        "fsdp_chain_fwd_bwd": 3.84e-3 + 32 * (1.5e-3 + 4e-3),
        # 8 ops per stage, 8 micro-batches on 2 ranks: 9 actions on the GPipe critical path,
        # each the stage's ops (20 / 40 us each) plus 0.7 ms forward, 0.9 ms backward
        "pipeline_chain_fwd": 9 * (8 * 20 * US + 0.7e-3),
        "pipeline_chain_fwd_bwd": 9 * (8 * 60 * US + 1.6e-3),
    }
    table = _chain_table(times)
    terms = host_overhead_term(table, source="measured: test", serial=True)
    got = terms.host_overhead
    assert got is not None
    assert (got.dtensor_all_reduce_forward_s, got.dtensor_all_reduce_backward_s) == (
        pytest.approx(1e-3),
        pytest.approx(2e-3),
    )
    assert (got.fsdp_unit_forward_s, got.fsdp_unit_backward_s) == (
        pytest.approx(1.5e-3),
        pytest.approx(4e-3),
    )
    assert (got.pipeline_action_forward_s, got.pipeline_action_backward_s) == (
        pytest.approx(0.7e-3),
        pytest.approx(0.9e-3),
    )
    assert (
        "9 actions on the critical path"
        in terms.provenance["host_overhead.pipeline_action_forward_us"]
    )
    assert set(terms.provenance) == {f"host_overhead.{k}" for k in HOST_OVERHEAD_KEYS}
    assert ("FSDP2 unit", "forward 1500 us, backward 4000 us") in terms.summary
    assert ("pipeline action", "forward 700 us, backward 900 us") in terms.summary
    plain = host_overhead_term(table.iloc[:2], source="m", serial=False).host_overhead
    assert plain is not None and not plain.serial and plain.dtensor_forward_op_s is None
    assert host_overhead_term(table.iloc[:1], source="m", serial=True).host_overhead is None


def _totals(mf: float, mb: float, sf: float, sb: float) -> PassTotals:
    return PassTotals(
        measured_forward_s=mf,
        measured_backward_s=mb,
        simulated_forward_s=sf,
        simulated_backward_s=sb,
        unobserved_forward_s=0.0,
        unobserved_backward_s=0.0,
    )


def test_host_scale_is_solved_only_when_the_passes_separate_it() -> None:
    # device (1, 2) and host (1, 1) s; measured = 1.5 x device + 2 x host = (3.5, 5)
    assert fit_host_scale(_totals(3.5, 5.0, 2.0, 3.0), _totals(0, 0, 1.0, 2.0)) == pytest.approx(2)
    # host (1, 2) parallel to device (1, 2): undetermined
    assert fit_host_scale(_totals(3.5, 7.0, 2.0, 4.0), _totals(0, 0, 1.0, 2.0)) is None
    # a negative device factor: rejected
    assert fit_host_scale(_totals(0.5, 5.0, 2.0, 3.0), _totals(0, 0, 1.0, 2.0)) is None


def test_dtensor_factors_close_each_pass() -> None:
    # DTensor host time (2, 6) s of (10, 20); measured (12, 26): factors (2, 2)
    assert fit_dtensor(_totals(12, 26, 10, 20), _totals(0, 0, 8, 14)) == pytest.approx((2, 2))
    assert fit_dtensor(_totals(1, 1, 10, 20), _totals(0, 0, 8, 14)) == (0.0, 0.0)
    assert fit_dtensor(_totals(12, 26, 10, 20), _totals(0, 0, 10, 20)) is None


def test_scaling_keeps_the_bare_dispatch() -> None:
    profile = dataclasses.replace(
        round_profile(), kernel_launch_s=5 * US, host_overhead=host(dtensor=True)
    )
    scaled = scale_host(profile, forward=2.0, backward=3.0).host_overhead
    assert scaled is not None
    assert scaled.forward_op_s == pytest.approx(5 * US + 2 * 15 * US)
    assert scaled.backward_op_s == pytest.approx(5 * US + 3 * 35 * US)
    assert scaled.dtensor_forward_op_s == pytest.approx(200 * US)
    only = scale_host(profile, forward=2.0, backward=2.0, dtensor_only=True).host_overhead
    assert only is not None and only.forward_op_s == 20 * US
    # without the host term: per-op figures at the bare dispatch (what the device terms
    # already hold on a serial device), DTensor per-linear extras zero
    bare = without_host(profile).host_overhead
    assert bare is not None
    assert (bare.forward_op_s, bare.backward_op_s) == pytest.approx((5 * US, 5 * US))
    assert (bare.dtensor_forward_op_s, bare.dtensor_backward_op_s) == (0.0, 0.0)
    assert without_host(round_profile()).host_overhead is None
    zeroed = without_host(profile, dtensor_only=True).host_overhead
    assert zeroed is not None and zeroed.dtensor_backward_op_s == 0.0


def _with_host(profile: HardwareProfile, overhead: HostOverhead) -> HardwareProfile:
    provenance = {
        **profile.provenance,
        **{f"host_overhead.{k}": "synthetic" for k in HOST_OVERHEAD_KEYS},
    }
    return dataclasses.replace(profile, host_overhead=overhead, provenance=provenance)


def test_refit_puts_a_tensor_parallel_error_into_the_dtensor_figures() -> None:
    plan = plan_from_fields(dp=1, tp=2, pp=1, micro_batch_size=1, global_batch_size=4)
    base = _with_host(profile_with_fp32(), host(dtensor=True))
    truth = scale_host(base, forward=3.0, backward=1.5, dtensor_only=True)
    ev = simulate_plan(MODEL, plan, truth, dtype="fp32")
    run = measured_run(
        ev.result.timeline, step_times_s=(ev.step_time_s,) * 3, plan=plan, memory=(1000,)
    )
    fitted = refit(run, base, dtype="fp32", source="test refit")
    assert fitted.factors["host_overhead.dtensor_forward"] == pytest.approx(3.0, rel=1e-6)
    assert fitted.factors["host_overhead.dtensor_backward"] == pytest.approx(1.5, rel=1e-6)
    assert "gemm_and_launch" not in fitted.factors
    assert abs(fitted.after.step_time_error_pct) < 0.1
    got = fitted.profile.host_overhead
    assert got is not None and got.dtensor_forward_op_s == pytest.approx(300 * US)
    assert got.forward_op_s == 20 * US
    assert (
        "x3 of the previous value"
        in fitted.profile.provenance["host_overhead.dtensor_forward_op_us"]
    )
    assert fitted.profile.provenance["host_overhead.forward_op_us"] == "synthetic"


def test_refit_keeps_an_undetermined_host_term() -> None:
    base = _with_host(profile_with_fp32(), host())
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)
    truth = scale_host(base, forward=2.0, backward=2.0)
    ev = simulate_plan(MODEL, plan, truth, dtype="fp32")
    run = measured_run(ev.result.timeline, step_times_s=(ev.step_time_s,) * 3, plan=plan)
    fitted = refit(run, base, dtype="fp32", source="test refit")
    # either the host term was solved for, or it was kept and the GEMM term took the error
    assert "host_overhead" in fitted.factors or any("host_overhead" in n for n in fitted.notes)
    assert abs(fitted.after.step_time_error_pct) < 5.0


def test_scaling_the_host_term_keeps_the_other_extras() -> None:
    """A refit's host factor applies to the per-op figures, the DTensor per-linear and the
    per-op selective-checkpoint extras (the host time of the passes it fitted); the DTensor
    all-reduce and FSDP2 unit extras
    (on communication segments) and the pipeline-action extras (between actions; refitted by
    ``refit_pipeline``) are kept, and were dropped before."""
    extras = {
        "dtensor_forward_op_s": 1e-4,
        "dtensor_backward_op_s": 2e-4,
        "dtensor_all_reduce_forward_s": 1e-3,
        "dtensor_all_reduce_backward_s": 2e-3,
        "fsdp_unit_forward_s": 3e-3,
        "fsdp_unit_backward_s": 4e-3,
        "pipeline_action_forward_s": 5e-4,
        "pipeline_action_backward_s": 6e-4,
        "sac_forward_op_s": 7e-5,
        "sac_backward_op_s": 8e-5,
    }
    host = HostOverhead(serial=False, forward_op_s=1e-5, backward_op_s=2e-5, **extras)
    profile = dataclasses.replace(round_profile(), host_overhead=host)
    both = scale_host(profile, forward=2.0, backward=3.0).host_overhead
    assert both is not None
    for name, value in extras.items():
        factor = 2.0 if "forward" in name else 3.0
        scaled = name.startswith(("dtensor_forward_op", "dtensor_backward_op", "sac_"))
        assert getattr(both, name) == pytest.approx(value * factor if scaled else value)
    assert (both.forward_op_s, both.backward_op_s) == pytest.approx((2e-5, 6e-5))
    tp_only = scale_host(profile, forward=0.0, backward=0.0, dtensor_only=True).host_overhead
    assert tp_only is not None
    for name, value in extras.items():
        dtensor = name.startswith("dtensor_") and name.endswith("_op_s")
        assert getattr(tp_only, name) == (0.0 if dtensor else value)
    assert (tp_only.forward_op_s, tp_only.backward_op_s) == (1e-5, 2e-5)


@pytest.mark.parametrize("quick", [True, False])
def test_the_pipeline_chains_run_over_every_rank(quick: bool) -> None:
    def pipeline_items(nproc: int) -> list[Item]:
        items = build_plan(nproc=nproc, device="cpu", quick=quick).items
        return [i for i in items if i.op in PIPELINE_OPS]

    assert pipeline_items(1) == []
    four = pipeline_items(4)
    passes = 3 if quick else 5  # every pass times the chains again (a drifting machine)
    assert [i.op for i in four] == list(PIPELINE_OPS) * passes
    assert [i.sweep for i in four] == [p for p in range(passes) for _ in PIPELINE_OPS]
    for item in four:
        assert item.group_size == 4 and item.kind == "host_op"
        assert item.shape == (PIPELINE_STAGE_OPS, PIPELINE_MICROBATCHES)
        assert item.work == PIPELINE_MICROBATCHES + 4 - 1 and item.work_unit == "action"
