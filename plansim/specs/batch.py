"""BatchOptions: sequences per micro-batch and per optimizer step (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import require_positive_int


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOptions:
    """The batch of one optimizer step.

    Attributes:
        micro_batch_size: sequences per micro-batch (Megatron-LM ``--micro-batch-size``).
        global_batch_size: sequences per optimizer step (``--global-batch-size``). With dp
            data-parallel replicas a pipeline runs global_batch_size / (micro_batch_size *
            dp) micro-batches a step (gradient-accumulation steps; checked by
            :class:`plansim.specs.plan.ParallelPlan`, which knows dp).

    Raises:
        SpecError: a size is not a positive integer.
    """

    micro_batch_size: int
    global_batch_size: int

    def __post_init__(self) -> None:
        mbs, gbs = self.micro_batch_size, self.global_batch_size
        if type(mbs) is not int or type(gbs) is not int or mbs < 1 or gbs < 1:
            require_positive_int("plan.micro_batch_size", mbs)
            require_positive_int("plan.global_batch_size", gbs)
