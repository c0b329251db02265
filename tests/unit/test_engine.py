"""SimPy engine: exact timelines on round numbers, bubbles and memory read from events.

Times in the hand-worked examples are in milliseconds (MS); forward 1 ms, backward 2 ms,
each P2P transfer 0.1 ms unless a test says otherwise.
"""

from __future__ import annotations

import pandas as pd
import pytest

from plansim.analytic.stored_activations import microbatches_in_flight
from plansim.schedule import Action, ScheduleError, build_actions
from plansim.schedule.actions import PerRankActions
from plansim.sim import COLUMNS, SimResult, make_timeline, simulate, validate_timeline
from plansim.sim.timeline import TimelineError
from plansim.specs.plan import Schedule, plan_from_fields
from plansim.specs.work import P2P, PipelineWork, RankWork, Segment, StageWork

MS = 1e-3
TOL = 1e-12


def seg(kind: str, duration_s: float, stream: str = "compute") -> Segment:
    return Segment(kind=kind, stream=stream, duration_s=duration_s)


def stage_work(
    *,
    forward: tuple[Segment, ...] = (seg("forward", 1 * MS),),
    backward: tuple[Segment, ...] = (seg("backward", 2 * MS),),
    backward_input: tuple[Segment, ...] = (),
    backward_weight: tuple[Segment, ...] = (),
    p2p_s: float = 0.1 * MS,
    activation_bytes: float = 1.0,
) -> StageWork:
    return StageWork(
        forward=forward,
        backward=backward,
        backward_input=backward_input,
        backward_weight=backward_weight,
        send_forward=P2P(duration_s=p2p_s, num_bytes=100.0),
        send_backward=P2P(duration_s=p2p_s, num_bytes=100.0),
        activation_bytes=activation_bytes,
    )


def pipeline(
    num_ranks: int,
    num_microbatches: int,
    stage: StageWork | None = None,
    *,
    rank: RankWork | None = None,
    num_stages: int | None = None,
) -> PipelineWork:
    stage = stage or stage_work()
    rank = rank or RankWork(static_bytes=0.0, grad_sync=(), optimizer=())
    return PipelineWork(
        stages=(stage,) * (num_stages or num_ranks),
        ranks=(rank,) * num_ranks,
        num_microbatches=num_microbatches,
    )


def acts(*rows: str) -> PerRankActions:
    return tuple(tuple(Action.parse(s) for s in row.split()) for row in rows)


def events(result: SimResult, stream: str = "compute") -> dict[str, tuple[float, float]]:
    """{'<rank>:<stage><F|B><mb>': (start_ms, end_ms)} for one stream."""
    letter = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
    rows = result.timeline[result.timeline["stream"] == stream]
    return {
        f"{r.rank}:{r.stage}{letter.get(r.kind, r.kind)}{r.microbatch}": (
            r.start_s / MS,
            r.end_s / MS,
        )
        for r in rows.itertuples()
    }


def assert_times(got: dict[str, tuple[float, float]], want: dict[str, tuple[float, float]]) -> None:
    assert sorted(got) == sorted(want)
    for key, (start, end) in want.items():
        assert got[key] == pytest.approx((start, end), abs=1e-9), key


# --- exact timelines ---------------------------------------------------------------------


