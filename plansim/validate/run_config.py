"""What the validate runner runs and how (:class:`RunConfig`): the input of
``plansim.validate.runner.run_plan`` and of every rank it starts (``plansim.validate.worker``).

Pure (no torch): the CLI builds one from its arguments, and each field is checked on
construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Schedule
from plansim.specs.stage_placement import StagePlacement
from plansim.validate.result import ValidateError
from plansim.validate.run_dtype import check_dtype_supported

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
#: Schedules the runner executes: those torch.distributed.pipelining places (looped or V;
#: ``plansim.validate.pipeline.TORCH_SCHEDULES`` names torch's class of each).
RUN_SCHEDULES = tuple(s for s in Schedule if s.placement is not StagePlacement.DUAL)


def check_schedule_supported(plan: ParallelPlan) -> None:
    """Raise ValidateError naming ``schedule`` for a schedule the runner cannot execute:
    DualPipe (two model copies fed from both ends) is not in torch.distributed.pipelining."""
    if plan.schedule in RUN_SCHEDULES:
        return
    runs = ", ".join(s.value for s in RUN_SCHEDULES)
    raise ValidateError(
        f"schedule {plan.schedule.value!r} cannot be run by the validator: "
        "torch.distributed.pipelining has no schedule with two model copies fed from both "
        f"ends (DualPipe); choose one of: {runs}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What to run and how.

    Attributes:
        model: the ModelSpec to build (already scaled down if needed; see
            ``plansim.validate.model.scale_model``).
        plan: the ParallelPlan; ``plan.num_gpus`` must equal ``num_processes``.
        backend: ``gloo`` or ``nccl``; device: ``cpu`` or ``cuda``.
        num_processes: world size.
        num_steps: measured steps (>= 1); num_warmup_steps: steps before them (>= 0). On CPU
            one more step follows, which measures memory (``plansim.validate.measure``).
        timeout_s: the whole run (start-up included) must end within it, seconds.
        seed: model initialisation and data seed.
        dtype: ``fp32`` or ``bf16`` (mixed precision as plansim prices it:
            ``plansim.validate.mixed_precision``; ZeRO 0, 2 or 3).
        optimizer: ``adamw`` (lr 1e-3, weight decay 0.01) or ``sgd`` (lr 1.0; the
            correctness tests use it: Adam is blind to a wrong gradient scale).

    Raises:
        ValidateError: a field is out of range or inconsistent, naming it.
    """

    model: ModelSpec
    plan: ParallelPlan
    backend: str
    device: str
    num_processes: int
    num_steps: int
    num_warmup_steps: int = 1
    timeout_s: float = 300.0
    seed: int = 0
    dtype: str = "fp32"
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValidateError(f"backend {self.backend!r}; choose one of: {', '.join(BACKENDS)}")
        if self.device not in DEVICES:
            raise ValidateError(f"device {self.device!r}; choose one of: {', '.join(DEVICES)}")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValidateError("backend nccl needs device cuda")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValidateError(f"optimizer {self.optimizer!r}; choose one of: adamw, sgd")
        check_dtype_supported(self.dtype, self.plan)
        check_schedule_supported(self.plan)
        if self.num_processes != self.plan.num_gpus:
            raise ValidateError(
                f"num_processes({self.num_processes}) != plan dp*tp*pp*cp = {self.plan.num_gpus}"
            )
        if self.num_steps < 1:
            raise ValidateError(f"num_steps({self.num_steps}) must be >= 1")
        if self.num_warmup_steps < 0:
            raise ValidateError(f"num_warmup_steps({self.num_warmup_steps}) must be >= 0")
        if not self.timeout_s > 0:
            raise ValidateError(f"timeout_s({self.timeout_s}) must be > 0")
