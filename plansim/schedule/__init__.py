"""Pipeline schedules as data: actions, per-schedule builders and invariant checks."""

from plansim.schedule.actions import (
    Action,
    ActionKind,
    PerRankActions,
    format_actions_csv,
    format_grid,
    parse_actions_csv,
)
from plansim.schedule.builders import build_actions
from plansim.schedule.checks import (
    ScheduleError,
    check_actions,
    check_structure,
    lockstep_grid,
)

__all__ = [
    "Action",
    "ActionKind",
    "PerRankActions",
    "ScheduleError",
    "build_actions",
    "check_actions",
    "check_structure",
    "format_actions_csv",
    "format_grid",
    "lockstep_grid",
    "parse_actions_csv",
]
