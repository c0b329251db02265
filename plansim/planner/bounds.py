"""Guaranteed lower bounds on a plan's simulated step time, for branch-and-bound search.

A bound here is a time the engine (``plansim.sim.engine.simulate``) can never beat for the
same :class:`PipelineWork` and action lists, so the planner may skip simulating a candidate
whose bound exceeds the K-th best simulated step time and still return the exact top K.

Why it holds (facts of the engine, each pinned by its tests):

* a rank runs its actions one after another, in list order, and the segments of an action
  back to back; a segment or transfer alone takes exactly its ``duration_s``, and sharing a
  link only stretches it (``plansim.sim.links``: rate 1/n <= 1, latency never shrinks), as
  does an asynchronous transfer beside compute (``plansim.sim.overlap``: compute at rate
  1/(1 + s) <= 1; the bounds ignore that slowdown, so they stay bounds, only looser);
* an action that needs a neighbour's output starts no earlier than that output's arrival:
  the producer's end plus the P2P transfer (FIFO on the sender's ``pp_send`` stream, so at
  least its duration); with ``blocking_p2p`` the sender also waits for that arrival;
* after its last action a rank queues ``grad_sync`` on its FIFO ``dp`` stream behind any
  gradient bucket, waits for the stream, then runs its optimizer segments. A bucket of the
  last action's stage is released ``ready_fraction`` x the action's nominal duration after
  the action starts. Parameter-server plans (``plansim.analytic.param_server``) use the same
  slots: the push in ``grad_sync`` or the buckets, the server update and the pull in
  ``optimizer``, so the terms below cover them unchanged.

From these, for every rank r (stage r is chunk 0 of rank r; all four schedules start rank
r with F(r, 0) and end it with the backward of stage r, micro-batch m - 1, followed only by
``min(r + 1, m)`` weight-gradient actions in ZB-H1: ``plansim.schedule.builders``):

* **work bound**: head_r + (all of rank r's actions before its last) + tail_r, where
  head_r = sum over stages s < r of (F_s + send_forward_s) (micro-batch 0 must cross them
  first), each action counts its segments plus, with ``blocking_p2p``, its send, and
  tail_r = max(d + send, max_k(f_k d + sum of buckets k..)) + grad_sync + optimizer
  measured from the last action's start (d its nominal duration); offload segments
  (``plansim.analytic.offload``: host copies, CPU Adam, NVMe, parameter fetches) are ordinary
  optimizer and action segments and count here like any other;
* **drain bound**: the backward of stage r for micro-batch m - 1 then has to travel down
  stages r - 1, ..., 0 (Narayanan et al. SC21 §2.2: the (p - 1) bubble slots of the drain),
  each backward taking its segments and each hop its send, before rank 0 finishes
  (its ZB-H1 W and tail_0).

With uniform stage costs and free P2P the drain bound of the last rank equals the textbook
pipeline times: (m + p - 1)(F + B) for GPipe/1F1B, (m + (p - 1)/v) v (F + B) for interleaved
1F1B, m(F + I + W) + (p - 1)(F + I - W) for ZB-H1 (Qi et al. 2024 §2.1). It ignores link
sharing, FIFO waits and the slack of blocking sends, so the engine may take longer; a
property test (``tests/unit/test_planner_pruning.py``) checks bound <= simulated time over
random plans. :data:`SAFETY` absorbs float rounding (the engine adds the same durations in
another order).

A cheaper, looser bound needs no :class:`PipelineWork`, only each stage's compute-stream
seconds (``plansim.analytic.stage_compute.stage_compute_s``): the work bound above without
the transfers, the rank's step tail and the CP segments (:func:`compute_lower_bound_s`). The
search adds the ZeRO-2/3 segments each action holds
(``plansim.analytic.zero_segments.sharded_action_s``, per plan: ZeRO-2's overlap flag
changes them), exactly as the work places them, so it stays a bound. The search gives it to
every feasible plan and builds the work for the full bound only where the cheap one does not
already exceed the K-th best.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plansim.specs.plan import Schedule
from plansim.specs.stage_placement import StagePlacement
from plansim.specs.work import GradBucket, PipelineWork, Segment, StageWork

#: Relative margin taken off every bound so float summation order cannot make it exceed the
#: engine's time for the same work (sums of at most ~1e6 terms, each rounding ~1e-16).
SAFETY = 1e-9
#: Margin of :func:`compute_lower_bound_s`: it must stay below the full bound of the same
#: plan (which sums the same seconds with others, in another order), not only below the
#: engine's time, so that refining it only ever raises a candidate's bound.
COMPUTE_SAFETY = 1e-6


def _sum(segments: tuple[Segment, ...]) -> float:
    return sum(seg.duration_s for seg in segments)


def _bucket_end_s(buckets: tuple[GradBucket, ...], d: float, memo: dict[Any, Any] | None) -> float:
    """max over buckets k of (ready_fraction_k x d + seconds of buckets k..end): when the
    FIFO dp stream can finish them, from the start of a backward of d seconds. Arrays per
    bucket tuple are memoised (a stage 0 may hold thousands of buckets)."""
    arrays = memo.get(("bucket_arrays", id(buckets))) if memo is not None else None
    if arrays is None:
        fractions = np.array([b.ready_fraction for b in buckets])
        seconds = np.array([b.segment.duration_s for b in buckets])
        suffix = np.cumsum(seconds[::-1])[::-1]
        arrays = (buckets, fractions, suffix)  # holds the tuple: its id stays its own
        if memo is not None:
            memo[("bucket_arrays", id(buckets))] = arrays
    _, fractions, suffix = arrays
    return float(np.max(fractions * d + suffix))


def _tail_from_last_start(
    work: PipelineWork,
    rank: int,
    *,
    last: tuple[Segment, ...],
    last_send_s: float,
    stage: int,
    memo: dict[Any, Any] | None = None,
) -> float:
    """Seconds from the start of ``rank``'s last action to the end of its step.

    ``last``: the segments of that action (of ``stage``); ``last_send_s``: its blocking send
    (0 when none). Gradient buckets of ``stage`` are released ``ready_fraction`` x the
    action's nominal duration after its start, in order, on the FIFO dp stream; without
    ``overlap_grad_reduce`` every bucket of the rank is queued after the last action.
    """
    d = _sum(last)
    rank_work = work.ranks[rank]
    after = _sum(rank_work.grad_sync)
    opt = _sum(rank_work.optimizer)
    end = d + last_send_s
    if work.overlap_grad_reduce:
        buckets = work.stages[stage].grad_buckets
        if len(buckets) > 8:
            end = max(end, _bucket_end_s(buckets, d, memo))
        else:
            queued = 0.0
            for bucket in reversed(buckets):  # latest first: suffix sums
                queued += bucket.segment.duration_s
                end = max(end, bucket.ready_fraction * d + queued)
    else:
        stages = range(rank, work.num_stages, work.num_ranks)
        after += sum(_sum(tuple(b.segment for b in work.stages[s].grad_buckets)) for s in stages)
    return end + after + opt


def _stage_sums(stage: StageWork, *, split: bool) -> tuple[float, float, float]:
    """(forward, backward or input-gradient, weight-gradient) seconds of one micro-batch."""
    if split:
        return _sum(stage.forward), _sum(stage.backward_input), _sum(stage.backward_weight)
    return _sum(stage.forward), _sum(stage.backward), 0.0


def step_time_lower_bound_s(
    work: PipelineWork, *, schedule: Schedule, memo: dict[Any, Any] | None = None
) -> float:
    """A step time the engine cannot beat for ``work`` run with ``schedule``'s action lists.

    Args:
        work: the costed pipeline replica (``plansim.analytic.cost.build_pipeline_work``).
        schedule: its schedule (action lists from ``plansim.schedule.builders``).
        memo: optional search-scoped cache (per-bucket-tuple arrays); same result without.

    Returns:
        Seconds, <= ``simulate(build_actions(schedule, ...), work).step_time_s`` (see the
        module docstring for the argument; :data:`SAFETY` below it). O(pp * vpp) time;
        identical stage and rank objects are summed once.
    """
    if work.placement is not StagePlacement.LOOP:
        return _placed_lower_bound_s(work, overlapped=schedule.overlaps_forward_backward)
    p, m = work.num_ranks, work.num_microbatches
    split = schedule is Schedule.ZB_H1
    blocking = work.blocking_p2p
    by_id: dict[int, tuple[float, float, float, float]] = {}
    for st in work.stages:
        if id(st) not in by_id:
            f, b, w = _stage_sums(st, split=split)
            sends = st.send_forward.duration_s + st.send_backward.duration_s
            by_id[id(st)] = (f, b, w, f + b + w + (sends if blocking else 0.0))
    rows = [by_id[id(st)] for st in work.stages]
    fwd = [row[0] for row in rows]
    bwd = [row[1] for row in rows]
    wgt = [row[2] for row in rows]
    per_mb = [row[3] for row in rows]
    send_f = [st.send_forward.duration_s for st in work.stages]
    send_b = [st.send_backward.duration_s for st in work.stages]
    tails: dict[tuple[int, int], float] = {}

    def tail(r: int) -> float:
        """Seconds from the start of rank r's last action (B or W of stage r) to the end."""
        key = (id(work.ranks[r]), id(work.stages[r]))
        if key not in tails:
            st = work.stages[r]
            last = st.backward_weight if split else st.backward
            send = send_b[r] if blocking and not split else 0.0
            tails[key] = _tail_from_last_start(
                work, r, last=last, last_send_s=send, stage=r, memo=memo
            )
        return tails[key]

    # rank 0 after the drain reaches it: ZB-H1 runs I(0, m-1) then W(0, m-1), else B(0, m-1)
    rank0_end = (bwd[0] if split else 0.0) + tail(0)
    best = 0.0
    head = 0.0  # sum over s < r of (F_s + send_forward_s): micro-batch 0 reaching stage r
    chain = 0.0  # from the end of B/I(r, m-1)'s segments to its arrival at stage 0
    for r in range(p):
        work_s = m * sum(per_mb[r::p])
        if split:
            last_s, last_send = wgt[r], 0.0
        else:
            last_s, last_send = bwd[r], (send_b[r] if blocking else 0.0)
        best = max(best, head + work_s - last_s - last_send + tail(r))
        if r > 0:
            chain += send_b[r] + (bwd[r - 1] if r > 1 else 0.0)
            suffix = min(r + 1, m) * wgt[r] if split else 0.0  # W actions after I(r, m-1)
            blocking_send = send_b[r] if blocking else 0.0
            best = max(best, head + work_s - suffix - blocking_send + chain + rank0_end)
        head += fwd[r] + send_f[r]
    return best * (1.0 - SAFETY)


