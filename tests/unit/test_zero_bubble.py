"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv:2401.10241, §2.1):
builder order, invariants, torch cross-check, bubble against the paper's closed form, memory,
planner and backtest dating.

Notation: F forward, I input gradient (the paper's B), W weight gradient; p ranks, m
micro-batches. Engine times in the hand-worked example are in milliseconds (MS).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pandas as pd
import pytest

from plansim.analytic.memory import rank_memory
from plansim.analytic.stored_activations import microbatch_activation_bytes, microbatches_in_flight
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.planner.framework_releases import first_year
from plansim.planner.run_space import _pipeline_schedule, run_year
from plansim.schedule import (
    Action,
    ActionKind,
    ScheduleError,
    build_actions,
    check_actions,
    lockstep_grid,
)
from plansim.schedule.actions import PerRankActions
from plansim.sim import SimResult, simulate, validate_timeline
from plansim.specs.plan import Recompute, Schedule, plan_from_fields
from plansim.specs.work import P2P, PipelineWork, RankWork, Segment, StageWork
from tests.unit.synthetic import round_profile

ZB = Schedule.ZB_H1
MS = 1e-3
_F, _I, _W = ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT


def zb(p: int, m: int) -> PerRankActions:
    return build_actions(ZB, num_ranks=p, num_microbatches=m)


def rows(actions: PerRankActions) -> list[str]:
    return [" ".join(str(a) for a in row) for row in actions]


def acts(*text: str) -> PerRankActions:
    return tuple(tuple(Action.parse(s) for s in row.split()) for row in text)


def _segs(kind: str, seconds: float) -> tuple[Segment, ...]:
    return (Segment(kind=kind, stream="compute", duration_s=seconds),)


def work(
    p: int,
    m: int,
    *,
    f: float = 1.0,
    i: float = 1.0,
    w: float = 1.0,
    p2p_s: float = 0.0,
    activation_bytes: float = 0.0,
    static_bytes: float = 0.0,
) -> PipelineWork:
    """Uniform stages: F = f, I = i, W = w and the unsplit B = i + w (for 1F1B)."""
    stage = StageWork(
        forward=_segs("forward", f),
        backward=_segs("backward", i + w),
        backward_input=_segs("backward_input", i),
        backward_weight=_segs("backward_weight", w),
        send_forward=P2P(duration_s=p2p_s, num_bytes=10.0),
        send_backward=P2P(duration_s=p2p_s, num_bytes=10.0),
        activation_bytes=activation_bytes,
    )
    rank = RankWork(static_bytes=static_bytes, grad_sync=(), optimizer=())
    return PipelineWork(stages=(stage,) * p, ranks=(rank,) * p, num_microbatches=m)


def idle_s(result: SimResult, busy_s: float) -> float:
    """Idle compute time of each rank (all ranks do the same busy_s here)."""
    return result.pipeline_time_s - busy_s


# --- builder -----------------------------------------------------------------------------


def test_order_p4_m8() -> None:
    # The paper's steady triple on rank r at slot x: (F_x, I_(x-(p-1-r)), W_(x-(p-1))),
    # slots 0..m+p-2, out-of-range indices dropped. Rank 0: W right after each I (1F1B
    # order with B split); rank 3: first W after 3 (F, I) pairs, last 3 W at the tail.
    assert rows(zb(4, 8)) == [
        "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 "
        "0I5 0W5 0I6 0W6 0I7 0W7",
        "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 "
        "1I6 1W5 1I7 1W6 1W7",
        "2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2F6 2I5 2W3 2F7 2I6 2W4 "
        "2I7 2W5 2W6 2W7",
        "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 "
        "3W5 3W6 3W7",
    ]


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 2), (3, 7), (4, 2), (4, 8), (5, 5), (8, 3)])
def test_forwards_and_inputs_follow_1f1b_and_rank_r_defers_w_by_r(p: int, m: int) -> None:
    # Independent description of the same order (paper §2.1): without the W, each rank runs
    # 1F1B with B -> I; W_j comes right after I_(j+r) when that exists, else at the tail in
    # micro-batch order.
    one_f_one_b = build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m)
    for rank, row in enumerate(zb(p, m)):
        no_w = [a for a in row if a.kind is not _W]
        assert [(a.kind, a.microbatch) for a in no_w] == [
            (_I if a.kind is ActionKind.FULL_BACKWARD else a.kind, a.microbatch)
            for a in one_f_one_b[rank]
        ]
        tail = [a.microbatch for a in row[len(row) - min(rank, m) :]]
        for j in range(m):
            k = row.index(Action(stage=rank, kind=_W, microbatch=j))
            if j + rank < m:
                assert row[k - 1] == Action(stage=rank, kind=_I, microbatch=j + rank)
            else:
                assert j in tail
        assert tail == sorted(tail)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 2), (2, 5), (3, 3), (4, 2), (4, 9), (8, 32)])
