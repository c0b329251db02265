"""TrainingRun: the whole run a user buys, tokens to train and the batch-size ramp (pure).

A run trains ``tokens`` tokens in phases (:class:`RampPhase`), each with its own global batch
size and optionally its own sequence length, ending at a token count: Llama 3 405B starts at
4M-token batches of 4,096-token sequences, doubles both after 252M tokens and doubles the
batch again after 2.87T tokens (Dubey et al. 2024, "The Llama 3 Herd of Models" §3.4.1).
A gradual ramp is written as Megatron-LM writes it, ``--rampup-batch-size <start>
<increment> <ramp-up samples>`` (:func:`rampup_phases`): DeepSeek-V3 raises its batch from
3,072 to 15,360 sequences over the first 469B tokens (arXiv 2412.19437 §4.2).

A phase ends at ``until_tokens`` (cumulative over the run); the last phase runs to the end of
the run and may leave ``until_tokens`` out. Steps per phase are whole: a phase of T tokens at
B sequences of S tokens runs ceil(T / (B * S)) steps, so the run may train up to one batch
more than stated per phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.errors import SpecError, require_positive_int


def _require_tokens(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise SpecError(f"{field} must be a positive number of tokens, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(f"{field} must be finite, got {value!r}")
    return float(value)


def _require_seconds(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise SpecError(f"{field} must be a number of seconds >= 0, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(f"{field} must be finite, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RampPhase:
    """One phase of the batch-size ramp.

    Attributes:
        global_batch_size: sequences per optimizer step in this phase (Megatron-LM
            ``--global-batch-size``).
        until_tokens: cumulative tokens of the run at which the phase ends; None for the last
            phase (runs to the end of the run).
        seq_length: tokens per sequence in this phase; None: the model's.

    Raises:
        SpecError: a size is not a positive integer or ``until_tokens`` is not a positive
            finite number.
    """

    global_batch_size: int
    until_tokens: float | None = None
    seq_length: int | None = None

    def __post_init__(self) -> None:
        require_positive_int("ramp.global_batch_size", self.global_batch_size)
        if self.seq_length is not None:
            require_positive_int("ramp.seq_length", self.seq_length)
        if self.until_tokens is not None:
            _require_tokens("ramp.until_tokens", self.until_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingRun:
    """A training run: tokens, batch-size phases and per-step overheads outside the model.

    Attributes:
        tokens: tokens to train (all phases together).
        phases: the batch-size ramp, in order (one phase for a constant batch).
        data_loading_s_per_step: seconds per step the input pipeline adds to the simulated
            step (not hidden behind compute); 0 when loading overlaps fully.
        eval_interval_tokens: tokens between evaluations; None: no evaluation.
        eval_s: seconds one evaluation takes (with ``eval_interval_tokens``).
        deadline_s: the wall time the run must finish in, or None; plans that miss it rank
            after those that meet it.

    Raises:
        SpecError: no phase; phases that do not end in increasing order; a phase other than
            the last without ``until_tokens``; a ramp that ends before or after ``tokens``;
            a negative overhead.
    """

    tokens: float
    phases: tuple[RampPhase, ...]
    data_loading_s_per_step: float = 0.0
    eval_interval_tokens: float | None = None
    eval_s: float = 0.0
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        _require_tokens("tokens", self.tokens)
        if self.deadline_s is not None:
            _require_seconds("deadline_s", self.deadline_s)
            if self.deadline_s == 0:
                raise SpecError("deadline_s must be above 0")
        _require_seconds("data_loading_s_per_step", self.data_loading_s_per_step)
        _require_seconds("eval_s", self.eval_s)
        if self.eval_interval_tokens is not None:
            _require_tokens("eval_interval_tokens", self.eval_interval_tokens)
        if not self.phases:
            raise SpecError("ramp.phases must hold at least one phase")
        self._check_phase_ends()

    def _check_phase_ends(self) -> None:
        previous = 0.0
        last = len(self.phases) - 1
        for i, phase in enumerate(self.phases):
            end = phase.until_tokens
            if end is None:
                if i != last:
                    raise SpecError(
                        f"ramp.phases[{i}].until_tokens is missing: only the last phase may "
                        "leave it out (it then runs to the end of the run)"
                    )
                continue
            if end <= previous:
                raise SpecError(
                    f"ramp.phases[{i}].until_tokens={end:.6g} must be above the previous "
                    f"phase's end ({previous:.6g}): phases end in increasing order"
                )
            if end > self.tokens or (i == last and end < self.tokens):
                raise SpecError(
                    f"ramp.phases[{i}].until_tokens={end:.6g} but the run trains "
                    f"tokens={self.tokens:.6g}: the ramp must end at the run's token count "
                    "(leave the last phase's until_tokens out to run it to the end)"
                )
            previous = end

    def phase_tokens(self) -> tuple[float, ...]:
        """Tokens each phase trains, in order (they add up to ``tokens``)."""
        out: list[float] = []
        start = 0.0
        for phase in self.phases:
            end = self.tokens if phase.until_tokens is None else phase.until_tokens
            out.append(end - start)
            start = end
        return tuple(out)


def steps_in_phase(tokens: float, *, global_batch_size: int, seq_length: int) -> int:
    """Optimizer steps that train ``tokens`` tokens at ``global_batch_size`` sequences of
    ``seq_length`` tokens: ceil(tokens / (global_batch_size * seq_length))."""
    return math.ceil(tokens / (global_batch_size * seq_length) - 1e-9)


def rampup_phases(
    *,
    start_global_batch_size: int,
    batch_size_increment: int,
    rampup_samples: int,
    global_batch_size: int,
    seq_length: int,
    start_tokens: float = 0.0,
) -> tuple[RampPhase, ...]:
    """The phases of Megatron-LM's ``--rampup-batch-size <start> <increment> <samples>``
    before the final batch: the batch grows by ``batch_size_increment`` every
    ``rampup_samples / num_increments`` samples, num_increments = (global_batch_size -
    start) / increment (megatron/core/num_microbatches_calculator.py,
    ``RampupBatchsizeNumMicroBatchesCalculator``). Phase ends are cumulative tokens from
    ``start_tokens``; the final batch's phase is the caller's to append.

    Raises:
        SpecError: a size is not a positive integer, the start is not below the final batch,
            or the difference is not a multiple of the increment (Megatron asserts the same).
    """
    require_positive_int("rampup_batch_size.start", start_global_batch_size)
    require_positive_int("rampup_batch_size.increment", batch_size_increment)
    require_positive_int("rampup_batch_size.samples", rampup_samples)
    diff = global_batch_size - start_global_batch_size
    if diff <= 0 or diff % batch_size_increment:
        raise SpecError(
            f"rampup_batch_size: the final global_batch_size ({global_batch_size}) minus the "
            f"start ({start_global_batch_size}) must be a positive multiple of the increment "
            f"({batch_size_increment})"
        )
    num_increments = diff // batch_size_increment
    samples_per_increment = rampup_samples / num_increments
    return tuple(
        RampPhase(
            global_batch_size=start_global_batch_size + k * batch_size_increment,
            until_tokens=start_tokens + (k + 1) * samples_per_increment * seq_length,
            seq_length=seq_length,
        )
        for k in range(num_increments)
    )
