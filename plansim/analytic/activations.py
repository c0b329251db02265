"""Activation bytes stored per transformer layer per micro-batch (pure).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
Table 2 and Eqs. 1-6 (16-bit activations, 1-byte dropout masks), restated per term so that
GQA (K/V narrower than Q), SwiGLU (three FFN matrices), dropout-free models and quantized
GEMM inputs change only the terms they touch. In units of s*b*h bytes for a GPT layer (MHA,
FFN = 4h, GELU, dropout on, 16-bit GEMM inputs):

    replicated over TP (divided by t only with sequence parallelism):
        layer-norm inputs 4, attention input 2, MLP input 2, two dropout masks 2   -> 10
    sharded over TP:
        Q 2, K 2, V 2, attention-projection input 2, FC1 output 8, FC2 input 8     -> 24
    attention core (softmax output 2, its dropout mask 1, dropout output 2), per a*s/h -> 5

which gives Eq. 2, s*b*h*(10 + 24/t + 5*a*s/(h*t)), and with SP Eq. 4, s*b*h/t*(34 + 5as/h).
Selective recompute and FlashAttention both drop the attention-core term (FlashAttention keeps
the fp32 log-sum-exp, 4 bytes per (token, head)). Full recompute stores the layer input only,
2*s*b*h (divided by t with SP, as Megatron stores the sequence-sharded input). torchtitan's
per-op policy stores what it saves (:func:`op_selective_stored_bytes`) and re-creates the
rest of the layer during its backward.

Two terms follow the run rather than the shape:

* Dropout (``model.dropout``): with hidden and attention dropout at 0 (Llama and Nemotron
  configs) no mask is kept: PyTorch's dropout returns its input unchanged at p = 0
  (``at::dropout``), so the two hidden masks go, and the unfused core keeps only the softmax
  output (2 per a*s/h).
* Quantized GEMM inputs (fp8 / fp4 with Transformer Engine): the GEMMs' inputs are kept for the
  weight gradient in the quantized form the GEMM reads (TE ``Linear`` / ``LayerNormLinear`` /
  ``LayerNormMLP`` save the FP8 copy of ``inputmat`` / ``ln_out`` / the activation output,
  ``QUANTIZED_ELEMENT_BYTES`` per element), so the attention input, MLP input and FC2 input
  take q bytes per element instead of 2; the attention-projection input is kept twice, the
  16-bit output the fused attention kernel saves for its own backward and the projection's
  q-byte copy (2 + q). FC1's output stays 16-bit (the activation's backward reads it).

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


#: Bytes per element of a 16-bit activation.
_HALF = 2.0


def _ffn_sharded_coeff(model: ModelSpec, gemm_input_bytes: float) -> float:
    """FFN tensors in units of s*b*h: FC1 output (16-bit; two matrices' worth for SwiGLU) +
    FC2 input (``gemm_input_bytes`` per element): GELU 4*ffn/h, SwiGLU 6*ffn/h at 16 bits."""
    ratio = model.ffn_hidden_size / model.hidden_size
    fc1_outputs = 2 if model.activation is Activation.SWIGLU else 1
    return ratio * (_HALF * fc1_outputs + gemm_input_bytes)


def _layer_bytes(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    core: float,
    cp: int = 1,
    gemm_input_bytes: float = _HALF,
) -> float:
    """(s/cp)*b*h*(replicated/(t if SP) + (sharded + core)/t) for an attention-core
    coefficient (in units of the rank's (s/cp)*b*h); replicated = 10 and sharded = 24 for a
    GPT layer at 16 bits (module docstring)."""
    h = model.hidden_size
    sbh = model.seq_length / cp * micro_batch_size * h
    q = gemm_input_bytes
    masks = 2.0 if model.dropout else 0.0
    replicated = 2 * _HALF + 2 * q + masks  # two norm inputs, attention and MLP inputs
    quantized = q < _HALF
    projection_input = _HALF + q if quantized else _HALF  # + the attention kernel's 16-bit O
    sharded = _HALF + 2 * _HALF * model.kv_size / h + projection_input
    sharded += _ffn_sharded_coeff(model, q)
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
    gemm_input_bytes: float = _HALF,
) -> float:
    """Bytes a layer stores without recompute (Korthikanti Eq. 2/4, generalised), on one of
    ``cp`` context-parallel ranks (s/cp tokens; the unfused score matrix (s/cp) x s), GEMM
    inputs kept at ``gemm_input_bytes`` per element (module docstring)."""
    h = model.hidden_size
    if flash:
        core = 4.0 * model.num_attention_heads / h  # fp32 log-sum-exp per (token, head)
    else:  # softmax output, and with dropout its mask and output
        per_score = 5.0 if model.dropout else _HALF
        core = per_score * model.num_attention_heads * model.seq_length / h
    return _layer_bytes(
        model,
        micro_batch_size=micro_batch_size,
        tp=tp,
        sequence_parallel=sequence_parallel,
        core=core,
        cp=cp,
        gemm_input_bytes=gemm_input_bytes,
    )


def op_selective_stored_bytes(
    model: ModelSpec, *, micro_batch_size: int, tp: int, sequence_parallel: bool, cp: int = 1
) -> float:
    """Bytes one layer keeps for one micro-batch under torchtitan's per-op selective
    activation checkpointing (``Recompute.SELECTIVE_OP``), on one TP (and CP) rank.

    What the policy saves (``plansim.analytic.flops.op_selective_recompute_gemms``), in units
    of the rank's (s/cp)*b*h at 16 bits: the block's input, which the checkpoint keeps (2,
    divided by t with SP); the outputs of the odd matmuls, Q (2/t), V (2*kv/(h t)) and the
    first FFN matrix (gate for SwiGLU, up otherwise: 2*ffn/(h t)), and for SwiGLU the down
    projection's (7th) output, which a row-parallel rank holds unreduced at full width (2);
    the attention kernel's output (2/t) and its fp32 log-sum-exp (4*a/(h t)); with sequence
    parallelism the outputs of the two reduce-scatters (2/t each), which torchtitan's save
    list names (``_c10d_functional.reduce_scatter_tensor``). Norms, RoPE, the activation
    function, residual adds and (without SP) the all-reduces are recomputed, so they keep
    nothing; dropout is not part of torchtitan's models.
    """
    h = model.hidden_size
    sbh = model.seq_length / cp * micro_batch_size * h
    block_input = _HALF / (tp if sequence_parallel else 1)
    sharded = _HALF + _HALF * model.kv_size / h  # Q, V
    sharded += _HALF + 4.0 * model.num_attention_heads / h  # attention output, log-sum-exp
    sharded += _HALF * model.ffn_hidden_size / h  # first FFN matrix's output
    if sequence_parallel and tp > 1:
        sharded += 2 * _HALF  # reduce-scatter outputs after the two row-parallel GEMMs
    down = _HALF if model.activation is Activation.SWIGLU else 0.0
    return sbh * (block_input + down + sharded / tp)


def layer_activations(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    flash: bool,
    cp: int = 1,
    gemm_input_bytes: float = _HALF,
) -> LayerActivations:
    """Activation bytes of one layer and micro-batch on one TP rank of one of ``cp``
    context-parallel ranks, for a recompute mode (every term 1/cp of the cp = 1 value), GEMM
    inputs kept at ``gemm_input_bytes`` per element (2: 16-bit; fp8 / fp4 with Transformer
    Engine: the quantized bytes, module docstring)."""
    full = full_layer_bytes(
        model,
        micro_batch_size=micro_batch_size,
        tp=tp,
        sequence_parallel=sequence_parallel,
        flash=flash,
        cp=cp,
        gemm_input_bytes=gemm_input_bytes,
    )
    if recompute is Recompute.FULL:
        sbh = model.seq_length / cp * micro_batch_size * model.hidden_size
        stored = 2.0 * sbh / (tp if sequence_parallel else 1)
        return LayerActivations(stored_bytes=stored, working_bytes=full)
    if recompute is Recompute.SELECTIVE_OP:
        stored = op_selective_stored_bytes(
            model,
            micro_batch_size=micro_batch_size,
            tp=tp,
            sequence_parallel=sequence_parallel,
            cp=cp,
        )
        return LayerActivations(stored_bytes=stored, working_bytes=max(0.0, full - stored))
    if recompute is Recompute.SELECTIVE:
        lse = 4.0 * model.num_attention_heads / model.hidden_size if flash else 0.0
        no_core = _layer_bytes(
            model,
            micro_batch_size=micro_batch_size,
            tp=tp,
            sequence_parallel=sequence_parallel,
            core=lse,
            cp=cp,
            gemm_input_bytes=gemm_input_bytes,
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
