"""What one real execution of a plan measured: the contract between the runner and the comparison.

Pure (no torch): the runner (``plansim.validate.runner``, torch.distributed) fills a
:class:`MeasuredRun`; the comparison (``plansim.validate.compare``) reads it next to the
simulated result of the same plan. Times are seconds, memory bytes.

Measured Timeline (``timelines``): one DataFrame per measured step in the Timeline schema of
``plansim.sim.timeline`` (columns ``rank, stream, kind, stage, microbatch, start_s, end_s,
bytes``), times relative to the start of that step (the earliest event of the step over all
ranks of the representative replica). ``rank`` is the pipeline rank (0 .. pp-1) of the
representative replica (dp index 0, tp index 0, cp index 0), exactly as in the simulator.
Compute rows use stream ``compute`` and the simulator's kinds: ``forward``, ``backward``
(full backward), ``backward_input`` / ``backward_weight`` (split backward), ``optimizer``;
observed communication uses the simulator's streams and kinds where it can be observed
(``pp_send`` / ``pp_recv`` with ``send_forward``, ``recv_forward``, ``send_backward``,
``recv_backward``; ``dp`` with ``dp_comm``); ``stage`` is the virtual pipeline stage and
``microbatch`` the micro-batch index, -1 when not tied to one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from plansim.calibrate.plan import CPU_SHARE_OK
from plansim.errors import PlansimError
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan

#: Least share of a core a CPU rank must get in a step for its timing to describe the plan
#: rather than other load on the machine: the calibration's rule for its own timings.
QUIET_CPU_SHARE = CPU_SHARE_OK


class ValidateError(PlansimError):
    """A validation run failed or its inputs are wrong; the message names the rank or field."""


class RunFailed(ValidateError):
    """The launched run failed: a rank raised, died or hung.

    Attributes:
        ranks: per rank, ``rank``, ``status`` (``ok``, ``raised``, ``died``, ``no result``),
            ``exit_status`` (None while running or unknown), ``last_progress`` and ``error``
            (the last line of its traceback, or the likely cause of its death).
    """

    def __init__(self, message: str, *, ranks: tuple[dict[str, object], ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class MeasuredRun:
    """One real run of ``plan`` on ``model``, as measured.

    Attributes:
        model: the ModelSpec actually run (possibly scaled down from what the user asked).
        plan: the ParallelPlan actually run.
        backend: ``gloo`` or ``nccl``.
        device: ``cpu`` or ``cuda``.
        num_processes: world size.
        num_warmup_steps: steps run before measuring (not in ``step_times_s``).
        step_times_s: wall time of each measured step (max over ranks), seconds.
        losses: training loss of every step, warm-up steps included, in order (the mean over
            the global batch, as the single-process reference computes it).
        timelines: one measured Timeline per measured step (see module docstring).
        peak_memory_bytes: per pipeline rank of the representative replica, the peak memory
            (CUDA max allocated on GPU; peak live tensor bytes on CPU), bytes.
        versions: software versions (``torch``, ``nccl`` when used, ``python``).
        run_queue_fractions: CPU runs: per measured step, the largest fraction of the step
            any rank's main thread spent runnable but waiting for a CPU behind other work
            (Linux ``schedstat`` run-queue delay over the step's wall time; time a rank
            waits for a message is not counted). Above 1 - :data:`QUIET_CPU_SHARE` other
            work on the machine held the rank back, and the step time says more about that
            load than about the plan (the calibration flags its own timings when a rank got
            less than that share of a core). Empty on GPU and where the kernel has no
            schedstat.
    """

    model: ModelSpec
    plan: ParallelPlan
    backend: str
    device: str
    num_processes: int
    num_warmup_steps: int
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    timelines: tuple[pd.DataFrame, ...]
    peak_memory_bytes: tuple[int, ...]
    versions: dict[str, str]
    run_queue_fractions: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.step_times_s:
            raise ValidateError("measured run has no measured steps (steps must be >= 1)")
        if len(self.timelines) != len(self.step_times_s):
            raise ValidateError(
                f"measured run has {len(self.timelines)} timelines for "
                f"{len(self.step_times_s)} measured steps"
            )
        if self.run_queue_fractions and len(self.run_queue_fractions) != len(self.step_times_s):
            raise ValidateError(
                f"measured run has {len(self.run_queue_fractions)} run-queue fractions for "
                f"{len(self.step_times_s)} measured steps"
            )
        if len(self.peak_memory_bytes) != self.plan.pp:
            raise ValidateError(
                f"peak_memory_bytes has {len(self.peak_memory_bytes)} entries; "
                f"expected one per pipeline rank (pp={self.plan.pp})"
            )

    @property
    def disturbed_steps(self) -> tuple[int, ...]:
        """Indices of the measured steps in which some rank waited for a CPU more than
        1 - :data:`QUIET_CPU_SHARE` of the step (none on GPU)."""
        fractions = self.run_queue_fractions
        return tuple(i for i, f in enumerate(fractions) if 1.0 - f < QUIET_CPU_SHARE)

    @property
    def median_step_time_s(self) -> float:
        """Median of the measured step times, seconds."""
        ordered = sorted(self.step_times_s)
        mid = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[mid]
        return 0.5 * (ordered[mid - 1] + ordered[mid])
