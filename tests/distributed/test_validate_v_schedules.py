"""ZB-V and DualPipeV run for real (CPU, gloo) under torch's own schedule classes' orders.

Each plan trains a tiny model for 3 steps on 2 or 4 ranks (V placement: rank r holds stages
r and 2 pp - 1 - r, rank 0 both ends) and must reproduce the single-process reference
losses within 1e-5 in fp32 (plain SGD: it sees a wrong gradient scale). The GPT model ties
its embedding: rank 0 holds both copies and sums their gradients itself. Per rank, the
compute order of torch's ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` must equal
plansim's action lists (``matches``), and so must the compute the stages ran in every step
(``executed_matches``). The order checks fail on a wrong order (fast tests at the end).
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from plansim.schedule.actions import parts
from plansim.schedule.builders import build_actions
from plansim.specs.plan import ParallelPlan, Schedule, plan_from_fields
from plansim.validate.run_config import RUN_SCHEDULES
from plansim.validate.runner import RunOutcome
from tests.distributed.test_validate_runner import GPT, LLAMA, _check_losses, _run

TORCH_CLASS = {Schedule.ZB_V: "ScheduleZBVZeroBubble", Schedule.DUALPIPE_V: "ScheduleDualPipeV"}


def _plan(schedule: Schedule, *, pp: int, global_batch_size: int) -> ParallelPlan:
    return plan_from_fields(
        dp=1,
        tp=1,
        pp=pp,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=global_batch_size,
        schedule=schedule,
    )


#: name -> (model, plan): one layer per stage; ZB-V on pp 4 with m = 4 < 2 pp - 1 (torch
#: pads its warm-up), DualPipeV with its least m = 2 pp.
PLANS = {
    "zb-v-pp2": (GPT, _plan(Schedule.ZB_V, pp=2, global_batch_size=4)),
    "zb-v-pp4": (
        dataclasses.replace(LLAMA, num_layers=8),
        _plan(Schedule.ZB_V, pp=4, global_batch_size=4),
    ),
    "dualpipev-pp2": (LLAMA, _plan(Schedule.DUALPIPE_V, pp=2, global_batch_size=4)),
    "dualpipev-pp4": (
        dataclasses.replace(GPT, num_layers=8),
        _plan(Schedule.DUALPIPE_V, pp=4, global_batch_size=8),
    ),
}


def _check_timeline(plan: ParallelPlan, df: pd.DataFrame) -> None:
    """Compute rows on the rank holding the stage; one forward and one backward (B, or I
    and W) per (stage, micro-batch); each rank's compute in our list's order (an overlap's
    forward, then its backward)."""
    compute = df[(df["stream"] == "compute") & (df["stage"] >= 0)]
    held = [
        plan.rank_holds_stage(r, s) for r, s in zip(compute["rank"], compute["stage"], strict=True)
    ]
    assert all(held)
    keys = [(s, j) for s in range(plan.num_stages) for j in range(plan.num_microbatches)]
    counts = compute.groupby(["kind", "stage", "microbatch"]).size().to_dict()
    for s, j in keys:
        assert counts.get(("forward", s, j)) == 1
        full = counts.get(("backward", s, j), 0)
        split = (counts.get(("backward_input", s, j), 0), counts.get(("backward_weight", s, j), 0))
        assert (full, split) in ((1, (0, 0)), (0, (1, 1))), (s, j)
    letters = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
    lists = build_actions(
        plan.schedule, num_ranks=plan.pp, num_microbatches=plan.num_microbatches, vpp=plan.vpp
    )
    for rank, items in enumerate(lists):
        rows = compute[compute["rank"] == rank].sort_values("start_s", kind="stable")
        ran = [
            f"{s}{letters[k]}{j}"
            for k, s, j in zip(rows["kind"], rows["stage"], rows["microbatch"], strict=True)
        ]
        assert ran == [str(a) for item in items for a in parts(item)], rank


@pytest.mark.parametrize("name", sorted(PLANS))
def test_v_schedule_trains_like_the_reference_in_torchs_order(name: str) -> None:
    model, plan = PLANS[name]
    outcome = _run(model, plan)
    assert isinstance(outcome, RunOutcome)
    _check_losses(model, plan, outcome.measured.losses)  # within 1e-5; the model trained
    checks = outcome.schedule_check
    assert len(checks) == plan.pp
    for check in checks:
        assert check["schedule"] == TORCH_CLASS[plan.schedule], check
        assert check["matches"] is True, check
        assert check["executed_matches"] is True, check
    for df in outcome.measured.timelines:
        _check_timeline(plan, df)


# --- the order checks themselves (no ranks launched) ---------------------------------------


def _torch_lists(schedule: Schedule, *, pp: int, m: int) -> dict[int, list[object]]:
    from torch.distributed.pipelining.schedules import _Action

    lists = build_actions(schedule, num_ranks=pp, num_microbatches=m, vpp=2)
    return {r: [_Action.from_str(str(a)) for a in items] for r, items in enumerate(lists)}


def test_the_order_check_fails_on_a_wrong_order() -> None:
    from plansim.validate.pipeline import compute_order, order_check

    ours = compute_order(_torch_lists(Schedule.DUALPIPE_V, pp=2, m=4))
    assert any(item.endswith(")OVERLAP_F_B") for item in ours[0])  # overlaps are compared
    assert order_check(ours[0], list(ours[0]), label="rank 0") == {"matches": True}
    swapped = list(ours[0])
    swapped[2], swapped[3] = swapped[3], swapped[2]
    check = order_check(ours[0], swapped, label="rank 0")
    assert check["matches"] is False and "position 2" in check["note"]
    zb_v = compute_order(_torch_lists(Schedule.ZB_V, pp=2, m=4))[0]
    assert order_check(ours[0], zb_v, label="rank 0")["matches"] is False
    assert order_check(ours[0], ours[0][:-1], label="rank 0")["matches"] is False  # one short
    assert order_check([], [], label="rank 0")["matches"] is False  # nothing compared


def test_executed_order_runs_an_overlap_as_its_two_sub_actions() -> None:
    from plansim.validate.pipeline import sub_action_order

    torch_lists = _torch_lists(Schedule.DUALPIPE_V, pp=2, m=4)
    ours = build_actions(Schedule.DUALPIPE_V, num_ranks=2, num_microbatches=4, vpp=2)
    for rank, items in enumerate(ours):
        assert sub_action_order(torch_lists[rank]) == [str(a) for i in items for a in parts(i)]


def test_every_schedule_the_runner_runs_has_torchs_class() -> None:
    from plansim.validate.pipeline import TORCH_SCHEDULES

    assert set(TORCH_SCHEDULES) == set(RUN_SCHEDULES)
    assert Schedule.DUALPIPE not in RUN_SCHEDULES