def test_passes_the_invariant_checks(p: int, m: int) -> None:
    actions = zb(p, m)
    check_actions(actions, num_microbatches=m)
    for rank, row in enumerate(actions):
        assert len(row) == 3 * m
        assert {a.stage for a in row} == {rank}
    # One F, one I and one W per (stage, micro-batch), I before W on the rank.
    for row in actions:
        for j in range(m):
            where = {a.kind: k for k, a in enumerate(row) if a.microbatch == j}
            assert set(where) == {_F, _I, _W}
            assert where[_F] < where[_I] < where[_W]


@pytest.mark.parametrize(("p", "m"), [(2, 2), (3, 3), (4, 8), (8, 16)])
def test_unit_time_lockstep_takes_3m_plus_p_minus_1_steps(p: int, m: int) -> None:
    # Unit-time steps, F = I = W = 1: (p - 1)(t_F + t_I - t_W) = p - 1 idle steps per rank.
    grid = lockstep_grid(zb(p, m), num_stages=p)
    assert max(len(row) for row in grid) == 3 * m + p - 1


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (8, 8), (3, 7), (2, 1)])
def test_in_flight_is_min_p_m_on_every_rank(p: int, m: int) -> None:
    # A micro-batch is stored from its F to its W (engine: freed at W when split).
    def peak(row: tuple[Action, ...]) -> int:
        live = top = 0
        for action in row:
            live += {_F: 1, _I: 0, _W: -1}[action.kind]
            top = max(top, live)
        return top

    assert [peak(row) for row in zb(p, m)] == [min(p, m)] * p
    plan = plan_from_fields(dp=1, tp=1, pp=p, micro_batch_size=1, global_batch_size=m, schedule=ZB)
    assert [microbatches_in_flight(plan, rank=r) for r in range(p)] == [min(p, m)] * p
    # Rank 0 holds exactly what it holds under 1F1B (paper §2.1).
    flat = plan_from_fields(dp=1, tp=1, pp=p, micro_batch_size=1, global_batch_size=m)
    assert microbatches_in_flight(plan, rank=0) == microbatches_in_flight(flat, rank=0)


def test_builder_refuses_one_rank_and_vpp() -> None:
    with pytest.raises(SpecError, match=re.escape("needs pp > 1 (got num_ranks=1); use 1f1b")):
        build_actions(ZB, num_ranks=1, num_microbatches=4)
    with pytest.raises(SpecError, match=re.escape("zb-h1 needs vpp == 1 (got vpp=2)")):
        build_actions(ZB, num_ranks=4, num_microbatches=8, vpp=2)


def test_builds_are_deterministic() -> None:
    assert zb(4, 8) == zb(4, 8)
    assert rows(zb(4, 8)) != rows(
        build_actions(Schedule.ONE_F_ONE_B, num_ranks=4, num_microbatches=8)
    )


# --- torch.distributed.pipelining cross-check (skipped without torch) --------------------


