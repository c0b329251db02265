"""What the charts are laid out from, without matplotlib: colours by event kind and
schedule, the Gantt chart's lanes and geometry, memory lines per rank, the Pareto front and
short plan labels. The PNG plots (``plansim.report.plots``) and the interactive figures of
the HTML report (``plansim.report.plotly_figures``) draw from the same values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from plansim.planner.evaluate import Evaluation
from plansim.sim import timeline as tl

#: Colour and legend label per Timeline kind; kinds sharing a label share a legend entry.
KIND_STYLES: dict[str, tuple[str, str]] = {
    "forward": ("#3A6FC4", "forward (F)"),
    "backward": ("#2E9E5B", "backward (B)"),
    "backward_input": ("#EE8A2E", "backward input-grad (I)"),
    "backward_weight": ("#8B62C9", "backward weight-grad (W)"),
    "recompute": ("#E8C31F", "recompute (R)"),
    "optimizer": ("#5F5F5F", "optimizer"),
    "tp_comm": ("#D33F49", "TP collective (blocks compute)"),
    "send_forward": ("#17BECF", "P2P activation send/recv"),
    "recv_forward": ("#17BECF", "P2P activation send/recv"),
    "send_backward": ("#BCBD22", "P2P gradient send/recv"),
    "recv_backward": ("#BCBD22", "P2P gradient send/recv"),
    "dp_comm": ("#8C564B", "DP gradient sync"),
    "embedding_grad_comm": ("#E377C2", "embedding gradient sync"),
}

#: Colours for kinds not in KIND_STYLES, given out in name order.
_SPARE_COLOURS = ("#9EDAE5", "#C49C94", "#F7B6D2", "#7F7F7F", "#AEC7E8", "#FFBB78")

IDLE_COLOUR = "#F3F3F3"

#: Scatter colour per Schedule member, in the enum's order.
SCHEDULE_COLOURS = ("#3A6FC4", "#EE8A2E", "#2E9E5B", "#8B62C9", "#D33F49")

#: (stream, lane height, short name); a rank's block stacks these top to bottom.
LANES = (
    ("compute", 1.0, "compute"),
    ("tp", 0.22, "tp"),
    ("pp_send", 0.22, "send"),
    ("pp_recv", 0.22, "recv"),
    ("dp", 0.22, "dp"),
)

LANE_GAP = 0.05

RANK_GAP = 0.5


def kind_colours(kinds: Sequence[str]) -> dict[str, str]:
    colours = {k: c for k, (c, _) in KIND_STYLES.items()}
    for i, kind in enumerate(sorted(set(kinds) - set(colours))):
        colours[kind] = _SPARE_COLOURS[i % len(_SPARE_COLOURS)]
    return colours


def time_unit(end_s: float) -> tuple[str, float]:
    """("ms", 1e3) for steps under 2 s, else ("s", 1.0)."""
    return ("ms", 1e3) if end_s < 2.0 else ("s", 1.0)


def lane_offsets(streams: Sequence[str]) -> tuple[dict[str, tuple[float, float]], float]:
    """(top offset, height) of each lane inside a rank block, and the block pitch.

    The compute lane always exists; communication lanes only for streams with events
    (unknown streams get a thin lane after the known ones, in name order).
    """
    known = {s for s, _, _ in LANES}
    lanes = [(s, h) for s, h, _ in LANES if s == "compute" or s in streams]
    lanes += [(s, 0.22) for s in sorted(set(streams) - known)]
    offsets: dict[str, tuple[float, float]] = {}
    y = 0.0
    for stream, height in lanes:
        offsets[stream] = (y, height)
        y += height + LANE_GAP
    return offsets, y + RANK_GAP


def short_stream(stream: str) -> str:
    return next((short for s, _, short in LANES if s == stream), stream)


@dataclass(frozen=True, slots=True, kw_only=True)
class GanttGeometry:
    """What the Gantt layout is derived from: ranks, chunks, times and the time unit."""

    num_ranks: int
    vpp: int
    step_s: float
    pipeline_s: float
    unit: str
    scale: float

    @classmethod
    def of(cls, timeline: pd.DataFrame) -> GanttGeometry:
        empty = not len(timeline)
        num_ranks = 1 if empty else int(timeline[tl.RANK].max()) + 1
        num_stages = 1 if empty else int(timeline[tl.STAGE].max()) + 1
        step_s = 0.0 if empty else float(timeline[tl.END_S].max())
        work = tl.pipeline_work(timeline)
        unit, scale = time_unit(step_s)
        return cls(
            num_ranks=num_ranks,
            vpp=max(1, num_stages // num_ranks),
            step_s=step_s,
            pipeline_s=float(work[tl.END_S].max()) if len(work) else 0.0,
            unit=unit,
            scale=scale,
        )


def memory_lines(
    memory: pd.DataFrame, *, end_s: float, scale: float
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per rank (ascending): times in axis units extended to ``end_s``, and GiB."""
    lines = []
    for rank in sorted(int(r) for r in memory["rank"].unique()):
        own = memory[memory["rank"] == rank]
        t = np.append(own["time_s"].to_numpy(dtype=np.float64), end_s) * scale
        gib = own["bytes"].to_numpy(dtype=np.float64) / 2**30
        lines.append((rank, t, np.append(gib, gib[-1])))
    return lines


def pareto_front(points: Sequence[tuple[float, float]]) -> tuple[int, ...]:
    """Indices of the points no other point beats on both coordinates (minimising both).

    A point is dominated when another is <= on both coordinates and < on at least one.
    Exact duplicates of a front point are on the front too.

    Args:
        points: ``(x, y)`` pairs, e.g. (step time s, peak memory bytes).

    Returns:
        Front indices ordered by x, then y, then index (x rises, y falls along the front).
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front: list[int] = []
    best_y = float("inf")
    for i in order:
        x, y = points[i]
        if y < best_y or (front and points[front[-1]] == (x, y)):
            front.append(i)
            best_y = min(best_y, y)
    return tuple(front)


def short_label(ev: Evaluation) -> str:
    """``tp4 pp8 dp32 vpp6 mbs1 zero2 none sp`` (the schedule is the point's colour)."""
    p = ev.plan
    parts = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"]
    parts += [f"cp{p.cp}"] if p.cp > 1 else []
    parts += [f"vpp{p.vpp}"] if p.vpp > 1 else []
    parts += [f"mbs{p.micro_batch_size}", f"zero{p.zero_stage}", p.recompute.value]
    parts += ["sp"] if p.sequence_parallel else []
    return " ".join(parts)


def lane_events(timeline: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the compute lane's events, the thin lanes' events) of a Gantt chart: TP collectives
    hold the compute stream, so they are drawn on the compute lane as well as on their own."""
    on_compute = timeline[timeline[tl.STREAM].isin(tl.COMPUTE_STREAMS)]
    comm = timeline[timeline[tl.STREAM] != "compute"]
    return on_compute, comm
