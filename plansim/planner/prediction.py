"""Prediction: the outcome of predicting one published run (status, note, step time, where
the step goes), shared by the dense back-test (``plansim.planner.backtest``) and the MoE
one (``plansim.planner.moe_backtest``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from plansim.planner.run_checks import LayerCheck
from plansim.specs.plan import ParallelPlan

#: A run's layout needs no more than this fraction over the GPU's memory in plansim's model
#: to be predicted anyway (status ``OVER_MEMORY``); further out, the row more likely misstates
#: its layout than plansim its memory.
MEMORY_MODEL_SLACK = 0.25
#: Status of a row predicted although plansim's memory model fits none of its layouts.
OVER_MEMORY = "over-memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Outcome of one row: ``ok`` or ``OVER_MEMORY`` with a prediction, or ``skipped`` with
    the reason in ``note``. ``plan`` is the chosen plan (its execution spec names the row's
    framework), ``plan_label`` its label.

    Besides the step time, a prediction says where the simulated step goes, so a row's error
    can be read against it: ``mfu_pct`` (model FLOPs over the step at the dense peak,
    Korthikanti et al. 2022 App. A, comparable with a row's ``mfu_pct``),
    ``bubble_fraction`` (the compute stream's idle share of the pipeline time,
    ``SimResult.bubble_fraction``: pipeline bubbles and waits on blocking communication)
    and ``exposed_comm_s_by_kind``, communication not hidden behind
    compute per kind, seconds per pipeline rank (the simulation's sum over the ranks of one
    pipeline, ``SimResult.exposed_s_by_kind``, over pp).

    Finer checks where the row gives the measurement (``plansim.planner.run_checks``):
    ``layer`` (one layer's forward and backward milliseconds and their errors; a row with
    per-layer times but no step time has status ``PER_LAYER`` and only this) and
    ``peak_memory_error_pct`` (the predicted peak against ``measured_peak_mem_gb``).

    With ``sensitivity`` asked for, what the chosen plan's step time rests on
    (``plansim.planner.sensitivity``): ``elasticity_by_term`` (term id -> elasticity) and
    ``elasticity_on_assumptions`` (the elasticities of the terms with an assumed figure,
    summed), so a row's error can be read against how much of its prediction the profile's
    assumptions carry, and ``out_of_range``: the profile curves its pricing read outside their
    measured points (``plansim.planner.lookups``), one ``OutOfRange.text()`` each.
    """

    status: str
    note: str
    predicted_step_time_s: float | None = None
    step_time_error_pct: float | None = None
    predicted_peak_memory_gib: float | None = None
    plan_label: str = ""
    plan: ParallelPlan | None = None
    mfu_pct: float | None = None
    bubble_fraction: float | None = None
    exposed_comm_s_by_kind: dict[str, float] = field(default_factory=dict)
    layer: LayerCheck | None = None
    peak_memory_error_pct: float | None = None
    elasticity_by_term: dict[str, float] = field(default_factory=dict)
    elasticity_on_assumptions: float | None = None
    out_of_range: tuple[str, ...] = ()
