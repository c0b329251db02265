"""PipelineOptions: the pipeline schedule and how the layers split over the pipeline ranks
(pure). The schedule's action lists are built by ``plansim.schedule.builders``."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, choice_error, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.pipeline_layout import expand_layout
from plansim.specs.stage_placement import StagePlacement


class Schedule(ChoiceEnum):
    """Pipeline schedule; action lists are built by ``plansim.schedule.builders``.

    GPIPE and ONE_F_ONE_B run one model chunk per rank (vpp == 1); INTERLEAVED_1F1B runs
    vpp > 1 chunks per rank (Narayanan et al. SC21 §2.2.2, Megatron-LM virtual pipeline).
    ZB_H1 is the memory-efficient zero-bubble schedule of Qi et al. (ICLR 2024,
    arXiv:2401.10241, §2.1 "ZB-H1"): 1F1B with each backward split into input-gradient (I)
    and weight-gradient (W) actions, W deferred to fill the tail bubble; vpp == 1, pp > 1.
    ZB_V is its V-shaped schedule (same paper, §6; torch ``ScheduleZBVZeroBubble``): two chunks
    per rank placed as a V (vpp == 2, ``plansim.specs.stage_placement``). DUALPIPE_V is
    DualPipe "cut in half" (torch ``ScheduleDualPipeV``): the V placement with a forward and
    a backward chunk of two micro-batches run overlapped (vpp == 2, m >= 2 pp). DUALPIPE is
    DeepSeek-V3's bidirectional schedule (arXiv:2412.19437 §3.2.1; deepseek-ai/DualPipe):
    two copies of the model fed from both ends, the same overlap (vpp == 1, pp even, m even
    and >= 2 pp).
    """

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZB_H1 = "zb-h1"
    ZB_V = "zb-v"
    DUALPIPE_V = "dualpipev"
    DUALPIPE = "dualpipe"

    @property
    def interleaved(self) -> bool:
        """True when the schedule runs several model chunks (vpp > 1) per rank in Megatron's
        looped placement (interleaved 1F1B)."""
        return self is Schedule.INTERLEAVED_1F1B

    @property
    def placement(self) -> StagePlacement:
        """Where the schedule puts the stages (``plansim.specs.stage_placement``)."""
        if self in (Schedule.ZB_V, Schedule.DUALPIPE_V):
            return StagePlacement.V
        if self is Schedule.DUALPIPE:
            return StagePlacement.DUAL
        return StagePlacement.LOOP

    @property
    def splits_backward(self) -> bool:
        """True when the schedule runs backward-input (I) and backward-weight (W) actions
        (the zero-bubble family and DualPipe's deferred weight gradients)."""
        return self in (Schedule.ZB_H1, Schedule.ZB_V, Schedule.DUALPIPE_V, Schedule.DUALPIPE)

    @property
    def overlaps_forward_backward(self) -> bool:
        """True when the schedule runs a forward and a backward chunk at once (DualPipe's
        overlapped F&B; torch ``OVERLAP_F_B``)."""
        return self in (Schedule.DUALPIPE_V, Schedule.DUALPIPE)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineOptions:
    """Pipeline schedule and layer split.

    Attributes:
        schedule: pipeline schedule; interleaved-1f1b needs vpp > 1, pp > 1 and a number of
            micro-batches that is a multiple of pp (Megatron-LM's rule for interleaving);
            gpipe and 1f1b need vpp == 1; zb-h1 needs vpp == 1 and pp > 1 (any number of
            micro-batches: neither the paper nor torch's ``ScheduleInterleavedZeroBubble``
            asks for m >= pp; with m < pp fewer W fill the tail, see the builder). Checked by
            the plan, which knows pp, vpp and the micro-batch count.
        decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers: transformer
            layers on the first / last pipeline rank (Megatron-LM
            ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
            uneven pipeline split); None = an even share. The other ranks split the
            remaining layers evenly; every rank's count must divide by vpp (its model
            chunks hold equal whole layers; Megatron-LM's rule). Needs pp > 1. Llama 3 405B
            trains 126 layers on pp 16 this way, one layer fewer on the first and the last
            stage (Dubey et al. 2024, arXiv:2407.21783, §3.3.2).
        account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split: the
            input embedding (loss: output layer and loss) takes the place of one layer in the
            split (Megatron-LM ``--account-for-embedding-in-pipeline-split`` /
            ``--account-for-loss-in-pipeline-split``): L + 1 (or L + 2) slots split evenly
            over the pp * vpp stages, and the first (last) stage holds one layer fewer. With
            both, Llama 3 405B's 126 layers fill 16 ranks x 8 chunks of one slot, the first
            chunk holding only the embedding and the last only the output and loss (Dubey et
            al. 2024 §3.3.2). Needs pp > 1; not with decoder_first/last_pipeline_num_layers.
        pipeline_model_parallel_layout: every stage's layers by name (Megatron-Core
            ``--pipeline-model-parallel-layout``, e.g. ``Et|(tt|)*30L``;
            ``plansim.specs.pipeline_layout``); None = the split above. Needs pp > 1 and
            pp x vpp stages; not with the other split fields.

    Raises:
        SpecError: schedule not a :class:`Schedule`, a layer count not None or a positive
            integer, an account_for flag not a boolean.
    """

    schedule: Schedule = Schedule.ONE_F_ONE_B
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_model_parallel_layout: str | None = None

    def __post_init__(self) -> None:
        if type(self.schedule) is not Schedule:
            raise choice_error("plan.schedule", self.schedule, [m.value for m in Schedule])
        if not self.uneven:
            return
        for edge in ("embedding", "loss"):
            field = f"account_for_{edge}_in_pipeline_split"
            value = getattr(self, field)
            if not isinstance(value, bool):
                raise choice_error(f"plan.{field}", value, [True, False])
        for edge in ("first", "last"):
            field = f"decoder_{edge}_pipeline_num_layers"
            value = getattr(self, field)
            if value is not None:
                require_positive_int(f"plan.{field}", value)
        layout = self.pipeline_model_parallel_layout
        if layout is not None:
            expand_layout(layout)  # a readable layout string (stage count: the plan's check)
            others = self.account_for_embedding_in_pipeline_split or (
                self.account_for_loss_in_pipeline_split
                or self.decoder_first_pipeline_num_layers is not None
                or self.decoder_last_pipeline_num_layers is not None
            )
            if others:
                raise SpecError(
                    "plan.pipeline_model_parallel_layout names every stage's layers: leave "
                    "decoder_first/last_pipeline_num_layers and account_for_* unset"
                )

    @property
    def uneven(self) -> bool:
        """The layers do not split evenly: the first or the last pipeline rank (or stage)
        has its own layer count."""
        return not (
            self.account_for_embedding_in_pipeline_split is False
            and self.account_for_loss_in_pipeline_split is False
            and self.decoder_first_pipeline_num_layers is None
            and self.decoder_last_pipeline_num_layers is None
            and self.pipeline_model_parallel_layout is None
        )
