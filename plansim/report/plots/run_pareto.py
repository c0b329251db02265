"""Time to train vs cost (or GPU-hours) of whole runs over GPU counts, with the Pareto front."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from plansim.report.chart_layout import pareto_front
from plansim.report.plots._common import _figure, _save, _style


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPoint:
    """One whole run: its GPUs, expected days and cost (dollars, or GPU-hours without a
    price table), and a short label of its plan."""

    num_gpus: int
    days: float
    cost: float
    label: str


def plot_run_pareto(
    points: Sequence[RunPoint],
    path: str | os.PathLike[str],
    *,
    title: str,
    cost_label: str,
    label: str = "--plot",
) -> Path:
    """Draw :func:`run_pareto_figure` and write it as a PNG (atomically).

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    fig = run_pareto_figure(points, title=title, cost_label=cost_label)
    return _save(fig, path, label=label)


def run_pareto_figure(points: Sequence[RunPoint], *, title: str, cost_label: str) -> Figure:
    """Scatter of days to train (x) vs cost (y), coloured by GPU count on a log colour
    scale, the front (no run both as quick and as cheap) circled, joined and labelled with
    its GPU counts.

    Args:
        points: the runs (one per GPU count and plan).
        title: the figure's first title line.
        cost_label: the y axis label ("cost (USD)" or "GPU-hours").
    """
    xs = np.array([p.days for p in points], dtype=np.float64)
    ys = np.array([p.cost for p in points], dtype=np.float64)
    gpus = np.array([p.num_gpus for p in points], dtype=np.float64)
    front = list(pareto_front(list(zip(xs.tolist(), ys.tolist(), strict=True))))
    with _style():
        fig = _figure(10.0, 6.0)
        ax = fig.add_axes((0.1, 0.1, 0.72, 0.8))
        if len(points):
            dots = ax.scatter(xs, ys, c=np.log2(gpus), cmap="viridis", s=40, linewidths=0, zorder=2)
            bar = fig.colorbar(dots, ax=ax, pad=0.02)
            ticks = sorted(set(gpus.tolist()))
            bar.set_ticks(np.log2(ticks).tolist())
            bar.set_ticklabels([f"{int(t):,}" for t in ticks])
            bar.set_label("GPUs")
        else:
            ax.text(0.5, 0.5, "no feasible run", transform=ax.transAxes, ha="center")
        if front:
            ax.plot(
                xs[front],
                ys[front],
                color="black",
                linewidth=1.0,
                marker="o",
                markersize=10,
                markerfacecolor="none",
                zorder=3,
            )
            for i in front:
                ax.annotate(
                    f"{points[i].num_gpus:,}: {points[i].label}",
                    (xs[i], ys[i]),
                    textcoords="offset points",
                    xytext=(6, 6),
                    fontsize=7,
                )
        ax.margins(x=0.15, y=0.1)
        ax.set_xlabel("expected days to train")
        ax.set_ylabel(cost_label)
        ax.set_title(f"{title}\n{len(points)} runs, {len(front)} on the front")
        ax.grid(color="#E5E5E5", linewidth=0.6)
    return fig
