"""``plansim simulate``'s printed report of a simulated plan: the table form and the JSON
form (``--format``), and a rejected plan's one line."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.analytic.layer_timing import LayerWallTimes
from plansim.analytic.memory_views import MemoryViews, memory_views
from plansim.analytic.sustained import UNTHROTTLED_DTYPES, dtype_pace_fraction, slowest_gpu_fraction
from plansim.planner.evaluate import Evaluation, Rejected
from plansim.planner.lookups import OutOfRange
from plansim.planner.sensitivity import Sensitivity
from plansim.report.sensitivity_table import outside_text, sensitivity_dict, sensitivity_text
from plansim.report.tables import (
    evaluation_dict,
    memory_table,
    plan_row,
    render,
    step_breakdown_s,
    step_breakdown_table,
)
from plansim.sim.steady_state import plan_steady_state
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


def rejected_text(outcome: Rejected, fmt: str) -> str:
    """A rejected plan's report, JSON or one line."""
    if fmt == "json":
        doc = {"status": "rejected", "category": outcome.category, "reason": outcome.reason}
        return json.dumps(doc, indent=2) + "\n"
    return f"rejected ({outcome.category}): {outcome.reason}\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateReport:
    """What ``run`` reports of a simulated plan."""

    model: ModelSpec
    plan: ParallelPlan
    profile: HardwareProfile
    outcome: Evaluation
    outside: tuple[OutOfRange, ...]
    layer: LayerWallTimes
    sens: Sensitivity | None

    @property
    def pace(self) -> float:
        """The GEMM pace fraction of the plan's dtype on its GPU count."""
        return dtype_pace_fraction(self.profile, self.plan.num_gpus, self.plan.precision.value)


def json_text(r: SimulateReport) -> str:
    """The JSON report (:func:`json_doc`) as text."""
    return json.dumps(json_doc(r), indent=2) + "\n"


def json_doc(r: SimulateReport) -> dict[str, Any]:
    """The JSON report: evaluation_dict plus pace, step breakdown, layer times, lookups
    outside the profile's points and, when asked, the sensitivity."""
    doc: dict[str, Any] = {"status": "ok", "model": r.model.name, "profile": r.profile.name}
    doc.update(evaluation_dict(r.outcome))
    doc["gemm_pace_fraction"] = r.pace
    doc["step_breakdown_s"] = {
        part: round(seconds, 3) for part, seconds in step_breakdown_s(r.outcome).items()
    }
    doc["layer_forward_ms"] = 1e3 * r.layer.forward_s
    doc["layer_backward_ms"] = 1e3 * r.layer.backward_s
    doc["out_of_range_lookups"] = [dataclasses.asdict(o) for o in r.outside]
    doc["simulated_microbatches"] = r.outcome.result.simulated_microbatches
    views = worst_rank_views(r)
    doc["memory_views_bytes"] = {
        "rank": r.outcome.memory.rank,
        "allocated": views.allocated_bytes,
        "reserved": views.reserved_bytes,
        "nvidia_smi": views.nvidia_smi_bytes,
        "fragmentation_fraction": views.fragmentation_fraction,
        "cuda_context": views.cuda_context_bytes,
        "nccl_buffers": views.nccl_bytes,
    }
    if r.sens is not None:
        doc["sensitivity"] = sensitivity_dict(r.sens)
    return doc


def table_text(r: SimulateReport) -> str:
    """The human report: metrics, where the step goes, memory, one layer's times, notes."""
    plan, profile = r.plan, r.profile
    parts = [f"{r.model.name} on {plan.num_gpus} x {profile.name}: {plan.label()}\n\n"]
    (_, metrics), (breakdown_caption, breakdown), (memory_caption, memory) = summary_tables(r)
    parts.append(render(metrics, "table"))
    parts.append(f"\n{breakdown_caption}:\n")
    parts.append(render(breakdown, "table"))
    parts.append(f"\n{memory_caption}:\n")
    parts.append(render(memory, "table"))
    parts.append(f"\n{memory_views_note(r)}\n")
    parts.append(f"\n{layer_note(r)}\n")
    parts += summary_notes(r)
    return "".join(parts)


def summary_tables(r: SimulateReport) -> tuple[tuple[str, pd.DataFrame], ...]:
    """(caption, table) of the report's three tables: the metrics (``plan_row`` as metric,
    value), where the step goes (``step_breakdown_table``) and the worst rank's memory in GiB
    (``memory_table``)."""
    plan, outcome = r.plan, r.outcome
    row = plan_row(outcome)
    metrics = pd.DataFrame([row]).T.reset_index().set_axis(["metric", "value"], axis=1)
    ranks = "one pipeline rank" if plan.pp == 1 else f"mean over the {plan.pp} pipeline ranks"
    return (
        ("metrics", metrics),
        (f"where the step goes ({ranks})", step_breakdown_table(outcome)),
        (
            f"memory of the worst pipeline rank (stage {outcome.memory.rank}), GiB",
            memory_table(outcome),
        ),
    )


