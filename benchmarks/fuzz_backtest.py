"""Random multi-cell fuzz of the back-test: no row of the runs schema may make it fail.

Rows are drawn from the public sample and the three files of ``benchmarks/published_runs``;
in each, 1-3 cells are rewritten with values the runs schema allows
(``../shared/reference/README.md``: the eight profile names, ``none`` / ``selective`` /
``full``, ``bf16`` / ``fp16`` / ``fp8`` / ``fp4``, ``yes`` / ``no``, blank) or numbers from 1 to
65,536 GPUs, sequences to 1M tokens and batches to 10^6 sequences. Each row is predicted as
``plansim backtest`` predicts it (``plansim.planner.backtest.predict_row``) in a worker with a
time limit. A row passes when it is predicted (``ok``, ``over-memory``, ``per-layer``) or
skipped with its reason; it fails on an exception, a status ``failed``, a prediction without
a step time, or the time limit. Prints the count per status and every failure; exit status
1 when any row failed. The same seed draws the same rows. A run of 3,000 rows (seeds
1000-3999 in the fuzzer's first form): 1,451 ok, 1,458 skipped, 49 over-memory, 41
per-layer, and one row over 90 s (a pipeline of 10^6 micro-batches, since simulated from
its steady state).

    .venv/bin/python benchmarks/fuzz_backtest.py [--rows N] [--seed S] [--jobs J] [--limit-s T]
"""

from __future__ import annotations

import argparse
import csv
import random
import signal
import sys
import time
import traceback
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

from plansim.io.runs import RunRow
from plansim.planner.backtest import predict_row

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    ROOT.parent / "shared/reference/published_runs.csv",
    *(ROOT / "benchmarks/published_runs" / f for f in (
        "nemo_performance.csv", "mosaic_llm_foundry.csv", "other_frameworks.csv",
    )),
)  # fmt: skip
#: Values the runs schema allows (blank = not stated), and numbers of every scale.
VALUES = {
    "gpu_type": (
        "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb",
        "b200-sxm-180gb", "gb200-nvl72", "gb300-nvl72", "mi300x-192gb",
    ),
    "num_gpus": ("", "1", "2", "6", "8", "12", "24", "96", "100", "1000", "4096", "65536"),
    "tp": ("", "1", "2", "3", "4", "8", "16", "64"),
    "pp": ("", "1", "2", "3", "4", "5", "8", "12", "35", "200"),
    "dp": ("", "1", "2", "7", "16", "64"),
    "cp": ("", "1", "2", "3", "4", "8", "16"),
    "virtual_pipeline_size": ("", "1", "2", "3", "4", "7"),
    "sequence_parallel": ("", "yes", "no"),
    "micro_batch_size_seqs": ("", "1", "2", "3", "4", "16", "64", "1000"),
    "global_batch_size_seqs": ("", "1", "8", "63", "512", "1536", "4096", "1000000"),
    "grad_accum_steps": ("", "1", "2", "5", "16", "1000"),
    "recompute": ("", "none", "selective", "full"),
    "zero_stage": ("", "0", "1", "2", "3"),
    "precision": ("", "bf16", "fp16", "fp8", "fp4"),
    "seq_len_tokens": ("512", "1000", "2048", "4096", "8192", "32768", "131072", "1048576"),
    "num_layers": ("1", "2", "3", "24", "25", "96", "105", "126", "1000"),
    "hidden_size": ("64", "768", "1000", "4096", "12288", "20480"),
    "num_attention_heads": ("1", "12", "13", "32", "96", "128"),
    "num_kv_heads": ("", "1", "2", "8", "32", "64", "200"),
    "ffn_hidden_size": ("", "100", "3072", "11008", "14336", "49152"),
    "ffn_activation": ("", "gelu", "swiglu", "relu", "squared_relu"),
    "vocab_size": ("", "1", "32000", "50257", "128256", "256000"),
    "step_time_s": ("", "1", "0.001", "1e6"),
    "per_layer_fwd_ms": ("", "10"),
    "measured_peak_mem_gb": ("", "50", "500"),
}  # fmt: skip
PASSING = ("ok", "skipped", "per-layer", "over-memory")


def load_rows() -> list[tuple[int, dict[str, str]]]:
    """(line, cells) of every row of the four files."""
    rows = []
    for path in FILES:
        with path.open(newline="") as fh:
            rows += [(line, r) for line, r in enumerate(csv.DictReader(fh), start=2)]
    return rows


def draw(rows: list[tuple[int, dict[str, str]]], seed: int) -> tuple[int, dict[str, str], str]:
    """Row ``seed``: a drawn row with 1-3 cells rewritten, and what was rewritten."""
    rng = random.Random(seed)
    line, cells = rows[rng.randrange(len(rows))]
    cells = dict(cells)
    changed = rng.sample(sorted(VALUES), rng.randint(1, 3))
    for column in changed:
        cells[column] = rng.choice(VALUES[column])
    what = ", ".join(f"{c}={cells[c]!r}" for c in changed)
    return line, cells, f"{cells.get('row_id', '?')} with {what}"


def _time_out(*_: object) -> None:
    raise TimeoutError("over the time limit")


def check(job: tuple[int, dict[str, str], str, float]) -> tuple[str, str]:
    """(status, failure or '') of one drawn row, predicted under a time limit."""
    line, cells, what, limit_s = job
    signal.signal(signal.SIGALRM, _time_out)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        got = predict_row(RunRow(path="fuzz.csv", line=line, cells=cells), simulate_top=2)
    except BaseException:  # the time limit or a plansim bug: both are failures
        return "exception", f"{what}: {traceback.format_exc(limit=-3)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    timed = got.predicted_step_time_s is not None or got.layer is not None
    if got.status not in PASSING or (got.status == "skipped" and not got.note):
        return got.status, f"{what}: status {got.status}: {got.note}"
    if got.status != "skipped" and not timed:
        return got.status, f"{what}: status {got.status} without a prediction"
    return got.status, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="first row's seed")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--limit-s", type=float, default=60.0, help="time limit per row")
    args = parser.parse_args(argv)
    rows = load_rows()
    jobs = [(*draw(rows, seed), args.limit_s) for seed in range(args.seed, args.seed + args.rows)]
    start = time.perf_counter()
    with Pool(args.jobs) as pool:
        results = pool.map(check, jobs, chunksize=1)
    counts = Counter(status for status, _ in results)
    failures = [failure for _, failure in results if failure]
    for failure in failures:
        print(f"FAILED {failure}")
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(
        f"fuzz: {args.rows} rows (seeds {args.seed}-{args.seed + args.rows - 1}) in "
        f"{time.perf_counter() - start:.1f} s: {summary}; {len(failures)} failed"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
