"""Whether a search's best plan stays best when one profile term is off by 10%.

A ranking is only as trustworthy as the figures it was priced from. For each term of
``plansim.specs.profile_terms`` and each direction (the term :data:`SPEED_UP` times faster,
then that much slower) the leading plans are simulated again on the changed profile and
ranked by step time; where another plan comes first, that is reported with its margin. A
best plan that no single 10% change dethrones is robust to the profile's likely errors (a
measured curve's run-to-run spread is a few percent; a datasheet-derived or assumed figure
can be off by more, see each profile's ``provenance``). One-at-a-time perturbation of the
model's inputs, as in :mod:`plansim.planner.sensitivity`.

Ties: measured step times of one layout differ between repeats (a shared cluster, one
iteration timed). In the BLOOM-176B layout search (``benchmarks/published_runs/
bloom_layout_search.csv``: 12 layouts timed 2-5 times) the max/min spread of a layout's
repeats is 0-7.6%, median 3.9% (:data:`RUN_TO_RUN_SPREAD_FRACTION`). Leading plans whose
predicted steps lie within that of the best one's are a tie (:func:`tied_with_best`): a
measurement could not tell them apart either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.planner.sensitivity import SPEED_UP, Sensitivity, sensitivity
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.profile_terms import PROFILE_TERMS, faster

#: Median max/min spread of repeated measurements of one layout in a published layout search
#: (BLOOM-176B on 384 A100s, chronicles-prequel.md: 12 layouts timed 2-5 times, 0-7.6%).
RUN_TO_RUN_SPREAD_FRACTION = 0.039


def tied_with_best(ranked: Sequence[Evaluation]) -> tuple[str, ...]:
    """Labels of the plans after the first of ``ranked`` (best first) whose predicted step
    is within :data:`RUN_TO_RUN_SPREAD_FRACTION` of the first's; empty when none or fewer
    than two plans."""
    if len(ranked) < 2:
        return ()
    limit_s = ranked[0].step_time_s * (1.0 + RUN_TO_RUN_SPREAD_FRACTION)
    return tuple(ev.plan.label() for ev in ranked[1:] if ev.step_time_s <= limit_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Upset:
    """One profile change under which another plan would rank first.

    Attributes:
        term: the term's id (``plansim.specs.profile_terms.TERM_NAMES``).
        label: what it is.
        factor: how much faster the term was made (``1 / SPEED_UP``: slower).
        winner_rank: 1-based rank, in the original ranking, of the plan that comes first.
        winner_step_time_s: its step time on the changed profile.
        best_step_time_s: the original best plan's step time on the changed profile
            (``inf`` when the change put it over its memory).
    """

    term: str
    label: str
    factor: float
    winner_rank: int
    winner_step_time_s: float
    best_step_time_s: float

    @property
    def margin_fraction(self) -> float:
        """How much faster the new winner is than the original best, as a fraction."""
        return 1.0 - self.winner_step_time_s / self.best_step_time_s


def ranking_upsets(
    model: ModelSpec,
    ranked: Sequence[Evaluation],
    profile: HardwareProfile,
    *,
    best: Sensitivity | None = None,
) -> tuple[Upset, ...]:
    """The single-term changes of ``profile`` (each term :data:`SPEED_UP` times faster, then
    slower) under which a plan other than ``ranked[0]`` is the fastest of ``ranked``.

    Args:
        ranked: the leading evaluations of a search, best first (at least one).
        best: :func:`plansim.planner.sensitivity.sensitivity` of ``ranked[0]`` when already
            computed: its faster step times are reused rather than simulated again.

    Raises:
        ValueError: ``ranked`` is empty.
        SpecError: as ``evaluate``.
    """
    if not ranked:
        raise ValueError("ranked must hold at least one evaluation")
    upsets = []
    for term in PROFILE_TERMS:
        for factor in (SPEED_UP, 1.0 / SPEED_UP):
            changed = faster(profile, term.name, factor)
            known = _known_step_s(best, term.name) if factor == SPEED_UP else None
            steps = [
                known if i == 0 and known is not None else _step_s(model, ev, changed)
                for i, ev in enumerate(ranked)
            ]
            # min() keeps the first of equal steps: ties go to the original order.
            winner = min(range(len(steps)), key=steps.__getitem__)
            if winner != 0:
                upsets.append(
                    Upset(
                        term=term.name,
                        label=term.label,
                        factor=factor,
                        winner_rank=winner + 1,
                        winner_step_time_s=steps[winner],
                        best_step_time_s=steps[0],
                    )
                )
    return tuple(upsets)


def _known_step_s(best: Sensitivity | None, term: str) -> float | None:
    """``best``'s step time with ``term`` :data:`SPEED_UP` times faster (``inf`` where that
    profile put the plan over its memory), or None without ``best``."""
    if best is None:
        return None
    faster_s = next(t.faster_step_time_s for t in best.terms if t.term == term)
    return math.inf if faster_s is None else faster_s


def _step_s(model: ModelSpec, ev: Evaluation, profile: HardwareProfile) -> float:
    outcome = evaluate(model, ev.plan, profile, checked=True)
    return math.inf if isinstance(outcome, Rejected) else outcome.step_time_s


@dataclass(frozen=True, slots=True, kw_only=True)
class RankingTrust:
    """What a search's answer rests on: the best plan's sensitivity and the upsets among
    the leading plans.

    Attributes:
        best: :func:`plansim.planner.sensitivity.sensitivity` of the best plan.
        upsets: :func:`ranking_upsets` of the leading plans.
        labels: the leading plans' labels, best first.
        tied: :func:`tied_with_best` of the leading plans.
    """

    best: Sensitivity
    upsets: tuple[Upset, ...]
    labels: tuple[str, ...]
    tied: tuple[str, ...] = ()


def ranking_trust(
    model: ModelSpec, ranked: Sequence[Evaluation], profile: HardwareProfile
) -> RankingTrust:
    """:class:`RankingTrust` of ``ranked`` (best first, at least one).

    Raises:
        ValueError: ``ranked`` is empty.
        SpecError: as ``evaluate``.
    """
    if not ranked:
        raise ValueError("ranked must hold at least one evaluation")
    best = sensitivity(model, ranked[0].plan, profile, base=ranked[0])
    return RankingTrust(
        best=best,
        upsets=ranking_upsets(model, ranked, profile, best=best),
        labels=tuple(ev.plan.label() for ev in ranked),
        tied=tied_with_best(ranked),
    )