def worst_rank_views(r: SimulateReport) -> MemoryViews:
    """The worst rank's peak as allocated, reserved and nvidia-smi read it
    (``plansim.analytic.memory_views``; the tensors' bytes: its total less the profile's
    reserve; the CUDA context of today's lazy module loading)."""
    memory = r.outcome.memory
    return memory_views(
        r.model,
        r.plan,
        allocated_bytes=max(0.0, memory.total_bytes - memory.reserve_bytes),
        rank=memory.rank,
    )


def memory_views_note(r: SimulateReport) -> str:
    """One line: the worst rank's peak as allocated, reserved and nvidia-smi read it, beside
    the fit's flat reserve."""
    views = worst_rank_views(r)
    gib = 2**30
    return (
        f"as users read it: allocated {views.allocated_bytes / gib:.1f} GiB, reserved "
        f"{views.reserved_bytes / gib:.1f} (caching-allocator fragmentation "
        f"{views.fragmentation_fraction:.1%}), nvidia-smi {views.nvidia_smi_bytes / gib:.1f} "
        f"(CUDA context {views.cuda_context_bytes / gib:.2f}, NCCL buffers "
        f"{views.nccl_bytes / gib:.2f} for {views.num_communicators} communicators); the fit "
        f"above adds the profile's reserve of {r.outcome.memory.reserve_bytes / gib:.1f} instead"
    )


def layer_note(r: SimulateReport) -> str:
    """One layer's forward and backward milliseconds for one micro-batch."""
    return (
        f"one layer, one micro-batch: forward {1e3 * r.layer.forward_s:.2f} ms, backward "
        f"{1e3 * r.layer.backward_s:.2f} ms (as a per-layer timer sees them: blocking TP "
        "collectives and recompute included)"
    )


def summary_notes(r: SimulateReport) -> list[str]:
    """The notes under the tables: GEMM pace, steady state, lookups outside the profile's
    points and, when asked, the sensitivity (each '' when it does not apply)."""
    plan, profile = r.plan, r.profile
    parts = []
    pace = r.pace
    if pace < 1.0:
        parts.append(pace_note(profile, plan.num_gpus, pace, dtype=plan.precision.value))
    parts.append(steady_state_note(r.outcome))
    parts.append(outside_text(r.outside, profile_name=profile.name))
    if r.sens is not None:
        parts.append(sensitivity_text(r.sens, profile_name=profile.name))
    return parts


def shown_window(plan: ParallelPlan, ev: Evaluation, *, hint: str) -> str:
    """'' when ``ev``'s timeline covers the whole step, else which micro-batches it shows:
    the longer of the steady-state simulations (``plansim.sim.steady_state``), whose windows
    the rest of the step repeats; ``hint`` ends it (how to see every micro-batch)."""
    shown, total = ev.result.simulated_microbatches, plan.num_microbatches
    if shown >= total:
        return ""
    sizes = plan_steady_state(plan)
    window = f" ({sizes.window}-micro-batch windows)" if sizes is not None else ""
    return (
        f"micro-batches 0-{shown - 1} of {total} shown: warm-up, steady state{window} and "
        f"cool-down of a shorter step; the rest repeats the steady state; {hint}"
    )


def write_html_report(path: Path, r: SimulateReport, *, title: str, shown_note: str) -> None:
    """Write the HTML report of the simulated plan (``plansim.report.html_report``):
    the printed tables and notes, the bubble Gantt chart, memory over time and the memory
    breakdown, atomically.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    from plansim.report.html_report import SimulatePage, simulate_report_html, write_report

    page = SimulatePage(
        title=title,
        tables=summary_tables(r),
        outcome=r.outcome,
        capacity_bytes=r.profile.hbm_capacity_bytes,
        shown_note=shown_note,
        notes=(layer_note(r), *summary_notes(r)),
    )
    write_report(path, simulate_report_html(page), label="--report")


def steady_state_note(outcome: Evaluation) -> str:
    """One line when the figures come from two shorter simulations
    (``plansim.sim.steady_state``; ``--trace`` or a plot simulates every micro-batch)."""
    plan = outcome.plan
    simulated = outcome.result.simulated_microbatches
    sizes = plan_steady_state(plan)
    if simulated >= plan.num_microbatches or sizes is None:
        return ""
    return (
        f"\n{plan.num_microbatches} micro-batches per pipeline, extrapolated from simulations "
        f"of {sizes.short} and {sizes.long} (past the warm-up each adds the same; --trace, "
        "--plot or --memory-plot simulates them all)\n"
    )


def pace_note(profile: HardwareProfile, num_gpus: int, pace: float, *, dtype: str) -> str:
    """One line on the GEMM rate the job sustains (``plansim.analytic.sustained``)."""
    slowest = slowest_gpu_fraction(profile, num_gpus)
    power = (
        f"{dtype} GEMMs run below the power limit"
        if dtype in UNTHROTTLED_DTYPES
        else f"{100 * profile.sustained_matmul_fraction:.1f}% sustained at the power limit"
    )
    return (
        f"\nGEMMs and attention at {100 * pace:.1f}% of {profile.name}'s burst rate: "
        f"{power} x {100 * slowest:.1f}% for the slowest of {num_gpus} GPUs\n"
    )


#: Output flags of ``plansim simulate``: argparse dest -> flag as typed.
