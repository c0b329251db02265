"""Shared style, figure and atomic-save helpers of the plots (the only matplotlib users)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import matplotlib
import matplotlib.style
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from plansim.io.outputs import write_bytes_atomic

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
