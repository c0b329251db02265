"""Step time vs peak memory of the simulated plans, with the Pareto front."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from plansim.planner.evaluate import Evaluation
from plansim.report.chart_layout import SCHEDULE_COLOURS, pareto_front, short_label
from plansim.report.plots._common import (
    _figure,
    _save,
    _style,
)
from plansim.specs.plan import Schedule
from plansim.units import bytes_to_gib


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
                colour = SCHEDULE_COLOURS[i % len(SCHEDULE_COLOURS)]
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
            short_label(evaluations[i]),
            (xs[i], ys[i]),
            xytext=(7, 2),
            textcoords="offset points",
            fontsize=7,
            color="#333333",
        )