def test_one_f_one_b_two_ranks_two_microbatches_exact() -> None:
    # rank 0: 0F0 0F1 0B0 0B1; rank 1: 1F0 1B0 1F1 1B1.
    # 0F0 [0, 1]; its activation travels [1, 1.1]; 1F0 [1.1, 2.1]; 0F1 [1, 2], sent [2, 2.1].
    # 1B0 [2.1, 4.1] (last stage: no gradient to wait for); 1F1 [4.1, 5.1]; 1B1 [5.1, 7.1].
    # 1B0's gradient travels [4.1, 4.2] -> 0B0 [4.2, 6.2]; 1B1's [7.1, 7.2] -> 0B1 [7.2, 9.2].
    result = simulate(
        build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=2), pipeline(2, 2)
    )
    assert_times(
        events(result),
        {
            "0:0F0": (0, 1),
            "0:0F1": (1, 2),
            "0:0B0": (4.2, 6.2),
            "0:0B1": (7.2, 9.2),
            "1:1F0": (1.1, 2.1),
            "1:1B0": (2.1, 4.1),
            "1:1F1": (4.1, 5.1),
            "1:1B1": (5.1, 7.1),
        },
    )
    send = {"send_forward": "F", "send_backward": "B"}
    sends = {
        f"{r.rank}:{r.stage}{send[r.kind]}{r.microbatch}": (r.start_s / MS, r.end_s / MS)
        for r in result.timeline[result.timeline["stream"] == "pp_send"].itertuples()
    }
    assert_times(
        sends,
        {"0:0F0": (1, 1.1), "0:0F1": (2, 2.1), "1:1B0": (4.1, 4.2), "1:1B1": (7.1, 7.2)},
    )
    recv = {"recv_forward": "F", "recv_backward": "B"}
    recvs = {
        f"{r.rank}:{r.stage}{recv[r.kind]}{r.microbatch}": (r.start_s / MS, r.end_s / MS)
        for r in result.timeline[result.timeline["stream"] == "pp_recv"].itertuples()
    }
    assert_times(
        recvs,
        {"1:1F0": (1, 1.1), "1:1F1": (2, 2.1), "0:0B0": (4.1, 4.2), "0:0B1": (7.1, 7.2)},
    )
    assert result.pipeline_time_s == pytest.approx(9.2 * MS, abs=TOL)
    assert result.step_time_s == pytest.approx(9.2 * MS, abs=TOL)
    # each rank computes 2 * (1 + 2) = 6 ms of 9.2 ms
    assert result.per_rank_bubble_fraction == pytest.approx((3.2 / 9.2, 3.2 / 9.2), abs=1e-9)
    assert result.num_events == 16 == len(result.timeline)
    assert result.busy_s_by_kind == pytest.approx(
        {
            "forward": 4 * MS,
            "backward": 8 * MS,
            "send_forward": 0.2 * MS,
            "recv_forward": 0.2 * MS,
            "send_backward": 0.2 * MS,
            "recv_backward": 0.2 * MS,
        },
        abs=TOL,
    )


def test_gpipe_two_ranks_two_microbatches_exact() -> None:
    # rank 0: 0F0 [0, 1], 0F1 [1, 2]; activations arrive at 1.1 and 2.1.
    # rank 1: 1F0 [1.1, 2.1], 1F1 [2.1, 3.1], 1B0 [3.1, 5.1], 1B1 [5.1, 7.1].
    # gradients arrive at 5.2 and 7.2: 0B0 [5.2, 7.2], 0B1 [7.2, 9.2].
    result = simulate(
        build_actions(Schedule.GPIPE, num_ranks=2, num_microbatches=2), pipeline(2, 2)
    )
    assert_times(
        events(result),
        {
            "0:0F0": (0, 1),
            "0:0F1": (1, 2),
            "0:0B0": (5.2, 7.2),
            "0:0B1": (7.2, 9.2),
            "1:1F0": (1.1, 2.1),
            "1:1F1": (2.1, 3.1),
            "1:1B0": (3.1, 5.1),
            "1:1B1": (5.1, 7.1),
        },
    )
    assert result.pipeline_time_s == pytest.approx(9.2 * MS, abs=TOL)


def test_sends_queue_on_the_fifo_pp_send_stream() -> None:
    # Transfers of 1.5 ms outlast a 1 ms forward: 0F1's send waits for 0F0's to end.
    # sends [1, 2.5] and [2.5, 4]; 1F0 [2.5, 3.5]; 1F1 [4, 5]; 1B0 [5, 7]; 1B1 [7, 9].
    # gradients [7, 8.5] and [9, 10.5]; 0B0 [8.5, 10.5]; 0B1 [10.5, 12.5].
    result = simulate(
        build_actions(Schedule.GPIPE, num_ranks=2, num_microbatches=2),
        pipeline(2, 2, stage_work(p2p_s=1.5 * MS)),
    )
    assert_times(
        events(result),
        {
            "0:0F0": (0, 1),
            "0:0F1": (1, 2),
            "0:0B0": (8.5, 10.5),
            "0:0B1": (10.5, 12.5),
            "1:1F0": (2.5, 3.5),
            "1:1F1": (4, 5),
            "1:1B0": (5, 7),
            "1:1B1": (7, 9),
        },
    )
    sends = result.timeline[result.timeline["stream"] == "pp_send"]
    got = [x for r in sends.itertuples() for x in (r.rank, r.start_s / MS, r.end_s / MS)]
    assert got == pytest.approx([0, 1, 2.5, 0, 2.5, 4, 1, 7, 8.5, 1, 9, 10.5], abs=1e-9)


