"""Plots (the only module importing matplotlib): pipeline Gantt chart, memory over time, Pareto.

Rendering uses matplotlib's object API with the Agg canvas (no pyplot, no global figure
state), matplotlib's default style with fixed sizes and DPI, and PNGs saved without the
"Software" metadata key, so the same input gives byte-identical files. Every PNG is written
atomically (``plansim.io.outputs.write_bytes_atomic``: temporary file in the same folder, then
``os.replace``).

Inputs are in SI units (seconds, bytes); the axes show ms or s and GiB.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from plansim.io.outputs import write_bytes_atomic
from plansim.planner.evaluate import Evaluation
from plansim.sim import timeline as tl
from plansim.specs.plan import Schedule
from plansim.units import bytes_to_gib

DPI = 100
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
#: Kinds whose bars carry the micro-batch number when wide enough.
_LABELLED = ("forward", "backward", "backward_input", "backward_weight", "recompute")
#: (stream, lane height, short name); a rank's block stacks these top to bottom.
_LANES = (
    ("compute", 1.0, "compute"),
    ("tp", 0.22, "tp"),
    ("pp_send", 0.22, "send"),
    ("pp_recv", 0.22, "recv"),
    ("dp", 0.22, "dp"),
)
_LANE_GAP = 0.05
_RANK_GAP = 0.5
_MAX_LABELS = 3000
_LABEL_PT = 7.0
_IDLE = "#F3F3F3"
#: Scatter colour per Schedule member, in the enum's order.
_SCHEDULE_COLOURS = ("#3A6FC4", "#EE8A2E", "#2E9E5B", "#8B62C9", "#D33F49")
_RC = {"font.size": 9.0, "axes.titlesize": 11.0, "legend.fontsize": 8.0}


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


@contextmanager
def _style() -> Iterator[None]:
    """matplotlib's default style plus our sizes, whatever the user's matplotlibrc says."""
    with matplotlib.style.context("default"), matplotlib.rc_context(cast(Any, _RC)):
        yield


def _figure(width_in: float, height_in: float) -> Figure:
    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike[str], *, label: str) -> Path:
    """Render ``fig`` to PNG bytes (no Software/date metadata) and write them atomically."""
    buf = io.BytesIO()
    with _style():
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return write_bytes_atomic(path, buf.getvalue(), label=label)


def _time_unit(end_s: float) -> tuple[str, float]:
    """("ms", 1e3) for steps under 2 s, else ("s", 1.0)."""
    return ("ms", 1e3) if end_s < 2.0 else ("s", 1.0)


def _lighten(colour: str, fraction: float) -> tuple[float, float, float, float]:
    """Blend ``colour`` towards white by ``fraction`` (0: unchanged, 1: white)."""
    rgba = np.array(to_rgba(colour))
    rgba[:3] = rgba[:3] + (1.0 - rgba[:3]) * fraction
    return (float(rgba[0]), float(rgba[1]), float(rgba[2]), 1.0)


def _kind_colours(kinds: Sequence[str]) -> dict[str, str]:
    colours = {k: c for k, (c, _) in KIND_STYLES.items()}
    for i, kind in enumerate(sorted(set(kinds) - set(colours))):
        colours[kind] = _SPARE_COLOURS[i % len(_SPARE_COLOURS)]
    return colours


# ---------------------------------------------------------------------------------- Gantt


def _lane_offsets(streams: Sequence[str]) -> tuple[dict[str, tuple[float, float]], float]:
    """(top offset, height) of each lane inside a rank block, and the block pitch.

    The compute lane always exists; communication lanes only for streams with events
    (unknown streams get a thin lane after the known ones, in name order).
    """
    known = {s for s, _, _ in _LANES}
    lanes = [(s, h) for s, h, _ in _LANES if s == "compute" or s in streams]
    lanes += [(s, 0.22) for s in sorted(set(streams) - known)]
    offsets: dict[str, tuple[float, float]] = {}
    y = 0.0
    for stream, height in lanes:
        offsets[stream] = (y, height)
        y += height + _LANE_GAP
    return offsets, y + _RANK_GAP


def _bars(
    rows: pd.DataFrame,
    *,
    y0: np.ndarray,
    height: float | np.ndarray,
    scale: float,
    min_width: float = 0.0,
) -> np.ndarray:
    """Rectangles (N, 4, 2) for rows at lane tops ``y0`` (data units).

    Bars of positive duration are at least ``min_width`` wide (data units), so that short
    transfers stay visible at full-step zoom; zero-length events stay zero-width.
    """
    x0 = rows[tl.START_S].to_numpy(dtype=np.float64) * scale
    x1 = rows[tl.END_S].to_numpy(dtype=np.float64) * scale
    x1 = np.where(x1 > x0, np.maximum(x1, x0 + min_width), x1)
    y1 = y0 + height
    return np.stack([np.column_stack(p) for p in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)


def _bar_colours(rows: pd.DataFrame, *, num_ranks: int, vpp: int) -> np.ndarray:
    """RGBA per row: the kind's colour, lighter for later model chunks when vpp > 1."""
    codes, kinds = pd.factorize(rows[tl.KIND], sort=True)
    colours = _kind_colours([str(k) for k in kinds])
    palette = np.array([to_rgba(colours[str(k)]) for k in kinds]).reshape(-1, 4)
    out = palette[codes] if len(rows) else np.zeros((0, 4))
    if vpp > 1:
        chunk = np.maximum(rows[tl.STAGE].to_numpy(), 0) // num_ranks
        fraction = 0.5 * chunk / (vpp - 1)
        out[:, :3] = out[:, :3] + (1.0 - out[:, :3]) * fraction[:, None]
    return out


