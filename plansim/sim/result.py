"""What one simulated step gives: :class:`SimResult`, read from the engine's event rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from plansim.sim import timeline as tl


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SimResult:
    """Outcome of one simulated step.

    Attributes:
        timeline: events, Timeline schema (``plansim.sim.timeline``).
        memory: samples ``rank, time_s, bytes`` at every change (and the static start).
        step_time_s: end of the last event (grad sync and optimizer included), seconds.
        pipeline_time_s: end of the last pipeline-work event of any rank, seconds.
        bubble_fraction: mean over ranks of ``per_rank_bubble_fraction``.
        per_rank_bubble_fraction: compute-stream idle time in [0, pipeline_time_s] over
            pipeline_time_s, per rank, read from the events.
        peak_memory_bytes: highest memory sample per rank.
        busy_s_by_kind: seconds of events per kind, summed over ranks and streams.
        num_events: timeline rows.
        exposed_s_by_kind: per communication kind, seconds during which a rank's compute
            stream is idle while that kind runs on the rank, summed over ranks
            (``plansim.sim.timeline.exposure``: blocking TP collectives count whole;
            overlaps are attributed by ``EXPOSED_PRIORITY``). Keys: every communication kind
            in the timeline, sorted.
        compute_busy_s: per rank, seconds its compute stream runs kernels (pipeline work and
            optimizer; TP and other communication excluded).
        simulated_microbatches: micro-batches per pipeline that ``timeline`` and ``memory``
            cover: the step's own, or fewer where its figures were extrapolated from two
            shorter simulations (``plansim.sim.steady_state``).
    """

    timeline: pd.DataFrame
    memory: pd.DataFrame
    step_time_s: float
    pipeline_time_s: float
    bubble_fraction: float
    per_rank_bubble_fraction: tuple[float, ...]
    peak_memory_bytes: tuple[float, ...]
    busy_s_by_kind: dict[str, float]
    num_events: int
    exposed_s_by_kind: dict[str, float] = field(default_factory=dict)
    compute_busy_s: tuple[float, ...] = ()
    simulated_microbatches: int = 0


def summarise(
    rows: list[tl.TimelineRow],
    memory_rows: Sequence[tuple[int, float, float]],
    *,
    peak: Sequence[float],
    num_ranks: int,
    num_microbatches: int = 0,
) -> SimResult:
    """The SimResult of a finished run: its event rows, memory samples (rank, time_s,
    bytes), peak memory per rank and micro-batches per pipeline."""
    timeline = tl.make_timeline(rows)
    memory = _memory_frame(memory_rows)
    work_rows = tl.pipeline_work(timeline)
    pipeline_time_s = float(work_rows[tl.END_S].max()) if len(work_rows) else 0.0
    per_rank = tl.bubble_fractions(timeline, num_ranks=num_ranks, pipeline_time_s=pipeline_time_s)
    durations = timeline[tl.END_S] - timeline[tl.START_S]
    by_kind = durations.groupby(timeline[tl.KIND], sort=True).sum()
    exposure = tl.exposure(timeline, num_ranks=num_ranks)
    return SimResult(
        timeline=timeline,
        memory=memory,
        step_time_s=float(timeline[tl.END_S].max()) if len(timeline) else 0.0,
        pipeline_time_s=pipeline_time_s,
        bubble_fraction=sum(per_rank) / num_ranks,
        per_rank_bubble_fraction=per_rank,
        peak_memory_bytes=tuple(peak),
        busy_s_by_kind={str(k): float(v) for k, v in by_kind.items()},
        num_events=len(timeline),
        exposed_s_by_kind=exposure.exposed_s_by_kind,
        compute_busy_s=exposure.compute_busy_s,
        simulated_microbatches=num_microbatches,
    )


def _memory_frame(samples: Sequence[tuple[int, float, float]]) -> pd.DataFrame:
    """Memory samples sorted by time, then rank; same-time samples keep event order."""
    ranks, times, values = zip(*samples, strict=True)
    rank = np.array(ranks, dtype=np.int64)
    time_s = np.array(times, dtype=np.float64)
    order = np.lexsort((rank, time_s))  # stable
    return pd.DataFrame(
        {"rank": rank[order], "time_s": time_s[order], "bytes": np.array(values, np.float64)[order]}
    )
