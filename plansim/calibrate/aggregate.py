"""Raw calibration rows -> one row per measured item, and the count of contended timings.
Pure (pandas, no torch); used by :mod:`plansim.calibrate.build`."""

from __future__ import annotations

import pandas as pd

from plansim.calibrate.plan import CPU_SHARE_OK

_COMPUTE_KINDS = ("gemm", "attention", "stream", "launch", "host_op", "adam")


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
