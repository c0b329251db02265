"""Overlay Gantt chart: the simulated step above the measured one, per pipeline rank."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from plansim.report.chart_layout import IDLE_COLOUR, time_unit
from plansim.report.plots._common import _figure, _save, _style
from plansim.report.plots.gantt import _bar_colours, _bars, _gantt_legend
from plansim.sim import timeline as tl

#: Height of one compute lane, of the communication strip under it, and the gaps.
_ROW = 1.0
_COMM = 0.25
_PAIR_GAP = 0.12
_RANK_GAP = 0.6
#: Offset of the second (measured) lane from the first inside a rank block.
_SIDE = _ROW + _COMM + _PAIR_GAP


def overlay_figure(
    simulated: pd.DataFrame, measured: pd.DataFrame, *, num_ranks: int, vpp: int, title: str
) -> Figure:
    """Per pipeline rank, two compute lanes: simulated (top, labelled ``sim``) and measured
    (below, ``meas``), on one time axis.

    Each lane shows the rank's compute-stream rows and its TP collectives (which hold the
    compute stream), coloured by kind as in :func:`plansim.report.plots.gantt.gantt_figure`
    (later model chunks lighter when vpp > 1); idle time is grey. A thin strip under each
    lane shows the rank's other communication (pipeline sends/receives, DP), all streams
    together. A solid line marks each side's step end (its last event).

    Args:
        simulated, measured: Timelines (seconds from the start of the step).
        num_ranks: pipeline ranks.
        vpp: model chunks per rank.
        title: first title line; a second gives both step ends and their signed difference.
    """
    sim_end = float(simulated[tl.END_S].max()) if len(simulated) else 0.0
    meas_end = float(measured[tl.END_S].max()) if len(measured) else 0.0
    unit, scale = time_unit(max(sim_end, meas_end))
    pitch = 2 * _SIDE - _PAIR_GAP + _RANK_GAP
    height_in = 1.5 + num_ranks * 1.3
    with _style():
        fig = _figure(16.0, height_in)
        ax = fig.add_axes((0.07, 0.5 / height_in, 0.9, 1.0 - 1.5 / height_in))
        x_max = max(sim_end, meas_end, 1e-12) * scale * 1.01
        for side, (df, end) in enumerate(((simulated, sim_end), (measured, meas_end))):
            offset = side * _SIDE
            _draw_lane(
                ax,
                df,
                offset=offset,
                pitch=pitch,
                num_ranks=num_ranks,
                vpp=vpp,
                scale=scale,
                end=end * scale,
            )
        ticks = [
            (r * pitch + side * _SIDE + _ROW / 2, f"rank {r} {name}")
            for r in range(num_ranks)
            for side, name in enumerate(("sim", "meas"))
        ]
        ax.set_yticks([y for y, _ in ticks], [t for _, t in ticks])
        ax.set_xlim(0.0, x_max)
        ax.set_ylim(num_ranks * pitch - _RANK_GAP + 0.1, -0.1)
        ax.set_xlabel(f"time ({unit})")
        ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
        ax.set_axisbelow(True)
        diff = 100.0 * (sim_end - meas_end) / meas_end if meas_end > 0 else 0.0
        fig.suptitle(
            f"{title}\nsimulated step {sim_end * scale:.4g} {unit}, measured "
            f"{meas_end * scale:.4g} {unit} ({diff:+.1f}%)",
            y=1.0 - 0.08 / height_in,
            va="top",
        )
        both = pd.concat([simulated, measured], ignore_index=True)
        _gantt_legend(fig, both, vpp=vpp)
    return fig


def _draw_lane(
    ax: Any,
    df: pd.DataFrame,
    *,
    offset: float,
    pitch: float,
    num_ranks: int,
    vpp: int,
    scale: float,
    end: float,
) -> None:
    """Background, bars and step-end mark of one side (simulated or measured)."""
    tops = np.arange(num_ranks) * pitch + offset
    backgrounds = [[(0, t), (0, t + _ROW), (end, t + _ROW), (end, t)] for t in tops]
    ax.add_collection(
        PolyCollection(backgrounds, facecolors=IDLE_COLOUR, edgecolors="none"), autolim=False
    )
    mine = df[df[tl.RANK] < num_ranks]
    on_compute = mine[tl.STREAM].isin(tl.COMPUTE_STREAMS)
    comm = mine[mine[tl.STREAM] != tl.COMPUTE]
    for rows, shift, height in ((mine[on_compute], 0.0, _ROW), (comm, _ROW, _COMM)):
        y0 = tops[rows[tl.RANK].to_numpy()] + shift
        verts = _bars(rows, y0=y0, height=height, scale=scale)
        bars = PolyCollection(
            cast(Any, verts),
            facecolors=_bar_colours(rows, num_ranks=num_ranks, vpp=vpp),
            edgecolors="none",
        )
        bars.set_snap(False)
        ax.add_collection(bars, autolim=False)
    for t in tops:
        ax.plot([end, end], [t, t + _ROW], color="black", linewidth=1.2)


def plot_overlay(
    simulated: pd.DataFrame,
    measured: pd.DataFrame,
    path: str | os.PathLike[str],
    *,
    num_ranks: int,
    vpp: int,
    title: str,
    label: str = "overlay",
) -> Path:
    """Draw :func:`overlay_figure` and write it as a PNG atomically.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    fig = overlay_figure(simulated, measured, num_ranks=num_ranks, vpp=vpp, title=title)
    return _save(fig, path, label=label)
