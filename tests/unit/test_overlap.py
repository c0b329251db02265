"""Overlapped DP gradient reduction and exposed communication, on hand-worked round numbers.

Engine cases use one rank unless a test says otherwise: actions 0F0 0B0 0F1 0B1 with
forward 1 ms and backward 2 ms, so F0 [0, 1], B0 [1, 3], F1 [3, 4], B1 [4, 6]; the
optimizer takes 0.5 ms. Times in the comments are in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.grad_buckets import BUCKET_MIN_PARAMS, grad_buckets, stage_parameters
from plansim.analytic.memory import rank_parameters
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.report.tables import evaluation_dict, plan_row
from plansim.schedule import Action, build_actions
from plansim.schedule.actions import PerRankActions
from plansim.sim import SimResult, simulate
from plansim.sim.timeline import exposed_comm_s, make_timeline
from plansim.specs.plan import ParallelPlan, Schedule, plan_from_fields
from plansim.specs.work import P2P, GradBucket, PipelineWork, RankWork, Segment, StageWork
from tests.unit.synthetic import round_profile

MS = 1e-3
OPTIMIZER = (Segment(kind="optimizer", stream="compute", duration_s=0.5 * MS),)


def acts(*rows: str) -> PerRankActions:
    return tuple(tuple(Action.parse(s) for s in row.split()) for row in rows)


def bucket(duration_ms: float, fraction: float = 1.0, kind: str = "dp_comm") -> GradBucket:
    seg = Segment(kind=kind, stream="dp", duration_s=duration_ms * MS, num_bytes=1.0)
    return GradBucket(segment=seg, ready_fraction=fraction)


def stage(
    *buckets: GradBucket,
    forward: tuple[Segment, ...] = (Segment(kind="forward", stream="compute", duration_s=MS),),
    backward: tuple[Segment, ...] = (
        Segment(kind="backward", stream="compute", duration_s=2 * MS),
    ),
    backward_input: tuple[Segment, ...] = (),
    backward_weight: tuple[Segment, ...] = (),
    p2p_ms: float = 0.0,
) -> StageWork:
    return StageWork(
        forward=forward,
        backward=backward,
        backward_input=backward_input,
        backward_weight=backward_weight,
        send_forward=P2P(duration_s=p2p_ms * MS, num_bytes=1.0),
        send_backward=P2P(duration_s=p2p_ms * MS, num_bytes=1.0),
        activation_bytes=0.0,
        grad_buckets=buckets,
    )


def work(
    stages: tuple[StageWork, ...],
    *,
    overlap: bool,
    num_ranks: int = 1,
    num_microbatches: int = 2,
    grad_sync: tuple[Segment, ...] = (),
) -> PipelineWork:
    rank = RankWork(static_bytes=0.0, grad_sync=grad_sync, optimizer=OPTIMIZER)
    return PipelineWork(
        stages=stages,
        ranks=(rank,) * num_ranks,
        num_microbatches=num_microbatches,
        overlap_grad_reduce=overlap,
    )


ONE_RANK = acts("0F0 0B0 0F1 0B1")


def rows(result: SimResult, stream: str) -> list[tuple[Any, ...]]:
    """(kind, stage, start_ms, end_ms) of one stream, in timeline order."""
    df = result.timeline[result.timeline["stream"] == stream]
    columns = (df["kind"], df["stage"], df["start_s"] / MS, df["end_s"] / MS)
    return list(zip(*(c.tolist() for c in columns), strict=True))


def assert_rows(got: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]]) -> None:
    """Same rows: labels exactly, times (floats) to 1e-9 ms."""
    assert len(got) == len(want), got
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-9), (g, w)


def optimizer_ms(result: SimResult, rank: int = 0) -> tuple[float, float]:
    df = result.timeline
    row = df[(df["kind"] == "optimizer") & (df["rank"] == rank)].iloc[0]
    return row["start_s"] / MS, row["end_s"] / MS


# --- the engine: when buckets start, what they add -----------------------------------------


@pytest.mark.parametrize("bucket_ms", [0.25, 0.9, 1.0])
def test_bucket_shorter_than_the_remaining_backward_adds_nothing(bucket_ms: float) -> None:
    # Ready halfway through B1 [4, 6], at 5; it runs [5, 5 + d] and d <= 1 ms of B1 remain.
    # The optimizer starts when B1 ends: [6, 6.5], as with no DP communication at all.
    result = simulate(ONE_RANK, work((stage(bucket(bucket_ms, 0.5)),), overlap=True))
    none = simulate(ONE_RANK, work((stage(),), overlap=True))
    assert_rows(rows(result, "dp"), [("dp_comm", 0, 5.0, 5.0 + bucket_ms)])
    assert result.step_time_s == pytest.approx(6.5 * MS, abs=1e-12)
    assert result.step_time_s == none.step_time_s
    assert result.exposed_s_by_kind == {"dp_comm": pytest.approx(0.0, abs=1e-15)}
    assert result.busy_s_by_kind["dp_comm"] == pytest.approx(bucket_ms * MS)


@pytest.mark.parametrize("bucket_ms", [1.25, 1.5, 3.0])
def test_longer_bucket_is_exposed_by_exactly_the_difference(bucket_ms: float) -> None:
    # [5, 5 + d] outlasts B1 by d - 1 ms: the optimizer waits for it.
    result = simulate(ONE_RANK, work((stage(bucket(bucket_ms, 0.5)),), overlap=True))
    extra = bucket_ms - 1.0
    assert optimizer_ms(result) == pytest.approx((6.0 + extra, 6.5 + extra))
    assert result.step_time_s == pytest.approx((6.5 + extra) * MS, abs=1e-12)
    assert result.exposed_s_by_kind["dp_comm"] == pytest.approx(extra * MS, abs=1e-12)


@pytest.mark.parametrize("bucket_ms", [0.25, 1.0, 3.0])
def test_without_overlap_the_whole_reduction_is_exposed(bucket_ms: float) -> None:
    # Same bucket, overlap off: it waits for the last action, [6, 6 + d], then the optimizer.
    result = simulate(ONE_RANK, work((stage(bucket(bucket_ms, 0.5)),), overlap=False))
    assert_rows(rows(result, "dp"), [("dp_comm", 0, 6.0, 6.0 + bucket_ms)])
    assert optimizer_ms(result) == pytest.approx((6.0 + bucket_ms, 6.5 + bucket_ms))
    assert result.step_time_s == pytest.approx((6.5 + bucket_ms) * MS, abs=1e-12)
    assert result.exposed_s_by_kind["dp_comm"] == pytest.approx(bucket_ms * MS, abs=1e-12)


def test_buckets_queue_fifo_and_the_optimizer_waits_for_the_last() -> None:
    # Ready at 4 + 2 x (0.25, 0.5, 0.5, 1) = 4.5, 5, 5, 6 during B1 [4, 6].
    # b0 [4.5, 5.5]; b1 ready at 5 waits for b0: [5.5, 5.7]; b2 (same ready time, queued
    # after b1) [5.7, 5.8]; b3 ready at B1's end: [6, 6.3]; embedding all-reduce (the rank's
    # grad_sync, queued after the last action) [6.3, 6.7]; optimizer [6.7, 7.2].
    buckets = (bucket(1.0, 0.25), bucket(0.2, 0.5), bucket(0.1, 0.5), bucket(0.3, 1.0))
    embedding = Segment(kind="embedding_grad_comm", stream="dp", duration_s=0.4 * MS)
    result = simulate(ONE_RANK, work((stage(*buckets),), overlap=True, grad_sync=(embedding,)))
    assert_rows(
        rows(result, "dp"),
        [
            ("dp_comm", 0, 4.5, 5.5),
            ("dp_comm", 0, 5.5, 5.7),
            ("dp_comm", 0, 5.7, 5.8),
            ("dp_comm", 0, 6.0, 6.3),
            ("embedding_grad_comm", -1, 6.3, 6.7),
        ],
    )
    durations = [d.segment.duration_s for d in buckets] + [embedding.duration_s]
    dp = result.timeline[result.timeline["stream"] == "dp"]
    assert (dp["end_s"] - dp["start_s"]).tolist() == pytest.approx(durations)
    assert dp["start_s"].iloc[1] == dp["end_s"].iloc[0]  # back to back, exactly
    assert optimizer_ms(result) == pytest.approx((6.7, 7.2))
    assert optimizer_ms(result)[0] * MS == dp["end_s"].max()
    # exposed: b3 and the embedding all-reduce run while nothing computes: 0.3 + 0.4
    assert result.exposed_s_by_kind == pytest.approx(
        {"dp_comm": 0.3 * MS, "embedding_grad_comm": 0.4 * MS}, abs=1e-12
    )


def test_split_backward_buckets_wait_for_w_not_i() -> None:
    # 0F0 [0, 1], 0I0 [1, 2], 0W0 [2, 3]: the weight gradients come from W, so a bucket
    # at half of the last backward is ready at 2.5, not 1.5. It runs [2.5, 3.5]; the
    # optimizer [3.5, 4].
    split = stage(
        bucket(1.0, 0.5),
        backward=(),
        backward_input=(Segment(kind="backward_input", stream="compute", duration_s=MS),),
        backward_weight=(Segment(kind="backward_weight", stream="compute", duration_s=MS),),
    )
    result = simulate(acts("0F0 0I0 0W0"), work((split,), overlap=True, num_microbatches=1))
    assert_rows(rows(result, "dp"), [("dp_comm", 0, 2.5, 3.5)])
    assert optimizer_ms(result) == pytest.approx((3.5, 4.0))


def test_chunks_on_one_rank_start_after_their_own_last_backward() -> None:
    # vpp-style placement: stages 0 and 1 on rank 0: 0F0 [0, 1], 1F0 [1, 2], 1B0 [2, 4],
    # 0B0 [4, 6]. Stage 1's bucket (1.5 ms, ready at the end of 1B0) runs [4, 5.5] beside
    # 0B0; stage 0's after 0B0: [6, 6.5]. Off: both after 0B0, stage 1 first (the order
    # of their last backward): [6, 7.5], [7.5, 8].
    stages = (stage(bucket(0.5)), stage(bucket(1.5)))
    on = simulate(acts("0F0 1F0 1B0 0B0"), work(stages, overlap=True, num_microbatches=1))
    off = simulate(acts("0F0 1F0 1B0 0B0"), work(stages, overlap=False, num_microbatches=1))
    assert_rows(rows(on, "dp"), [("dp_comm", 1, 4.0, 5.5), ("dp_comm", 0, 6.0, 6.5)])
    assert_rows(rows(off, "dp"), [("dp_comm", 1, 6.0, 7.5), ("dp_comm", 0, 7.5, 8.0)])
    assert on.step_time_s == pytest.approx(7.0 * MS)
    assert off.step_time_s == pytest.approx(8.5 * MS)


def test_two_ranks_reduce_while_the_other_rank_still_computes() -> None:
    # 1F1B, p = 2, m = 2, p2p 0.1 (test_engine's exact case): 0B1 [7.2, 9.2]; 1B1 [5.1, 7.1].
    # Stage 1's single bucket (2 ms, ready at 1B1's end) runs [7.1, 9.1], inside rank 0's
    # last backward: the step is rank 0's, 9.2 + the optimizer = 9.7, as without DP traffic.
    # Off, rank 1's bucket waits for 1B1 anyway (its last action): the same [7.1, 9.1].
    stages = (stage(bucket(0.8, 0.5), p2p_ms=0.1), stage(bucket(2.0), p2p_ms=0.1))
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=2)
    on = simulate(actions, work(stages, overlap=True, num_ranks=2))
    off = simulate(actions, work(stages, overlap=False, num_ranks=2))
    dp = on.timeline[on.timeline["stream"] == "dp"]
    columns = (dp["rank"], dp["start_s"] / MS, dp["end_s"] / MS)
    got = list(zip(*(c.tolist() for c in columns), strict=True))
    assert_rows(got, [(1, 7.1, 9.1), (0, 8.2, 9.0)])
    assert on.step_time_s == pytest.approx(9.7 * MS)
    # off: rank 0's bucket [9.2, 10.0], optimizer [10.0, 10.5]
    assert off.step_time_s == pytest.approx(10.5 * MS)
    # Per rank: rank 1 idles [7.1, 9.1] waiting for its reduction, but its send of 1B1's
    # gradient [7.1, 7.2] comes first in the priority: 1.9 dp_comm, 0.1 send_backward.
    # Rank 0 hides its own bucket [8.2, 9.0] (on); off it is exposed whole: 0.8 more.
    assert on.exposed_s_by_kind["dp_comm"] == pytest.approx(1.9 * MS, abs=1e-12)
    assert on.exposed_s_by_kind["send_backward"] == pytest.approx(0.1 * MS, abs=1e-12)
    assert off.exposed_s_by_kind["dp_comm"] == pytest.approx(2.7 * MS, abs=1e-12)


def test_overlap_flag_without_buckets_changes_nothing() -> None:
    grad_sync = (Segment(kind="dp_comm", stream="dp", duration_s=0.7 * MS),)
    on = simulate(ONE_RANK, work((stage(),), overlap=True, grad_sync=grad_sync))
    off = simulate(ONE_RANK, work((stage(),), overlap=False, grad_sync=grad_sync))
    pd.testing.assert_frame_equal(on.timeline, off.timeline)
    assert_rows(rows(on, "dp"), [("dp_comm", -1, 6.0, 6.7)])


# --- exposed communication by kind ---------------------------------------------------------


def test_exposed_by_kind_in_a_two_rank_pipeline() -> None:
    # test_engine's 1F1B p = 2, m = 2 case (F 1, B 2, P2P 0.1), no DP traffic.
    # rank 0 computes F0 [0, 1], F1 [1, 2], B0 [4.2, 6.2], B1 [7.2, 9.2]: its sends
    # [1, 1.1] (hidden by F1) and [2, 2.1] (idle: 0.1 send_forward); receives [4.1, 4.2]
    # and [7.1, 7.2] (idle: 0.2 recv_backward).
    # rank 1 computes F0 [1.1, 2.1], B0 [2.1, 4.1], F1 [4.1, 5.1], B1 [5.1, 7.1]: receives
    # [1, 1.1] (idle: 0.1 recv_forward) and [2, 2.1] (hidden by F0); sends [4.1, 4.2]
    # (hidden by F1) and [7.1, 7.2] (idle: 0.1 send_backward).
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=2)
    stages = (stage(p2p_ms=0.1), stage(p2p_ms=0.1))
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=())
    result = simulate(actions, PipelineWork(stages=stages, ranks=(rank, rank), num_microbatches=2))
    assert result.exposed_s_by_kind == pytest.approx(
        {
            "recv_backward": 0.2 * MS,
            "recv_forward": 0.1 * MS,
            "send_backward": 0.1 * MS,
            "send_forward": 0.1 * MS,
        },
        abs=1e-12,
    )
    assert list(result.exposed_s_by_kind) == sorted(result.exposed_s_by_kind)
    assert result.compute_busy_s == pytest.approx((6 * MS, 6 * MS))


def test_tp_counts_whole_and_wins_over_dp_running_beside_it() -> None:
    # B = backward 2 + blocking tp_comm 0.5: B0 [1, 3] + tp [3, 3.5], F1 [3.5, 4.5],
    # B1 [4.5, 6.5] + tp [6.5, 7]. The bucket, ready halfway through the 2.5 ms action at
    # 5.75, runs [5.75, 7.75]: [6.5, 7] goes to tp_comm (first in priority), [7, 7.75] to
    # dp_comm. Optimizer [7.75, 8.25].
    backward = (
        Segment(kind="backward", stream="compute", duration_s=2 * MS),
        Segment(kind="tp_comm", stream="tp", duration_s=0.5 * MS),
    )
    result = simulate(ONE_RANK, work((stage(bucket(2.0, 0.5), backward=backward),), overlap=True))
    assert_rows(rows(result, "dp"), [("dp_comm", 0, 5.75, 7.75)])
    assert result.exposed_s_by_kind == pytest.approx(
        {"dp_comm": 0.75 * MS, "tp_comm": 1.0 * MS}, abs=1e-12
    )
    assert result.compute_busy_s == pytest.approx((6.5 * MS,))  # 1 + 2 + 1 + 2 + 0.5
    assert result.step_time_s == pytest.approx(8.25 * MS)


def test_exposed_comm_attribution_is_order_independent() -> None:
    # rank 0: compute [0, 1]; dp [0.5, 3]; recv_forward [2, 2.5]; a kind not in the
    # priority list, "all_to_all", [2.75, 4]. Idle [1, 4]: recv_forward gets [2, 2.5],
    # dp_comm [1, 2] + [2.5, 3], all_to_all [3, 4]. Rank 1 only computes.
    raw = [
        (0, "compute", "forward", 0, 0, 0.0, 1.0, 0.0),
        (0, "dp", "dp_comm", -1, -1, 0.5, 3.0, 0.0),
        (0, "pp_recv", "recv_forward", 0, 0, 2.0, 2.5, 0.0),
        (0, "tp", "all_to_all", 0, 0, 2.75, 4.0, 0.0),
        (1, "compute", "forward", 1, 0, 0.0, 4.0, 0.0),
    ]
    expected = {"all_to_all": 1.0, "dp_comm": 1.5, "recv_forward": 0.5}
    assert exposed_comm_s(make_timeline(raw), num_ranks=2) == pytest.approx(expected)
    assert exposed_comm_s(make_timeline(raw[::-1]), num_ranks=2) == pytest.approx(expected)
    assert exposed_comm_s(make_timeline([]), num_ranks=1) == {}


def test_two_runs_give_identical_results_with_buckets() -> None:
    stages = tuple(
        stage(
            *(bucket(0.3 + 0.1 * s, f) for f in (0.25, 0.5, 1.0)),
            forward=(Segment(kind="forward", stream="compute", duration_s=(1 + 0.1 * s) * MS),),
            p2p_ms=0.1,
        )
        for s in range(8)
    )
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=4, num_microbatches=8, vpp=2)
    first = simulate(actions, work(stages, overlap=True, num_ranks=4, num_microbatches=8))
    second = simulate(actions, work(stages, overlap=True, num_ranks=4, num_microbatches=8))
    pd.testing.assert_frame_equal(first.timeline, second.timeline)
    assert first.exposed_s_by_kind == second.exposed_s_by_kind
    assert first.compute_busy_s == second.compute_busy_s
    assert (first.timeline["kind"] == "dp_comm").sum() == 8 * 3


def test_bucket_contract_is_validated() -> None:
    with pytest.raises(SpecError, match="must be 'dp'"):
        GradBucket(segment=Segment(kind="dp_comm", stream="compute", duration_s=1.0))
    with pytest.raises(SpecError, match=r"ready_fraction must be in \(0, 1\]"):
        bucket(1.0, 0.0)
    with pytest.raises(SpecError, match="ready in order"):
        stage(bucket(1.0, 1.0), bucket(1.0, 0.5))


# --- costing: buckets from the model and the plan ------------------------------------------

MODEL = resolve_model("megatron-1.7b")  # 24 layers, h 2304, tied embeddings (V 51200)


def plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {
        "dp": 2,
        "tp": 1,
        "pp": 2,
        "micro_batch_size": 1,
        "global_batch_size": 16,
    }
    return plan_from_fields(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("pp", "vpp"), [(1, 1), (2, 1), (4, 2), (2, 3)])
def test_stage_parameters_add_up_to_the_rank(pp: int, vpp: int) -> None:
    schedule = Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B
    p = plan(pp=pp, vpp=vpp, tp=2, dp=1, global_batch_size=8 * pp, schedule=schedule)
    for rank in range(pp):
        stages = range(rank, p.num_stages, pp)
        total = sum(stage_parameters(MODEL, p, stage=s).total for s in stages)
        assert total == pytest.approx(rank_parameters(MODEL, p, rank=rank), rel=1e-12)


def test_round_profile_buckets_hand_worked() -> None:
    # dp 2 in one node: a bucket of 40M params x 4 B (fp32 grads) = 160 MB; all-reduce on
    # the round profile = 10 us + 2(n-1)/n x 160 MB / 100 GB/s = 1.61 ms; ZeRO-1's
    # reduce-scatter moves (n-1)/n: 0.81 ms.
    prof = round_profile()
    for zero, first_s in ((0, 1.61e-3), (1, 0.81e-3)):
        p = plan(zero_stage=zero, overlap_grad_reduce=True)
        groups = layout_groups(p, gpus_per_node=prof.gpus_per_node)
        buckets = grad_buckets(MODEL, p, prof, groups, stage=0)
        params = stage_parameters(MODEL, p, stage=0)
        assert len(buckets) == math.ceil(params.total / BUCKET_MIN_PARAMS)
        assert buckets[0].segment.duration_s == pytest.approx(first_s, rel=1e-12)
        assert buckets[0].segment.num_bytes == 4.0 * BUCKET_MIN_PARAMS
        assert sum(b.num_params for b in buckets) == pytest.approx(params.total, rel=1e-12)
        fractions = [b.ready_fraction for b in buckets]
        # 12 layers of 63.7M params: the first 40M finish with the first layer (1/12) ...
        assert fractions[0] == pytest.approx(1 / 12)
        # ... the embedding (the tail, last in backward) at the end
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
        # Megatron buckets pipeline rank 0's first chunk only: stage 1 is one bucket
        last = grad_buckets(MODEL, p, prof, groups, stage=1)
        assert len(last) == 1 and last[0].ready_fraction == 1.0


def test_buckets_grow_with_dp() -> None:
    # bucket = max(40M, 1M x dp) params: dp 64 gives 64M-param buckets.
    prof = round_profile()
    p = plan(dp=64, global_batch_size=128, overlap_grad_reduce=True)
    groups = layout_groups(p, gpus_per_node=prof.gpus_per_node)
    buckets = grad_buckets(MODEL, p, prof, groups, stage=0)
    assert buckets[0].num_params == 64e6
    assert len(buckets) == math.ceil(stage_parameters(MODEL, p, stage=0).total / 64e6)


def test_cost_moves_the_reduction_into_stage_buckets() -> None:
    prof = round_profile()
    off = build_pipeline_work(MODEL, plan(), prof)
    on = build_pipeline_work(MODEL, plan(overlap_grad_reduce=True), prof)
    assert not off.overlap_grad_reduce and on.overlap_grad_reduce
    assert all(not s.grad_buckets for s in off.stages)
    assert [seg.kind for seg in off.ranks[0].grad_sync] == ["dp_comm", "embedding_grad_comm"]
    assert [seg.kind for seg in on.ranks[0].grad_sync] == ["embedding_grad_comm"]
    assert [len(s.grad_buckets) > 1 for s in on.stages] == [True, False]
    # the same bytes are reduced, split by stage and bucket
    moved = sum(b.segment.num_bytes for s in on.stages for b in s.grad_buckets)
    assert moved == pytest.approx(sum(r.grad_sync[0].num_bytes for r in off.ranks), rel=1e-12)
    # ZeRO-2 and ZeRO-3 reduce per micro-batch; dp 1 has nothing to reduce
    zero2 = build_pipeline_work(MODEL, plan(zero_stage=2, overlap_grad_reduce=True), prof)
    zero3 = build_pipeline_work(MODEL, plan(zero_stage=3, overlap_grad_reduce=True), prof)
    dp1 = build_pipeline_work(
        MODEL, plan(dp=1, global_batch_size=8, overlap_grad_reduce=True), prof
    )
    assert all(not s.grad_buckets for s in (*zero2.stages, *zero3.stages, *dp1.stages))


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_overlap_shortens_the_evaluated_step(zero: int) -> None:
    prof = round_profile()
    off = evaluate(MODEL, plan(zero_stage=zero), prof)
    on = evaluate(MODEL, plan(zero_stage=zero, overlap_grad_reduce=True), prof)
    assert isinstance(off, Evaluation) and isinstance(on, Evaluation)
    assert on.step_time_s < off.step_time_s
    assert on.exposed_comm_s_by_kind["dp_comm"] < off.exposed_comm_s_by_kind["dp_comm"]
    # ZeRO-2 overlaps its per-micro-batch reduce-scatters layer by layer, not in buckets
    assert off.num_grad_buckets == 0
    assert on.num_grad_buckets == 0 if zero == 2 else on.num_grad_buckets > 1
    # Compute is the same; the time saved is dp_comm that is no longer exposed.
    assert on.result.compute_busy_s == pytest.approx(off.result.compute_busy_s, rel=1e-12)
    doc = evaluation_dict(on)
    assert doc["plan"]["overlap_grad_reduce"] is True
    assert doc["exposed_comm_s_by_kind"] == dict(sorted(on.exposed_comm_s_by_kind.items()))
    assert doc["num_grad_buckets"] == on.num_grad_buckets
    assert len(doc["per_rank_compute_busy_s"]) == 2
    assert plan_row(on)["grad_reduce"] == "overlap" and plan_row(off)["grad_reduce"] == "end"
    assert on.plan.label().endswith("overlap-grad") and "overlap-grad" not in off.plan.label()


def test_plan_validates_the_flag() -> None:
    with pytest.raises(SpecError, match=r"plan\.overlap_grad_reduce"):
        plan(overlap_grad_reduce="yes")
    assert plan().overlap_grad_reduce is False  # Megatron's default
