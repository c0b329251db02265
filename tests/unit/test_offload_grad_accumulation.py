"""DeepSpeed accumulates an offloaded optimizer's gradient shard in host memory
(plansim.analytic.offload, "Gradient accumulation through the host")."""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.offload import BOUNDARY_GRAD_BYTES
from plansim.analytic.offload_microbatch import (
    accumulates_on_host,
    host_accumulation_bytes_per_param,
    stage_parameters,
)
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.plan import ParallelPlan, Schedule
from tests.unit.test_offload import CPU, MODEL, NVME, PCIE_BYTES_PER_S, host_profile, plan

DP = 8


def _plan(zero: int, m: int, **kw: object) -> ParallelPlan:
    return plan(zero_stage=zero, offload_optimizer=CPU, global_batch_size=DP * m, **kw)


def _shard(p: ParallelPlan, stage: int = 0) -> float:
    return stage_parameters(MODEL, p, stage=stage) / DP


def _copies(segments: tuple) -> list:  # type: ignore[type-arg]
    return [(s.kind, s.num_bytes) for s in segments if s.kind.startswith("offload_")]


@pytest.mark.parametrize(("zero", "m", "per_param"), [(3, 4, 2.0), (3, 1, 2.0), (2, 4, 1.5)])
def test_each_backward_moves_the_shard_to_the_host_and_back(
    zero: int, m: int, per_param: float
) -> None:
    # ZeRO-3: one 16-bit copy each way every micro-batch; ZeRO-2: m - 1 of them per step
    p = _plan(zero, m)
    assert host_accumulation_bytes_per_param(p) == pytest.approx(per_param)
    stage = build_pipeline_work(MODEL, p, host_profile()).stages[0]
    shard = _shard(p)
    copies = _copies(stage.backward[-2:])
    assert [k for k, _ in copies] == ["offload_d2h", "offload_h2d"]
    assert [b for _, b in copies] == pytest.approx([per_param * shard] * 2)
    assert stage.backward[-1].duration_s == pytest.approx(per_param * shard / PCIE_BYTES_PER_S)
    assert stage.backward[-1].link == "pcie"
    assert not _copies(stage.forward)


@pytest.mark.parametrize(("zero", "m"), [(1, 4), (2, 1)])
def test_without_accumulation_on_the_host_the_backward_copies_nothing(zero: int, m: int) -> None:
    p = _plan(zero, m)
    assert not accumulates_on_host(p)
    stage = build_pipeline_work(MODEL, p, host_profile()).stages[0]
    assert not _copies(stage.backward)


def test_a_step_moves_the_documented_bytes_over_pcie() -> None:
    for zero, m, round_trips in ((3, 4, 4), (2, 4, 3), (2, 1, 0), (1, 4, 0)):
        p = _plan(zero, m)
        ev = evaluate(MODEL, p, host_profile())
        assert isinstance(ev, Evaluation)
        rows = ev.result.timeline
        local = _shard(p)  # pp 1: the rank's shard is its stage's
        d2h = rows.loc[rows["kind"] == "offload_d2h", "bytes"].sum()
        h2d = rows.loc[rows["kind"] == "offload_h2d", "bytes"].sum()
        # the fp32 gradient shard at the boundary, the 16-bit parameters back
        assert d2h == pytest.approx((2 * round_trips + BOUNDARY_GRAD_BYTES) * local), zero
        assert h2d == pytest.approx((2 * round_trips + 2) * local), zero


def test_a_split_backward_copies_after_the_weight_gradients() -> None:
    p = plan(
        pp=2,
        dp=4,
        global_batch_size=16,
        zero_stage=3,
        offload_optimizer=NVME,
        schedule=Schedule.ZB_H1,
    )
    stage = build_pipeline_work(MODEL, p, host_profile()).stages[1]
    assert [k for k, _ in _copies(stage.backward_weight)] == ["offload_d2h", "offload_h2d"]
    assert not _copies(stage.backward_input)
