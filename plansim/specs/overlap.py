"""OverlapOptions: which communication runs beside compute (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import require_flags

_FIELDS = ("overlap_p2p_comm", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")


@dataclass(frozen=True, slots=True, kw_only=True)
class OverlapOptions:
    """Communication/compute overlap switches, each a Megatron-LM flag of the same name.

    Attributes:
        overlap_p2p_comm: pipeline sends/receives run asynchronously beside compute (Megatron
            ``--overlap-p2p-communication``, interleaved schedule only); off, a rank waits for
            its send to finish before its next action (Megatron's default synchronous
            ``batch_isend_irecv`` + wait).
        tp_comm_overlap: Megatron-LM ``--tp-comm-overlap`` (Transformer Engine userbuffers;
            needs sequence parallelism): each TP all-gather / reduce-scatter is split into
            tp chunks pipelined with its GEMM, and the backward's input all-gather overlaps
            the input-gradient GEMM (``plansim.analytic.tp_comm``).
        overlap_grad_reduce: the ZeRO-0/1 gradient reduction of each model chunk starts in
            buckets while backward still runs (Megatron-LM ``--overlap-grad-reduce``; PyTorch
            DDP buckets, Li et al. VLDB 2020), else after the rank's last backward; ZeRO-2's
            per-micro-batch reduce-scatters run beside the next layer's backward (DeepSpeed
            ``overlap_comm``), else serially (``plansim.analytic.zero3``). No effect with
            ZeRO-3 or dp * cp == 1 (except with dedicated parameter servers: a push).
        overlap_param_gather: Megatron-LM ``--overlap-param-gather`` (distributed optimizer,
            with ``overlap_grad_reduce``): the ZeRO-1/2 parameter all-gather after the
            optimizer is issued per gradient bucket and waited for at the next step's
            forward, one bucket ahead (``plansim.analytic.rank_work``).

    What each needs of the rest of the plan (schedule, sequence parallelism, ZeRO stage) is
    checked by :class:`plansim.specs.plan.ParallelPlan`.

    Raises:
        SpecError: a switch is not a boolean.
    """

    overlap_p2p_comm: bool = False
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    def __post_init__(self) -> None:
        values = (
            self.overlap_p2p_comm,
            self.tp_comm_overlap,
            self.overlap_grad_reduce,
            self.overlap_param_gather,
        )
        require_flags(_FIELDS, values, prefix="plan.")
