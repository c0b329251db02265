"""Which pipeline rank holds which stage, and the path a micro-batch takes through the stages
(pure).

Three placements, as the schedules that use them lay the model out:

- ``loop`` (GPipe, 1F1B, interleaved 1F1B, ZB-H1): stage s on rank ``s % p``; a micro-batch
  runs stages 0, 1, ..., S - 1 (Megatron-LM's virtual pipeline; torch
  ``generate_stage_to_rank_mapping(style="loop")``).
- ``v`` (ZB-V, DualPipeV): 2p stages, rank r holds stages r and 2p - 1 - r, so the chain goes
  down the ranks and back up and rank 0 holds both the first and the last stage (Qi et al.,
  ICLR 2024, arXiv:2401.10241 §6; torch ``generate_stage_to_rank_mapping(style="v")``).
- ``dual`` (DualPipe, DeepSeek-V3 report, arXiv:2412.19437 §3.2.1, and the
  deepseek-ai/DualPipe repository): two copies of a p-stage model fed from both ends. Work
  stage ``c p + d`` is depth d of copy c: copy 0 on rank d, copy 1 on rank p - 1 - d.
  Micro-batches 0 .. m/2 - 1 run copy 0 (fed at rank 0), m/2 .. m - 1 copy 1 (fed at rank
  p - 1). A plan's stage (one copy's chunk) is ``work_stage % p``; rank r holds the plan
  stages r and p - 1 - r, twice the parameters of a one-copy rank (DeepSeek-V3 Table 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError
from plansim.specs.choice_enum import ChoiceEnum


class StagePlacement(ChoiceEnum):
    """How stages sit on pipeline ranks (module docstring)."""

    LOOP = "loop"
    V = "v"
    DUAL = "dual"


@dataclass(frozen=True, slots=True, kw_only=True)
class StageGraph:
    """The stages of one pipeline replica, their ranks and each micro-batch's path.

    Attributes:
        placement: the layout.
        num_ranks: pipeline ranks p.
        num_stages: work stages S: p * vpp (loop), 2p (v, dual; for dual, two copies of p).
        num_microbatches: micro-batches m per step (dual: even, half per copy).

    Raises:
        SpecError: S not a positive multiple of p, a v or dual graph without 2p stages, or a
            dual graph with an odd micro-batch count.
    """

    placement: StagePlacement
    num_ranks: int
    num_stages: int
    num_microbatches: int

    def __post_init__(self) -> None:
        p, s = self.num_ranks, self.num_stages
        if p < 1 or s < p or s % p:
            raise SpecError(f"{s} stages for {p} ranks; stages must be a positive multiple")
        if self.placement is not StagePlacement.LOOP and s != 2 * p:
            raise SpecError(
                f"placement {self.placement.value} needs 2 stages per rank "
                f"(got {s} stages on {p} ranks)"
            )
        if self.placement is StagePlacement.DUAL and self.num_microbatches % 2:
            raise SpecError(
                f"placement dual feeds half the micro-batches from each end: "
                f"num_microbatches({self.num_microbatches}) must be even"
            )

    def rank_of_stage(self, stage: int) -> int:
        """Rank holding work stage ``stage``."""
        return rank_of_stage(self.placement, stage, num_ranks=self.num_ranks)

    def previous_stage(self, stage: int) -> int | None:
        """The stage whose forward output feeds ``stage``; None at the start of a chain."""
        if stage == 0 or (self.placement is StagePlacement.DUAL and stage == self.num_ranks):
            return None
        return stage - 1

    def next_stage(self, stage: int) -> int | None:
        """The stage ``stage``'s forward output feeds; None at the end of a chain (the loss)."""
        last = self.num_stages - 1
        if stage == last or (self.placement is StagePlacement.DUAL and stage == self.num_ranks - 1):
            return None
        return stage + 1

    def visits(self, stage: int, microbatch: int) -> bool:
        """Whether ``microbatch`` runs through ``stage`` (always, except across dual copies)."""
        if self.placement is not StagePlacement.DUAL:
            return True
        return (microbatch >= self.num_microbatches // 2) == (stage >= self.num_ranks)

    def stages_of_rank(self, rank: int) -> tuple[int, ...]:
        """Work stages on ``rank``, ascending."""
        return tuple(s for s in range(self.num_stages) if self.rank_of_stage(s) == rank)


def rank_of_stage(placement: StagePlacement, stage: int, *, num_ranks: int) -> int:
    """Rank holding work stage ``stage`` (module docstring): ``stage % p`` looped; depth d of
    the first half (the V's way down, DualPipe's copy 0) on rank d, of the second half on
    rank p - 1 - d. For a plan's stages (one copy) of the dual placement: rank ``stage``."""
    if placement is StagePlacement.LOOP:
        return stage % num_ranks
    half, depth = divmod(stage, num_ranks)
    return depth if half == 0 else num_ranks - 1 - depth


def plan_stages_of_rank(
    placement: StagePlacement, *, rank: int, num_ranks: int, num_stages: int
) -> tuple[int, ...]:
    """A plan's stages (model chunks of one copy, ``0 .. num_stages - 1``) held by ``rank``:
    ``rank, rank + p, ...`` (loop); ``rank, 2p - 1 - rank`` (v); ``rank, p - 1 - rank``
    (dual: the same chunk index in the two copies, first the copy fed at rank 0).

    Raises:
        SpecError: a v or dual placement without its stage count (2p for v, p for dual).
    """
    p = num_ranks
    if placement is StagePlacement.LOOP:
        return tuple(range(rank, num_stages, p))
    if placement is StagePlacement.V:
        if num_stages != 2 * p:
            raise SpecError(f"placement v needs vpp == 2 (got {num_stages} stages on {p} ranks)")
        return (rank, 2 * p - 1 - rank)
    if num_stages != p:
        raise SpecError(f"placement dual needs vpp == 1 (got {num_stages} stages on {p} ranks)")
    return (rank, p - 1 - rank)
