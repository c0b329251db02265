"""How well plansim orders the layouts of a published layout search.

A layout search (e.g. ``benchmarks/published_runs/bloom_layout_search.csv``, the BLOOM-176B
search on 384 A100s) measures many layouts of one model shape; what a user acts on is the
order, not each step time. For each group of rows (``--group-by``, default ``layout_group``)
this prints:

* layouts: distinct layouts (rows equal in every layout column below); repeats of one layout
  are merged by the median of their measured step times (the search's repeats spread by up to
  8%: a shared cluster, one iteration timed), their predictions are equal;
* tau: Kendall's tau-b between predicted and measured step times;
* wtau: a top-weighted Kendall tau (Vigna 2015, "A weighted correlation index for rankings
  with ties", additive hyperbolic weights): each pair weighs 1/(1 + r_i) + 1/(1 + r_j), r the
  measured rank from 0 (fastest), so swaps among the fastest layouts count most;
* regret: how much slower the layout plansim ranks first ran than the measured fastest (%).

Then the same figures over all groups with at least three layouts, tau and wtau weighted by
their layout counts. Nothing here is a target: the rows find mechanisms, never constants. Run:
    .venv/bin/python benchmarks/bench_ranking.py [--runs FILE.csv | --predictions OUT.csv]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from plansim.io.runs import read_runs
from plansim.planner.backtest import predict_row
from plansim.planner.parallel import default_jobs, map_in_order

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = ROOT / "benchmarks" / "published_runs" / "bloom_layout_search.csv"
#: Columns whose values make a layout (a row equal in all of them repeats it).
LAYOUT_COLUMNS = (
    "num_attention_heads",
    "num_gpus",
    "tp",
    "pp",
    "dp",
    "cp",
    "virtual_pipeline_size",
    "micro_batch_size_seqs",
    "recompute",
    "zero_stage",
)


def kendall_tau(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Kendall's tau-b of ``x`` and ``y`` (1-D, equal length >= 2), optionally with a weight
    per pair (``weights[i, j]``); NaN when either side is constant."""
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    upper = np.triu(np.ones_like(dx, dtype=bool), k=1)
    w = np.ones_like(dx, dtype=float) if weights is None else weights
    w = np.where(upper, w, 0.0)
    denom = np.sqrt(np.sum(w * (dx != 0)) * np.sum(w * (dy != 0)))
    return float(np.sum(w * dx * dy) / denom) if denom > 0 else float("nan")


def hyperbolic_weights(measured: np.ndarray) -> np.ndarray:
    """Pair weights 1/(1 + r_i) + 1/(1 + r_j), r the rank of ``measured`` from 0 (smallest)."""
    rank = np.argsort(np.argsort(measured, kind="stable"), kind="stable")
    w = 1.0 / (1.0 + rank)
    return w[:, None] + w[None, :]


def group_figures(group: pd.DataFrame) -> dict[str, float]:
    """Layouts, tau, weighted tau and regret (%) of one group of predicted rows."""
    keys = [c for c in LAYOUT_COLUMNS if c in group.columns]
    merged = (
        group.assign(**{c: group[c].map(str) for c in keys})
        .groupby(keys, dropna=False)[["step_time_s", "predicted_step_time_s"]]
        .median()
    )
    measured = merged["step_time_s"].to_numpy(dtype=float)
    predicted = merged["predicted_step_time_s"].to_numpy(dtype=float)
    figures: dict[str, float] = {"layouts": float(len(merged))}
    if len(merged) < 2:
        return figures | {"tau": float("nan"), "wtau": float("nan"), "regret_pct": float("nan")}
    figures["tau"] = kendall_tau(predicted, measured)
    figures["wtau"] = kendall_tau(predicted, measured, hyperbolic_weights(measured))
    picked = measured[int(np.argmin(predicted))]
    figures["regret_pct"] = 100.0 * (picked / measured.min() - 1.0)
    return figures


def predictions(runs: Path, jobs: int) -> pd.DataFrame:
    """Each row of ``runs`` with the back-test's ``predicted_step_time_s`` beside it."""
    _, rows = read_runs(runs)
    predicted = map_in_order(partial(predict_row, simulate_top=8), rows, jobs)
    frame = pd.DataFrame(
        [
            {**row.cells, "predicted_step_time_s": p.predicted_step_time_s}
            for row, p in zip(rows, predicted, strict=True)
        ]
    )
    frame["step_time_s"] = pd.to_numeric(frame["step_time_s"], errors="coerce")
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="runs CSV to predict")
    source.add_argument("--predictions", type=Path, help="a 'plansim backtest --out' CSV")
    parser.add_argument("--group-by", default="layout_group")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    args = parser.parse_args()
    frame = pd.read_csv(args.predictions) if args.predictions else predictions(args.runs, args.jobs)
    frame = frame[frame["predicted_step_time_s"].notna() & frame["step_time_s"].notna()]
    rows = []
    for name, group in frame.groupby(args.group_by, sort=True):
        rows.append({args.group_by: name, **group_figures(group)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    ranked = table[table["layouts"] >= 3]
    if ranked.empty:
        print("no group has three or more layouts")
        return
    weight = ranked["layouts"]
    print(
        f"{len(ranked)} groups with >= 3 layouts ({int(weight.sum())} layouts): "
        f"tau {np.average(ranked['tau'], weights=weight):.2f}, "
        f"wtau {np.average(ranked['wtau'], weights=weight):.2f}, "
        f"regret median {ranked['regret_pct'].median():.1f}%, max {ranked['regret_pct'].max():.1f}%"
    )


if __name__ == "__main__":
    main()
