"""The validate run's FSDP2 under pipelining and the twin that prices it
(plansim.validate.executed_fsdp, plansim.validate.simulated)."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.specs.plan import ParallelPlan, Schedule, Zero3ParamFetch, plan_from_fields
from plansim.validate.executed_fsdp import executed_zero_plan, reshard_after_forward, runs_per_step
from plansim.validate.framework_overhead import fsdp_unit_extra
from plansim.validate.simulated import run_plan, simulate_plan
from tests.unit.synthetic import round_profile
from tests.unit.test_validate_framework_overhead import GPT, MS, _profile

PER_STEP = Zero3ParamFetch.PER_STEP


def _plan(**kw: object) -> ParallelPlan:
    """dp 2 x pp 2, four micro-batches of one sequence, ZeRO-3 unless overridden."""
    base: dict[str, object] = dict(
        dp=2, tp=1, pp=2, micro_batch_size=1, global_batch_size=8, zero_stage=3
    )
    return plan_from_fields(**{**base, **kw})  # type: ignore[arg-type]


def test_fsdp2_reshards_after_forward_only_for_zero3_without_a_pipeline() -> None:
    assert reshard_after_forward(_plan(pp=1))
    assert not reshard_after_forward(_plan())  # torchtitan with pp > 1
    assert not reshard_after_forward(_plan(schedule=Schedule.ZB_H1))
    assert not reshard_after_forward(_plan(pp=1, zero_stage=2))


@pytest.mark.parametrize("zero", [2, 3])
def test_a_pipelined_zero2_or_zero3_run_is_priced_as_zero3_per_step(zero: int) -> None:
    plan = _plan(zero_stage=zero)
    assert runs_per_step(plan)
    for profile in (round_profile(), _profile()):  # a GPU profile and a serial (CPU) one
        executed = run_plan(plan, profile, dtype="bf16")
        assert (executed.zero_stage, executed.zero3_param_fetch) == (3, PER_STEP)
    # without a pipeline, or without data parallelism, nothing changes
    assert run_plan(_plan(pp=1), _profile(), dtype="bf16").zero3_param_fetch is (
        Zero3ParamFetch.LAYER_SYNC
    )
    for plan in (_plan(pp=1), _plan(dp=1, global_batch_size=4), _plan(zero_stage=1)):
        assert not runs_per_step(plan)
        assert executed_zero_plan(plan) == plan


def _dp_comm_rows(plan: ParallelPlan, profile: object) -> object:
    rows = simulate_plan(GPT, plan, profile, dtype="bf16").result.timeline  # type: ignore[arg-type]
    return rows[rows["kind"] == "dp_comm"]


def test_the_twin_reduces_and_gathers_once_per_rank_and_step() -> None:
    # the run: one REDUCE_GRAD per stage after its last backward, one gather per unit in the
    # first forward (torch.distributed.pipelining turns FSDP2's sync off until then)
    rows = _dp_comm_rows(_plan(), _profile())
    assert rows.groupby("rank").size().to_dict() == {0: 2, 1: 2}
    # the same bytes whatever the number of micro-batches
    more = _dp_comm_rows(_plan(global_batch_size=32), _profile())
    assert more["bytes"].sum() == pytest.approx(rows["bytes"].sum(), rel=1e-12)


def test_fsdp2_unit_figures_count_once_per_step() -> None:
    plan = _plan()
    measured = {"fsdp_unit_forward_s": 1.5 * MS, "fsdp_unit_backward_s": 4 * MS}
    with_extra = _profile(**measured)
    extra = fsdp_unit_extra(run_plan(plan, with_extra, dtype="bf16"), with_extra)
    assert extra.forward_s > 0 and extra.backward_s > 0
    before = _dp_comm_rows(plan, _profile())
    after = _dp_comm_rows(plan, with_extra)
    units = GPT.num_layers // plan.pp + 1  # the rank's layers and its stage root
    for rank in (0, 1):
        grown = (
            after[after["rank"] == rank]["end_s"] - after[after["rank"] == rank]["start_s"]
        ).sum()
        base = (
            before[before["rank"] == rank]["end_s"] - before[before["rank"] == rank]["start_s"]
        ).sum()
        assert grown - base == pytest.approx(units * (extra.forward_s + extra.backward_s), rel=1e-9)


def test_a_serial_host_waits_for_every_gather() -> None:
    serial, overlapped = _profile(), dataclasses.replace(_profile(), host_overhead=None)
    plan = run_plan(_plan(), serial, dtype="bf16")

    def gather_s(profile: object) -> float:
        rows = simulate_plan(GPT, plan, profile, dtype="bf16").result.timeline  # type: ignore[arg-type]
        rows = rows[(rows["kind"] == "dp_comm") & (rows["rank"] == 0)]
        last = rows.sort_values("start_s").iloc[-1]  # the gather, after the optimizer
        return float(last["end_s"] - last["start_s"])

    # prefetched beside the next layer's forward on a GPU; one after another on a CPU
    assert gather_s(serial) > gather_s(overlapped)