def _torch_zero_bubble(p: int, m: int) -> list[str]:
    """Compute order of torch's ``ScheduleInterleavedZeroBubble`` with ONE stage per rank.

    The class is built for real (its __init__ plans every rank, adds the dependency bubbles
    and lowers the plan with communication) on a stand-in stage: planning reads only the
    stage's group size, rank, stage count and ``submod`` (None: nothing compiled), so no
    process group is needed.
    """
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = getattr(schedules, "ScheduleInterleavedZeroBubble", None)
    if cls is None:
        pytest.skip("this torch has no ScheduleInterleavedZeroBubble")
    stage = SimpleNamespace(submod=None, group_size=p, group_rank=0, num_stages=p, stage_index=0)
    try:
        schedule = cls([stage], n_microbatches=m)
    except (AttributeError, TypeError) as exc:  # planning API drifted: cannot compare
        pytest.skip(f"cannot plan {cls.__name__} on a stand-in stage: {exc}")
    order = schedule.pipeline_order
    return [" ".join(str(a) for a in order[r] if a is not None) for r in range(p)]


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 8), (4, 4), (4, 2), (3, 6), (8, 16), (4, 12)])
def test_order_matches_torch_interleaved_zero_bubble_with_one_stage_per_rank(
    p: int, m: int
) -> None:
    # torch's class implements the paper's ZB1P (= ZB-H1) and accepts one stage per rank:
    # warm-up p - r - 1 forwards, (F, I) pairs, and W from the rank's (r + 1)-th pair on
    # (``_get_1f1b_rank_ops`` with num_1f1b_microbatches = rank), the rest at the end.
    assert rows(zb(p, m)) == _torch_zero_bubble(p, m)


def test_torch_refuses_some_counts_we_build() -> None:
    # torch asks m to be a multiple of max(1, m // p) "rounds", an interleaving rule that
    # does not change the order with one stage per rank; its per-rank planner gives ours.
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = getattr(schedules, "ScheduleInterleavedZeroBubble", None)
    planner = getattr(cls, "_calculate_single_rank_operations", None)
    if planner is None:
        pytest.skip("this torch has no ScheduleInterleavedZeroBubble planner")
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        _torch_zero_bubble(3, 7)
    fake = SimpleNamespace(pp_group_size=3, n_local_stages=1, _n_microbatches=7)
    fake.microbatches_per_round = 7 // 2
    theirs = [" ".join(str(a) for a in planner(fake, r) if a is not None) for r in range(3)]
    assert rows(zb(3, 7)) == theirs


# --- engine: exact timeline, bubble against the paper, memory -----------------------------


def test_two_ranks_two_microbatches_exact_timeline() -> None:
    # F = I = W = 1 ms, transfers 0.1 ms (not blocking).
    # rank 0: 0F0 0F1 0I0 0W0 0I1 0W1; rank 1: 1F0 1I0 1F1 1I1 1W0 1W1.
    # 0F0 [0, 1] sent [1, 1.1]; 0F1 [1, 2] sent [2, 2.1].
    # 1F0 [1.1, 2.1]; 1I0 [2.1, 3.1] (last stage) sent [3.1, 3.2]; 1F1 [3.1, 4.1];
    # 1I1 [4.1, 5.1] sent [5.1, 5.2]; 1W0 [5.1, 6.1]; 1W1 [6.1, 7.1].
    # 0I0 waits for 1I0's gradient: [3.2, 4.2]; 0W0 [4.2, 5.2]; 0I1 [5.2, 6.2]; 0W1 [6.2, 7.2].
    # Same work under 1F1B (B = I + W = 2 ms) ends at 9.2 ms (tests/unit/test_engine.py).
    result = simulate(zb(2, 2), work(2, 2, f=MS, i=MS, w=MS, p2p_s=0.1 * MS))
    compute = result.timeline[result.timeline["stream"] == "compute"]
    letter = {"forward": "F", "backward_input": "I", "backward_weight": "W"}
    got = {
        f"{r.rank}:{r.stage}{letter[r.kind]}{r.microbatch}": (r.start_s / MS, r.end_s / MS)
        for r in compute.itertuples()
    }
    want = {
        "0:0F0": (0, 1),
        "0:0F1": (1, 2),
        "0:0I0": (3.2, 4.2),
        "0:0W0": (4.2, 5.2),
        "0:0I1": (5.2, 6.2),
        "0:0W1": (6.2, 7.2),
        "1:1F0": (1.1, 2.1),
        "1:1I0": (2.1, 3.1),
        "1:1F1": (3.1, 4.1),
        "1:1I1": (4.1, 5.1),
        "1:1W0": (5.1, 6.1),
        "1:1W1": (6.1, 7.1),
    }
    assert sorted(got) == sorted(want)
    for key, span in want.items():
        assert got[key] == pytest.approx(span, abs=1e-9), key
    sends = result.timeline[result.timeline["stream"] == "pp_send"]
    assert [(r.rank, r.kind, r.microbatch) for r in sends.itertuples()] == [
        (0, "send_forward", 0),
        (0, "send_forward", 1),
        (1, "send_backward", 0),
        (1, "send_backward", 1),
    ]
    assert result.pipeline_time_s == pytest.approx(7.2 * MS, abs=1e-12)
    # each rank computes 6 ms: idle 1.2 ms (rank 0 [2, 3.2]; rank 1 [0, 1.1] + [7.1, 7.2])
    assert result.per_rank_bubble_fraction == pytest.approx((1.2 / 7.2, 1.2 / 7.2), abs=1e-9)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (3, 7), (4, 4), (4, 8), (8, 8), (8, 16)])
