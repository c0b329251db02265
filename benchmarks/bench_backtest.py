"""Back-test accuracy and wall time over every runs file this repository checks against.

For each file (the public sample ``../shared/reference/published_runs.csv`` and the files in
``benchmarks/published_runs/``) one line: runs, runs predicted, mean / median / max |error|
and mean signed error of the step time (%), and the wall time with ``--jobs`` processes, so a
change to the model can be read against all of them at once (the figures ``plansim
backtest`` prints per file). Nothing here is a target: the files are for finding mechanisms,
never for fitting a constant. Run:
    .venv/bin/python benchmarks/bench_backtest.py [--jobs N] [--files A.csv,B.csv]
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

from plansim.commands.backtest import ErrorStats, error_stats
from plansim.io.runs import read_runs
from plansim.planner.backtest import predict_row
from plansim.planner.parallel import default_jobs, map_in_order

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    ROOT.parent / "shared" / "reference" / "published_runs.csv",
    ROOT / "benchmarks" / "published_runs" / "nemo_performance.csv",
    ROOT / "benchmarks" / "published_runs" / "mosaic_llm_foundry.csv",
    ROOT / "benchmarks" / "published_runs" / "other_frameworks.csv",
    ROOT / "benchmarks" / "published_runs" / "bloom_layout_search.csv",
)


def summary(path: Path, jobs: int) -> dict[str, object]:
    """Accuracy figures (``plansim backtest``'s error statistics) and wall time of one runs
    file."""
    start = time.perf_counter()
    _, rows = read_runs(path)
    predictions = list(map_in_order(partial(predict_row, simulate_top=8), rows, jobs))
    errors = [p.step_time_error_pct for p in predictions if p.step_time_error_pct is not None]
    nan = float("nan")
    stats = error_stats(errors) if errors else ErrorStats(nan, nan, nan, nan)
    return {
        "file": path.name,
        "runs": len(rows),
        "predicted": len(errors),
        "mean_abs_pct": stats.mean_abs,
        "median_abs_pct": stats.median_abs,
        "max_abs_pct": stats.max_abs,
        "mean_signed_pct": stats.mean_signed,
        "wall_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--files", help="comma list of runs CSVs (default: every file checked)")
    args = parser.parse_args()
    files = [Path(f) for f in args.files.split(",")] if args.files else list(FILES)
    header = (
        f"{'file':28s} {'runs':>5s} {'pred':>5s} {'mean|e|':>8s} {'median':>7s} "
        f"{'max':>6s} {'signed':>7s} {'wall_s':>7s}"
    )
    print(f"step-time error (%) of each runs file, {args.jobs} processes")
    print(header)
    for path in files:
        s = summary(path, args.jobs)
        print(
            f"{s['file']:28s} {s['runs']:5d} {s['predicted']:5d} {s['mean_abs_pct']:8.2f} "
            f"{s['median_abs_pct']:7.2f} {s['max_abs_pct']:6.1f} {s['mean_signed_pct']:+7.2f} "
            f"{s['wall_s']:7.1f}"
        )


if __name__ == "__main__":
    main()
