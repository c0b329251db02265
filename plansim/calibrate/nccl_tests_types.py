"""What ``plansim.calibrate.nccl_tests`` reads out of an nccl-tests log: its rows, runs,
problems and the whole log. Pure (pandas)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One half (out-of-place or in-place) of a row, in SI units."""

    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRow:
    """One result row: message ``size_bytes`` (nccl-tests' size) and its two timings."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str
    out_of_place: Timing | None
    in_place: Timing | None

    @property
    def time_s(self) -> float:
        """The smaller of the two times (what a fit uses; it drops single outliers)."""
        return min(t.time_s for t in (self.out_of_place, self.in_place) if t is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRun:
    """One table: a collective over ``num_ranks`` ranks on ``num_nodes`` hosts.

    ``num_ranks`` comes from the ``#  Rank`` lines, else from busbw/algbw of the largest row
    (the bus factor); ``None`` when neither is available. ``complete`` is True when the table
    ended with nccl-tests' summary lines (a truncated log has False).
    """

    collective: str
    binary: str
    first_line: int
    num_ranks: int | None
    num_nodes: int | None
    devices: tuple[str, ...]
    nccl_tests_version: str | None
    nccl_version: str | None
    complete: bool
    rows: tuple[NcclTestsRow, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """A line that could not be used, with the reason (line numbers start at 1)."""

    line: int
    reason: str
    text: str

    def describe(self, source: str) -> str:
        """``source:line: reason: text`` (text shortened to 80 characters)."""
        text = self.text.strip()
        text = text if len(text) <= 80 else text[:77] + "..."
        return f"{source}:{self.line}: {self.reason}" + (f": {text!r}" if text else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsLog:
    """Everything usable in one log: runs of the supported collectives and the problems."""

    source: str
    runs: tuple[NcclTestsRun, ...]
    problems: tuple[Problem, ...]

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per result row (SI units; NaN for a missing half)."""
        records = []
        for index, run in enumerate(self.runs):
            for row in run.rows:
                record: dict[str, object] = {
                    "source": self.source,
                    "run": index,
                    "line": row.line,
                    "collective": run.collective,
                    "num_ranks": run.num_ranks,
                    "num_nodes": run.num_nodes,
                    "size_bytes": row.size_bytes,
                    "dtype": row.dtype,
                }
                for tag, timing in (("oop", row.out_of_place), ("ip", row.in_place)):
                    record[f"{tag}_time_s"] = timing.time_s if timing else math.nan
                    record[f"{tag}_algbw_bytes_per_s"] = (
                        timing.algbw_bytes_per_s if timing else math.nan
                    )
                    record[f"{tag}_busbw_bytes_per_s"] = (
                        timing.busbw_bytes_per_s if timing else math.nan
                    )
                records.append(record)
        return pd.DataFrame.from_records(records)
