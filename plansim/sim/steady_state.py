"""A step of many micro-batches from two shorter simulations of it (pure, no SimPy).

A 1F1B-family schedule (1F1B, interleaved 1F1B, ZB-H1; Narayanan et al. SC21 §2.2, Qi et al.
2023) runs a warm-up, a steady state and a cool-down. In the steady state every rank repeats
one forward and one backward per micro-batch (per model chunk with interleaving, in groups
of pp micro-batches), with the same transfers on the same links, and the once-per-step work
(gradient buckets after the last backward, the DP sync, the optimizer) hangs off the
cool-down. The engine is deterministic, so once the warm-up has passed, each further group
of micro-batches adds the same seconds to every event time, busy and exposed time, the same
events, and the same (zero) memory: every figure of the step is affine in the number of
micro-batches m. Measured on the engine: the second differences over m of the
step time, exposed communication, idle time and event count are below 1e-12 of the figure
for 1F1B (from m = pp), interleaved 1F1B with 3, 6 and 12 chunks per rank, overlapped p2p and
gradient buckets (from m = 2 pp), ZB-H1 (its step time from m = 2 pp, its exposed
communication from m = 8 pp: at 4 pp its second differences are 1e-3), ZeRO-1/2/3 and
DeepSpeed's per-tensor ZeRO-3 (m = 64-256), and ZB-V, DualPipeV and DualPipe (their main step
repeats two overlapped pairs per round: step time equal within 3e-14 at m = 400 on pp 4,
``tests/unit/test_dualpipe.py``). GPipe is not affine: its forwards queue every
send on the ``pp_send`` stream, and the backlog grows with m (second differences of 1e-5),
so it is always simulated whole (its activation memory grows with m anyway).

So a plan with m far beyond the warm-up (more than :data:`MIN_WINDOWS` windows) is simulated
twice, with m_short and m_short + w micro-batches (``w``, the window:
:data:`WARMUP_MICROBATCHES_PER_RANK` per pipeline rank, at least
:data:`MIN_WINDOW_MICROBATCHES`, a multiple of pp so that both keep the interleaved
schedule's m % pp), m_short in [w, 2w) congruent to m modulo w, and every figure is
extrapolated as long + k (long - short), k = (m - m_short) / w - 1. The cost is two
simulations of under 3w micro-batches instead of one of m: GPT-3 175B with 8192 micro-batches
on 16 ranks (tp 4, ZB-H1) simulates in 0.6 s instead of 11.8 s, the step time equal to 2e-13.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.sim.result import SimResult
from plansim.specs.plan import ParallelPlan, Schedule

#: Micro-batches per pipeline rank of the window: the shorter simulation runs at least this
#: many per rank, past the warm-up of every schedule measured (module docstring: 1F1B and
#: interleaved 1F1B with up to 12 chunks per rank are affine from 2 per rank, ZB-H1's exposed
#: communication from 8).
WARMUP_MICROBATCHES_PER_RANK = 8
#: The smallest window, in micro-batches (a plan without a pipeline still has per-step work
#: around its micro-batches).
MIN_WINDOW_MICROBATCHES = 64
#: A step is extrapolated only when it has more than this many windows of micro-batches,
#: so that the two shorter simulations (at most 3 windows together) cost clearly less.
MIN_WINDOWS = 4


@dataclass(frozen=True, slots=True)
class SteadyStateSizes:
    """Micro-batches of the two simulations and the windows between the longer one and m."""

    short: int
    window: int
    repeats: int

    @property
    def long(self) -> int:
        return self.short + self.window


def steady_state_sizes(
    num_microbatches: int, *, pp: int, schedule: Schedule
) -> SteadyStateSizes | None:
    """The two shorter simulations that give a step of ``num_microbatches`` (module
    docstring), or None when it is to be simulated whole: GPipe, or m within
    :data:`MIN_WINDOWS` windows."""
    if schedule is Schedule.GPIPE:
        return None
    window = max(WARMUP_MICROBATCHES_PER_RANK * pp, MIN_WINDOW_MICROBATCHES)
    window = -(-window // pp) * pp
    if num_microbatches <= MIN_WINDOWS * window:
        return None
    short = window + num_microbatches % window
    return SteadyStateSizes(
        short=short, window=window, repeats=(num_microbatches - short) // window - 1
    )


def plan_steady_state(plan: ParallelPlan) -> SteadyStateSizes | None:
    """:func:`steady_state_sizes` of ``plan``'s micro-batches, pipeline and schedule."""
    return steady_state_sizes(plan.num_microbatches, pp=plan.pp, schedule=plan.schedule)


def _affine(short: float, long: float, repeats: int) -> float:
    """``long`` plus ``repeats`` more windows of (long - short)."""
    return long + repeats * (long - short)


def _per_kind(short: dict[str, float], long: dict[str, float], repeats: int) -> dict[str, float]:
    keys = sorted(set(short) | set(long))
    return {k: _affine(short.get(k, 0.0), long.get(k, 0.0), repeats) for k in keys}


def _per_rank(short: tuple[float, ...], long: tuple[float, ...], repeats: int) -> tuple[float, ...]:
    return tuple(_affine(s, g, repeats) for s, g in zip(short, long, strict=True))


def extrapolate(short: SimResult, long: SimResult, *, repeats: int) -> SimResult:
    """The step ``repeats`` windows longer than ``long``, from ``short`` one window shorter.

    Every figure is affine in the windows (module docstring); a rank's bubble fraction is its
    idle seconds over the pipeline time, each extrapolated. ``timeline`` and ``memory`` are
    ``long``'s events (``SimResult.simulated_microbatches`` says how many micro-batches they
    cover).

    Raises:
        ValueError: the two results have different rank counts.
    """
    if len(short.peak_memory_bytes) != len(long.peak_memory_bytes):
        raise ValueError("the two simulations have different rank counts")
    pipeline_s = _affine(short.pipeline_time_s, long.pipeline_time_s, repeats)
    idle = _per_rank(
        tuple(f * short.pipeline_time_s for f in short.per_rank_bubble_fraction),
        tuple(f * long.pipeline_time_s for f in long.per_rank_bubble_fraction),
        repeats,
    )
    per_rank = tuple(i / pipeline_s if pipeline_s > 0 else 0.0 for i in idle)
    return SimResult(
        timeline=long.timeline,
        memory=long.memory,
        step_time_s=_affine(short.step_time_s, long.step_time_s, repeats),
        pipeline_time_s=pipeline_s,
        bubble_fraction=sum(per_rank) / len(per_rank),
        per_rank_bubble_fraction=per_rank,
        peak_memory_bytes=_per_rank(short.peak_memory_bytes, long.peak_memory_bytes, repeats),
        busy_s_by_kind=_per_kind(short.busy_s_by_kind, long.busy_s_by_kind, repeats),
        num_events=round(_affine(short.num_events, long.num_events, repeats)),
        exposed_s_by_kind=_per_kind(short.exposed_s_by_kind, long.exposed_s_by_kind, repeats),
        compute_busy_s=_per_rank(short.compute_busy_s, long.compute_busy_s, repeats),
        simulated_microbatches=long.simulated_microbatches,
    )
