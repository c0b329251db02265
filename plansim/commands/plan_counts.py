"""``plansim plan --gpus A:B``: the best plan of each GPU count of a scaling study, its whole
run (``--tokens``) and the time-to-train vs cost Pareto plot (``--plot``).

Each count is searched as ``plansim plan`` searches one (the same search space and
constraints), its ``--top`` fastest plans' whole runs are estimated and the best by
``--objective`` is its row. For large grids (many models, GPU kinds or batch sizes) on a Dask
or Ray cluster, ``plansim sweep`` does the same per cell.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from plansim.commands.plan_space import search_from_args, search_spaces
from plansim.commands.run_options import RunInputs, write_run_plot
from plansim.errors import SpecError
from plansim.planner.evaluate import Evaluation
from plansim.planner.training_run import (
    SECONDS_PER_DAY,
    Objective,
    RunEstimate,
    order_by_objective,
    run_columns,
)
from plansim.report.tables import render
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec

#: Flags that describe one search's table, not a scaling study.
_SINGLE_COUNT_FLAGS = ("save_plan", "sensitivity")


def check_range_args(args: argparse.Namespace) -> None:
    """The flags a GPU-count range takes.

    Raises:
        SpecError: --tokens missing, or a flag of a single search given.
    """
    if args.tokens is None:
        raise SpecError("--gpus A:B compares whole runs over GPU counts: give --tokens")
    for name in _SINGLE_COUNT_FLAGS:
        if getattr(args, name):
            flag = "--" + name.replace("_", "-")
            raise SpecError(f"{flag} is for one GPU count: give --gpus N, not a range")
    if args.format == "csv":
        raise SpecError("--gpus A:B prints a table or JSON: give --format table or json")


def run_counts(
    args: argparse.Namespace,
    model: ModelSpec,
    profile: HardwareProfile,
    inputs: RunInputs,
    *,
    jobs: int,
    plot: Path | None,
) -> int:
    """Search every count, print one row per count; exit 0 when some count has a run, 1
    when none does."""
    rows = []
    for num_gpus in args.gpus:
        best, est = _best_of_count(args, model, profile, inputs, num_gpus=num_gpus, jobs=jobs)
        rows.append(_row(num_gpus, best, est))
    table = pd.DataFrame(rows)
    if args.format == "json":
        doc = {"model": model.name, "profile": profile.name, "objective": args.objective}
        doc["counts"] = rows
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(
            f"{model.name} on {profile.name}, global batch {args.gbs} x {model.seq_length} "
            f"tokens, {inputs.run.tokens:.4g} tokens; each count's plan by {args.objective}\n\n"
        )
        sys.stdout.write(render(table.dropna(axis=1, how="all"), "table"))
        if inputs.run.deadline_s is not None:
            sys.stdout.write(_deadline_line(rows, days=inputs.run.deadline_s / SECONDS_PER_DAY))
    if plot is not None:
        write_run_plot(
            plot, rows, title=f"{model.name} on {profile.name}", priced=inputs.prices is not None
        )
    return 0 if any(row["days"] is not None for row in rows) else 1


def _best_of_count(
    args: argparse.Namespace,
    model: ModelSpec,
    profile: HardwareProfile,
    inputs: RunInputs,
    *,
    num_gpus: int,
    jobs: int,
) -> tuple[Evaluation | None, RunEstimate | None]:
    """The count's plan by the objective among its --top fastest, and its whole run."""
    _, space = search_spaces(args, model, profile)
    result = search_from_args(
        args,
        model,
        profile,
        space=space,
        num_gpus=num_gpus,
        global_batch_size=args.gbs,
        top_k=args.top,
        jobs=jobs,
    )
    ranked = result.ranked[: args.top]
    if not ranked:
        return None, None
    outcomes = inputs.estimates(model, ranked, profile)
    best, outcome = order_by_objective(ranked, outcomes, Objective(args.objective))[0]
    return best, outcome if isinstance(outcome, RunEstimate) else None


def _deadline_line(rows: list[dict[str, object]], *, days: float) -> str:
    """The answer to "how many GPUs to finish in time": the fewest that meet the deadline."""
    meeting = [row for row in rows if row.get("meets_deadline") is True]
    if not meeting:
        return f"\nno GPU count of the range finishes within {days:g} days\n"
    first = meeting[0]
    return (
        f"\nthe fewest GPUs that finish within {days:g} days: {first['num_gpus']} "
        f"({first['days']} days, {first['plan']})\n"
    )


def _row(num_gpus: int, ev: Evaluation | None, est: RunEstimate | None) -> dict[str, object]:
    row: dict[str, object] = {
        "num_gpus": num_gpus,
        "plan": "no feasible plan" if ev is None else ev.plan.label(),
        "step_time_s": None if ev is None else round(ev.step_time_s, 3),
        "mfu_pct": None if ev is None else round(100 * ev.mfu, 1),
    }
    if est is None:
        row.update(dict.fromkeys(("days", "gpu_hours", "energy_mwh", "cost_usd")))
    else:
        row.update(run_columns(est))
    return row
