"""A progress bar with what is being measured and an ETA (tqdm when installed; off when stdout
is not a terminal, so logs and pipes stay clean). Pure: no torch."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO


class Progress:
    """``update(done, label)`` as items start; ``close()`` at the end (or use ``with``).

    With tqdm (``pip install plansim[torch]`` brings it) the bar is tqdm's; without it a
    one-line ``[ 12/60] label  ETA 20 s`` is redrawn on stderr. Disabled: every call is a no-op.
    """

    def __init__(self, total: int, *, enabled: bool | None = None, stream: TextIO | None = None):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = sys.stdout.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self.done = 0
        self._bar: Any = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(total=total, file=self.stream, unit="item", dynamic_ncols=True)

    def update(self, done: int, label: str) -> None:
        """``done`` items finished; ``label`` is the one now running."""
        if not self.enabled:
            return
        step, self.done = max(0, done - self.done), max(self.done, done)
        if self._bar is not None:
            self._bar.set_description_str(label[:50])
            self._bar.update(step)
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        eta_text = f"ETA {eta:.0f} s" if eta == eta else "ETA ?"
        width = len(str(self.total))
        self.stream.write(f"\r[{self.done:{width}d}/{self.total}] {label[:50]:<50}  {eta_text}  ")
        self.stream.flush()

    def close(self, *, complete: bool = True) -> None:
        """End the bar (filled to the total when ``complete``)."""
        if not self.enabled:
            return
        if self._bar is not None:
            if complete:
                self._bar.update(max(0, self.total - self.done))
            self._bar.close()
        else:
            self.stream.write("\n")
            self.stream.flush()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close(complete=kind is None)
