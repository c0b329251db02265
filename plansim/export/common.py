"""What the three exporters share (pure): the check that a plan splits its model, and the
collection of the plan fields a target framework has no setting for, raised together as one
:class:`~plansim.errors.SpecError`.

Each exporter lists every field it cannot express (not only the first), so one message tells
a user all they would have to change: ``"cannot export the plan to Megatron-LM core_v0.16.1:
plan.zero_stage=2: ...; plan.offload_optimizer=cpu: ..."``.
"""

from __future__ import annotations

import enum

from plansim.errors import SpecError
from plansim.specs.layer_split import model_split_reason
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan

__all__ = ["Problems", "check_fits", "show"]


def show(value: object) -> str:
    """A plan value as a message shows it: an enum by its value ('interleaved-1f1b'), anything
    else as ``str`` (True, 4, None)."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


class Problems:
    """The plan fields one export cannot express, in the order the exporter checks them.

    Args:
        framework: the target as messages name it, with the version whose names the exporter
            follows (e.g. ``"Megatron-LM core_v0.16.1"``).
    """

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.messages: list[str] = []

    def add(self, field: str, value: object, supported: str) -> None:
        """Record that ``field`` (a plan attribute, or ``model.<attribute>``) holding ``value``
        has no equivalent; ``supported`` says what the framework supports instead."""
        name = field if field.startswith("model.") else f"plan.{field}"
        self.messages.append(f"{name}={show(value)}: {supported}")

    def raise_any(self) -> None:
        """Raise SpecError listing every recorded field, if any.

        Raises:
            SpecError: ``"cannot export the plan to <framework>: <field>=<value>: <what the
                framework supports>; ..."``.
        """
        if self.messages:
            raise SpecError(
                f"cannot export the plan to {self.framework}: " + "; ".join(self.messages)
            )


def check_fits(plan: ParallelPlan, model: ModelSpec) -> None:
    """The plan splits the model (``plansim.specs.layer_split.model_split_reason``:
    layers over pp * vpp stages, heads and query groups over tp, the sequence over 2 * cp).

    Raises:
        SpecError: naming the model and why it does not split.
    """
    reason = model_split_reason(plan, model)
    if reason is not None:
        raise SpecError(f"the plan does not split model {model.name}: {reason}")
