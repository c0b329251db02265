"""Enumerate parallel layouts for a model, GPU count and global batch (pure).

Divisor generators in the style of calculon's execution search: every (tp, pp, dp) with
tp * pp * dp = num_gpus, every micro-batch size that divides the per-replica batch, every ZeRO
stage, recompute mode, sequence-parallel setting and schedule. Combinations that cannot be
built (a model that does not split, memory) are rejected later by
``plansim.planner.evaluate.check_plan`` with a reason, so the planner can count them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from plansim.specs.plan import AttentionKernel, ParallelPlan, Precision, Recompute, Schedule


def divisors(n: int) -> list[int]:
    """Positive divisors of n in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Which knob values the planner tries (all of them by default).

    Attributes:
        tp, pp, micro_batch_size: fixed values to try, or None for every divisor.
        max_micro_batch_size: largest micro-batch size tried when not fixed.
        zero_stages, recomputes, sequence_parallel, schedules: values tried.
        precision, attention: fixed for the whole search.
    """

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    micro_batch_size: tuple[int, ...] | None = None
    max_micro_batch_size: int = 16
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recomputes: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    sequence_parallel: tuple[bool, ...] = (False, True)
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
    precision: Precision = Precision.BF16
    attention: AttentionKernel = AttentionKernel.FLASH


def _layouts(num_gpus: int, space: SearchSpace) -> Iterator[tuple[int, int, int]]:
    for tp in space.tp or divisors(num_gpus):
        if num_gpus % tp:
            continue
        for pp in space.pp or divisors(num_gpus // tp):
            if (num_gpus // tp) % pp:
                continue
            dp = num_gpus // (tp * pp)
            if space.dp is None or dp in space.dp:
                yield tp, pp, dp


def enumerate_plans(
    *, num_gpus: int, global_batch_size: int, space: SearchSpace
) -> Iterator[ParallelPlan]:
    """Every candidate plan for ``num_gpus`` GPUs and ``global_batch_size`` sequences."""
    for tp, pp, dp in _layouts(num_gpus, space):
        if global_batch_size % dp:
            continue
        per_replica = global_batch_size // dp
        mbs_values = space.micro_batch_size or tuple(
            d for d in divisors(per_replica) if d <= space.max_micro_batch_size
        )
        for mbs in mbs_values:
            yield from _knobs(tp, pp, dp, mbs, global_batch_size, space)


def _knobs(
    tp: int, pp: int, dp: int, mbs: int, gbs: int, space: SearchSpace
) -> Iterator[ParallelPlan]:
    for zero in space.zero_stages:
        if zero > 0 and dp == 1:
            continue  # ZeRO without data parallelism is plain DP
        for recompute in space.recomputes:
            if recompute is Recompute.SELECTIVE and space.attention is AttentionKernel.FLASH:
                continue  # FlashAttention stores no s x s scores: selective == none
            for sp in space.sequence_parallel:
                if sp and tp == 1:
                    continue
                for schedule in space.schedules:
                    if schedule is Schedule.GPIPE and pp == 1:
                        continue  # one stage: the schedules coincide
                    if gbs % (mbs * dp):
                        continue
                    yield ParallelPlan(
                        dp=dp,
                        tp=tp,
                        pp=pp,
                        micro_batch_size=mbs,
                        global_batch_size=gbs,
                        zero_stage=zero,
                        recompute=recompute,
                        sequence_parallel=sp,
                        schedule=schedule,
                        precision=space.precision,
                        attention=space.attention,
                    )
