"""Raw calibration rows -> one row per measured item, and the count of contended timings.
Pure (pandas, no torch); used by :mod:`plansim.calibrate.build`."""

from __future__ import annotations

import pandas as pd

from plansim.calibrate.plan import CPU_SHARE_OK

_COMPUTE_KINDS = ("gemm", "attention", "stream", "launch", "host_op", "adam", "elementwise")
#: Start of the note of a cache-flushed timing (``cold_timer.COLD_NOTE``; kept equal by a test,
#: as this module does not import torch).
COLD_NOTE = "each call timed alone after a cache-evicting write"


def cache_note(rows: pd.DataFrame, kind: str) -> str:
    """How the ``kind`` timings met the caches, for provenance: the cold-timing note of the
    first such row (e.g. ``"each call ... write of 72 MiB"``), else ``"calls timed back to
    back (operands stay cached)"`` (runs recorded before cold timing existed)."""
    timed = rows[(rows["kind"] == kind) & (rows["status"] == "ok")]
    notes = timed["note"].fillna("").astype(str)
    for note in notes:
        for part in note.split("; "):
            if part.startswith(COLD_NOTE):
                return part
    return "calls timed back to back (operands stay cached)"


def contention(rows: pd.DataFrame) -> tuple[int, int]:
    """(compute timings with cpu_share < CPU_SHARE_OK, compute timings with a cpu_share)."""
    compute = rows[rows["kind"].isin(_COMPUTE_KINDS) & (rows["status"] == "ok")]
    shares = pd.to_numeric(compute["cpu_share"], errors="coerce").dropna()
    return int((shares < CPU_SHARE_OK).sum()), len(shares)


def aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per measured item: ``time_s`` and ``num_ranks`` that timed it.

    Per pass (``sweep``): the median over ranks for compute, the slowest rank for a
    collective; then the median over passes.
    """
    ok = rows[(rows["status"] == "ok") & (rows["kind"] != "memory")]
    keys = ["kind", "op", "dtype", "shape", "group_size", "work", "work_unit"]
    per_pass = ok.groupby([*keys, "sweep"], sort=False)["median_s"].agg(["median", "max", "size"])
    per_pass = per_pass.reset_index()
    collective = per_pass["kind"] == "collective"
    per_pass["time_s"] = per_pass["median"].where(~collective, per_pass["max"])
    table = per_pass.groupby(keys, sort=False).agg(
        time_s=("time_s", "median"), num_ranks=("size", "max"), passes=("sweep", "nunique")
    )
    return table.reset_index()
