"""DTensor all-reduce and FSDP2 unit overheads in the validate simulation
(validate/framework_overhead)."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.specs.compute_terms import HostOverhead
from plansim.specs.plan import Schedule, plan_from_fields
from plansim.validate.framework_overhead import (
    fsdp_unit_extra,
    pipeline_action_extra,
    tp_all_reduce_extra,
)
from plansim.validate.simulated import PIPELINE_ACTION_KIND, simulate_plan
from tests.unit.synthetic import round_profile

GPT = resolve_model("megatron-1.7b")
MS = 1e-3


def _profile(**measured: float):  # type: ignore[no-untyped-def]
    host = HostOverhead(serial=True, forward_op_s=0.0, backward_op_s=0.0, **measured)
    return dataclasses.replace(round_profile(), host_overhead=host)


def test_tp_extra_is_the_measured_all_reduce_less_its_priced_time() -> None:
    plan = plan_from_fields(dp=1, tp=2, pp=1, micro_batch_size=1, global_batch_size=2)
    profile = _profile(dtensor_all_reduce_forward_s=1 * MS, dtensor_all_reduce_backward_s=2 * MS)
    assert layout_groups(plan, gpus_per_node=8).tp.num_nodes == 1
    priced = profile.intra_node["all_reduce"].latency_s  # alpha of the fit
    got = tp_all_reduce_extra(plan, profile, backward_all_reduces=4)
    assert got.forward_s == pytest.approx(2 * (1 * MS - priced))
    assert got.backward_s == pytest.approx(4 * (2 * MS - priced))
    assert tp_all_reduce_extra(plan.with_fields(tp=1, dp=2), profile,
                               backward_all_reduces=0).forward_s == 0  # fmt: skip
    assert tp_all_reduce_extra(plan, round_profile(), backward_all_reduces=4).forward_s == 0


def test_fsdp_extra_is_the_measured_unit_less_its_priced_collectives() -> None:
    plan = plan_from_fields(dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=2, zero_stage=3)
    profile = _profile(fsdp_unit_forward_s=1.5 * MS, fsdp_unit_backward_s=4 * MS)
    assert layout_groups(plan, gpus_per_node=8).dp_cp.num_nodes == 1
    gather, scatter = (profile.intra_node[c].latency_s for c in ("all_gather", "reduce_scatter"))
    got = fsdp_unit_extra(plan, profile)
    assert got.forward_s == pytest.approx(1.5 * MS - gather)
    assert got.backward_s == pytest.approx(4 * MS - gather - scatter)
    assert fsdp_unit_extra(plan.with_fields(zero_stage=1), profile).forward_s == 0


def test_the_simulated_step_pays_them_on_the_critical_path() -> None:
    tp2 = plan_from_fields(dp=1, tp=2, pp=1, micro_batch_size=1, global_batch_size=2)
    zero3 = plan_from_fields(
        dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=4, zero_stage=3
    )
    base = _profile()
    for plan, measured, units in (
        (tp2, {"dtensor_all_reduce_forward_s": MS, "dtensor_all_reduce_backward_s": 2 * MS}, 0),
        (zero3, {"fsdp_unit_forward_s": 1.5 * MS, "fsdp_unit_backward_s": 4 * MS}, 1),
    ):
        with_extra = _profile(**measured)
        extra = tp_all_reduce_extra(plan, with_extra, backward_all_reduces=4)
        if units:
            extra = fsdp_unit_extra(plan, with_extra)
        before = simulate_plan(GPT, plan, base, dtype="bf16").step_time_s
        after = simulate_plan(GPT, plan, with_extra, dtype="bf16").step_time_s
        # pp = 1: every micro-batch's layers (and, for FSDP2, the root unit) in series
        per_mb = (GPT.num_layers + units) * (extra.forward_s + extra.backward_s)
        assert after - before == pytest.approx(plan.num_microbatches * per_mb, rel=1e-9)
        assert per_mb > 0


def test_pipeline_extra_is_the_measured_action_less_the_p2p_latency() -> None:
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=8)
    profile = _profile(pipeline_action_forward_s=0.9 * MS, pipeline_action_backward_s=1.1 * MS)
    priced = profile.intra_node["sendrecv"].latency_s
    got = pipeline_action_extra(plan, profile)
    assert (got.forward_s, got.backward_s) == (
        pytest.approx(0.9 * MS - priced),
        pytest.approx(1.1 * MS - priced),
    )
    assert pipeline_action_extra(plan.with_fields(pp=1, dp=2), profile).forward_s == 0
    assert pipeline_action_extra(plan, round_profile()).forward_s == 0
    # across nodes the priced latency is the NIC's
    wide = dataclasses.replace(profile, gpus_per_node=1)
    assert pipeline_action_extra(plan, wide).forward_s == pytest.approx(
        max(0.0, 0.9 * MS - wide.nic_latency_s)
    )


def test_pipeline_actions_lengthen_the_simulated_step() -> None:
    """GPipe, pp 2, m 4: each rank runs its 4 forwards and 4 backwards in series, and the
    critical path holds m + p - 1 = 5 of each, so the step grows by between 4 and 5 times
    (forward + backward extra)."""
    m = 4
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=m,
                        schedule=Schedule.GPIPE)  # fmt: skip
    measured = {"pipeline_action_forward_s": 5 * MS, "pipeline_action_backward_s": 7 * MS}
    with_extra = _profile(**measured)
    extra = pipeline_action_extra(plan, with_extra)
    per_pair = extra.forward_s + extra.backward_s
    before = simulate_plan(GPT, plan, _profile(), dtype="bf16").step_time_s
    after = simulate_plan(GPT, plan, with_extra, dtype="bf16").step_time_s
    assert per_pair > 10 * MS
    assert m * per_pair - 1e-9 <= after - before <= (m + 1) * per_pair + 1e-9


def test_pipeline_actions_are_their_own_compute_rows() -> None:
    """The per-action cost sits before each stage forward and backward as a
    ``pipeline_action`` compute row (the run's forward/backward intervals do not hold it):
    one per action, each of the extra's length, and the forward rows keep their length."""
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)
    with_extra = _profile(pipeline_action_forward_s=5 * MS, pipeline_action_backward_s=7 * MS)
    extra = pipeline_action_extra(plan, with_extra)
    tl = simulate_plan(GPT, plan, with_extra, dtype="bf16").result.timeline
    plain = simulate_plan(GPT, plan, _profile(), dtype="bf16").result.timeline
    rows = tl[tl["kind"] == PIPELINE_ACTION_KIND]
    actions = 2 * plan.pp * plan.num_microbatches  # F and B of every stage and micro-batch
    assert len(rows) == actions and (rows["stream"] == "compute").all()
    durations = sorted((rows["end_s"] - rows["start_s"]).round(12))
    half = actions // 2
    assert durations == pytest.approx([extra.forward_s] * half + [extra.backward_s] * half)

    def forward_s(df):  # type: ignore[no-untyped-def]
        f = df[df["kind"] == "forward"]
        return float((f["end_s"] - f["start_s"]).sum())

    assert forward_s(tl) == pytest.approx(forward_s(plain))