def test_zero_length_transfers_still_order_events() -> None:
    result = simulate(
        build_actions(Schedule.GPIPE, num_ranks=2, num_microbatches=1),
        pipeline(2, 1, stage_work(p2p_s=0.0)),
    )
    assert_times(
        events(result),
        {"0:0F0": (0, 1), "1:1F0": (1, 2), "1:1B0": (2, 4), "0:0B0": (4, 6)},
    )
    recvs = result.timeline[result.timeline["stream"] == "pp_recv"]
    assert [(r.kind, r.start_s / MS, r.end_s / MS) for r in recvs.itertuples()] == [
        ("recv_forward", 1.0, 1.0),
        ("recv_backward", 4.0, 4.0),
    ]


# --- bubble, memory, once-per-step work --------------------------------------------------


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 1), (4, 2), (4, 4), (4, 8), (3, 7), (8, 3)])
def test_uniform_bubble_matches_closed_form(schedule: Schedule, p: int, m: int) -> None:
    # Narayanan et al. SC21 §2.2: bubble (p-1)/(m+p-1) with uniform costs and free P2P.
    uniform = stage_work(
        forward=(seg("forward", 1.0),), backward=(seg("backward", 1.0),), p2p_s=0.0
    )
    result = simulate(
        build_actions(schedule, num_ranks=p, num_microbatches=m), pipeline(p, m, uniform)
    )
    expected = (p - 1) / (m + p - 1)
    assert result.pipeline_time_s == pytest.approx(2.0 * (m + p - 1), abs=TOL)
    assert result.bubble_fraction == pytest.approx(expected, abs=1e-12)
    assert result.per_rank_bubble_fraction == pytest.approx((expected,) * p, abs=1e-12)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 2), (4, 2, 8), (4, 3, 4), (3, 2, 6), (8, 4, 16)])
def test_interleaved_uniform_bubble_is_one_vth_of_1f1b(p: int, v: int, m: int) -> None:
    # Narayanan et al. SC21 §2.2.2: with t_f, t_b the per-micro-batch times of a rank's layers,
    # the interleaved bubble is (p-1)(t_f + t_b)/v against the ideal m(t_f + t_b), so
    # bubble_fraction = ((p-1)/v) / (m + (p-1)/v). Each chunk: F = B = 1 (t_f = t_b = v).
    chunk = stage_work(forward=(seg("forward", 1.0),), backward=(seg("backward", 1.0),), p2p_s=0.0)
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)
    result = simulate(actions, pipeline(p, m, chunk, num_stages=p * v))
    expected = ((p - 1) / v) / (m + (p - 1) / v)
    assert result.pipeline_time_s == pytest.approx(2.0 * m * v + 2.0 * (p - 1), abs=TOL)
    assert result.bubble_fraction == pytest.approx(expected, abs=1e-12)
    assert result.per_rank_bubble_fraction == pytest.approx((expected,) * p, abs=1e-12)
    # 1F1B on the same layers (one stage per rank: F = B = v) idles v times as long.
    whole = stage_work(
        forward=(seg("forward", float(v)),), backward=(seg("backward", float(v)),), p2p_s=0.0
    )
    flat = simulate(
        build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m), pipeline(p, m, whole)
    )
    busy = 2.0 * m * v
    assert (flat.pipeline_time_s - busy) == pytest.approx(v * (result.pipeline_time_s - busy))
    # ... so its bubble fraction is close to 1/v of 1F1B's (the ideal time is the same):
    # (p-1)/v / (m + (p-1)/v) lies between (p-1)/(v(m + p - 1)) and (p-1)/(v m).
    assert flat.bubble_fraction / v < result.bubble_fraction
    assert result.bubble_fraction < flat.bubble_fraction / v * (m + p - 1) / m


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 3, 4), (2, 4, 6), (4, 3, 12)])
def test_interleaved_peak_memory_matches_analytic_in_flight(p: int, v: int, m: int) -> None:
    # Each chunk stores 1/v of the rank's per-micro-batch bytes (cost.py): 30 / v per chunk.
    per_microbatch = 30.0
    work = pipeline(
        p,
        m,
        stage_work(activation_bytes=per_microbatch / v),
        rank=RankWork(static_bytes=1000.0, grad_sync=(), optimizer=()),
        num_stages=p * v,
    )
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)
    result = simulate(actions, work)
    plan = plan_from_fields(
        dp=1,
        tp=1,
        pp=p,
        vpp=v,
        micro_batch_size=1,
        global_batch_size=m,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    analytic = [1000.0 + per_microbatch * microbatches_in_flight(plan, rank=r) for r in range(p)]
    assert result.peak_memory_bytes == pytest.approx(analytic, rel=1e-12)
    assert result.memory.groupby("rank")["bytes"].last().tolist() == [1000.0] * p


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (3, 3)])
def test_peak_in_flight_activations(p: int, m: int) -> None:
    work = pipeline(
        p,
        m,
        stage_work(activation_bytes=10.0),
        rank=RankWork(static_bytes=1000.0, grad_sync=(), optimizer=()),
    )
    one_f_one_b = simulate(
        build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m), work
    )
    gpipe = simulate(build_actions(Schedule.GPIPE, num_ranks=p, num_microbatches=m), work)
    assert one_f_one_b.peak_memory_bytes == tuple(1000.0 + 10.0 * min(p - r, m) for r in range(p))
    assert gpipe.peak_memory_bytes == (1000.0 + 10.0 * m,) * p
    memory = one_f_one_b.memory
    assert list(memory.columns) == ["rank", "time_s", "bytes"]
    for rank in range(p):
        samples = memory[memory["rank"] == rank]
        assert samples["bytes"].iloc[0] == 1000.0 and samples["time_s"].iloc[0] == 0.0
        assert samples["bytes"].iloc[-1] == 1000.0  # everything freed at the end
        assert samples["bytes"].max() == one_f_one_b.peak_memory_bytes[rank]
        assert len(samples) == 1 + 2 * m  # static, then one change per F start and B end


