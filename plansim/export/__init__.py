"""Export a plan as launch configuration for a training framework (pure: text out, no I/O,
no torch).

One module per target, each following one release's names and citing its source files:

* ``plansim.export.megatron``: Megatron-LM command-line arguments (core_v0.16.1).
* ``plansim.export.torchtitan``: a torchtitan TOML job config (0.2.2).
* ``plansim.export.deepspeed``: a DeepSpeed JSON config (0.19.8).

Each refuses, with one :class:`~plansim.errors.SpecError` listing them all, the plan fields
its framework has no setting for (``plansim.export.common.Problems``). Output is
deterministic: the same plan and model give the same text, keys and arguments in a fixed
order.

Example::

    exported = export_plan(plan, resolve_model("gpt3-175b"), to=ExportTarget.MEGATRON)
    path = f"plan{exported.suffix}"   # the caller writes exported.text there
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from plansim.errors import SpecError
from plansim.export.deepspeed import DEEPSPEED_VERSION, deepspeed_text
from plansim.export.megatron import MEGATRON_VERSION, megatron_text
from plansim.export.torchtitan import TORCHTITAN_VERSION, torchtitan_text
from plansim.specs.execution import Framework
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan

__all__ = ["FRAMEWORK_TARGET", "ExportTarget", "ExportedConfig", "export_plan", "target_of"]


class ExportTarget(enum.Enum):
    """A framework a plan can be exported to."""

    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"

    @property
    def suffix(self) -> str:
        """The file suffix of the exported text: ``.txt`` (Megatron-LM arguments, one per
        line), ``.toml`` (torchtitan job config), ``.json`` (DeepSpeed config)."""
        return {
            ExportTarget.MEGATRON: ".txt",
            ExportTarget.TORCHTITAN: ".toml",
            ExportTarget.DEEPSPEED: ".json",
        }[self]

    @property
    def version(self) -> str:
        """The framework release whose names the export follows."""
        return {
            ExportTarget.MEGATRON: f"Megatron-LM {MEGATRON_VERSION}",
            ExportTarget.TORCHTITAN: f"torchtitan {TORCHTITAN_VERSION}",
            ExportTarget.DEEPSPEED: f"DeepSpeed {DEEPSPEED_VERSION}",
        }[self]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportedConfig:
    """A plan exported for one framework.

    Attributes:
        target: the framework.
        text: the configuration (Megatron-LM arguments, TOML or JSON), ending in a newline.
        suffix: suggested file suffix (``target.suffix``).
    """

    target: ExportTarget
    text: str
    suffix: str


#: The export target of a plan's own framework (``ExecutionSpec.framework``), where it has one.
FRAMEWORK_TARGET = {
    Framework.MEGATRON_CORE: ExportTarget.MEGATRON,
    Framework.MEGATRON_LM: ExportTarget.MEGATRON,
    Framework.MEGATRON_DEEPSPEED: ExportTarget.DEEPSPEED,
    Framework.DEEPSPEED: ExportTarget.DEEPSPEED,
    Framework.TORCHTITAN: ExportTarget.TORCHTITAN,
}


def target_of(plan: ParallelPlan) -> ExportTarget:
    """The export target of the plan's own framework (:data:`FRAMEWORK_TARGET`).

    Raises:
        SpecError: the framework (Composer, plain PyTorch) has no export target.
    """
    framework = plan.execution.framework
    if framework not in FRAMEWORK_TARGET:
        raise SpecError(
            f"plan.framework {framework.value} has no export target; choose one of: "
            f"{', '.join(t.value for t in ExportTarget)}"
        )
    return FRAMEWORK_TARGET[framework]


def export_plan(
    plan: ParallelPlan, model: ModelSpec, *, to: ExportTarget | None = None
) -> ExportedConfig:
    """Export ``plan`` for training ``model`` with the framework ``to``.

    Args:
        plan: the parallel layout (``num_gpus`` ranks are the launcher's business).
        model: the model the plan trains.
        to: the target framework; None: the plan's own (:func:`target_of`).

    Returns:
        The configuration text with its suffix and target.

    Raises:
        SpecError: the plan does not split the model, or it sets fields the target has no
            equivalent for; the message names each field, its value and what the target
            supports.
    """
    if to is None:
        to = target_of(plan)
    writers = {
        ExportTarget.MEGATRON: megatron_text,
        ExportTarget.TORCHTITAN: torchtitan_text,
        ExportTarget.DEEPSPEED: deepspeed_text,
    }
    return ExportedConfig(target=to, text=writers[to](plan, model), suffix=to.suffix)
