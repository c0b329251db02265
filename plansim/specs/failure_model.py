"""FailureModel: how often a run is interrupted and what a restart and a checkpoint cost (pure).

Interruptions are a Poisson process whose rate grows with the GPUs of the job: a job of N
GPUs sees ``interruptions_per_gpu_hour * N`` per hour (independent failures, the model of
Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine Learning Research
Clusters", arXiv 2410.21680, where a job's MTTF falls as 1/N). Published rates:

* Llama 3 405B on 16,384 H100s: 419 unexpected interruptions in a 54-day snapshot (466 with
  the 47 planned ones), Dubey et al. 2024 §3.3.4: 419 / (54 x 24 h x 16,384 GPUs) =
  1.97e-5 per GPU-hour (a job MTBF of 3.1 h).
* Meta's research clusters (A100): a 1,024-GPU job's MTTF 7.9 h (Kokolis et al. 2024):
  1 / (7.9 h x 1,024) = 1.24e-4 per GPU-hour.

A checkpoint writes the run's model state (weights and optimizer state; gradients are not
kept) through the storage system's aggregate write bandwidth; the time is blocking (an
asynchronous checkpoint's blocking part is its copy to host memory: give that bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import require_bounded

SECONDS_PER_HOUR = 3600.0


def _require(field: str, value: object, *, positive: bool) -> None:
    require_bounded(f"failures.{field}", value, minimum=0.0, strict=positive)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureModel:
    """Interruptions, restart and checkpoint storage of a run.

    Attributes:
        interruptions_per_gpu_hour: job interruptions per GPU-hour (module docstring).
        restart_s: seconds from an interruption to training again: detection, rescheduling,
            process-group set-up, checkpoint load, warm-up.
        checkpoint_write_bytes_per_s: aggregate bandwidth a checkpoint is written at.
        checkpoint_interval_s: seconds of training between checkpoints; None: the optimum
            (Daly 2006, ``plansim.analytic.goodput.daly_interval_s``).
        source: where the figures come from (printed with the results).

    Raises:
        SpecError: a rate, time or bandwidth that is negative, zero where it must not be, or
            not finite.
    """

    interruptions_per_gpu_hour: float
    restart_s: float
    checkpoint_write_bytes_per_s: float
    checkpoint_interval_s: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        _require("interruptions_per_gpu_hour", self.interruptions_per_gpu_hour, positive=True)
        _require("restart_s", self.restart_s, positive=False)
        _require("checkpoint_write_bytes_per_s", self.checkpoint_write_bytes_per_s, positive=True)
        if self.checkpoint_interval_s is not None:
            _require("checkpoint_interval_s", self.checkpoint_interval_s, positive=True)

    def mtbf_s(self, num_gpus: int) -> float:
        """Mean seconds between interruptions of a job on ``num_gpus`` GPUs."""
        return SECONDS_PER_HOUR / (self.interruptions_per_gpu_hour * num_gpus)