def _gantt_layers(
    ax: Any, timeline: pd.DataFrame, *, geo: _GanttGeometry, px_per_unit: float
) -> tuple[dict[str, tuple[float, float]], float]:
    """Draw lane backgrounds and every bar; return the lane offsets and the block pitch.

    Two polygon collections (compute lane, communication lanes), unsnapped so that bars
    narrower than a pixel blend in proportion to their length instead of flickering.
    Communication bars are drawn at least one pixel wide.
    """
    streams = [str(s) for s in timeline[tl.STREAM].unique()]
    offsets, pitch = _lane_offsets(streams)
    bases = np.arange(geo.num_ranks) * pitch
    end = geo.step_s * geo.scale if geo.step_s > 0 else 1.0
    backgrounds = [
        [(0, b + top), (0, b + top + h), (end, b + top + h), (end, b + top)]
        for b in bases
        for top, h in offsets.values()
    ]
    ax.add_collection(
        PolyCollection(backgrounds, facecolors=_IDLE, edgecolors="none"), autolim=False
    )
    # TP collectives hold the compute stream: draw them on the compute lane as well.
    on_compute = timeline[timeline[tl.STREAM].isin(tl.COMPUTE_STREAMS)]
    comm = timeline[timeline[tl.STREAM] != "compute"]
    lanes: list[tuple[pd.DataFrame, np.ndarray, float | np.ndarray, float]] = [
        (on_compute, np.full(len(on_compute), offsets["compute"][0]), 1.0, 0.0),
        (
            comm,
            comm[tl.STREAM].map(lambda s: offsets[s][0]).to_numpy(dtype=np.float64),
            comm[tl.STREAM].map(lambda s: offsets[s][1]).to_numpy(dtype=np.float64),
            1.0 / px_per_unit,
        ),
    ]
    for rows, tops, height, min_width in lanes:
        y0 = bases[rows[tl.RANK].to_numpy()] + tops
        verts = _bars(rows, y0=y0, height=height, scale=geo.scale, min_width=min_width)
        collection = PolyCollection(
            cast(Any, verts),
            facecolors=_bar_colours(rows, num_ranks=geo.num_ranks, vpp=geo.vpp),
            edgecolors="white",
            linewidths=_edge_width(verts, px_per_unit=px_per_unit),
        )
        collection.set_snap(False)
        ax.add_collection(collection, autolim=False)
    return offsets, pitch


