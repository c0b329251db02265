"""Shared style, figure and atomic-save helpers of the plots (the only matplotlib users)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
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
#: Kinds whose bars carry the micro-batch number when wide enough.
_LABELLED = ("forward", "backward", "backward_input", "backward_weight", "recompute")
_MAX_LABELS = 3000
_LABEL_PT = 7.0
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


def _lighten(colour: str, fraction: float) -> tuple[float, float, float, float]:
    """Blend ``colour`` towards white by ``fraction`` (0: unchanged, 1: white)."""
    rgba = np.array(to_rgba(colour))
    rgba[:3] = rgba[:3] + (1.0 - rgba[:3]) * fraction
    return (float(rgba[0]), float(rgba[1]), float(rgba[2]), 1.0)


# ---------------------------------------------------------------------------------- Gantt