def test_grad_sync_and_optimizer_extend_the_step_by_their_durations() -> None:
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=3, num_microbatches=4)
    base = simulate(actions, pipeline(3, 4))
    tail = RankWork(
        static_bytes=0.0,
        grad_sync=(seg("dp_comm", 0.5 * MS, "dp"), seg("dp_comm", 0.25 * MS, "dp")),
        optimizer=(seg("optimizer", 0.125 * MS),),
    )
    result = simulate(actions, pipeline(3, 4, rank=tail))
    assert result.pipeline_time_s == base.pipeline_time_s
    # rank 0 ends its pipeline work last in 1F1B, so it ends the step.
    assert result.step_time_s == pytest.approx(base.pipeline_time_s + 0.875 * MS, abs=TOL)
    tl = result.timeline
    for rank in range(3):
        last = tl[(tl["rank"] == rank) & (tl["stage"] >= 0) & (tl["stream"] == "compute")]
        dp = tl[(tl["rank"] == rank) & (tl["stream"] == "dp")]
        opt = tl[(tl["rank"] == rank) & (tl["kind"] == "optimizer")]
        assert dp["start_s"].iloc[0] == last["end_s"].max()
        assert dp["start_s"].iloc[1] == dp["end_s"].iloc[0]
        assert opt["start_s"].iloc[0] == dp["end_s"].iloc[1]
        assert (dp["stage"] == -1).all() and (opt["microbatch"] == -1).all()
    assert result.bubble_fraction == base.bubble_fraction  # tail work is not pipeline work
    pipeline_rows = tl[tl["stage"] >= 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(pipeline_rows, base.timeline)


def test_tp_segment_is_recorded_on_tp_and_blocks_compute() -> None:
    # One rank, GPipe: 0F0 compute [0, 1] + tp [1, 1.5]; 0F1 [1.5, 2.5] + tp [2.5, 3];
    # 0B0 [3, 5]; 0B1 [5, 7].
    forward = (seg("forward", 1 * MS), seg("tp_comm", 0.5 * MS, "tp"))
    result = simulate(
        build_actions(Schedule.GPIPE, num_ranks=1, num_microbatches=2),
        pipeline(1, 2, stage_work(forward=forward)),
    )
    assert_times(
        events(result),
        {"0:0F0": (0, 1), "0:0F1": (1.5, 2.5), "0:0B0": (3, 5), "0:0B1": (5, 7)},
    )
    assert_times(events(result, "tp"), {"0:0tp_comm0": (1, 1.5), "0:0tp_comm1": (2.5, 3)})
    assert result.bubble_fraction == 0.0  # the tp segments count as busy compute stream
    assert result.busy_s_by_kind["tp_comm"] == pytest.approx(1 * MS, abs=TOL)


def test_split_backward_frees_activations_at_w() -> None:
    # 0F0 [0, 1]; 1F0 [1, 2]; 1I0 [2, 3]; 1W0 [3, 4]; 0I0 [3, 4] (after 1I0's gradient);
    # 0W0 [4, 5]. Rank 1 keeps the activation until 1W0 ends at 4, not 1I0's end at 3.
    split = stage_work(
        backward=(),
        backward_input=(seg("backward_input", 1 * MS),),
        backward_weight=(seg("backward_weight", 1 * MS),),
        p2p_s=0.0,
        activation_bytes=5.0,
    )
    result = simulate(acts("0F0 0I0 0W0", "1F0 1I0 1W0"), pipeline(2, 1, split))
    assert_times(
        events(result),
        {
            "0:0F0": (0, 1),
            "1:1F0": (1, 2),
            "1:1I0": (2, 3),
            "1:1W0": (3, 4),
            "0:0I0": (3, 4),
            "0:0W0": (4, 5),
        },
    )
    rank1 = result.memory[result.memory["rank"] == 1]
    assert list(rank1["time_s"] / MS) == pytest.approx([0, 1, 4], abs=1e-9)
    assert list(rank1["bytes"]) == [0.0, 5.0, 0.0]


def test_adjacent_stages_on_one_rank_hand_over_without_transfer() -> None:
    # Two stages on one rank (vpp = 2 placement): no P2P events, back-to-back compute.
    result = simulate(acts("0F0 1F0 1B0 0B0"), pipeline(1, 1, num_stages=2))
    assert_times(
        events(result), {"0:0F0": (0, 1), "0:1F0": (1, 2), "0:1B0": (2, 4), "0:0B0": (4, 6)}
    )
    assert set(result.timeline["stream"]) == {"compute"}


# --- determinism, schema, errors, speed --------------------------------------------------


def _uneven_work(p: int, m: int) -> PipelineWork:
    stages = tuple(
        stage_work(
            forward=(seg("forward", (1 + 0.1 * s) * MS), seg("tp_comm", 0.05 * MS, "tp")),
            backward=(seg("backward", (2 + 0.3 * s) * MS),),
            p2p_s=(0.1 + 0.01 * s) * MS,
            activation_bytes=1e6 * (s + 1),
        )
        for s in range(p)
    )
    ranks = tuple(
        RankWork(static_bytes=1e9, grad_sync=(seg("dp_comm", 0.3 * MS, "dp"),), optimizer=())
        for _ in range(p)
    )
    return PipelineWork(stages=stages, ranks=ranks, num_microbatches=m)


def test_two_runs_give_identical_frames() -> None:
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=4, num_microbatches=8)
    first = simulate(actions, _uneven_work(4, 8))
    second = simulate(actions, _uneven_work(4, 8))
    pd.testing.assert_frame_equal(first.timeline, second.timeline)
    pd.testing.assert_frame_equal(first.memory, second.memory)
    assert first.busy_s_by_kind == second.busy_s_by_kind
    validate_timeline(first.timeline)
    assert tuple(first.timeline.columns) == COLUMNS
    sort_keys = ["start_s", "rank", "stream"]
    ordered = first.timeline.sort_values(sort_keys, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(ordered, first.timeline)


def test_interleaved_runs_give_identical_frames() -> None:
    p, v, m = 4, 2, 8
    stages = tuple(
        stage_work(
            forward=(seg("forward", (1 + 0.1 * s) * MS), seg("tp_comm", 0.05 * MS, "tp")),
            backward=(seg("backward", (2 + 0.3 * s) * MS),),
            p2p_s=(0.1 + 0.01 * s) * MS,
            activation_bytes=1e6 * (s + 1),
        )
        for s in range(p * v)
    )
    work = PipelineWork(stages=stages, ranks=_uneven_work(p, m).ranks, num_microbatches=m)
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)
    first, second = simulate(actions, work), simulate(actions, work)
    pd.testing.assert_frame_equal(first.timeline, second.timeline)
    pd.testing.assert_frame_equal(first.memory, second.memory)
    validate_timeline(first.timeline)
    # chunk boundaries cross ranks (stage 3 on rank 3 -> stage 4 on rank 0): real transfers
    sends = first.timeline[first.timeline["kind"] == "send_forward"]
    assert len(sends) == m * (p * v - 1)
    assert set(sends[sends["stage"] == 3]["rank"]) == {3}


