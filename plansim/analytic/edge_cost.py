"""The first and last pipeline stages' extra work per micro-batch (pure): the embedding
lookup, and the final norm, logits GEMM and cross-entropy (:func:`edge_times`). Split from
``layer_cost``, whose GEMM pricing (``layer_cost.gemm_time_s``) it uses."""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic import flops as fl
from plansim.analytic.comm import Collective, collective_time_s
from plansim.analytic.elementwise import cross_entropy_bytes
from plansim.analytic.layer_cost import cp_local_model, gemm_time_s, unquantized_dtype
from plansim.analytic.op_overheads import edge_ops, with_host_s
from plansim.analytic.ranks import LayoutGroups
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeTimes:
    """Extra per-micro-batch seconds of the first stage (embedding) and last stage (logits)."""

    first_forward_s: float
    first_backward_s: float
    first_tp_s: float
    last_forward_s: float
    last_backward_input_s: float
    last_backward_weight_s: float
    last_tp_s: float


def edge_times(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> EdgeTimes:
    """Embedding lookup (first stage) and final norm + logits + cross-entropy (last stage).

    Vocab-parallel embedding ends in an all-reduce (reduce-scatter with SP) of b*s*h 16-bit
    values; vocab-parallel cross-entropy all-reduces three fp32 values per token (max,
    sum of exponentials, target logit) (Megatron-LM ``VocabParallelEmbedding`` and
    ``vocab_parallel_cross_entropy``). Cross-entropy traffic is that of Megatron-LM's
    ``_VocabParallelCrossEntropy`` op by op on fp32 logits (:func:`cross_entropy_bytes`).
    Activations are 16-bit, or 4-byte in fp32 training. The logits GEMMs run at the 16-bit
    rate in fp8 and fp4 training too: Megatron-core's output layer is
    ``megatron.core.tensor_parallel.ColumnParallelLinear``, a PyTorch matmul outside
    Transformer Engine, so TE's ``fp8_autocast`` leaves it unquantized (as it leaves the
    attention core). With context parallelism every cp rank does this for its s/cp tokens.
    Host cost of the embedding and head ops (``op_overheads.edge_ops``, ``with_host_s``) when
    the profile has ``host_overhead``.
    """
    b, tp = plan.micro_batch_size, plan.tp
    local = cp_local_model(model, plan.cp)
    tokens = local.seq_length * b
    hbm = profile.streaming_bytes_per_s()
    launch = profile.kernel_launch_s
    act = float(plan.precision.activation_bytes)
    act_bytes = act * tokens * model.hidden_size
    emb_tp = 0.0
    ce_tp = 0.0
    if tp > 1:
        kind = Collective.REDUCE_SCATTER if plan.sequence_parallel else Collective.ALL_REDUCE
        emb_tp = collective_time_s(
            profile, collective=kind, message_bytes=act_bytes, span=groups.tp
        )
        ce_tp = 3 * collective_time_s(
            profile, collective=Collective.ALL_REDUCE, message_bytes=4.0 * tokens, span=groups.tp
        )
    logits = fl.logits_forward_gemm(local, micro_batch_size=b, tp=tp)
    logits_s = gemm_time_s(logits, profile, dtype=unquantized_dtype(plan))
    num_logits = tokens * model.vocab_size / tp
    norm_s = 2.0 * act * model.hidden_size * tokens / hbm + launch
    first, last = edge_ops(model.position_embedding)
    ce_forward_bytes, ce_backward_bytes = cross_entropy_bytes(act)
    return EdgeTimes(
        first_forward_s=with_host_s(act_bytes / hbm + launch, first, profile, backward=False),
        first_backward_s=with_host_s(3.0 * act_bytes / hbm + launch, first, profile, backward=True),
        first_tp_s=emb_tp,
        last_forward_s=with_host_s(
            logits_s + norm_s + ce_forward_bytes * num_logits / hbm + 6 * launch,
            last,
            profile,
            backward=False,
        ),
        last_backward_input_s=with_host_s(
            logits_s + 2.0 * norm_s + ce_backward_bytes * num_logits / hbm + 3 * launch,
            last,
            profile,
            backward=True,
        ),
        last_backward_weight_s=logits_s,
        last_tp_s=ce_tp,
    )
