"""The planner's memo helpers: plan enums hash by identity and a memo computes once."""

from __future__ import annotations

import enum
import pickle

import pytest

import plansim.specs.hardware
import plansim.specs.model
import plansim.specs.plan
from plansim.analytic.memo import memoised
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.plan import Precision

#: Every enum of the plan, model and hardware specs (the three modules are imported above).
ENUMS = tuple(sorted(ChoiceEnum.__subclasses__(), key=lambda cls: cls.__name__))


def test_every_spec_enum_is_a_choice_enum() -> None:
    names = {cls.__name__ for cls in ENUMS}
    modules = (plansim.specs.hardware, plansim.specs.model, plansim.specs.plan)
    spec_enums = {
        name
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, enum.Enum) and value is not ChoiceEnum
    }
    assert spec_enums and spec_enums <= names
    assert {"Precision", "Schedule", "Recompute", "Activation", "LinkTier"} <= names


@pytest.mark.parametrize("cls", ENUMS, ids=lambda c: c.__name__)
def test_plan_enums_hash_by_identity_and_survive_pickling(cls: type[ChoiceEnum]) -> None:
    assert issubclass(cls, ChoiceEnum)
    for member in cls:
        assert hash(member) == object.__hash__(member)
        copy = pickle.loads(pickle.dumps(member))
        assert copy is member
        assert {member: 1}[copy] == 1
        assert cls(member.value) is member


def test_memoised_computes_once_per_key_and_not_without_a_memo() -> None:
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    memo: dict[tuple[object, ...], object] = {}
    key = ("tag", Precision.BF16, 3)
    assert memoised(memo, key, compute) == 1
    assert memoised(memo, ("tag", Precision.BF16, 3), compute) == 1  # equal key: a hit
    assert memoised(memo, ("tag", Precision.FP8, 3), compute) == 2
    assert memoised(None, key, compute) == 3  # no memo: computed every time
    assert memo == {key: 1, ("tag", Precision.FP8, 3): 2}


def test_a_cached_none_is_returned_not_recomputed() -> None:
    calls: list[int] = []

    def compute() -> None:
        calls.append(1)

    memo: dict[tuple[object, ...], object] = {}
    memoised(memo, ("none",), compute)
    memoised(memo, ("none",), compute)
    assert len(calls) == 1
