"""ParallelPlan: one DP x TP x PP x CP layout with batch, ZeRO, recompute and schedule."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from plansim.errors import SpecError, choice_error, require_positive_int


class Precision(enum.Enum):
    """Training precision of the matmuls (mixed precision: fp32 master weights for Adam)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def param_bytes(self) -> int:
        """Bytes of the working (low-precision) copy of a parameter; FP8 keeps bf16 weights."""
        return 2

    @property
    def activation_bytes(self) -> int:
        """Bytes per stored activation element (16-bit activations in all three modes)."""
        return 2


class Recompute(enum.Enum):
    """Activation recomputation (Korthikanti et al. 2022 §4-5)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class AttentionKernel(enum.Enum):
    """Attention implementation: fused FlashAttention (Dao et al. 2022) or the unfused
    softmax(QK^T)V that materialises the s x s scores (Megatron-LM before FlashAttention)."""

    FLASH = "flash"
    UNFUSED = "unfused"


class Schedule(enum.Enum):
    """Pipeline schedule; action lists are built by ``plansim.schedule.builders``.

    GPIPE and ONE_F_ONE_B run one model chunk per rank (vpp == 1); INTERLEAVED_1F1B runs
    vpp > 1 chunks per rank (Narayanan et al. SC21 §2.2.2, Megatron-LM virtual pipeline).
    ZB_H1 is the memory-efficient zero-bubble schedule of Qi et al. (ICLR 2024,
    arXiv:2401.10241, §2.1 "ZB-H1"): 1F1B with each backward split into input-gradient (I)
    and weight-gradient (W) actions, W deferred to fill the tail bubble; vpp == 1, pp > 1.
    """

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZB_H1 = "zb-h1"

    @property
    def interleaved(self) -> bool:
        """True when the schedule runs several model chunks (vpp > 1) per rank."""
        return self is Schedule.INTERLEAVED_1F1B


def parse_enum(enum_cls: type[enum.Enum], field: str, value: object) -> enum.Enum:
    """Map a user string (or an enum member) to ``enum_cls``; SpecError names the choices."""
    if isinstance(value, enum_cls):
        return value
    for member in enum_cls:
        if member.value == value:
            return member
    raise choice_error(field, value, [m.value for m in enum_cls])


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelPlan:
    """A parallel layout for data (dp), tensor (tp), pipeline (pp) and context (cp) parallelism.

    Rank order is tp -> cp -> dp -> pp (Megatron-LM ``RankGenerator`` default), so a TP group
    holds consecutive ranks and stays inside a node when tp <= GPUs per node.

    Attributes:
        dp, tp, pp, cp: parallel degrees; num_gpus = dp * tp * pp * cp. Context parallelism
            (cp, Megatron-LM ``--context-parallel-size``; Llama 3, Dubey et al. 2024 §3.3.2)
            gives each of cp ranks s/cp tokens of every sequence and runs attention as a ring
            (Liu et al. 2023); weights are replicated over cp and gradients reduced over the
            dp * cp ranks (``plansim.analytic.ranks``). The micro-batch count does not depend
            on cp (the cp ranks of a replica share its sequences).
        vpp: virtual pipeline stages per rank (model chunks, Megatron
            ``virtual_pipeline_model_parallel_size``); 1 = not interleaved.
        micro_batch_size: sequences per micro-batch (``--micro-batch-size``).
        global_batch_size: sequences per optimizer step (``--global-batch-size``).
        zero_stage: 0 (plain DP), 1 (optimizer states sharded; Megatron distributed optimizer),
            2 (+ gradients), 3 (+ parameters).
        recompute: activation recomputation mode.
        sequence_parallel: Megatron sequence parallelism (needs tp > 1).
        schedule: pipeline schedule; interleaved-1f1b needs vpp > 1, pp > 1 and a number of
            micro-batches that is a multiple of pp (Megatron-LM's rule for interleaving);
            gpipe and 1f1b need vpp == 1; zb-h1 needs vpp == 1 and pp > 1 (any number of
            micro-batches: neither the paper nor torch's ``ScheduleInterleavedZeroBubble``
            asks for m >= pp; with m < pp fewer W fill the tail, see the builder).
        precision: matmul precision.
        attention: attention kernel (FlashAttention drops the s x s activations and traffic).
        overlap_p2p_comm: pipeline sends/receives run asynchronously beside compute (Megatron
            ``--overlap-p2p-communication``, interleaved schedule only); off, a rank waits for
            its send to finish before its next action (Megatron's default synchronous
            ``batch_isend_irecv`` + wait).
        overlap_grad_reduce: the DP gradient reduction (all-reduce, or ZeRO-1/2
            reduce-scatter) of each model chunk starts in buckets while backward still runs
            (Megatron-LM ``--overlap-grad-reduce``, default off; PyTorch DDP buckets, Li et
            al. VLDB 2020); off, it all runs after the rank's last backward. No effect with
            ZeRO-3, whose reduce-scatters are per micro-batch already, or dp * cp == 1.
        gradient_accumulation_fusion: weight-gradient GEMMs accumulate straight into the
            gradient buffer (Megatron-LM ``--gradient-accumulation-fusion``, default on since
            2022); off, every micro-batch adds its fresh weight gradients into the buffer with
            a separate memory-bound pass (Megatron-LM 2021's ``main_grad.add_``, PyTorch
            autograd accumulation).

    Raises:
        SpecError: a degree is not a positive integer, the global batch does not split into
            micro-batches over dp, zero_stage is out of 0-3, sequence_parallel with tp == 1,
            vpp and the schedule do not go together (see ``schedule``), or cp > 1 without
            FlashAttention (Megatron-LM supports context parallelism only in Transformer
            Engine's attention).
    """

    dp: int
    tp: int
    pp: int
    cp: int = 1
    vpp: int = 1
    micro_batch_size: int
    global_batch_size: int
    zero_stage: int = 0
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    precision: Precision = Precision.BF16
    attention: AttentionKernel = AttentionKernel.FLASH
    overlap_p2p_comm: bool = False
    overlap_grad_reduce: bool = False
    gradient_accumulation_fusion: bool = True

    def __post_init__(self) -> None:
        for field in ("dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "global_batch_size"):
            require_positive_int(f"plan.{field}", getattr(self, field))
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise choice_error("plan.zero_stage", self.zero_stage, [0, 1, 2, 3])
        for field, cls in (
            ("recompute", Recompute),
            ("schedule", Schedule),
            ("precision", Precision),
            ("attention", AttentionKernel),
        ):
            if not isinstance(getattr(self, field), cls):
                raise choice_error(f"plan.{field}", getattr(self, field), [m.value for m in cls])
        per_step = self.micro_batch_size * self.dp
        if self.global_batch_size % per_step:
            raise SpecError(
                f"plan.global_batch_size({self.global_batch_size}) is not divisible by "
                f"micro_batch_size({self.micro_batch_size}) * dp({self.dp}) = {per_step}"
            )
        for flag in ("overlap_grad_reduce", "gradient_accumulation_fusion"):
            if not isinstance(getattr(self, flag), bool):
                raise choice_error(f"plan.{flag}", getattr(self, flag), [True, False])
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("plan.sequence_parallel needs tp > 1 (got tp=1)")
        if self.overlap_p2p_comm and not self.schedule.interleaved:
            raise SpecError(
                f"plan.overlap_p2p_comm needs schedule {Schedule.INTERLEAVED_1F1B.value} "
                f"(got {self.schedule.value}), as in Megatron-LM"
            )
        self._check_schedule()
        if self.cp > 1 and self.attention is not AttentionKernel.FLASH:
            raise SpecError(
                f"plan.cp({self.cp}) needs attention {AttentionKernel.FLASH.value} (got "
                f"{self.attention.value}): Megatron-LM runs context parallelism only through "
                f"Transformer Engine's fused attention (TEDotProductAttention)"
            )

    def _check_schedule(self) -> None:
        """vpp, pp and micro-batch count against the schedule (Megatron-LM's rules; ZB-H1:
        Qi et al. 2024 §2.1 needs a pipeline, pp > 1)."""
        name = self.schedule.value
        if not self.schedule.interleaved:
            if self.vpp != 1:
                raise SpecError(
                    f"schedule {name} needs vpp == 1 (got vpp={self.vpp}); "
                    f"use {Schedule.INTERLEAVED_1F1B.value}"
                )
            if self.schedule is Schedule.ZB_H1 and self.pp == 1:
                raise SpecError(
                    f"schedule {name} needs pp > 1 (got pp=1): one stage has no pipeline "
                    f"bubble for the deferred weight gradients to fill; use "
                    f"{Schedule.ONE_F_ONE_B.value}"
                )
            return
        if self.vpp == 1:
            raise SpecError(f"schedule {name} needs vpp > 1 (got vpp=1); use 1f1b")
        if self.pp == 1:
            raise SpecError(f"schedule {name} needs pp > 1 (got pp=1, vpp={self.vpp})")
        if self.num_microbatches % self.pp:
            raise SpecError(
                f"schedule {name} needs num_microbatches({self.num_microbatches}) = "
                f"global_batch_size({self.global_batch_size}) / (micro_batch_size"
                f"({self.micro_batch_size}) * dp({self.dp})) to be a multiple of pp({self.pp})"
            )

    @property
    def num_gpus(self) -> int:
        """dp * tp * pp * cp."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step = gradient-accumulation steps."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def num_stages(self) -> int:
        """Pipeline stages (model chunks) = pp * vpp."""
        return self.pp * self.vpp

    def label(self) -> str:
        """Compact one-line description, e.g. 'tp8 pp16 dp8 mbs1 zero1 selective sp 1f1b' or
        'tp8 pp8 dp1 vpp3 mbs1 zero0 full interleaved-1f1b' (vpp shown when > 1)."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        parts += [f"mbs{self.micro_batch_size}", f"zero{self.zero_stage}", self.recompute.value]
        if self.sequence_parallel:
            parts.append("sp")
        parts.append(self.schedule.value)
        if self.overlap_p2p_comm:
            parts.append("overlap-p2p")
        if self.overlap_grad_reduce:
            parts.append("overlap-grad")
        if not self.gradient_accumulation_fusion:
            parts.append("unfused-grad-acc")
        if self.attention is AttentionKernel.UNFUSED:
            parts.append("unfused-attn")
        return " ".join(parts)


def check_plan_divides_model(
    plan: ParallelPlan,
    *,
    num_layers: int,
    num_attention_heads: int,
    num_query_groups: int,
    seq_length: int | None = None,
) -> str | None:
    """Return why ``plan`` cannot split the model, or None when it can.

    Checks: layers split evenly over pp * vpp stages (each model chunk holds whole layers);
    heads and query groups over tp; with cp > 1, the sequence into 2 * cp chunks (Megatron-LM
    context parallelism gives each cp rank chunks i and 2cp - 1 - i, balancing the causal
    mask; ``get_batch_on_this_cp_rank``). For a vpp that does not divide the layers per rank,
    the reason lists the vpp values that do. ``seq_length`` None skips the cp check.
    """
    if num_layers % plan.num_stages:
        reason = (
            f"num_layers({num_layers}) is not divisible by pp({plan.pp}) * vpp({plan.vpp})"
            f" = {plan.num_stages}"
        )
        if plan.vpp > 1 and num_layers % plan.pp == 0:
            per_rank = num_layers // plan.pp
            fits = [str(v) for v in range(2, per_rank + 1) if per_rank % v == 0]
            reason += (
                f": vpp must divide the {per_rank} layers per pipeline rank"
                f" ({', '.join(fits) or 'none above 1'})"
            )
        return reason
    if num_attention_heads % plan.tp:
        return f"num_attention_heads({num_attention_heads}) is not divisible by tp({plan.tp})"
    if num_query_groups % plan.tp and plan.tp % num_query_groups:
        return f"num_query_groups({num_query_groups}) and tp({plan.tp}) do not divide one another"
    if seq_length is not None and plan.cp > 1 and seq_length % (2 * plan.cp):
        return (
            f"seq_length({seq_length}) is not divisible by 2 * cp({plan.cp}) = {2 * plan.cp}: "
            f"context parallelism splits each sequence into 2 * cp load-balanced chunks"
        )
    return None