def _edge_width(verts: np.ndarray, *, px_per_unit: float) -> float:
    """White separators between bars only when the median bar is over 4 px wide."""
    if not len(verts):
        return 0.0
    widths_px = (verts[:, 2, 0] - verts[:, 0, 0]) * px_per_unit
    return 0.4 if float(np.median(widths_px)) > 4.0 else 0.0


def _microbatch_labels(
    ax: Any, timeline: pd.DataFrame, *, bases: np.ndarray, geo: _GanttGeometry, px_per_unit: float
) -> int:
    """Write the micro-batch number inside compute bars wide enough; returns how many.

    No labels at all when more than ``_MAX_LABELS`` would fit (text is the slow part of
    rendering).
    Black text on light bars, white on dark ones (relative luminance threshold 0.5).
    """
    rows = timeline[(timeline[tl.STREAM] == "compute") & timeline[tl.KIND].isin(_LABELLED)]
    rows = rows[rows[tl.MICROBATCH] >= 0]
    text = rows[tl.MICROBATCH].astype(str).to_numpy()
    width_px = (rows[tl.END_S] - rows[tl.START_S]).to_numpy() * geo.scale * px_per_unit
    need_px = np.char.str_len(text.astype(str)) * _LABEL_PT * 0.65 * DPI / 72 + 3
    fits = width_px >= need_px
    if int(fits.sum()) > _MAX_LABELS:
        return 0
    rows, text = rows[fits], text[fits]
    centres = (rows[tl.START_S] + rows[tl.END_S]).to_numpy() * 0.5 * geo.scale
    ys = bases[rows[tl.RANK].to_numpy()] + 0.5
    rgba = _bar_colours(rows, num_ranks=geo.num_ranks, vpp=geo.vpp)
    luminance = rgba[:, :3] @ np.array([0.2126, 0.7152, 0.0722])
    for x, y, label, lum in zip(centres, ys, text, luminance, strict=True):
        colour = "black" if lum > 0.5 else "white"
        ax.text(x, y, label, ha="center", va="center", fontsize=_LABEL_PT, color=colour)
    return len(text)


def _gantt_legend(fig: Figure, timeline: pd.DataFrame, *, vpp: int) -> None:
    """One legend entry per label present, in KIND_STYLES order (unknown kinds after)."""
    present = set(timeline[tl.KIND].unique())
    colours = _kind_colours(sorted(present))
    handles: dict[str, Patch] = {}
    ordered = [k for k in KIND_STYLES if k in present] + sorted(present - set(KIND_STYLES))
    for kind in ordered:
        name = KIND_STYLES.get(kind, (None, kind))[1]
        handles.setdefault(name, Patch(facecolor=colours[kind], label=name))
    items = list(handles.values())
    if vpp > 1:
        light = _lighten(KIND_STYLES["forward"][0], 0.5)
        items.append(Patch(facecolor=light, label=f"lighter: later model chunk (vpp {vpp})"))
    items.append(Patch(facecolor=_IDLE, edgecolor="#BBBBBB", label="idle"))
    fig.legend(
        handles=items,
        loc="upper center",
        bbox_to_anchor=(0.5, 1.0 - 0.45 / fig.get_figheight()),
        ncol=min(len(items), 6),
        frameon=False,
    )


