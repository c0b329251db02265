"""Single-field checks of a :class:`plansim.specs.plan.ParallelPlan` (pure): sizes are
positive integers, ``zero_stage`` is 0-3, enum fields hold members of their enum and flags
are booleans. Valid values take a fast path (the planner builds ~150K plans a search); an
error's message is built only on failure and names the field and its allowed values."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from plansim.errors import choice_error, require_positive_int
from plansim.specs.plan_enums import (
    AttentionKernel,
    DdpImpl,
    OffloadDevice,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)

if TYPE_CHECKING:
    from plansim.specs.plan import ParallelPlan

#: Fields that must be positive integers, in the order they are checked.
POSITIVE_FIELDS = ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "global_batch_size")
#: Fields that must be a member of their enum.
ENUM_FIELDS = (
    ("recompute", Recompute),
    ("schedule", Schedule),
    ("precision", Precision),
    ("attention", AttentionKernel),
    ("offload_optimizer", OffloadDevice),
    ("offload_param", OffloadDevice),
    ("zero3_param_fetch", Zero3ParamFetch),
    ("ddp_impl", DdpImpl),
)
#: Fields that must be booleans.
FLAG_FIELDS = (
    "overlap_grad_reduce",
    "gradient_accumulation_fusion",
    "fused_elementwise",
    "persist_layer_norm",
    "scatter_gather_p2p",
    "tp_comm_overlap",
    "overlap_param_gather",
    "grad_reduce_in_bf16",
    "use_torch_fsdp2",
    "reshard_after_forward",
    "recompute_early_stop",
)

_sizes = attrgetter(*POSITIVE_FIELDS)
_choices = attrgetter(*(name for name, _ in ENUM_FIELDS))
_flags = attrgetter(*FLAG_FIELDS)
#: The types valid values have, field by field (one C-level tuple comparison per group).
_SIZE_TYPES = (int,) * len(POSITIVE_FIELDS)
_CHOICE_TYPES = tuple(cls for _, cls in ENUM_FIELDS)
_FLAG_TYPES = (bool,) * len(FLAG_FIELDS)


def check_sizes_and_choices(plan: ParallelPlan) -> None:
    """:data:`POSITIVE_FIELDS`, ``zero_stage`` and :data:`ENUM_FIELDS`.

    Raises:
        SpecError: the first field out of its allowed values.
    """
    sizes = _sizes(plan)
    if tuple(map(type, sizes)) != _SIZE_TYPES or min(sizes) < 1:
        for field, size in zip(POSITIVE_FIELDS, sizes, strict=True):
            if type(size) is not int or size < 1:
                require_positive_int(f"plan.{field}", size)
    if plan.zero_stage not in (0, 1, 2, 3) or isinstance(plan.zero_stage, bool):
        raise choice_error("plan.zero_stage", plan.zero_stage, [0, 1, 2, 3])
    choices = _choices(plan)
    if tuple(map(type, choices)) != _CHOICE_TYPES:
        for (field, cls), choice in zip(ENUM_FIELDS, choices, strict=True):
            if type(choice) is not cls:
                raise choice_error(f"plan.{field}", choice, [m.value for m in cls])


def check_flags(plan: ParallelPlan) -> None:
    """:data:`FLAG_FIELDS` are booleans.

    Raises:
        SpecError: the first flag that is not.
    """
    flags = _flags(plan)
    if tuple(map(type, flags)) != _FLAG_TYPES:
        for flag, value in zip(FLAG_FIELDS, flags, strict=True):
            if type(value) is not bool:
                raise choice_error(f"plan.{flag}", value, [True, False])