def test_uniform_bubble_is_the_papers_closed_form_a_third_of_1f1b(p: int, m: int) -> None:
    # Paper §2.1 with t_F = t_B = t_W = 1 (t_B = our I): 1F1B idles (p-1)(t_F + t_B + t_W)
    # = 3(p-1) per rank, ZB-H1 (p-1)(t_F + t_B - t_W) = p - 1, a third. Free transfers.
    uniform = work(p, m)
    result = simulate(zb(p, m), uniform)
    flat = simulate(build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m), uniform)
    busy = 3.0 * m
    assert idle_s(result, busy) == pytest.approx(p - 1, abs=1e-9)
    assert idle_s(flat, busy) == pytest.approx(3 * (p - 1), abs=1e-9)
    expected = (p - 1) / (3 * m + p - 1)
    assert result.per_rank_bubble_fraction == pytest.approx((expected,) * p, abs=1e-12)
    assert result.bubble_fraction == pytest.approx(expected, abs=1e-12)
    assert flat.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize(("f", "i", "w"), [(2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (3.0, 2.0, 1.0)])
@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 8), (3, 7)])
def test_unequal_costs_bubble_is_the_papers_closed_form(
    f: float, i: float, w: float, p: int, m: int
) -> None:
    # (p-1)(t_F + t_I - t_W) per rank (paper §2.1); these cases keep t_W <= min(t_F, t_I)
    # and m >= p, where every tail slot of the 1F1B bubble is filled by a W.
    result = simulate(zb(p, m), work(p, m, f=f, i=i, w=w))
    assert idle_s(result, m * (f + i + w)) == pytest.approx((p - 1) * (f + i - w), abs=1e-9)


@pytest.mark.parametrize(("p", "m"), [(4, 2), (4, 3), (8, 5)])
def test_fewer_microbatches_than_ranks_leave_part_of_the_tail_unfilled(p: int, m: int) -> None:
    # With m < p only m W per rank exist: the bubble lies between the closed form (p - 1)
    # and 1F1B's 3(p - 1), and the schedule still runs.
    result = simulate(zb(p, m), work(p, m))
    flat = simulate(
        build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m), work(p, m)
    )
    assert p - 1 < idle_s(result, 3.0 * m) < idle_s(flat, 3.0 * m)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (3, 3)])
def test_engine_peak_memory_equals_analytic_in_flight(p: int, m: int) -> None:
    # 10 bytes per micro-batch, 1000 static: the engine (freed at W) must reach the analytic
    # peak of every rank; rank 0 is also 1F1B's peak.
    uniform = work(p, m, activation_bytes=10.0, static_bytes=1000.0)
    result = simulate(zb(p, m), uniform)
    plan = plan_from_fields(dp=1, tp=1, pp=p, micro_batch_size=1, global_batch_size=m, schedule=ZB)
    analytic = [1000.0 + 10.0 * microbatches_in_flight(plan, rank=r) for r in range(p)]
    assert list(result.peak_memory_bytes) == analytic
    flat = simulate(build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m), uniform)
    assert result.peak_memory_bytes[0] == flat.peak_memory_bytes[0]
    assert result.memory.groupby("rank")["bytes"].last().tolist() == [1000.0] * p


