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

from plansim.errors import PlansimError
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


class ValidateError(PlansimError):
    """A validation run failed or its inputs are wrong; the message names the rank or field."""


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

    def __post_init__(self) -> None:
        if not self.step_times_s:
            raise ValidateError("measured run has no measured steps (steps must be >= 1)")
        if len(self.timelines) != len(self.step_times_s):
            raise ValidateError(
                f"measured run has {len(self.timelines)} timelines for "
                f"{len(self.step_times_s)} measured steps"
            )
        if len(self.peak_memory_bytes) != self.plan.pp:
            raise ValidateError(
                f"peak_memory_bytes has {len(self.peak_memory_bytes)} entries; "
                f"expected one per pipeline rank (pp={self.plan.pp})"
            )

    @property
    def median_step_time_s(self) -> float:
        """Median of the measured step times, seconds."""
        ordered = sorted(self.step_times_s)
        mid = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[mid]
        return 0.5 * (ordered[mid - 1] + ordered[mid])
