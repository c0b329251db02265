"""plansim sweep: the planner over models x GPU kinds x GPU counts x global batch sizes."""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
from pathlib import Path

import pandas as pd

from plansim.catalog import resolve_model
from plansim.commands.common import MAX_GPUS, comma_items, doubling_range
from plansim.commands.plan import add_search_args, resolve_jobs
from plansim.commands.run_options import (
    add_objective_arg,
    add_run_args,
    check_run_flags,
    cost_inputs,
    training_run,
    write_run_plot,
)
from plansim.errors import PlansimError, SpecError, require_positive_int
from plansim.io.outputs import check_writable, write_bytes_atomic
from plansim.io.result_cache import cache_from
from plansim.planner.progress import progress_bar
from plansim.planner.sweep import (
    EXECUTORS,
    OBJECTIVE_PLANS,
    RUN_COLUMNS,
    SweepCell,
    SweepSettings,
    check_names,
    run_sweep,
    sweep_grid,
)
from plansim.planner.training_run import Objective
from plansim.report.tables import render
from plansim.specs.plan import AttentionKernel, Precision

FORMATS = (".csv", ".parquet")
_INT_COLUMNS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch_size", "zero_stage")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim sweep``."""
    p = sub.add_parser(
        "sweep",
        help="best plan for every cell of a models x GPUs x GPU counts x batch sizes grid",
        description="Run the exact planner search for every combination of the given "
        "models, GPU kinds, GPU counts and global batch sizes (comma-separated lists) and "
        "write one row per cell (best plan, step time, MFU, tokens/s, memory, feasible "
        "count, or the rejection summary) to a CSV or Parquet table.",
    )
    p.add_argument("--model", required=True, help="comma-separated presets or config.json paths")
    p.add_argument("--gpu", "--profile", dest="gpu", required=True, help="comma-separated profiles")
    p.add_argument(
        "--gpus",
        required=True,
        help="comma-separated GPU counts; A:B is A, 2A, 4A, ... up to B (e.g. 1024:16384)",
    )
    p.add_argument("--gbs", required=True, help="comma-separated global batch sizes (sequences)")
    p.add_argument("--seq-len", type=int, default=None, help="override sequence length")
    p.add_argument("--precision", choices=[x.value for x in Precision], default="bf16")
    p.add_argument("--attention", choices=[a.value for a in AttentionKernel], default="flash")
    p.add_argument("--out", required=True, metavar="FILE", help="table: .csv or .parquet")
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="where cells run: local processes (default), a Dask or a Ray cluster",
    )
    add_search_args(p)
    add_run_args(p)
    add_objective_arg(
        p,
        help_text="with --tokens: pick each cell's plan among its "
        f"{OBJECTIVE_PLANS} fastest by the whole run's time to train, cost or energy "
        "(default: the fastest step)",
    )
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="with --tokens: days to train vs cost (GPU-hours without --prices) of the "
        "cells, coloured by GPU count, Pareto front marked (PNG)",
    )
    p.set_defaults(func=run)


def _counts(option: str, text: str) -> list[int]:
    values = []
    for item in _expand_ranges(option, comma_items(option, text)):
        try:
            value = int(item)
        except ValueError:
            raise SpecError(f"{option}: {item!r} is not a positive integer") from None
        require_positive_int(option, value)
        if option == "--gpus" and value > MAX_GPUS:
            raise SpecError(f"--gpus: {value} is above the {MAX_GPUS:,} GPUs a plan may have")
        values.append(value)
    return values


def _expand_ranges(option: str, items: list[str]) -> list[str]:
    """Items with each ``A:B`` replaced by A, 2A, 4A, ... up to B (``--gpus`` only;
    ``common.doubling_range``).

    Raises:
        SpecError: a range elsewhere or a bad range.
    """
    out: list[str] = []
    for item in items:
        if ":" not in item:
            out.append(item)
        elif option != "--gpus":
            raise SpecError(f"{option}: {item!r}: a range A:B is for --gpus only")
        else:
            out.extend(str(n) for n in doubling_range(option, item))
    return out