def test_end_to_end_peak_memory_equals_analytic() -> None:
    # megatron-1.7b (24 layers) on the round-number profile, pp 4, m 8: cost.py prices I and
    # W, the engine frees at W; every rank's simulated peak must equal rank_memory's total,
    # with min(p, m) = 4 micro-batches of activations in flight on every rank.
    model = resolve_model("megatron-1.7b")
    prof = round_profile()
    plan = plan_from_fields(
        dp=1,
        tp=1,
        pp=4,
        micro_batch_size=1,
        global_batch_size=8,
        recompute=Recompute.FULL,
        schedule=ZB,
    )
    ev = evaluate(model, plan, prof)
    assert isinstance(ev, Evaluation)
    for rank in range(plan.pp):
        breakdown = rank_memory(model, plan, prof, rank=rank)
        per_mb = microbatch_activation_bytes(model, plan, rank=rank)
        assert breakdown.activations_bytes == pytest.approx(4 * per_mb, rel=1e-15)
        assert ev.result.peak_memory_bytes[rank] == pytest.approx(breakdown.total_bytes, rel=1e-12)
    kinds = set(ev.result.timeline["kind"])
    assert {"backward_input", "backward_weight"} <= kinds and "backward" not in kinds


def test_simulation_is_deterministic() -> None:
    stages = tuple(
        StageWork(
            forward=_segs("forward", (1 + 0.1 * s) * MS),
            backward=_segs("backward", (2 + 0.3 * s) * MS),
            backward_input=_segs("backward_input", (1.2 + 0.1 * s) * MS),
            backward_weight=_segs("backward_weight", (0.8 + 0.2 * s) * MS),
            send_forward=P2P(duration_s=(0.1 + 0.01 * s) * MS, num_bytes=1.0),
            send_backward=P2P(duration_s=(0.1 + 0.01 * s) * MS, num_bytes=1.0),
            activation_bytes=1e6 * (s + 1),
        )
        for s in range(4)
    )
    ranks = (RankWork(static_bytes=1e9, grad_sync=(), optimizer=()),) * 4
    uneven = PipelineWork(stages=stages, ranks=ranks, num_microbatches=8)
    first, second = simulate(zb(4, 8), uneven), simulate(zb(4, 8), uneven)
    pd.testing.assert_frame_equal(first.timeline, second.timeline)
    pd.testing.assert_frame_equal(first.memory, second.memory)
    validate_timeline(first.timeline)
    # W of stage s: (0.8 + 0.2 s) ms, summed over 4 stages = 4.4 ms per micro-batch
    assert first.busy_s_by_kind["backward_weight"] == pytest.approx(8 * 4.4 * MS, abs=1e-12)


# --- invariant violations name the action and show the grid -------------------------------


def _assert_grid(info: pytest.ExceptionInfo[ScheduleError], *needles: str) -> None:
    message = str(info.value)
    for needle in ("Pipeline schedule (timestep x rank", "Rank 0", "Rank 1", "Step 0", *needles):
        assert needle in message, message


def test_w_before_its_i_is_reported_with_grid() -> None:
    with pytest.raises(ScheduleError) as info:
        check_actions(
            acts("0F0 0F1 0I0 0W1 0I1 0W0", "1F0 1I0 1F1 1I1 1W0 1W1"), num_microbatches=2
        )
    _assert_grid(info, "rank 0, step 3: 0W1 runs before 0I1", "Step 3: [0W1]  1I1 <-- ERROR HERE")


def test_missing_w_is_reported_with_grid() -> None:
    with pytest.raises(ScheduleError) as info:
        check_actions(acts("0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1F1 1I1 1W0"), num_microbatches=2)
    _assert_grid(info, "missing action 1W1", "1I1")


def test_deadlock_is_reported_with_grid() -> None:
    # Rank 0 starts 0I0 before sending 0F1; rank 1 runs 1F1 before 1I0.
    with pytest.raises(ScheduleError) as info:
        check_actions(
            acts("0F0 0I0 0W0 0F1 0I1 0W1", "1F0 1F1 1I0 1I1 1W0 1W1"), num_microbatches=2
        )
    _assert_grid(
        info,
        "deadlocks at timestep 2",
        "rank 0 waits at 0I0 for 1B0/1I0 (rank 1)",
        "rank 1 waits at 1F1 for 0F1 (rank 0)",
    )


# --- plan, planner, backtest -------------------------------------------------------------


