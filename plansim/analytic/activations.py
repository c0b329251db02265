"""Activation bytes stored per transformer layer per micro-batch (pure).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
Table 2 and Eqs. 1-6 (16-bit activations, 1-byte dropout masks), restated per term so that
GQA (K/V narrower than Q) and SwiGLU (three FFN matrices) change only the terms they touch.
In units of s*b*h bytes for a GPT layer (MHA, FFN = 4h, GELU):

    replicated over TP (divided by t only with sequence parallelism):
        layer-norm inputs 4, attention input 2, MLP input 2, two dropout masks 2   -> 10
    sharded over TP:
        Q 2, K 2, V 2, attention-projection input 2, FC1 output 8, FC2 input 8     -> 24
    attention core (softmax output 2, its dropout mask 1, dropout output 2), per a*s/h -> 5

which gives Eq. 2, s*b*h*(10 + 24/t + 5*a*s/(h*t)), and with SP Eq. 4, s*b*h/t*(34 + 5as/h).
Selective recompute and FlashAttention both drop the attention-core term (FlashAttention keeps
the fp32 log-sum-exp, 4 bytes per (token, head)). Full recompute stores the layer input only,
2*s*b*h (divided by t with SP, as Megatron stores the sequence-sharded input).

Context parallelism (cp ranks, Megatron-LM / Llama 3 §3.3.2): each rank keeps s/cp tokens of
every sequence, so every per-token term above uses s/cp tokens; the attention core's key
length stays s (a rank's queries attend over the whole ring), so the unfused s x s term is
(s/cp) x s. Every term, and so the total, is the cp = 1 value divided by cp.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.specs.model import Activation, ModelSpec
from plansim.specs.plan import Recompute


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerActivations:
    """Stored activation bytes of one layer for one micro-batch, on one TP (and CP) rank.

    Attributes:
        stored_bytes: kept from forward until the backward of this layer.
        working_bytes: extra bytes alive while one layer's backward recomputes (full
            recompute: that layer's activations; otherwise 0).
    """

    stored_bytes: float
    working_bytes: float


def _ffn_sharded_coeff(model: ModelSpec) -> float:
    """FFN tensors in units of s*b*h: FC1 output + FC2 input (GELU: 4*ffn/h, SwiGLU: 6*ffn/h)."""
    per_matrix = 2.0 * model.ffn_hidden_size / model.hidden_size
    return per_matrix * (3 if model.activation is Activation.SWIGLU else 2)


def _layer_bytes(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    core: float,
    cp: int = 1,
) -> float:
    """(s/cp)*b*h*(10/(t if SP) + (24-equivalent + core)/t) for an attention-core
    coefficient (in units of the rank's (s/cp)*b*h)."""
    h = model.hidden_size
    sbh = model.seq_length / cp * micro_batch_size * h
    replicated = 10.0
    sharded = 2.0 + 4.0 * model.kv_size / h + 2.0 + _ffn_sharded_coeff(model)
    rep_div = tp if sequence_parallel else 1
    return sbh * (replicated / rep_div + (sharded + core) / tp)


def full_layer_bytes(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    flash: bool,
    cp: int = 1,
) -> float:
    """Bytes a layer stores without recompute (Korthikanti Eq. 2/4, generalised), on one of
    ``cp`` context-parallel ranks (s/cp tokens; the unfused score matrix (s/cp) x s)."""
    h = model.hidden_size
    if flash:
        core = 4.0 * model.num_attention_heads / h  # fp32 log-sum-exp per (token, head)
    else:
        core = 5.0 * model.num_attention_heads * model.seq_length / h
    return _layer_bytes(
        model,
        micro_batch_size=micro_batch_size,
        tp=tp,
        sequence_parallel=sequence_parallel,
        core=core,
        cp=cp,
    )


def layer_activations(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    flash: bool,
    cp: int = 1,
) -> LayerActivations:
    """Activation bytes of one layer and micro-batch on one TP rank of one of ``cp``
    context-parallel ranks, for a recompute mode (every term 1/cp of the cp = 1 value)."""
    full = full_layer_bytes(
        model,
        micro_batch_size=micro_batch_size,
        tp=tp,
        sequence_parallel=sequence_parallel,
        flash=flash,
        cp=cp,
    )
    if recompute is Recompute.FULL:
        sbh = model.seq_length / cp * micro_batch_size * model.hidden_size
        stored = 2.0 * sbh / (tp if sequence_parallel else 1)
        return LayerActivations(stored_bytes=stored, working_bytes=full)
    if recompute is Recompute.SELECTIVE:
        lse = 4.0 * model.num_attention_heads / model.hidden_size if flash else 0.0
        no_core = _layer_bytes(
            model,
            micro_batch_size=micro_batch_size,
            tp=tp,
            sequence_parallel=sequence_parallel,
            core=lse,
            cp=cp,
        )
        return LayerActivations(stored_bytes=no_core, working_bytes=0.0)
    return LayerActivations(stored_bytes=full, working_bytes=0.0)


def ring_kv_chunk_bytes(model: ModelSpec, *, micro_batch_size: int, tp: int, cp: int) -> float:
    """Bytes of the K and V one context-parallel rank passes to its ring neighbour per step.

    2 (K and V) * (s/cp) * b * (local KV width) * 2 bytes (16-bit), the local KV width being
    the rank's query groups times head_dim (num_query_groups / tp, or one group when tp
    exceeds the groups and KV heads are replicated). Ring attention, Liu et al. 2023 §3;
    Transformer Engine ``AttnFuncWithCPAndKVP2P`` sends K and V as one buffer. 0 when cp == 1.
    """
    if cp == 1:
        return 0.0
    groups = model.num_query_groups
    local_groups = groups // tp if groups % tp == 0 else 1
    kv_width = local_groups * model.head_dim
    return 2.0 * (model.seq_length / cp) * micro_batch_size * kv_width * 2.0
