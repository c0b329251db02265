"""The base of plansim's enumerated choices (plan, model and link enums)."""

from __future__ import annotations

import enum
from typing import TypeVar

from plansim.errors import choice_error


class ChoiceEnum(enum.Enum):
    """An enum whose members hash by identity.

    ``enum.Enum.__hash__`` is Python code (``hash(self._name_)``); the planner hashes plan
    enums millions of times a search in its memo keys, where that call was about 6% of the
    costing time. Members are singletons that compare by identity (pickling returns the
    same member), so the identity hash agrees with equality; like the name hash (randomised
    per process for strings), it is not stable across processes, and nothing relies on it.
    """

    __hash__ = object.__hash__

    @classmethod
    def parse(cls: type[_E], value: object, *, field: str) -> _E:
        """``value`` as a member: a member as it is, a member's value (as files and users
        write it) as that member.

        Raises:
            SpecError: anything else, naming ``field`` and the allowed values.
        """
        return parse_enum(cls, field, value)  # type: ignore[return-value]


_E = TypeVar("_E", bound=ChoiceEnum)


def parse_enum(enum_cls: type[enum.Enum], field: str, value: object) -> enum.Enum:
    """Map a user string (or an enum member) to ``enum_cls``; SpecError names the choices."""
    if isinstance(value, enum_cls):
        return value
    for member in enum_cls:
        if member.value == value:
            return member
    raise choice_error(field, value, [m.value for m in enum_cls])


def require_members(
    names: tuple[str, ...], values: tuple[object, ...], classes: tuple[type, ...]
) -> None:
    """Raise SpecError naming the first of ``names`` (as ``plan.<name>``) whose value is not a
    member of its enum in ``classes``, with the allowed values; one tuple comparison when all
    are."""
    if tuple(map(type, values)) == classes:
        return
    for name, value, cls in zip(names, values, classes, strict=True):
        if type(value) is not cls:
            raise choice_error(f"plan.{name}", value, [m.value for m in cls])  # type: ignore[attr-defined]
