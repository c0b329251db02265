"""Which dtypes the validate runner trains in, and which plans it runs in each (pure).

fp32: every plan the runner executes. bf16: mixed precision as plansim prices it
(``plansim.validate.mixed_precision``: Megatron-LM's bf16 weights, fp32 main gradients and
master weights for ZeRO-0; FSDP2's ``MixedPrecisionPolicy`` for ZeRO-2/3), not ZeRO-1.
"""

from __future__ import annotations

from plansim.specs.plan import ParallelPlan
from plansim.validate.result import ValidateError

#: Run dtypes the runner trains in (``plansim validate --dtype``).
RUN_DTYPES = ("fp32", "bf16")


def uses_fsdp(plan: ParallelPlan) -> bool:
    """True where the runner shards with FSDP2 (``parallelize.apply_zero``: ZeRO-2/3, dp > 1)."""
    return plan.zero_stage >= 2 and plan.dp > 1


def check_dtype_supported(dtype: str, plan: ParallelPlan) -> None:
    """Raise ValidateError naming the field for a dtype the runner does not train in, or a
    plan it cannot run in that dtype.

    bf16 is not run with ZeRO-1 over dp > 1 (``ZeroRedundancyOptimizer`` would keep every
    fp32 master weight on each rank, where plansim shards them with the optimizer states).
    """
    if dtype not in RUN_DTYPES:
        raise ValidateError(f"dtype {dtype!r}; choose one of: {', '.join(RUN_DTYPES)}")
    if dtype == "fp32":
        return
    if plan.zero_stage == 1 and plan.dp > 1:
        raise ValidateError(
            f"plan.zero_stage 1 with dtype {dtype}: ZeroRedundancyOptimizer keeps every fp32 "
            "master weight on each rank, where plansim shards them; use zero_stage 0, 2 or 3, "
            "or dtype fp32"
        )
