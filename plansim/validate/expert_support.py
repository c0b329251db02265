"""Which Mixture-of-Experts layouts the validate runner executes (pure, no torch).

The runner's MoE layer (``plansim.validate.moe_layer``) routes dropless over an EP group of
data-parallel ranks (``plansim.validate.expert_parallel``); it has no expert tensor
parallelism (so tp = etp = 1), no capacity factor, and runs with every recompute mode but
the per-op selective one, and without hybrid sharding.
"""

from __future__ import annotations

from plansim.specs.model import ModelSpec
from plansim.specs.moe import ExpertCapacity
from plansim.specs.plan import ParallelPlan, Recompute
from plansim.validate.result import ValidateError


def check_moe_supported(model: ModelSpec, plan: ParallelPlan) -> None:
    """Raise ValidateError for expert layouts the runner cannot execute, naming the field."""
    moe = model.moe
    if moe is None:
        if plan.ep > 1 or plan.etp is not None:
            raise ValidateError(
                f"plan.ep({plan.ep}) / etp({plan.etp}) split routed experts, and model "
                f"{model.name} is dense (model.moe is None): leave ep 1 and etp unset"
            )
        return
    if plan.tp > 1 or (plan.etp or 1) > 1:
        raise ValidateError(
            f"plan.tp({plan.tp}) / etp({plan.etp}) > 1 with model.moe is not supported: the "
            "validator's MoE layer has no (expert) tensor parallelism"
        )
    if moe.num_experts % plan.ep:
        raise ValidateError(
            f"model.moe.num_experts({moe.num_experts}) is not divisible by plan.ep({plan.ep})"
        )
    if moe.capacity is not ExpertCapacity.DROPLESS:
        raise ValidateError(
            f"model.moe.capacity {moe.capacity.value!r} is not supported by the validator: "
            f"it routes dropless ({ExpertCapacity.DROPLESS.value!r})"
        )
    if plan.recompute is Recompute.SELECTIVE_OP:
        raise ValidateError(
            f"plan.recompute {plan.recompute.value!r} with model.moe is not supported "
            "(its per-op policy would replay the experts' all-to-alls)"
        )
    if plan.dp_shard is not None:
        raise ValidateError(
            f"plan.dp_shard({plan.dp_shard}) (hybrid sharding) with model.moe is not supported"
        )