def _compute_s(segments: tuple[Segment, ...]) -> float:
    return sum(seg.duration_s for seg in segments if seg.stream == "compute")


def _placed_lower_bound_s(work: PipelineWork, *, overlapped: bool) -> float:
    """The bound of the V and dual placements (ZB-V, DualPipeV, DualPipe): per rank r, the
    forwards micro-batch 0 must cross before r's first action (the shorter of its two
    chains), then the seconds of all of r's actions, then r's grad_sync and optimizer
    (queued after its last action). With ``overlapped`` F&B pairs (DualPipe) only the
    compute-stream segments count: a pair runs its halves' compute one at a time on the GPU,
    but its communication may hide behind the other half's compute."""
    graph = work.graph
    p, m = work.num_ranks, work.num_microbatches
    visits = m // 2 if work.placement is StagePlacement.DUAL else m
    seconds = _compute_s if overlapped else _sum
    forward = [seconds(st.forward) for st in work.stages]
    best = 0.0
    for r in range(p):
        mine = graph.stages_of_rank(r)
        busy = 0.0
        for s in mine:
            st = work.stages[s]
            split = seconds(st.backward_input) + seconds(st.backward_weight)
            back = min(seconds(st.backward), split)
            busy += visits * (forward[s] + back)
        heads = []
        for s in mine:
            head, before = 0.0, graph.previous_stage(s)
            while before is not None:
                head += forward[before]
                before = graph.previous_stage(before)
            heads.append(head)
        rank = work.ranks[r]
        best = max(best, min(heads) + busy + _sum(rank.grad_sync) + _sum(rank.optimizer))
    return best * (1.0 - SAFETY)


