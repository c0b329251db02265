"""The cache a planner search threads through the costing functions (pure helpers).

A memo is a plain dict a :class:`plansim.planner.context.SearchContext` owns for one model
and one profile; costing functions take it as an optional argument and give identical
results without it. Keys start with a tag naming what is cached, followed by the plan
fields that quantity depends on (each module lists the fields it leaves out).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import TypeVar

from plansim.specs.plan import FIELD_PATHS

T = TypeVar("T")

Memo = dict[tuple[object, ...], object]

_MISSING = object()


def memoised(memo: Memo | None, key: tuple[object, ...], compute: Callable[[], T]) -> T:
    """``memo[key]``, computed by ``compute()`` the first time; ``compute()`` without a memo."""
    if memo is None:
        return compute()
    value = memo.get(key, _MISSING)  # one hash of the key (a hit is the common case)
    if value is _MISSING:
        value = memo[key] = compute()
    return value  # type: ignore[return-value]


def fields_getter(names: tuple[str, ...]) -> Callable[[object], tuple[object, ...]]:
    """A function giving a plan's values of the flat fields ``names``
    (``plansim.specs.plan.PLAN_FIELDS``) as a tuple, for memo keys: one C call reading each
    field from its group (``"tp"`` as ``plan.dims.tp``) instead of a Python loop of getattr.

    Raises:
        ValueError: fewer than two names (one would give a bare value, not a tuple), or a
            name that is not a plan field.
    """
    if len(names) < 2:
        raise ValueError(f"fields_getter needs two or more names, got {names!r}")
    unknown = [name for name in names if name not in FIELD_PATHS]
    if unknown:
        raise ValueError(f"fields_getter: {unknown!r} are not plan fields")
    return attrgetter(*(FIELD_PATHS[name] for name in names))
