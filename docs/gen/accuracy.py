"""Write docs/accuracy.md, its plots and README's accuracy table from ``plansim backtest``.

Two steps. ``run`` calls ``plansim backtest RUNS.csv --out PRED.csv`` on each runs file (the
public sample in ``../shared/reference/`` and the files in ``benchmarks/published_runs/``)
and keeps what the command wrote: the prediction columns of every row and the summary lines
it printed, in ``docs/gen/data/`` (the per-row errors are the command's own, never
recomputed here). ``render`` turns those into the page, the README table (between the
``accuracy:begin`` / ``accuracy:end`` comments) and the PNG plots in ``docs/images/``;
summaries over groups of rows use :func:`plansim.commands.backtest.error_stats`, the
command's own statistics. Run:

    .venv/bin/python docs/gen/accuracy.py run       # every file (about 2 minutes on 2 cores)
    .venv/bin/python docs/gen/accuracy.py run --files published_runs.csv,moe_runs.csv
    .venv/bin/python docs/gen/accuracy.py render    # page, README table, plots from the data
    .venv/bin/python docs/gen/accuracy.py check     # exit 1 if page or README table is stale

``make docs-data`` runs ``run`` then ``render``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from plansim.commands.backtest import error_stats

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "gen" / "data"
ROWS_CSV = DATA / "backtest_rows.csv"
SUMMARY_JSON = DATA / "backtest_summary.json"
PAGE = ROOT / "docs" / "accuracy.md"
README = ROOT / "README.md"
IMAGES = ROOT / "docs" / "images"
SCATTER_PNG = IMAGES / "accuracy-predicted-vs-measured.png"
FAMILY_PNG = IMAGES / "accuracy-error-by-framework.png"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"


@dataclass(frozen=True)
class RunsFile:
    """One runs file of the back-test."""

    name: str
    path: Path
    what: str


SHARED = ROOT.parent / "shared" / "reference"
PUBLISHED = ROOT / "benchmarks" / "published_runs"
FILES = (
    RunsFile(
        "published_runs.csv",
        SHARED / "published_runs.csv",
        "dense GPT runs on A100 (Megatron-LM, DeepSpeed ZeRO-3; 2021-2022)",
    ),
    RunsFile(
        "moe_runs.csv",
        SHARED / "moe_runs.csv",
        "Mixture-of-Experts runs (Megatron-Core / Bridge, DeepSeek-V3)",
    ),
    RunsFile(
        "nemo_performance.csv",
        PUBLISHED / "nemo_performance.csv",
        "NVIDIA NeMo / Megatron-Bridge performance tables (H100, B200, GB200, GB300)",
    ),
    RunsFile(
        "mosaic_llm_foundry.csv",
        PUBLISHED / "mosaic_llm_foundry.csv",
        "MosaicML MPT on PyTorch FSDP (A100, H100)",
    ),
    RunsFile(
        "other_frameworks.csv",
        PUBLISHED / "other_frameworks.csv",
        "Megatron-DeepSpeed, Meta's stacks, torchtitan",
    ),
    RunsFile(
        "bloom_layout_search.csv",
        PUBLISHED / "bloom_layout_search.csv",
        "the BLOOM-176B layout search (384 A100)",
    ),
)
#: Files whose back-test takes seconds, not minutes (the test re-runs these).
CHEAP = ("published_runs.csv", "moe_runs.csv", "mosaic_llm_foundry.csv", "bloom_layout_search.csv")
#: The prediction columns ``plansim backtest --out`` writes that the page reads.
KEEP = (
    "row_id",
    "model_name",
    "gpu_type",
    "framework",
    "precision",
    "num_gpus",
    "step_time_s",
    "status",
    "predicted_step_time_s",
    "step_time_error_pct",
    "layer_forward_error_pct",
    "layer_backward_error_pct",
    "peak_memory_error_pct",
)


def _file(name: str) -> RunsFile:
    for f in FILES:
        if f.name == name:
            return f
    raise SystemExit(f"unknown runs file {name!r}; known: {', '.join(f.name for f in FILES)}")


# --------------------------------------------------------------------------- run
def backtest(runs: RunsFile, jobs: int) -> tuple[pd.DataFrame, list[str]]:
    """``plansim backtest`` of one file: its rows' prediction columns (as text) and the
    summary lines it printed (those starting with ``backtest``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "predictions.csv"
        cmd = [
            sys.executable, "-m", "plansim", "backtest", str(runs.path),
            "--out", str(out), "--jobs", str(jobs),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr}")
        table = pd.read_csv(out, dtype=str, keep_default_na=False)
    for column in KEEP:
        if column not in table:
            table[column] = ""
    rows = table[list(KEEP)].copy()
    rows.insert(0, "file", runs.name)
    lines = [line for line in done.stdout.splitlines() if line.startswith("backtest")]
    return rows, lines


def _load() -> tuple[pd.DataFrame, dict[str, list[str]]]:
    rows = pd.read_csv(ROWS_CSV, dtype=str, keep_default_na=False)
    summaries = json.loads(SUMMARY_JSON.read_text(encoding="utf-8"))
    return rows, summaries


def run(names: Sequence[str], jobs: int) -> None:
    """Back-test ``names`` and replace their rows and summaries in ``docs/gen/data``."""
    if ROWS_CSV.exists():
        rows, summaries = _load()
    else:
        rows, summaries = pd.DataFrame(columns=["file", *KEEP]), {}
    for name in names:
        fresh, lines = backtest(_file(name), jobs)
        rows = pd.concat([rows[rows["file"] != name], fresh], ignore_index=True)
        summaries[name] = lines
        print(f"{name}: {len(fresh)} rows; {lines[0] if lines else ''}")
    order = {f.name: i for i, f in enumerate(FILES)}
    rows = rows.sort_values("file", key=lambda s: s.map(order), kind="stable")
    DATA.mkdir(parents=True, exist_ok=True)
    rows.to_csv(ROWS_CSV, index=False, lineterminator="\n")
    ordered = {f.name: summaries[f.name] for f in FILES if f.name in summaries}
    SUMMARY_JSON.write_text(json.dumps(ordered, indent=1) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- render
def _errors(rows: pd.DataFrame, column: str = "step_time_error_pct") -> list[float]:
    return [float(v) for v in rows[column] if v != ""]


def _clean(text: str) -> str:
    """A framework or precision label without its parentheses (``Megatron-LM (2021)`` ->
    ``Megatron-LM``), blank as ``(blank)``."""
    return re.sub(r"\s*\([^)]*\)", "", text).strip() or "(blank)"


def _stats_cells(errors: list[float]) -> list[str]:
    s = error_stats(errors)
    return [
        f"{s.mean_abs:.1f}%",
        f"{s.median_abs:.1f}%",
        f"{s.max_abs:.1f}%",
        f"{s.mean_signed:+.1f}%",
    ]


def _table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines


STAT_HEADER = ("mean \\|error\\|", "median \\|error\\|", "max \\|error\\|", "mean signed")


def _summary_numbers(line: str) -> list[str]:
    """'mean |error| 4.6%, median 4.2%, max 15.1%, mean signed -3.8%' -> the four cells."""
    found = re.search(
        r"mean \|error\| ([\d.]+%).*?median ([\d.]+%).*?max ([\d.]+%).*?mean signed ([+-][\d.]+%)",
        line,
    )
    if found is None:
        raise ValueError(f"not a backtest summary line: {line!r}")
    return list(found.groups())


def _per_file(
    rows: pd.DataFrame, summaries: dict[str, list[str]]
) -> Iterator[tuple[RunsFile, int, int, list[str]]]:
    """(file, rows, rows predicted, the four cells of the error summary ``plansim backtest``
    printed for it) of each runs file with rows, the summary checked against its rows'
    errors."""
    for f in FILES:
        part = rows[rows["file"] == f.name]
        if part.empty:
            continue
        errors = _errors(part)
        printed = _summary_numbers(summaries[f.name][0])
        if printed != _stats_cells(errors):
            raise ValueError(
                f"{f.name}: printed {printed} but its rows give {_stats_cells(errors)}"
            )
        yield f, len(part), len(errors), printed


def by_source(rows: pd.DataFrame, summaries: dict[str, list[str]]) -> list[str]:
    """One row per runs file: its rows, those predicted, and the error summary
    ``plansim backtest`` printed for it (checked against its rows' errors)."""
    body = [
        [f"`{f.name}`", f.what, str(total), str(predicted), *printed]
        for f, total, predicted, printed in _per_file(rows, summaries)
    ]
    return _table(("runs file", "what", "rows", "predicted", *STAT_HEADER), body)


def by_column(rows: pd.DataFrame, column: str, label: str) -> list[str]:
    """Step-time error by the (cleaned) value of ``column`` over every predicted row."""
    predicted = rows[rows["step_time_error_pct"] != ""]
    groups: dict[str, list[float]] = {}
    for value, err in zip(predicted[column], predicted["step_time_error_pct"], strict=True):
        groups.setdefault(_clean(value), []).append(float(err))
    body = [
        [f"`{value}`", *_stats_cells(errs), str(len(errs))]
        for value, errs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    return _table((label, *STAT_HEADER, "rows"), body)


def other_checks(rows: pd.DataFrame) -> list[str]:
    """Per-layer times and peak memory, where the rows measure them."""
    body = []
    for column, what in (
        ("layer_forward_error_pct", "one layer's forward time"),
        ("layer_backward_error_pct", "one layer's backward time"),
        ("peak_memory_error_pct", "peak memory per GPU"),
    ):
        for f in FILES:
            errs = _errors(rows[rows["file"] == f.name], column)
            if errs:
                body.append([what, f"`{f.name}`", *_stats_cells(errs), str(len(errs))])
    return _table(("quantity", "runs file", *STAT_HEADER, "rows"), body)


def _status_counts(rows: pd.DataFrame) -> str:
    counts = rows["status"].value_counts()
    return ", ".join(f"{status} {counts[status]}" for status in sorted(counts.index))


def page(rows: pd.DataFrame, summaries: dict[str, list[str]]) -> str:
    """The Markdown of docs/accuracy.md."""
    predicted = len(_errors(rows))
    lines = [
        "# How accurate is it",
        "",
        "<!-- Generated by docs/gen/accuracy.py from `plansim backtest` outputs; do not edit. -->",
        "",
        "`plansim backtest RUNS.csv` predicts published training runs and compares the "
        "predicted step time with the measured one. A row states the model, the GPU kind "
        "and count, the batch and whatever the source says of the layout; knobs it leaves "
        "blank are searched, with the framework's own defaults of the row's date "
        "([the back-test](methods/backtest.md)). The error is signed, 100 x (predicted - "
        "measured) / measured: below 0 the prediction is too fast.",
        "",
        f"Over {len(rows)} published rows, {predicted} step times were predicted "
        f"(statuses: {_status_counts(rows)}; a skipped row says why in its `note`, and a "
        "per-layer row checks one layer's times only).",
        "",
        "## By source",
        "",
        *by_source(rows, summaries),
        "",
        "The first two files are the public sample in `../shared/reference/`; the others are "
        "in `benchmarks/published_runs/` with their sources "
        "(`benchmarks/published_runs/README.md`). Nothing was fitted to these rows: each "
        "profile figure has its own source ([hardware profiles](methods/hardware.md)).",
        "",
        "![Predicted against measured step time](images/accuracy-predicted-vs-measured.png)",
        "",
        "## By GPU",
        "",
        *by_column(rows, "gpu_type", "GPU profile"),
        "",
        "## By framework",
        "",
        *by_column(rows, "framework", "framework"),
        "",
        "![Signed error by framework](images/accuracy-error-by-framework.png)",
        "",
        "## By precision",
        "",
        *by_column(rows, "precision", "precision"),
        "",
        "## Per-layer times and memory",
        "",
        *other_checks(rows),
        "",
        "## Reproduce",
        "",
        "```bash",
        "plansim backtest ../shared/reference/published_runs.csv --out predictions.csv",
        "plansim backtest benchmarks/published_runs/nemo_performance.csv --group-by gpu_type",
        "make docs-data   # every file, then this page, its plots and README's table",
        "```",
        "",
        "`--out` writes each row's prediction, the chosen plan and its error; `--sensitivity` "
        "adds what each prediction rests on (which profile terms, and how much of them are "
        "assumptions rather than measurements).",
    ]
    return "\n".join(lines) + "\n"


def readme_block(rows: pd.DataFrame, summaries: dict[str, list[str]]) -> str:
    """The README's table (without the marker lines)."""
    body = [
        [f"`{f.name}`", f"{predicted} of {total}", *printed]
        for f, total, predicted, printed in _per_file(rows, summaries)
    ]
    return "\n".join(_table(("runs file", "step times predicted", *STAT_HEADER), body))


def readme_text(readme: str, block: str) -> str:
    """``readme`` with the text between the markers replaced by ``block``."""
    head, sep, rest = readme.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def plots(rows: pd.DataFrame, outdir: Path) -> list[Path]:
    """The two PNGs: predicted against measured step time (log-log, by file) and signed
    error by framework. Deterministic: Agg backend, no timestamp or software metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    predicted = rows[rows["step_time_error_pct"] != ""].copy()
    predicted["predicted"] = predicted["predicted_step_time_s"].astype(float)
    predicted["error"] = predicted["step_time_error_pct"].astype(float)
    # the measured step time the command compared with (a row may give tokens/s instead)
    predicted["measured"] = predicted["predicted"] / (1 + predicted["error"] / 100)
    metadata = {"Software": None}
    outdir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6.4, 5.2), dpi=110)
    markers = "osD^vP"
    for i, f in enumerate(FILES):
        part = predicted[predicted["file"] == f.name]
        if part.empty:
            continue
        ax.scatter(part["measured"], part["predicted"], s=14, marker=markers[i % 6], label=f.name)
    low = min(predicted["measured"].min(), predicted["predicted"].min()) * 0.8
    high = max(predicted["measured"].max(), predicted["predicted"].max()) * 1.25
    ax.plot([low, high], [low, high], color="black", linewidth=0.8)
    for factor in (0.8, 1.2):
        ax.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("plansim backtest: predicted vs measured (dashed: ±20%)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = outdir / SCATTER_PNG.name
    fig.savefig(path, metadata=metadata)
    plt.close(fig)
    written.append(path)

    predicted["family"] = predicted["framework"].map(_clean)
    families = sorted(
        predicted["family"].unique(), key=lambda v: (-(predicted["family"] == v).sum(), v)
    )
    fig, ax = plt.subplots(figsize=(7.2, 0.42 * len(families) + 1.4), dpi=110)
    for y, family in enumerate(families):
        errs = sorted(predicted.loc[predicted["family"] == family, "error"])
        offsets = [((k % 5) - 2) * 0.06 for k in range(len(errs))]  # fixed spread, no random
        ax.scatter(errs, [y + o for o in offsets], s=10, alpha=0.7)
        ax.plot([sum(errs) / len(errs)] * 2, [y - 0.3, y + 0.3], color="black", linewidth=1.2)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(
        range(len(families)), [f"{f} ({(predicted['family'] == f).sum()})" for f in families]
    )
    ax.invert_yaxis()
    ax.set_xlabel("signed step-time error (%), bar: mean")
    ax.set_title("plansim backtest: error by framework (rows)")
    fig.tight_layout()
    path = outdir / FAMILY_PNG.name
    fig.savefig(path, metadata=metadata)
    plt.close(fig)
    written.append(path)
    return written


def render() -> None:
    """Write the page, the README table and the plots from ``docs/gen/data``."""
    rows, summaries = _load()
    PAGE.write_text(page(rows, summaries), encoding="utf-8")
    README.write_text(
        readme_text(README.read_text(encoding="utf-8"), readme_block(rows, summaries)),
        encoding="utf-8",
    )
    for path in plots(rows, IMAGES):
        print(f"wrote {path.relative_to(ROOT)}")
    print(f"wrote {PAGE.relative_to(ROOT)} and README.md's accuracy table")


def stale() -> list[str]:
    """Which generated texts differ from what the data gives now."""
    rows, summaries = _load()
    found = []
    if PAGE.read_text(encoding="utf-8") != page(rows, summaries):
        found.append(str(PAGE.relative_to(ROOT)))
    readme = README.read_text(encoding="utf-8")
    if readme != readme_text(readme, readme_block(rows, summaries)):
        found.append("README.md (accuracy table)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("run", "render", "check"))
    parser.add_argument("--files", help="comma list of runs file names (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if args.step == "run":
        names = args.files.split(",") if args.files else [f.name for f in FILES]
        run(names, args.jobs)
    elif args.step == "render":
        render()
    else:
        found = stale()
        for name in found:
            print(f"{name} is stale: run docs/gen/accuracy.py render")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