def plot_gantt(
    timeline: pd.DataFrame, path: str | os.PathLike[str], *, title: str, label: str = "plot"
) -> Path:
    """Draw the pipeline Gantt chart of one step (:func:`gantt_figure`) and write it as a PNG.

    Args:
        timeline: Timeline schema, seconds.
        path: destination PNG.
        title: first title line.
        label: what the path came from (e.g. ``"--plot"``), named in errors.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    return _save(gantt_figure(timeline, title=title), path, label=label)


@dataclass(frozen=True, slots=True, kw_only=True)
class _GanttGeometry:
    """What the Gantt layout is derived from: ranks, chunks, times and the time unit."""

    num_ranks: int
    vpp: int
    step_s: float
    pipeline_s: float
    unit: str
    scale: float

    @classmethod
    def of(cls, timeline: pd.DataFrame) -> _GanttGeometry:
        empty = not len(timeline)
        num_ranks = 1 if empty else int(timeline[tl.RANK].max()) + 1
        num_stages = 1 if empty else int(timeline[tl.STAGE].max()) + 1
        step_s = 0.0 if empty else float(timeline[tl.END_S].max())
        work = tl.pipeline_work(timeline)
        unit, scale = _time_unit(step_s)
        return cls(
            num_ranks=num_ranks,
            vpp=max(1, num_stages // num_ranks),
            step_s=step_s,
            pipeline_s=float(work[tl.END_S].max()) if len(work) else 0.0,
            unit=unit,
            scale=scale,
        )


def gantt_figure(timeline: pd.DataFrame, *, title: str) -> Figure:
    """The pipeline Gantt chart of one step.

    One block per pipeline rank (rank 0 on top): a tall compute lane (F, B, I, W, R, optimizer;
    TP collectives too, as they hold the compute stream) and thin lanes for the tp, pp_send,
    pp_recv and dp streams that have events (communication bars at least 1 px wide). Idle
    time is the empty grey of a lane; at the right, each rank's idle fraction of the pipeline
    time (its bubble, ``plansim.sim.timeline.bubble_fractions``). Dashed line: end of the
    pipeline work; solid: step end. Micro-batch numbers sit inside compute bars wide enough
    for them (none when more than 3000 would fit); with vpp > 1 later model chunks are
    lighter. Bars are two polygon collections: 30,000 events (p = 16, m = 192) draw in about
    a second.

    Args:
        timeline: Timeline schema, seconds.
        title: first title line; a second gives step time, pipeline time and mean bubble.
    """
    geo = _GanttGeometry.of(timeline)
    top_in, bottom_in = 1.25, 0.55
    height_in = top_in + bottom_in + geo.num_ranks * (0.95 if geo.num_ranks <= 8 else 0.8)
    with _style():
        fig = _figure(16.0, height_in)
        ax = fig.add_axes(
            (0.07, bottom_in / height_in, 0.85, 1.0 - (top_in + bottom_in) / height_in)
        )
        x_max = geo.step_s * geo.scale * 1.005 if geo.step_s > 0 else 1.0
        px_per_unit = ax.bbox.width / x_max
        offsets, pitch = _gantt_layers(ax, timeline, geo=geo, px_per_unit=px_per_unit)
        bases = np.arange(geo.num_ranks) * pitch
        _microbatch_labels(ax, timeline, bases=bases, geo=geo, px_per_unit=px_per_unit)
        _gantt_axes(ax, offsets=offsets, bases=bases, pitch=pitch, x_max=x_max)
        idle = tl.bubble_fractions(
            timeline, num_ranks=geo.num_ranks, pipeline_time_s=geo.pipeline_s
        )
        _gantt_marks(ax, idle=idle, bases=bases, geo=geo)
        ax.set_xlabel(f"time ({geo.unit})")
        thin = [_short(s) for s in offsets if s != "compute"]
        if thin:
            note = "thin lanes under each rank, top to bottom: " + ", ".join(thin)
            fig.text(0.005, 0.1 / height_in, note, fontsize=7, va="bottom", color="#444444")
        fig.suptitle(
            f"{title}\nstep {geo.step_s * geo.scale:.4g} {geo.unit}, pipeline work until "
            f"{geo.pipeline_s * geo.scale:.4g} {geo.unit}, "
            f"mean bubble {100 * sum(idle) / len(idle):.1f}%",
            y=1.0 - 0.08 / height_in,
            va="top",
        )
        _gantt_legend(fig, timeline, vpp=geo.vpp)
    return fig


def _gantt_axes(
    ax: Any,
    *,
    offsets: dict[str, tuple[float, float]],
    bases: np.ndarray,
    pitch: float,
    x_max: float,
) -> None:
    """Limits, rank labels (major ticks) and lane names (minor ticks, up to 8 ranks)."""
    ax.set_xlim(0.0, x_max)
    ax.set_ylim(len(bases) * pitch - _RANK_GAP + 0.1, -0.1)
    ax.set_yticks(bases + 0.5, [f"rank {r}" for r in range(len(bases))])
    lane_ranks = bases if len(bases) <= 8 else bases[:0]
    minor = [(b + top + h / 2, name) for b in lane_ranks for name, (top, h) in offsets.items()]
    minor = [(y, _short(name)) for y, name in minor if name != "compute"]
    ax.set_yticks([y for y, _ in minor], [n for _, n in minor], minor=True)
    ax.tick_params(axis="y", which="minor", labelsize=6, length=0, pad=2)
    ax.tick_params(axis="y", which="major", length=0, pad=22 if minor else 3)
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _short(stream: str) -> str:
    return next((short for s, _, short in _LANES if s == stream), stream)


def _gantt_marks(ax: Any, *, idle: Sequence[float], bases: np.ndarray, geo: _GanttGeometry) -> None:
    """Per-rank idle fraction at the right; pipeline-end (dashed) and step-end lines."""
    right = blended_transform_factory(ax.transAxes, ax.transData)
    for base, fraction in zip(bases, idle, strict=True):
        ax.text(
            1.004,
            base + 0.5,
            f"idle {100 * fraction:.1f}%",
            transform=right,
            va="center",
            fontsize=8,
        )
    pipeline, step = geo.pipeline_s * geo.scale, geo.step_s * geo.scale
    ax.axvline(pipeline, color="#444444", linestyle="--", linewidth=0.9)
    ax.axvline(step, color="black", linewidth=1.2)
    top = blended_transform_factory(ax.transData, ax.transAxes)
    ax.text(pipeline, 1.003, "pipeline end ", transform=top, ha="right", va="bottom", fontsize=7)
    ax.text(step, 1.003, " step end", transform=top, ha="left", va="bottom", fontsize=7)


# ---------------------------------------------------------------------------------- memory


def plot_memory(
    memory: pd.DataFrame,
    path: str | os.PathLike[str],
    *,
    title: str,
    capacity_bytes: float,
    end_s: float | None = None,
    label: str = "memory plot",
) -> Path:
    """Draw memory over time per rank (:func:`memory_figure`) and write it as a PNG.

    Args:
        memory: samples ``rank, time_s, bytes`` (``SimResult.memory``).
        path: destination PNG.
        title: figure title.
        capacity_bytes: usable memory per GPU, bytes.
        end_s: extend every line to this time (seconds); default the last sample.
        label: what the path came from (e.g. ``"--memory-plot"``), named in errors.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    fig = memory_figure(memory, title=title, capacity_bytes=capacity_bytes, end_s=end_s)
    return _save(fig, path, label=label)