def test_validate_timeline_rejects_broken_frames() -> None:
    good = make_timeline([(0, "compute", "forward", 0, 0, 0.0, 1.0, 0.0)])
    validate_timeline(good)
    with pytest.raises(TimelineError, match="columns"):
        validate_timeline(good.drop(columns=["bytes"]))
    with pytest.raises(TimelineError, match="end_s < start_s"):
        validate_timeline(make_timeline([(0, "compute", "forward", 0, 0, 2.0, 1.0, 0.0)]))
    with pytest.raises(TimelineError, match="streams"):
        validate_timeline(make_timeline([(0, "gpu", "forward", 0, 0, 0.0, 1.0, 0.0)]))
    two = make_timeline(
        [(0, "compute", "forward", 0, 0, 0.0, 1.0, 0.0), (0, "compute", "x", 0, 1, 1.0, 2.0, 0.0)]
    )
    with pytest.raises(TimelineError, match="not sorted"):
        validate_timeline(two.iloc[::-1].reset_index(drop=True))


def test_deadlocking_lists_raise_with_grid() -> None:
    with pytest.raises(ScheduleError) as info:
        simulate(acts("0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"), pipeline(2, 2))
    message = str(info.value)
    for needle in ("simulation stopped", "Rank 0", "Rank 1", "Step 1", "[0B0]", "[1F1]"):
        assert needle in message, message


