"""The sensitivity of a step time to the profile's terms, as a table and a JSON section."""

from __future__ import annotations

import math

import pandas as pd

from plansim.planner.sensitivity import SPEED_UP, Sensitivity


def _classes(sources: dict[str, str]) -> str:
    """Distinct provenance classes with their counts, e.g. ``derived 2, datasheet 1``."""
    counts: dict[str, int] = {}
    for cls in sources.values():
        counts[cls] = counts.get(cls, 0) + 1
    return ", ".join(f"{c} {n}" for c, n in sorted(counts.items())) or "-"


def sensitivity_table(s: Sensitivity) -> pd.DataFrame:
    """One row per profile term: elasticity, the step time with the term faster, and the
    classes of the profile figures behind it."""
    pct = round(100 * (SPEED_UP - 1))
    return pd.DataFrame(
        [
            {
                "term": t.label,
                "elasticity": f"{t.elasticity:.3f}",
                f"step_s_{pct}pct_faster": "-"
                if t.faster_step_time_s is None
                else f"{t.faster_step_time_s:.4g}",
                "least_certain_source": t.weakest_source or "-",
                "sources": _classes(t.sources),
            }
            for t in s.terms
        ]
    )


def sensitivity_summary(s: Sensitivity) -> str:
    """Two lines under the table: what the elasticities add to, and how much of the step
    moves with assumed figures."""
    pct = round(100 * (SPEED_UP - 1))
    assumed = s.elasticity_resting_on("assumption")
    return (
        f"elasticity = fraction the step shortens per fraction a term speeds up (each term "
        f"made {pct}% faster alone and the plan simulated again); sum {s.total_elasticity:.3f}\n"
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