def memory_figure(
    memory: pd.DataFrame, *, title: str, capacity_bytes: float, end_s: float | None = None
) -> Figure:
    """Memory per GPU over time, one step line per rank (GiB), and the capacity.

    Two panels sharing the time axis: on top the full scale from 0 with the capacity (red
    dashed) and the headroom left at the peak; below, the same lines zoomed to the range the
    samples span, where the micro-batches in flight show as steps, with the peak marked.

    Args:
        memory: samples ``rank, time_s, bytes`` (``SimResult.memory``): each value holds from
            its sample to the next.
        title: figure title.
        capacity_bytes: usable memory per GPU, bytes.
        end_s: extend every line to this time (e.g. the step end), seconds; default the last
            sample.
    """
    end = max(float(memory["time_s"].max()) if len(memory) else 0.0, end_s or 0.0)
    unit, scale = _time_unit(end)
    lines = _memory_lines(memory, end_s=end, scale=scale)
    capacity_gib = bytes_to_gib(capacity_bytes)
    peak_gib = max((float(g.max()) for _, _, g in lines), default=0.0)
    with _style():
        fig = _figure(12.0, 7.0)
        full = fig.add_axes((0.07, 0.66, 0.76, 0.26))
        zoom = fig.add_axes((0.07, 0.08, 0.76, 0.5), sharex=full)
        cmap = matplotlib.colormaps["viridis"]
        for i, (rank, t, gib) in enumerate(lines):
            colour = cmap(i / max(1, len(lines) - 1) * 0.9)
            for ax in (full, zoom):
                ax.plot(t, gib, drawstyle="steps-post", color=colour, lw=1.1, label=f"rank {rank}")
        full.axhline(capacity_gib, color="#D62728", linestyle="--", linewidth=1.2)
        note = (
            f" capacity {capacity_gib:.1f} GiB, headroom at peak {capacity_gib - peak_gib:.1f} GiB"
        )
        left = blended_transform_factory(full.transAxes, full.transData)
        full.text(
            0.005, capacity_gib, note, transform=left, va="bottom", fontsize=8, color="#D62728"
        )
        full.set_ylim(0.0, max(capacity_gib, peak_gib) * 1.12)
        full.set_xlim(0.0, end * scale if end > 0 else 1.0)
        _memory_zoom(zoom, lines, capacity_gib=capacity_gib)
        full.set_title(title)
        full.set_ylabel("GiB")
        full.tick_params(labelbottom=False)
        zoom.set_ylabel("memory per GPU (GiB), zoomed")
        zoom.set_xlabel(f"time ({unit})")
        for ax in (full, zoom):
            ax.grid(color="#E5E5E5", linewidth=0.6)
        if lines:
            ncol = 1 if len(lines) <= 16 else 2
            zoom.legend(
                loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7, ncol=ncol
            )
    return fig