def _check_out(path: str) -> Path:
    out = check_writable(path, label="--out")
    if out.suffix.lower() not in FORMATS:
        raise SpecError(f"--out={path!r}: the table must end in one of: {', '.join(FORMATS)}")
    if out.suffix.lower() == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise PlansimError(
            "--out: writing .parquet needs the 'pyarrow' package, which is not installed "
            "(pip install pyarrow); or write a .csv"
        )
    return out


def run(args: argparse.Namespace) -> int:
    """Validate the grid, run every cell, write the table and print it."""
    out = _check_out(args.out)
    cells = sweep_grid(
        comma_items("--model", args.model),
        comma_items("--gpu", args.gpu),
        _counts("--gpus", args.gpus),
        _counts("--gbs", args.gbs),
    )
    settings = _settings(args, cells)
    plot = _check_plot(args)
    check_names(cells, settings)
    jobs = resolve_jobs(args.jobs)
    bar = progress_bar(forced=args.progress)
    if bar is not None:
        bar.start("sweep", len(cells))
    rows = run_sweep(
        cells,
        settings,
        executor=args.executor,
        jobs=jobs,
        on_row=None if bar is None else lambda: bar.update(1),
    )
    if bar is not None:
        bar.close()
    table = pd.DataFrame(rows)
    for column in _INT_COLUMNS:  # cells with no plan leave them empty, not float
        table[column] = table[column].astype("Int64")
    table["sequence_parallel"] = table["sequence_parallel"].astype("boolean")
    if out.suffix.lower() == ".csv":
        data = table.to_csv(index=False, lineterminator="\n").encode()
    else:
        buf = io.BytesIO()
        table.to_parquet(buf, index=False)
        data = buf.getvalue()
    write_bytes_atomic(out, data, label="--out")
    columns = ["model", "gpu", "num_gpus", "global_batch_size", "status", "plan", "step_time_s"]
    if settings.runs is not None:
        columns += [c for c in RUN_COLUMNS if c in table and table[c].notna().any()]
    sys.stdout.write(render(table[columns], "table"))
    if plot is not None:
        title = ", ".join(sorted({f"{row['model']} on {row['gpu']}" for row in rows}))
        write_run_plot(plot, rows, title=title, priced=settings.prices is not None)
    sys.stdout.write(f"\n{len(rows)} cells; wrote {out}\n")
    return 0


def _settings(args: argparse.Namespace, cells: list[SweepCell]) -> SweepSettings:
    """The cells' shared settings, with each model's whole run when ``--tokens`` is given.

    Raises:
        SpecError, InputFileError: as ``run_options.training_run`` (once per model and
            batch: a ramp file's sequence length defaults to the model's) and
            ``run_options.cost_inputs`` (read once).
    """
    base = {
        "seq_length": args.seq_len,
        "precision": Precision(args.precision),
        "attention": AttentionKernel(args.attention),
        "cache": cache_from(args.cache_dir),  # the folder checked once, before any cell
    }
    if args.tokens is None:
        if args.objective != Objective.STEP_TIME.value:
            raise SpecError(f"--objective {args.objective} ranks by the whole run: give --tokens")
        check_run_flags(args)
        return SweepSettings(**base)
    runs = {
        (name, gbs): training_run(
            args, model=resolve_model(name, seq_length=args.seq_len), global_batch_size=gbs
        )
        for name, gbs in dict.fromkeys((c.model, c.global_batch_size) for c in cells)
    }
    return SweepSettings(
        **base, runs=runs, **cost_inputs(args), objective=Objective(args.objective)
    )


def _check_plot(args: argparse.Namespace) -> Path | None:
    if args.plot is None:
        return None
    if args.tokens is None:
        raise SpecError("--plot draws days to train vs cost: give --tokens")
    return check_writable(args.plot, label="--plot")
