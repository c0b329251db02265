"""Why a constrained plan search enumerated no candidate at all (the rejection summary
explains the candidates it did enumerate; this explains an empty enumeration).

Each constraint flag that was given is dropped in turn (its knob back to the unconstrained
search's values) and the layouts that then exist are listed by that knob, e.g. ``--tp 3`` on
16 GPUs: "without --tp 3: tp in (1, 2, 4, 8, 16)".
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from itertools import islice

from plansim.planner.enumerate import SearchSpace, enumerate_plans

#: Plans enumerated per relaxed constraint at most (a relaxed search on thousands of GPUs
#: can be large; the values seen by then are listed).
MAX_PLANS = 200_000


@dataclass(frozen=True, slots=True)
class Constraint:
    """One constraint flag: its name, the SearchSpace field it sets, the plan attribute it
    constrains."""

    flag: str
    field: str
    attribute: str


#: The constraint flags of ``plansim plan`` (``commands.plan_space.add_constraint_args``, --cp,
#: --dp-sync), in the order they are reported.
CONSTRAINTS = (
    Constraint("tp", "tp", "tp"),
    Constraint("cp", "cp", "cp"),
    Constraint("pp", "pp", "pp"),
    Constraint("dp", "dp", "dp"),
    Constraint("vpp", "vpps", "vpp"),
    Constraint("mbs", "micro_batch_size", "micro_batch_size"),
    Constraint("zero", "zero_stages", "zero_stage"),
    Constraint("recompute", "recomputes", "recompute"),
    Constraint("schedule", "schedules", "schedule"),
    Constraint("dp-sync", "dp_syncs", "dp_sync"),
)


def empty_search_lines(
    args: argparse.Namespace,
    space: SearchSpace,
    unconstrained: SearchSpace,
    *,
    num_gpus: int,
    global_batch_size: int,
    num_layers: int,
) -> list[str]:
    """Lines saying, for each constraint flag given, which values of its knob would have
    given layouts without it (``space``: the constrained search; ``unconstrained``: the same
    search without the constraint flags). Empty when no constraint differs."""
    given = [c for c in CONSTRAINTS if getattr(space, c.field) != getattr(unconstrained, c.field)]
    if not given:
        return []
    texts = {c.flag: _flag_text(args, c) for c in given}
    lines = [
        "  not enumerated: no layout of "
        f"{num_gpus} GPUs and global batch {global_batch_size} meets "
        + " ".join(texts[c.flag] for c in given)
    ]
    for c in given:
        relaxed = replace(space, **{c.field: getattr(unconstrained, c.field)})
        plans = enumerate_plans(
            num_gpus=num_gpus,
            global_batch_size=global_batch_size,
            space=relaxed,
            num_layers=num_layers,
        )
        seen = {getattr(p, c.attribute) for p in islice(plans, MAX_PLANS)}
        values = [_value(v) for v in sorted(seen, key=_order)]
        shown = ", ".join(values) if values else "none either"
        lines.append(f"    without {texts[c.flag]}: {c.attribute} in ({shown})")
    return lines


def _flag_text(args: argparse.Namespace, c: Constraint) -> str:
    """'--tp 3' as given on the command line."""
    return f"--{c.flag} {getattr(args, c.flag.replace('-', '_'))}"


def _order(v: object) -> tuple[int, float, str]:
    """Numbers in numeric order, then enum members by their value."""
    if isinstance(v, int | float):
        return (0, float(v), "")
    return (1, 0.0, str(getattr(v, "value", v)))


def _value(v: object) -> str:
    """A knob value as the flags spell it (enum members by their value)."""
    return str(getattr(v, "value", v))