def compute_lower_bound_s(
    stage_compute: tuple[tuple[float, float], ...],
    *,
    num_ranks: int,
    num_microbatches: int,
    placement: StagePlacement = StagePlacement.LOOP,
) -> float:
    """A bound from compute alone, <= :func:`step_time_lower_bound_s` of the same plan.

    Args:
        stage_compute: per stage (model chunk), stage 0 first, (forward, backward) seconds
            of one micro-batch that hold the compute stream (``stage_compute.stage_compute_s``);
            stage s runs on rank s mod ``num_ranks``.
        num_ranks: pipeline ranks p; num_microbatches: m.

    Returns:
        Seconds: max over ranks r of (sum over stages s < r of F_s) + m x (sum over r's
        stages of F + B), the module docstring's work bound with every transfer, the
        step's tail and the non-compute segments left out (:data:`COMPUTE_SAFETY` below).
        Every schedule runs each of rank r's actions after micro-batch 0 crossed stages
        0..r - 1, one after another, each at least its compute-stream seconds. ``placement``
        V: stage s on rank s or 2p - 1 - s; dual: rank r runs plan stages r and p - 1 - r
        for m/2 micro-batches each, after the shorter of the two chains reaching it (not for
        schedules that overlap F&B: their TP/EP collectives may hide behind compute).
    """
    p, m = num_ranks, num_microbatches
    if placement is StagePlacement.DUAL:
        forward = [f for f, _ in stage_compute]
        best = 0.0
        for r in range(p):
            twin = p - 1 - r
            busy = (m // 2) * (sum(stage_compute[r]) + sum(stage_compute[twin]))
            best = max(best, min(sum(forward[:r]), sum(forward[:twin])) + busy)
        return best * (1.0 - COMPUTE_SAFETY)
    if placement is StagePlacement.V:
        per_v = [0.0] * p
        for s, (f, b) in enumerate(stage_compute):
            per_v[s if s < p else 2 * p - 1 - s] += f + b
        head_v = [sum(f for f, _ in stage_compute[:r]) for r in range(p)]
        return max(h + m * w for h, w in zip(head_v, per_v, strict=True)) * (1.0 - COMPUTE_SAFETY)
    per_rank = [0.0] * p
    for s, (f, b) in enumerate(stage_compute):
        per_rank[s % p] += f + b
    best = 0.0
    head = 0.0
    for r in range(p):
        best = max(best, head + m * per_rank[r])
        head += stage_compute[r][0]
    return best * (1.0 - COMPUTE_SAFETY)
