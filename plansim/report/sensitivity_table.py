"""The sensitivity of a step time to the profile's terms, as a table and a JSON section."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pandas as pd

from plansim.planner.lookups import OutOfRange
from plansim.planner.robustness import RUN_TO_RUN_SPREAD_FRACTION, RankingTrust, Upset
from plansim.planner.sensitivity import SPEED_UP, Sensitivity
from plansim.report.tables import render
from plansim.specs.profile_terms import PROFILE_TERMS, class_counts

#: :data:`SPEED_UP` as the percentage the reports print (10).
_PCT = round(100 * (SPEED_UP - 1))


def sensitivity_table(s: Sensitivity) -> pd.DataFrame:
    """One row per profile term: elasticity, the step time with the term faster, and the
    classes of the profile figures behind it."""
    return pd.DataFrame(
        [
            {
                "term": t.label,
                "elasticity": f"{t.elasticity:.3f}",
                f"step_s_{_PCT}pct_faster": "-"
                if t.faster_step_time_s is None
                else f"{t.faster_step_time_s:.4g}",
                "least_certain_source": t.weakest_source or "-",
                "sources": class_counts(t.sources.values()),
            }
            for t in s.terms
        ]
    )


def sensitivity_summary(s: Sensitivity) -> str:
    """Two lines under the table: what the elasticities add to, and how much of the step
    moves with assumed figures."""
    assumed = s.elasticity_resting_on("assumption")
    return (
        f"elasticity = fraction the step shortens per fraction a term speeds up (each term "
        f"made {_PCT}% faster alone and the plan simulated again); sum {s.total_elasticity:.3f}\n"
        f"terms resting on at least one assumed figure carry {assumed:.3f} of the step "
        "(the profile's provenance names each figure's source)\n"
    )


def sensitivity_dict(s: Sensitivity) -> dict[str, object]:
    """JSON section: per term its elasticity, faster step time and sources (key -> class)."""
    return {
        "speed_up": SPEED_UP,
        "total_elasticity": round(s.total_elasticity, 6),
        "elasticity_resting_on_assumptions": round(s.elasticity_resting_on("assumption"), 6),
        "terms": [
            {
                "term": t.term,
                "label": t.label,
                "elasticity": None if math.isnan(t.elasticity) else round(t.elasticity, 6),
                "faster_step_time_s": t.faster_step_time_s,
                "sources": t.sources,
            }
            for t in s.terms
        ],
    }


def _change(factor: float) -> str:
    return f"{_PCT}% faster" if factor > 1 else f"{_PCT}% slower"


def robustness_lines(upsets: Sequence[Upset], *, num_plans: int, labels: Sequence[str]) -> str:
    """What :func:`plansim.planner.robustness.ranking_upsets` found, as text: one line per
    change that puts another plan first, or one line saying none does."""
    head = (
        f"ranking under single-term profile errors (each term {_PCT}% faster or slower, the "
        f"top {num_plans} plans simulated again):\n"
    )
    if not upsets:
        return head + f"  rank 1 stays first under every change ({2 * len(PROFILE_TERMS)} tried)\n"
    lines = [
        f"  {u.label} {_change(u.factor)}: rank {u.winner_rank} ({labels[u.winner_rank - 1]}) "
        f"first, {100 * u.margin_fraction:.1f}% faster than rank 1\n"
        for u in upsets
    ]
    return head + "".join(lines)


def robustness_dict(upsets: Sequence[Upset], *, num_plans: int) -> dict[str, object]:
    """JSON section: the plans compared and each change that reorders the first place."""
    return {
        "num_plans": num_plans,
        "speed_up": SPEED_UP,
        "upsets": [
            {
                "term": u.term,
                "factor": u.factor,
                "winner_rank": u.winner_rank,
                "winner_step_time_s": u.winner_step_time_s,
                "best_step_time_s": u.best_step_time_s,
            }
            for u in upsets
        ],
    }


def sensitivity_text(s: Sensitivity, *, profile_name: str, whose: str = "the step") -> str:
    """A heading, :func:`sensitivity_table` rendered and :func:`sensitivity_summary`."""
    return (
        f"\nwhat {whose} time rests on ({profile_name}'s terms):\n"
        + render(sensitivity_table(s), "table")
        + sensitivity_summary(s)
    )


def trust_text(trust: RankingTrust, *, profile_name: str) -> str:
    """``plansim plan --sensitivity``'s text: rank 1's sensitivity, then the ranking check."""
    return (
        sensitivity_text(trust.best, profile_name=profile_name, whose="rank 1's step")
        + "\n"
        + robustness_lines(trust.upsets, num_plans=len(trust.labels), labels=trust.labels)
        + tie_text(trust.tied)
    )


def tie_text(tied: Sequence[str]) -> str:
    """The tie line of ``plansim plan --sensitivity`` ('' when rank 1 stands alone)."""
    if not tied:
        return ""
    spread = f"{100 * RUN_TO_RUN_SPREAD_FRACTION:.1f}%"
    shown = "".join(f"  {label}\n" for label in tied)
    return (
        f"\nA tie: {len(tied)} more plan(s) within {spread} of rank 1's step, the run-to-run "
        f"spread of one layout's repeats in a published layout search; measure them too:\n" + shown
    )


def outside_dicts(outside: Sequence[OutOfRange]) -> list[dict[str, object]]:
    """JSON records of :class:`OutOfRange` lookups."""
    return [dataclasses.asdict(o) for o in outside]


def outside_text(outside: Sequence[OutOfRange], *, profile_name: str, reader: str = "") -> str:
    """The curves read outside their measured points, a line each ('' when none); ``reader``
    says by whom (e.g. " by rank 1's pricing")."""
    if not outside:
        return ""
    lines = "".join(f"  {o.text()}\n" for o in outside)
    return f"\n{profile_name}'s curves read outside their measured points{reader}:\n{lines}"


def trust_dict(trust: RankingTrust) -> dict[str, object]:
    """``plansim plan --sensitivity``'s JSON sections."""
    return {
        "sensitivity_of_best": sensitivity_dict(trust.best),
        "ranking_robustness": robustness_dict(trust.upsets, num_plans=len(trust.labels)),
        "tied_with_best": {
            "spread_fraction": RUN_TO_RUN_SPREAD_FRACTION,
            "plans": list(trust.tied),
        },
    }
