"""Analytic step-time estimate of one pipeline replica, for ranking candidates before
simulating (the planner's ``simulate_top`` mode; pure).

An estimate, not a bound (``plansim.planner.bounds`` has those): it may fall on either side of
the simulated step time.
"""

from __future__ import annotations

from plansim.specs.plan import Schedule
from plansim.specs.stage_placement import StagePlacement
from plansim.specs.work import PipelineWork, StageWork


def estimate_step_time_s(work: PipelineWork, *, schedule: Schedule = Schedule.ONE_F_ONE_B) -> float:
    """Analytic step time of one pipeline replica, for ranking candidates before simulating.

    v = 1 (GPipe, 1F1B): (m + p - 1) x the slowest stage's (F + B + sends) (Narayanan et al.
    SC21 §2.2.1): 1F1B has no slack to hide a send, so every micro-batch pays them.

    v > 1 (interleaved 1F1B): (m + (p - 1)/v) x the slowest rank's F + B per micro-batch
    (summed over its v chunks; the bubble is 1/v of 1F1B's, §2.2.2), plus one forward and one
    backward send per chunk boundary (p v - 1 of them): the first micro-batch's trip through
    every stage. In steady state Megatron's 2(p - r - 1) extra warm-up forwards leave the slack
    that hides the sends (measured on the engine with uniform costs: the pipeline time is
    exactly 2(p v - 1) sends above the compute-only oracle).

    ZB-H1 (Qi et al. 2024 §2.1): weight-gradient work fills the tail, so each rank idles
    (p - 1)(F + I - W) instead of (p - 1)(F + I + W): m x (F + B + sends) + (p - 1) x
    (F + I - W + sends) of the slowest stage.

    ZB-V, DualPipeV (V placement): the busiest rank's m x (F + B) over its two chunks plus
    (p - 1) chunk (F + B): interleaving's bubble with v = 2. DualPipe: the busiest rank's
    m/2 x (F + B) over its two chunks plus (p/2 - 1) stage (F + B) (DeepSeek-V3 Table 2's
    (PP/2 - 1) slots, the overlap of F&B not credited).

    All plus the slowest rank's tail: gradient sync and optimizer (:func:`_rank_tail_s`).
    """
    tail = max(_rank_tail_s(work, rank) for rank in range(work.num_ranks))
    m, p, num_stages = work.num_microbatches, work.num_ranks, work.num_stages
    compute = [
        sum(seg.duration_s for seg in st.forward) + sum(seg.duration_s for seg in st.backward)
        for st in work.stages
    ]
    if work.placement is not StagePlacement.LOOP:
        dual = work.placement is StagePlacement.DUAL
        visits = m // 2 if dual else m
        busy = [0.0] * p
        for stage, seconds in enumerate(compute):
            busy[work.rank_of_stage(stage)] += visits * seconds
        slots = p // 2 - 1 if dual else p - 1
        return max(busy) + slots * max(compute) + tail
    sends = [st.send_forward.duration_s + st.send_backward.duration_s for st in work.stages]
    if schedule is Schedule.ZB_H1:
        return (
            max(_zb_h1_estimate(st, s, m, p) for st, s in zip(work.stages, sends, strict=True))
            + tail
        )
    if num_stages == p:
        return (m + p - 1) * max(c + s for c, s in zip(compute, sends, strict=True)) + tail
    per_rank = [0.0] * p
    for stage, seconds in enumerate(compute):
        per_rank[work.rank_of_stage(stage)] += seconds
    vpp = num_stages // p
    return (m + (p - 1) / vpp) * max(per_rank) + (num_stages - 1) * max(sends) + tail


def _rank_tail_s(work: PipelineWork, rank: int) -> float:
    """Seconds a rank adds after its last backward: its gradient sync and optimizer. With
    ``overlap_grad_reduce`` the buckets of its stages run during the last backward from the
    first bucket's ready point on; only what does not fit there is added."""
    stages = [st for s, st in enumerate(work.stages) if work.rank_of_stage(s) == rank]
    buckets_s = 0.0
    hidden_s = 0.0
    if work.overlap_grad_reduce:
        for st in stages:
            if not st.grad_buckets:
                continue
            buckets_s += sum(b.segment.duration_s for b in st.grad_buckets)
            backward_s = sum(seg.duration_s for seg in st.backward)
            hidden_s += (1.0 - st.grad_buckets[0].ready_fraction) * backward_s
    rk = work.ranks[rank]
    sync_s = sum(seg.duration_s for seg in rk.grad_sync)
    optimizer_s = sum(seg.duration_s for seg in rk.optimizer)
    return sync_s + max(0.0, buckets_s - hidden_s) + optimizer_s


def _zb_h1_estimate(stage: StageWork, sends_s: float, m: int, p: int) -> float:
    """Pipeline time of one ZB-H1 stage: m full micro-batches plus (p - 1)(F + I - W)."""
    f = sum(seg.duration_s for seg in stage.forward)
    i = sum(seg.duration_s for seg in stage.backward_input)
    w = sum(seg.duration_s for seg in stage.backward_weight)
    return m * (f + i + w + sends_s) + (p - 1) * (f + i - w + sends_s)
