"""A whole run's figures for people and programs: the run columns of a ranked table, the
JSON ``run`` object and the printed section of ``plansim simulate --tokens``.

Units at this edge: days, GPU-hours, MWh, dollars, minutes, TB (1e12 bytes), percent.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from plansim.planner.training_run import RunEstimate, run_columns
from plansim.report.tables import render

SECONDS_PER_MINUTE = 60.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def energy_scope(est: RunEstimate, *, facility: bool) -> str:
    """What the energy figure covers, in words."""
    if est.power is None:
        return "none: the hardware profile has no max_power_w"
    where = "GPUs, hosts, network and PUE" if facility else "GPUs only (no --facility)"
    return f"{where}; GPU power: {est.power.basis}"


def run_dict(est: RunEstimate, *, facility: bool) -> dict[str, Any]:
    """The JSON ``run`` object: :func:`run_columns`, the failure-free time, the phases, the
    checkpoint, the Monte Carlo check and what the energy covers."""
    doc = run_columns(est)
    doc["failure_free_days"] = round(est.work_s / 86400.0, 2)
    doc["energy_scope"] = energy_scope(est, facility=facility)
    doc["checkpoint_tb"] = round(est.checkpoint_bytes / 1e12, 3)
    doc["checkpoint_write_s"] = _round(est.checkpoint_s, 2)
    gp, mc = est.goodput, est.monte_carlo
    if gp is not None and mc is not None:
        doc["expected_failures"] = round(gp.expected_failures, 1)
        doc["monte_carlo"] = {
            "trials": mc.num_trials,
            "seed": mc.seed,
            "goodput_pct": round(100 * mc.goodput_fraction, 2),
            "wall_days": round(mc.mean_wall_s / 86400.0, 3),
            "wall_days_ci95": round(mc.wall_s_ci95 / 86400.0, 3),
        }
    doc["phases"] = phase_table(est).to_dict(orient="records")
    return doc


def phase_table(est: RunEstimate) -> pd.DataFrame:
    """One row per ramp phase: tokens, batch, sequence, steps, step seconds, failure-free
    days."""
    return pd.DataFrame(
        [
            {
                "phase": i,
                "tokens": f"{p.tokens:.4g}",
                "gbs": p.global_batch_size,
                "seq": p.seq_length,
                "steps": p.steps,
                "step_s": round(p.evaluation.step_time_s, 3),
                "mfu_pct": round(100 * p.evaluation.mfu, 1),
                "days": round(p.work_s / 86400.0, 2),
            }
            for i, p in enumerate(est.phases)
        ]
    )


def run_text(est: RunEstimate, *, tokens: float, facility: bool, failures_source: str) -> str:
    """The printed section of a whole run."""
    lines = [f"\nthe whole run ({tokens:.4g} tokens, {len(est.phases)} ramp phase(s)):\n"]
    lines.append(render(phase_table(est), "table"))
    lines.append(f"  failure-free: {est.work_s / 86400.0:.2f} days\n")
    gp, mc = est.goodput, est.monte_carlo
    if gp is not None and mc is not None:
        lines.append(
            f"  failures ({failures_source or 'the --failures file'}): "
            f"{gp.expected_failures:.0f} expected; checkpoint {est.checkpoint_bytes / 1e12:.2f} "
            f"TB written in {est.checkpoint_s or 0.0:.1f} s every "
            f"{gp.interval_s / SECONDS_PER_MINUTE:.1f} min (Daly 2006 optimum unless given)\n"
        )
        lines.append(
            f"  goodput {100 * gp.goodput_fraction:.2f}% (Daly's expectation); Monte Carlo "
            f"{100 * mc.goodput_fraction:.2f}% over {mc.num_trials} trials, wall "
            f"{mc.mean_wall_s / 86400.0:.2f} +/- {mc.wall_s_ci95 / 86400.0:.2f} days (95% CI)\n"
        )
    else:
        lines.append("  no failure model (--failures): the wall time is the failure-free time\n")
    lines.append(f"  days {est.days:.2f}, GPU-hours {est.gpu_hours:,.0f}\n")
    if est.deadline_s is not None:
        verdict = "meets" if est.meets_deadline else "misses"
        lines.append(f"  {verdict} the deadline of {est.deadline_s / 86400.0:g} days\n")
    if est.energy_mwh is not None:
        lines.append(
            f"  energy {est.energy_mwh:,.1f} MWh ({energy_scope(est, facility=facility)})\n"
        )
    else:
        lines.append(f"  energy: {energy_scope(est, facility=facility)}\n")
    if est.cost_usd is not None:
        lines.append(f"  cost ${est.cost_usd:,.0f}\n")
    return "".join(lines)
