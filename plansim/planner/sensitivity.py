"""What a plan's simulated step time rests on: its elasticity to each profile term.

For each term of ``plansim.specs.profile_terms`` (GEMM rate, HBM, NVLink, network, kernel
launch, collective latency, host, PCIe) the plan is simulated again with that term alone made
:data:`SPEED_UP` times faster, and the elasticity

    e = ln(T / T_faster) / ln(SPEED_UP)

is the fraction by which the step shortens per fraction the term speeds up: 1 for a step
spent entirely waiting on that term, 0 for a term off the critical path (hidden behind
another stream or not used). Over the terms the elasticities sum to about 1 when the step is
priced from the profile alone (exactly 1 for a step of one rate; less where code constants
such as NCCL's tuning latencies carry part of it, more or less where ``max`` terms switch
sides). Each term also reports the provenance classes of the profile figures behind it
(measured, datasheet, derived, assumption), so the share of the step resting on assumed
figures can be read off. It is the one-at-a-time (local) sensitivity analysis of a
performance model; a finite 10% step is used rather than a derivative because the
simulated step is piecewise (overlap ``max`` terms, log-log curves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.specs.profile_terms import PROFILE_TERMS, PROVENANCE_CLASSES, faster, term_sources

#: How much faster each term is made (10%).
SPEED_UP = 1.1


@dataclass(frozen=True, slots=True, kw_only=True)
class TermSensitivity:
    """One term's effect on the step.

    Attributes:
        term: the term's id (``plansim.specs.profile_terms.TERM_NAMES``).
        label: what it is.
        elasticity: ln(T / T_faster) / ln(:data:`SPEED_UP`), dimensionless; NaN when the
            faster profile's simulation put the plan over its memory (a plan at its limit
            whose simulated peak moved with the timing).
        faster_step_time_s: the step time with the term :data:`SPEED_UP` times faster
            (None in that case).
        sources: provenance key -> class (measured, datasheet, derived, assumption) of the
            profile figures behind the term; empty when the profile names none.
    """

    term: str
    label: str
    elasticity: float
    faster_step_time_s: float | None
    sources: dict[str, str]

    @property
    def weakest_source(self) -> str | None:
        """The least certain class among :attr:`sources` (None without sources)."""
        classes = set(self.sources.values())
        return next((c for c in PROVENANCE_CLASSES if c in classes), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sensitivity:
    """A plan's step time and its elasticity to every profile term.

    Attributes:
        step_time_s: the plan's simulated step time on the unchanged profile.
        terms: one :class:`TermSensitivity` per term, in ``PROFILE_TERMS`` order.
    """

    step_time_s: float
    terms: tuple[TermSensitivity, ...]

    @property
    def total_elasticity(self) -> float:
        """Sum of the terms' elasticities (about 1, module docstring)."""
        return math.fsum(t.elasticity for t in self.terms if not math.isnan(t.elasticity))

    def elasticity_resting_on(self, source_class: str) -> float:
        """Sum of the elasticities of terms with at least one figure of ``source_class``
        (e.g. ``assumption``): how much of the step moves with such figures."""
        return math.fsum(
            t.elasticity
            for t in self.terms
            if source_class in t.sources.values() and not math.isnan(t.elasticity)
        )


def sensitivity(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, base: Evaluation
) -> Sensitivity:
    """The elasticity of ``base`` (``plan`` evaluated on ``profile``) to each profile term.

    Raises:
        SpecError: as ``evaluate``.
    """
    step = base.step_time_s
    dtype = plan.precision.value
    rows = []
    for term in PROFILE_TERMS:
        outcome = evaluate(model, plan, faster(profile, term.name, SPEED_UP), checked=True)
        # A faster term moves no bytes, but the simulated peak may shift with the timing:
        # a plan at its memory limit can then fail on the faster profile (no figure).
        faster_s = None if isinstance(outcome, Rejected) else outcome.step_time_s
        rows.append(
            TermSensitivity(
                term=term.name,
                label=term.label,
                elasticity=math.nan
                if faster_s is None
                else math.log(step / faster_s) / math.log(SPEED_UP),
                faster_step_time_s=faster_s,
                sources=term_sources(profile, term, dtype=dtype),
            )
        )
    return Sensitivity(step_time_s=step, terms=tuple(rows))
