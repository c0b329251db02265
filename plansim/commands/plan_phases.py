"""``plansim plan --ramp``: each phase of the batch ramp on its own best plan.

A ramp's phases differ in global batch (and sequence length); the layout that is best for
the final batch may not divide, fit or be fastest for the first. Beside the ranked table (one
layout for the whole run), this searches each distinct (batch, sequence length) of the ramp
on the same GPUs and reports the run with each phase on its fastest plan: what a job that
re-launches with a new layout at each batch change would take.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pandas as pd

from plansim.commands.plan_space import search_from_args, search_spaces
from plansim.commands.run_options import RunInputs
from plansim.planner.evaluate import Evaluation
from plansim.planner.training_run import RunEstimate, estimate_run, phase_keys, run_columns
from plansim.report.tables import render
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PhasePlans:
    """Each phase's own best plan and the run they give.

    Attributes:
        best: per (global batch, sequence length), the fastest plan's simulated step, or
            None where the search found no feasible plan.
        run: the whole run with those plans, or None when a phase has none.
    """

    best: dict[tuple[int, int], Evaluation | None]
    run: RunEstimate | None


def phase_plans(
    args: argparse.Namespace,
    model: ModelSpec,
    profile: HardwareProfile,
    inputs: RunInputs,
    *,
    jobs: int,
) -> PhasePlans | None:
    """Search every distinct phase of ``inputs.run``; None for a run of one phase.

    Raises:
        SpecError: as ``estimate_run``.
    """
    keys = phase_keys(model, inputs.run)
    if len(keys) < 2:
        return None
    best: dict[tuple[int, int], Evaluation | None] = {}
    for gbs, seq in keys:
        phase_model = (
            model if seq == model.seq_length else dataclasses.replace(model, seq_length=seq)
        )
        _, space = search_spaces(args, phase_model, profile)
        result = search_from_args(
            args,
            phase_model,
            profile,
            space=space,
            num_gpus=args.gpus,
            global_batch_size=gbs,
            top_k=1,
            jobs=jobs,
            progress=False,
        )
        best[(gbs, seq)] = result.ranked[0] if result.ranked else None
    found = {key: ev for key, ev in best.items() if ev is not None}
    if len(found) < len(keys):
        return PhasePlans(best=best, run=None)
    last = found[keys[-1]]
    est = estimate_run(
        model,
        last.plan,
        profile,
        inputs.run,
        failures=inputs.failures,
        facility=inputs.facility,
        prices=inputs.prices,
        phase_steps=found,
    )
    return PhasePlans(best=best, run=est if isinstance(est, RunEstimate) else None)


def phase_plans_dict(plans: PhasePlans) -> dict[str, Any]:
    """The JSON ``per_phase_plans`` object: each phase's plan and the run's columns."""
    return {
        "phases": [
            {
                "global_batch_size": gbs,
                "seq_length": seq,
                "plan": None if ev is None else ev.plan.label(),
                "step_time_s": None if ev is None else round(ev.step_time_s, 6),
            }
            for (gbs, seq), ev in plans.best.items()
        ],
        "run": None if plans.run is None else run_columns(plans.run),
    }


def phase_plans_text(plans: PhasePlans) -> str:
    """The printed section: one row per distinct phase and the run's totals."""
    rows = phase_plans_dict(plans)["phases"]
    lines = ["\neach ramp phase on its own fastest plan:\n", render(pd.DataFrame(rows), "table")]
    if plans.run is None:
        lines.append("  no run: a phase has no feasible plan\n")
    else:
        cols = run_columns(plans.run)
        lines.append(
            "  "
            + ", ".join(f"{key} {value}" for key, value in cols.items() if value is not None)
            + "\n"
        )
    return "".join(lines)
