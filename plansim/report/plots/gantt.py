"""Pipeline bubble Gantt chart: ranks x time, compute and communication lanes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from plansim.report.chart_layout import (
    IDLE_COLOUR,
    KIND_STYLES,
    RANK_GAP,
    GanttGeometry,
    kind_colours,
    lane_events,
    lane_offsets,
    short_stream,
)
from plansim.report.plots._common import (
    _LABEL_PT,
    _LABELLED,
    _MAX_LABELS,
    DPI,
    _figure,
    _lighten,
    _save,
    _style,
)
from plansim.sim import timeline as tl


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
    colours = kind_colours([str(k) for k in kinds])
    palette = np.array([to_rgba(colours[str(k)]) for k in kinds]).reshape(-1, 4)
    out = palette[codes] if len(rows) else np.zeros((0, 4))
    if vpp > 1:
        chunk = np.maximum(rows[tl.STAGE].to_numpy(), 0) // num_ranks
        fraction = 0.5 * chunk / (vpp - 1)
        out[:, :3] = out[:, :3] + (1.0 - out[:, :3]) * fraction[:, None]
    return out


def _gantt_layers(
    ax: Any, timeline: pd.DataFrame, *, geo: GanttGeometry, px_per_unit: float
) -> tuple[dict[str, tuple[float, float]], float]:
    """Draw lane backgrounds and every bar; return the lane offsets and the block pitch.

    Two polygon collections (compute lane, communication lanes), unsnapped so that bars
    narrower than a pixel blend in proportion to their length instead of flickering.
    Communication bars are drawn at least one pixel wide.
    """
    streams = [str(s) for s in timeline[tl.STREAM].unique()]
    offsets, pitch = lane_offsets(streams)
    bases = np.arange(geo.num_ranks) * pitch
    end = geo.step_s * geo.scale if geo.step_s > 0 else 1.0
    backgrounds = [
        [(0, b + top), (0, b + top + h), (end, b + top + h), (end, b + top)]
        for b in bases
        for top, h in offsets.values()
    ]
    ax.add_collection(
        PolyCollection(backgrounds, facecolors=IDLE_COLOUR, edgecolors="none"), autolim=False
    )
    on_compute, comm = lane_events(timeline)
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
    ax: Any, timeline: pd.DataFrame, *, bases: np.ndarray, geo: GanttGeometry, px_per_unit: float
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
    colours = kind_colours(sorted(present))
    handles: dict[str, Patch] = {}
    ordered = [k for k in KIND_STYLES if k in present] + sorted(present - set(KIND_STYLES))
    for kind in ordered:
        name = KIND_STYLES.get(kind, (None, kind))[1]
        handles.setdefault(name, Patch(facecolor=colours[kind], label=name))
    items = list(handles.values())
    if vpp > 1:
        light = _lighten(KIND_STYLES["forward"][0], 0.5)
        items.append(Patch(facecolor=light, label=f"lighter: later model chunk (vpp {vpp})"))
    items.append(Patch(facecolor=IDLE_COLOUR, edgecolor="#BBBBBB", label="idle"))
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
    geo = GanttGeometry.of(timeline)
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
        thin = [short_stream(s) for s in offsets if s != "compute"]
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
    ax.set_ylim(len(bases) * pitch - RANK_GAP + 0.1, -0.1)
    ax.set_yticks(bases + 0.5, [f"rank {r}" for r in range(len(bases))])
    lane_ranks = bases if len(bases) <= 8 else bases[:0]
    minor = [(b + top + h / 2, name) for b in lane_ranks for name, (top, h) in offsets.items()]
    minor = [(y, short_stream(name)) for y, name in minor if name != "compute"]
    ax.set_yticks([y for y, _ in minor], [n for _, n in minor], minor=True)
    ax.tick_params(axis="y", which="minor", labelsize=6, length=0, pad=2)
    ax.tick_params(axis="y", which="major", length=0, pad=22 if minor else 3)
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _gantt_marks(ax: Any, *, idle: Sequence[float], bases: np.ndarray, geo: GanttGeometry) -> None:
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
