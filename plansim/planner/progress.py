"""Progress of a long planner search on stderr (tqdm), and the interface the planner reports to.

The planner calls a :class:`Progress` (or nothing) and never prints itself. The CLI's bar
(:func:`progress_bar`) appears only after ``delay_s`` of work (searches shorter than about a
second show nothing) and only on a terminal unless forced (``--progress``), so captured
output (tests, pipes) stays clean.
"""

from __future__ import annotations

import sys
from typing import Protocol, TextIO


class Progress(Protocol):
    """What a search reports: phases, units done, and the figures so far."""

    def start(self, phase: str, total: int) -> None:
        """A phase begins with ``total`` units (layouts to cost, plans to simulate)."""

    def update(
        self, done: int, *, feasible: int | None = None, best_s: float | None = None
    ) -> None:
        """``done`` more units; ``feasible`` plans so far and ``best_s`` the best simulated
        step, for a search (None for units that are not plans: sweep cells, back-test rows)."""

    def close(self) -> None:
        """The search ended."""


class TqdmProgress:
    """A tqdm bar per phase on ``stream``, shown after ``delay_s`` seconds.

    Args:
        stream: where to draw (stderr).
        delay_s: seconds before a phase's bar appears (0: at once).
    """

    def __init__(self, stream: TextIO, *, delay_s: float) -> None:
        self._stream = stream
        self._delay_s = delay_s
        self._bar: object | None = None

    def start(self, phase: str, total: int) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self.close()
        self._bar = tqdm(
            total=total,
            desc=phase,
            file=self._stream,
            delay=self._delay_s,
            leave=False,
            dynamic_ncols=True,
        )

    def update(
        self, done: int, *, feasible: int | None = None, best_s: float | None = None
    ) -> None:
        bar = self._bar
        if bar is None:
            return
        if feasible is not None:
            best = "-" if best_s is None else f"{best_s:.4g} s"
            bar.set_postfix_str(f"feasible {feasible}, best {best}", refresh=False)  # type: ignore[attr-defined]
        bar.update(done)  # type: ignore[attr-defined]

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()  # type: ignore[attr-defined]
            self._bar = None


def progress_bar(*, forced: bool, stream: TextIO | None = None) -> Progress | None:
    """The CLI's progress: a bar when ``forced`` (at once) or when ``stream`` (stderr) is a
    terminal (after 1 s); None otherwise."""
    out = sys.stderr if stream is None else stream
    if forced:
        return TqdmProgress(out, delay_s=0.0)
    if out.isatty():
        return TqdmProgress(out, delay_s=1.0)
    return None