def test_plan_validation_names_values() -> None:
    kw = dict(dp=1, tp=1, micro_batch_size=1, global_batch_size=8, schedule=ZB)
    with pytest.raises(SpecError, match=re.escape("schedule zb-h1 needs pp > 1 (got pp=1)")):
        plan_from_fields(pp=1, **kw)
    with pytest.raises(SpecError, match=re.escape("schedule zb-h1 needs vpp == 1 (got vpp=2)")):
        plan_from_fields(pp=4, vpp=2, **kw)
    plan = plan_from_fields(pp=4, **{**kw, "global_batch_size": 3})  # m < p is allowed
    assert plan.label().endswith("zb-h1") and plan.num_microbatches == 3


def test_default_search_offers_zb_h1_only_with_a_pipeline_and_vpp_1() -> None:
    space = SearchSpace(
        zero_stages=(0,), recomputes=(Recompute.FULL,), sequence_parallel=(False,),
        micro_batch_size=(1,), tp=(1,),
    )  # fmt: skip
    assert ZB in space.schedules
    plans = list(enumerate_plans(num_gpus=4, global_batch_size=8, space=space, num_layers=8))
    with_zb = {(p.pp, p.vpp) for p in plans if p.schedule is ZB}
    assert with_zb == {(2, 1), (4, 1)}
    assert {(p.pp, p.vpp) for p in plans if p.schedule is Schedule.INTERLEAVED_1F1B} == {
        (2, 2),
        (2, 4),
        (4, 2),
    }
    assert not [p for p in plans if p.pp == 1 and p.schedule is not Schedule.ONE_F_ONE_B]


def _row(**cells: str) -> RunRow:
    return RunRow(path="runs.csv", line=2, cells={"row_id": "Z1", **cells})


@pytest.mark.parametrize(
    ("cells", "year", "offered"),
    [
        ({"framework": "Megatron-LM (2023)"}, 2023, False),
        ({"source_locator": "arXiv:2401.10241"}, 2024, True),
        ({"source_locator": "SC21"}, 2021, False),
        ({"framework": "NeMo (nvcr.io/nvidia/nemo:23.11)"}, 2023, False),
        ({"framework": "torchtitan (2024)"}, 2024, True),
        ({"framework": "PyTorch 2.1 FSDP"}, None, True),
        ({}, None, True),
        # NVIDIA's Megatron family has no zero-bubble schedule, whatever the date
        ({"framework": "Megatron-LM (2024)"}, 2024, False),
        ({"framework": "NeMo 24.07"}, 2024, False),
        ({"framework": "Megatron-Bridge 25.11"}, 2025, False),
        # nor has DeepSpeed's pipeline engine (TrainSchedule only)
        ({"framework": "Megatron-DeepSpeed (2024)"}, 2024, False),
    ],
)
def test_backtest_offers_zb_h1_from_2024_or_undated(
    cells: dict[str, str], year: int | None, offered: bool
) -> None:
    row = _row(**cells)
    assert run_year(row) == year
    assert (
        first_year("zero_bubble", frozenset()) == 2024
    )  # Qi et al., ICLR 2024 (arXiv:2401.10241, January 2024)
    _, schedules = _pipeline_schedule(row, year, [])
    assert (ZB in schedules) is offered
    _, stated_flat = _pipeline_schedule(_row(virtual_pipeline_size="1", **cells), year, [])
    assert (ZB in stated_flat) is offered
    _, stated_vpp = _pipeline_schedule(_row(virtual_pipeline_size="2", **cells), year, [])
    assert stated_vpp == (Schedule.INTERLEAVED_1F1B,)


@pytest.mark.parametrize(
    "framework", ["Megatron-LM (2021)", "Megatron-LM (2024)", "NeMo 24.07", "DeepSpeed (2022)"]
)
def test_megatron_and_deepspeed_rows_search_only_1f1b_schedules(framework: str) -> None:
    """get_forward_backward_func (megatron/core/pipeline_parallel/schedules.py) picks 1F1B
    with or without interleaving; DeepSpeed's engine runs TrainSchedule: never GPipe."""
    for vpp in ("", "1"):
        row = _row(framework=framework, virtual_pipeline_size=vpp)
        _, schedules = _pipeline_schedule(row, run_year(row), [])
        assert Schedule.GPIPE not in schedules and ZB not in schedules
        assert Schedule.ONE_F_ONE_B in schedules
