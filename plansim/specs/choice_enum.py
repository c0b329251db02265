"""The base of plansim's enumerated choices (plan, model and link enums)."""

from __future__ import annotations

import enum


class ChoiceEnum(enum.Enum):
    """An enum whose members hash by identity.

    ``enum.Enum.__hash__`` is Python code (``hash(self._name_)``); the planner hashes plan
    enums millions of times a search in its memo keys, where that call was about 6% of the
    costing time. Members are singletons that compare by identity (pickling returns the
    same member), so the identity hash agrees with equality; like the name hash (randomised
    per process for strings), it is not stable across processes, and nothing relies on it.
    """

    __hash__ = object.__hash__