def _memory_lines(
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


def _memory_zoom(
    ax: Any, lines: list[tuple[int, np.ndarray, np.ndarray]], *, capacity_gib: float
) -> None:
    """Y range of the samples (plus margins; the capacity when close) and the peak marker."""
    if not lines:
        ax.text(0.5, 0.5, "no memory samples", transform=ax.transAxes, ha="center")
        return
    low = min(float(g.min()) for _, _, g in lines)
    high = max(float(g.max()) for _, _, g in lines)
    if capacity_gib <= high + 0.1 * (high - low):
        high = max(high, capacity_gib)
        ax.axhline(capacity_gib, color="#D62728", linestyle="--", linewidth=1.2)
    pad = max(0.08 * (high - low), 0.05)
    ax.set_ylim(low - pad, high + 2 * pad)
    rank, t, gib = max(lines, key=lambda line: (float(line[2].max()), -line[0]))
    j = int(np.argmax(gib))
    ax.plot([t[j]], [gib[j]], marker="v", color="black", markersize=6)
    ax.annotate(
        f"peak {gib[j]:.2f} GiB (rank {rank})",
        (t[j], gib[j]),
        xytext=(6, 5),
        textcoords="offset points",
        fontsize=8,
    )


# ---------------------------------------------------------------------------------- Pareto


def plot_pareto(
    evaluations: Sequence[Evaluation],
    path: str | os.PathLike[str],
    *,
    title: str,
    capacity_bytes: float,
    label: str = "plot",
) -> Path:
    """Draw step time vs peak memory (:func:`pareto_figure`) and write it as a PNG.

    Args:
        evaluations: simulated plans (``SearchResult.ranked``).
        path: destination PNG.
        title: figure title.
        capacity_bytes: usable memory per GPU, bytes.
        label: what the path came from (e.g. ``"--plot"``), named in errors.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    fig = pareto_figure(evaluations, title=title, capacity_bytes=capacity_bytes)
    return _save(fig, path, label=label)


def pareto_figure(
    evaluations: Sequence[Evaluation], *, title: str, capacity_bytes: float
) -> Figure:
    """Scatter of simulated step time (s) vs peak memory per GPU (GiB), Pareto front joined.

    Points are coloured by schedule (a fixed colour per ``Schedule`` member); the front
    (:func:`pareto_front`: no other plan is both as fast and as light) is circled in black
    and connected; the fastest plan is annotated with its full label, up to 8 other front
    points with a short one; the capacity is a red dashed line.

    Args:
        evaluations: simulated plans (``SearchResult.ranked``).
        title: first title line; a second counts the plans and the front.
        capacity_bytes: usable memory per GPU, bytes.
    """
    xs = np.array([ev.step_time_s for ev in evaluations], dtype=np.float64)
    ys = np.array([bytes_to_gib(ev.peak_memory_bytes) for ev in evaluations], dtype=np.float64)
    front = list(pareto_front(list(zip(xs.tolist(), ys.tolist(), strict=True))))
    capacity_gib = bytes_to_gib(capacity_bytes)
    with _style():
        fig = _figure(12.0, 6.5)
        ax = fig.add_axes((0.075, 0.1, 0.76, 0.8))
        for i, schedule in enumerate(Schedule):
            mask = np.array([ev.plan.schedule is schedule for ev in evaluations], dtype=bool)
            if mask.any():
                colour = _SCHEDULE_COLOURS[i % len(_SCHEDULE_COLOURS)]
                ax.scatter(
                    xs[mask],
                    ys[mask],
                    s=22,
                    color=colour,
                    alpha=0.75,
                    label=schedule.value,
                    linewidths=0,
                )
        if front:
            ax.plot(
                xs[front],
                ys[front],
                color="black",
                linewidth=1.0,
                marker="o",
                markersize=8,
                markerfacecolor="none",
                label="Pareto front",
            )
            _annotate_front(ax, evaluations, front, xs, ys)
        ax.axhline(
            capacity_gib,
            color="#D62728",
            linestyle="--",
            linewidth=1.2,
            label=f"capacity {capacity_gib:.1f} GiB",
        )
        if not len(evaluations):
            ax.text(0.5, 0.5, "no feasible plan", transform=ax.transAxes, ha="center")
        ax.set_ylim(0.0, max([capacity_gib, *ys.tolist()]) * 1.1)
        ax.set_xlabel("simulated step time (s)")
        ax.set_ylabel("peak memory per GPU (GiB)")
        ax.set_title(f"{title}\n{len(evaluations)} simulated plans, {len(front)} on the front")
        ax.grid(color="#E5E5E5", linewidth=0.6)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def _annotate_front(
    ax: Any, evaluations: Sequence[Evaluation], front: list[int], xs: np.ndarray, ys: np.ndarray
) -> None:
    """Label the fastest plan (the front's first point) in a box in the lower left corner,
    which no plan can occupy (it would beat the front), and up to 8 other front points."""
    best = front[0]
    ev = evaluations[best]
    ax.annotate(
        f"fastest: {ev.plan.label()}\n{xs[best]:.3f} s per step, {ys[best]:.1f} GiB peak",
        (xs[best], ys[best]),
        xytext=(0.02, 0.05),
        textcoords="axes fraction",
        ha="left",
        va="bottom",
        fontsize=8,
        fontweight="bold",
        arrowprops={"arrowstyle": "->", "color": "#555555", "shrinkB": 6, "linewidth": 0.8},
        bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "#888888"},
    )
    for i in front[1:9]:
        ax.annotate(
            _short_label(evaluations[i]),
            (xs[i], ys[i]),
            xytext=(7, 2),
            textcoords="offset points",
            fontsize=7,
            color="#333333",
        )


def _short_label(ev: Evaluation) -> str:
    """``tp4 pp8 dp32 vpp6 mbs1 zero2 none sp`` (the schedule is the point's colour)."""
    p = ev.plan
    parts = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"]
    parts += [f"vpp{p.vpp}"] if p.vpp > 1 else []
    parts += [f"mbs{p.micro_batch_size}", f"zero{p.zero_stage}", p.recompute.value]
    parts += ["sp"] if p.sequence_parallel else []
    return " ".join(parts)