def test_invalid_lists_are_rejected_before_running() -> None:
    with pytest.raises(ScheduleError, match="wrong rank"):
        simulate(acts("0F0 0B0 1F0", "1B0"), pipeline(2, 1))
    with pytest.raises(ScheduleError, match="missing action 1B0"):
        simulate(acts("0F0 0B0", "1F0"), pipeline(2, 1))
    with pytest.raises(ScheduleError, match="3 ranks of actions"):
        simulate(acts("0F0 0B0", "1F0 1B0", ""), pipeline(2, 1))


def test_sixteen_ranks_256_microbatches_event_count() -> None:
    # Speed is measured by benchmarks/bench_sim.py, not asserted here.
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=16, num_microbatches=256)
    result = simulate(actions, _uneven_work(16, 256))
    assert result.num_events == 16 * 256 * 3 + 2 * 2 * 15 * 256 + 16


def test_blocking_p2p_holds_the_sender_until_its_send_ends() -> None:
    # Same as the FIFO case (1.5 ms transfers), but synchronous sends (Megatron default):
    # rank 0: 0F0 [0, 1], send [1, 2.5], 0F1 [2.5, 3.5], send [3.5, 5].
    # rank 1: 1F0 [2.5, 3.5], 1F1 [5, 6], 1B0 [6, 8] + send [8, 9.5], 1B1 [9.5, 11.5],
    #         send [11.5, 13]; rank 0: 0B0 [9.5, 11.5], 0B1 [13, 15].
    work = pipeline(2, 2, stage_work(p2p_s=1.5 * MS))
    blocking = PipelineWork(
        stages=work.stages, ranks=work.ranks, num_microbatches=2, blocking_p2p=True
    )
    result = simulate(build_actions(Schedule.GPIPE, num_ranks=2, num_microbatches=2), blocking)
    assert_times(
        events(result),
        {
            "0:0F0": (0, 1),
            "0:0F1": (2.5, 3.5),
            "0:0B0": (9.5, 11.5),
            "0:0B1": (13, 15),
            "1:1F0": (2.5, 3.5),
            "1:1F1": (5, 6),
            "1:1B0": (6, 8),
            "1:1B1": (9.5, 11.5),
        },
    )
    assert result.pipeline_time_s == pytest.approx(15 * MS, abs=TOL)
