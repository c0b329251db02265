"""Memory over time per rank, with the capacity line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from plansim.report.chart_layout import memory_lines, time_unit
from plansim.report.plots._common import (
    _figure,
    _save,
    _style,
)
from plansim.units import bytes_to_gib


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
    unit, scale = time_unit(end)
    lines = memory_lines(memory, end_s=end, scale=scale)
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
