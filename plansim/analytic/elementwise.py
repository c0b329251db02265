"""HBM traffic of the memory-bound (non-GEMM) kernels of one transformer layer (pure).

Counted per token, in bytes, kernel by kernel, for Megatron-LM's fused kernels (fused
layer-norm, fused bias-dropout-add, fused bias-GELU / SwiGLU, fused scale-mask-softmax): each
kernel reads its inputs and writes its outputs once; 16-bit tensors (2 B), dropout masks 1 B.
The tensors are those Korthikanti et al. 2022 (§4.1, Table 2) count as stored activations, so
the two models agree term by term. h = hidden, f = FFN width, a = heads, s = sequence,
kv = K (= V) width.

    kernel (count per layer)           forward              backward
    replicated over TP (split by t with sequence parallelism):
    layer norm (2)                     read x, write y: 4h  read dy, x, write dx: 6h
    residual-gradient sum (2)          -                    read 2, read 2, write 2: 6h
    bias-dropout-add (2)               read 2+2, write 2+1: 7h
                                                            read dy + mask, write dx: 5h;
                                                            bias-grad reduction read: 2h
    split over TP:
    bias-GELU (1)                      read 2f, write 2f    read dy, x, write dx: 6f;
                                                            bias-grad reduction read: 2f
    SwiGLU (1)                         read 4f, write 2f    read dy, gate, up, write 2: 10f
    RoPE on Q and K (RoPE models)      4(h + kv)            4(h + kv)
    unfused attention only, per head:
      scale-mask-softmax               read 2s, write 2s    read dy, y, write dx: 6s
      attention dropout                read 2s, write 2s+1s read dy + mask, write dx: 5s
      context permute + contiguous     4h (read, write)     4h

A norm's backward is counted as one pass (Megatron-LM's persistent layer norm computes the
input and the weight gradients together). With ``plan.persist_layer_norm`` off it is two
passes, the weight (and bias) gradients' kernel reading dy and x again: 4h more per norm
(:func:`norm_second_pass_traffic`).

So an unfused GPT layer moves 22h + (4f + 9as + 4h)/t per token forward and
38h + (8f + 11as + 4h)/t backward (t = TP size; replicated terms also /t with SP).
Launch overhead: one kernel launch per kernel above, in each direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.ranks import dp_cp_size
from plansim.errors import SpecError
from plansim.specs.model import Activation, ModelSpec, PositionEmbedding
from plansim.specs.plan import DdpImpl, DpSync, ParallelPlan, Precision


@dataclass(frozen=True, slots=True, kw_only=True)
class ElementwiseTraffic:
    """HBM traffic of a layer's memory-bound kernels on one GPU, forward and backward."""

    forward_bytes: float
    backward_bytes: float
    num_kernels: int

    def __add__(self, other: ElementwiseTraffic) -> ElementwiseTraffic:
        """Both sets of kernels: bytes and kernel counts summed."""
        return ElementwiseTraffic(
            forward_bytes=self.forward_bytes + other.forward_bytes,
            backward_bytes=self.backward_bytes + other.backward_bytes,
            num_kernels=self.num_kernels + other.num_kernels,
        )


def rank_traffic(
    tokens: float,
    *,
    replicated: tuple[float, float],
    split: tuple[float, float],
    tp: int,
    sequence_parallel: bool,
    num_kernels: int,
) -> ElementwiseTraffic:
    """One TP rank's share of ``tokens`` tokens' traffic, given per token as (forward,
    backward) bytes: ``replicated`` over TP (split by tp with sequence parallelism) and
    ``split`` over TP."""
    rep_div = tp if sequence_parallel else 1
    return ElementwiseTraffic(
        forward_bytes=tokens * (replicated[0] / rep_div + split[0] / tp),
        backward_bytes=tokens * (replicated[1] / rep_div + split[1] / tp),
        num_kernels=num_kernels,
    )


#: Bytes per element of h that a norm's backward moves in a second pass over dy and x for the
#: weight (and bias) gradients (read 2 + 2; apex ``cuComputePartGradGammaBeta``, PyTorch
#: ``GammaBetaBackwardCUDAKernel``).
NORM_SECOND_PASS_BYTES = 4.0


def norm_second_pass_traffic(
    model: ModelSpec, *, micro_batch_size: int, tp: int, sequence_parallel: bool
) -> ElementwiseTraffic:
    """Backward bytes the two norms of one layer add on one TP rank when each computes its
    weight gradients in a pass of its own (``plan.persist_layer_norm`` off): 4h per norm and
    token, replicated over TP (split by tp with sequence parallelism); no extra kernel is
    counted (the count applies to both directions)."""
    per_token = 2 * NORM_SECOND_PASS_BYTES * model.hidden_size
    return rank_traffic(
        model.seq_length * micro_batch_size,
        replicated=(0.0, per_token),
        split=(0.0, 0.0),
        tp=tp,
        sequence_parallel=sequence_parallel,
        num_kernels=0,
    )


def layer_elementwise_traffic(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    unfused_attention: bool,
) -> ElementwiseTraffic:
    """Forward and backward HBM bytes and kernel count of one layer's elementwise work on one
    TP rank (table in the module docstring)."""
    tokens = model.seq_length * micro_batch_size
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_size
    rep_fwd, rep_bwd = _replicated_per_token(h)
    if model.activation is Activation.SWIGLU:
        sh_fwd, sh_bwd = 6.0 * f, 10.0 * f
    else:
        sh_fwd, sh_bwd = _GELU_FWD * f, _GELU_BWD * f
    kernels = 5
    if model.position_embedding is PositionEmbedding.ROPE:
        sh_fwd += 4.0 * (h + kv)
        sh_bwd += 4.0 * (h + kv)
        kernels += 1
    if unfused_attention:
        per_head = model.num_attention_heads * model.seq_length
        sh_fwd += 9.0 * per_head + 4.0 * h
        sh_bwd += 11.0 * per_head + 4.0 * h
        kernels += 3
    return rank_traffic(
        tokens,
        replicated=(rep_fwd, rep_bwd),
        split=(sh_fwd, sh_bwd),
        tp=tp,
        sequence_parallel=sequence_parallel,
        num_kernels=kernels,
    )


#: Bytes per element of a quantized GEMM operand, data and block scales: FP8 (E4M3/E5M2 with
#: one scale per tensor) 1 B; NVFP4 (E2M1, 4 bits, plus one E4M3 scale per 16 elements; the
#: one FP32 scale per tensor left out) 0.5 + 1/16 = 0.5625 B (NVIDIA, "Pretraining Large
#: Language Models with NVFP4", arXiv:2509.25149, §2; NeMo AutoModel's NVFP4 packing: "0.5625
#: bytes per parameter").
QUANTIZED_ELEMENT_BYTES = {Precision.FP8: 1.0, Precision.FP4: 0.5625}


def quantize_traffic(
    model: ModelSpec,
    *,
    precision: Precision,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
) -> ElementwiseTraffic:
    """HBM traffic of Transformer Engine's quantization of one layer's four linear GEMMs'
    operands on one TP rank (``precision`` fp8 or fp4: the GEMMs read 1-byte or 4-bit operands,
    but their 16-bit inputs and output gradients are cast first).

    Every GEMM operand is needed in two layouts: row-wise for one GEMM and column-wise
    (transposed) for the other (Hopper's FP8 GEMMs take only the TN layout, so TE keeps a
    transposed copy; block-scaled formats scale along the contraction dimension, so each
    direction has its own scales). Transformer Engine docs, "Low precision training /
    Performance considerations: Handling transposes"; ``cast_transpose`` in its C API. Per
    element, from a 16-bit tensor: read 2 B, write 2 q (q = ``QUANTIZED_ELEMENT_BYTES``).

    * FP8 (one scale per tensor: the transposed copy is a transpose of the FP8 data), forward,
      QKV and first-MLP inputs: TE's LayerNormLinear writes the norm's output in FP8 (1 B
      instead of the 2 B :func:`layer_elementwise_traffic` counts, on the rank's T/t tokens
      with sequence parallelism), and the column-wise copy of the (gathered) T tokens is one
      more pass, read 1 + write 1 B: 2 T h - T h / r per input (r = t with SP, else 1).
    * NVFP4 (1 x 16 blocks along the contraction dimension: the column-wise copy cannot be
      made from the row-wise one, NVFP4 paper §3-4), forward, QKV and first-MLP inputs: the
      norm writes its 16-bit output as in bf16, then one cast of both layouts over the
      (gathered) T tokens, (2 + 2 q) T h per input.
    * Forward, projection and second-MLP inputs (attention output, activation output:
      16-bit): ``cast_transpose``, (2 + 2 q) B per element: (2 + 2 q) T (h + f) / t.
    * Backward, the output gradient of each GEMM: ``cast_transpose`` of T x (QKV width / t,
      h, first-MLP width / t, h): (2 + 2 q) T ((h + 2 kv + u f) / t + 2 h), u = 2 for SwiGLU
      (gate and up) and 1 for GELU.

    Weights are cast once per optimizer step and cached across micro-batches (TE's
    ``is_first_microbatch``), and the amax reductions are per step: both left out. NVFP4's
    random Hadamard transform of the weight-gradient GEMM inputs and its stochastic rounding
    of gradients run inside the cast kernels (TE, MaxText's NVFP4 example): compute, no extra
    bytes, left out. Kernels: 4 forward, 4 backward.

    Raises:
        SpecError: ``precision`` is not a quantized one (fp8, fp4).
    """
    if precision not in QUANTIZED_ELEMENT_BYTES:
        allowed = ", ".join(p.value for p in QUANTIZED_ELEMENT_BYTES)
        raise SpecError(f"precision={precision.value!r} is not quantized; choose one of: {allowed}")
    q = QUANTIZED_ELEMENT_BYTES[precision]
    cast = 2.0 + 2.0 * q
    tokens = model.seq_length * micro_batch_size
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_size
    up = model.activation.num_ffn_matrices - 1
    rep_div = tp if sequence_parallel else 1
    if precision is Precision.FP8:
        norm_fed = 2 * (2.0 * q * h - (2.0 - q) * h / rep_div)
    else:
        norm_fed = 2 * cast * h
    forward = tokens * (norm_fed + cast * (h + f) / tp)
    backward = tokens * cast * ((h + 2 * kv + up * f) / tp + 2.0 * h)
    return ElementwiseTraffic(forward_bytes=forward, backward_bytes=backward, num_kernels=4)


#: Bytes per FFN element of bias-GELU (16-bit), forward and backward (module table).
_GELU_FWD, _GELU_BWD = 4.0, 8.0


def _replicated_per_token(hidden: int) -> tuple[float, float]:
    """Forward and backward 16-bit bytes per token of the TP-replicated kernels: two layer
    norms, two bias-dropout-adds, two residual-gradient sums (module table)."""
    h = float(hidden)
    return 2 * 4.0 * h + 2 * 7.0 * h, 2 * (6.0 + 6.0) * h + 2 * (5.0 + 2.0) * h


def gelu_layer_bytes(
    *, tokens: int, hidden: int, ffn: int, element_bytes: float
) -> tuple[float, float]:
    """Forward and backward bytes of the memory-bound kernels of one GELU layer of ``tokens``
    tokens on one rank (no TP, RoPE or unfused attention): ``tokens * (22h + 4f)`` and
    ``tokens * (38h + 8f)`` for 16-bit elements (module table), scaled by
    ``element_bytes / 2``. The bytes ``plansim calibrate`` credits its elementwise items with,
    so that a measured rate applies to :func:`layer_elementwise_traffic` as it counts."""
    rep_fwd, rep_bwd = _replicated_per_token(hidden)
    width = element_bytes / 2.0
    return (
        width * tokens * (rep_fwd + _GELU_FWD * ffn),
        width * tokens * (rep_bwd + _GELU_BWD * ffn),
    )


def adam_step_bytes(num_params: float, *, precision: Precision = Precision.BF16) -> float:
    """HBM bytes of one optimizer step over ``num_params`` local parameters.

    Mixed precision (bf16, fp16, fp8, fp4): the passes of Megatron-LM's
    ``Float16OptimizerWithFloat16Params`` with apex multi-tensor kernels, per parameter:
    gradient L2 norm for clipping reads the fp32 grad (4 B); fused Adam reads fp32 param,
    grad, m, v (16 B) and writes param, m, v (12 B); the fp32 main params are copied into the
    16-bit model params (read 4, write 2); the fp32 grad buffer is zeroed for the next step
    (write 4): 42 bytes per parameter.

    fp16 adds the loss scaler's passes (Megatron-LM ``megatron/optimizer/optimizer.py``,
    ``Float16OptimizerWithFloat16Params.step``): its 16-bit gradients become the fp32 main
    gradients (``_copy_model_grads_to_main_grads``: ``main_grad.float()``, read 2, write 4)
    and are unscaled and checked for inf/NaN (``_unscale_main_grads_and_check_for_nan``:
    ``torch._amp_foreach_non_finite_check_and_unscale_``, read 4, write 4; only with a grad
    scaler, which fp16 always has and bf16 has not by default), and the zeroed buffer is
    16-bit (write 2): 54 bytes per parameter.

    fp32: PyTorch's ``torch.optim.AdamW`` with ``fused=True`` or ``foreach=True`` (torch docs,
    ``torch.optim.AdamW``: the fused/foreach implementations update all parameters in
    multi-tensor passes) reads param, grad, exp_avg, exp_avg_sq (16 B) and writes param,
    exp_avg, exp_avg_sq (12 B): 28 bytes per parameter; no master copy, no clipping pass,
    gradients freed (``zero_grad(set_to_none=True)``, the default) instead of zeroed.
    """
    if precision is Precision.FP32:
        return 28.0 * num_params
    if precision is Precision.FP16:
        return 54.0 * num_params
    return 42.0 * num_params


def grad_average_bytes(plan: ParallelPlan, *, grad_buffer_bytes: float) -> float:
    """HBM bytes of the once-per-step passes that turn a rank's summed data-parallel
    gradients into their average, over its gradient buffer of ``grad_buffer_bytes`` (the
    rank's unsharded gradients in the reduce dtype), as ``plan.ddp_impl`` runs them:

    * ``megatron-core``: ``grad_data *= gradient_scaling_factor`` on every bucket before its
      collective, skipped when the factor is 1 (dp * cp == 1; Megatron-core
      ``ParamAndGradBucketGroup.start_grad_sync``): read + write, 2 x the buffer;
    * ``local`` (Megatron-LM's legacy ``DistributedDataParallel.allreduce_gradients``,
      ``megatron/model/distributed.py``, 2020-2023): ``buffer_.data /=
      data_parallel_world_size`` over the contiguous buffer before the all-reduce, every
      step, also at dp 1: 2 x the buffer;
    * ``torch`` (PyTorch DDP, ``gradient_as_bucket_view=False``, its default): the reducer
      copies each gradient into its bucket dividing on the way (``mul_out`` into the bucket
      view) and copies the reduced bucket back into the gradient: 4 x the buffer;
    * ``average-in-collective`` (``ReduceOp.AVG``; Megatron-core
      ``--ddp-average-in-collective``): the collective averages, no pass.

    Zero with ZeRO-2/3 (their reduce-scatter path divides the shard:
    ``zero3.flat_copy_bytes``) and with a parameter server (the servers average).
    """
    if plan.zero_stage >= 2 or plan.dp_sync is DpSync.PARAMETER_SERVER:
        return 0.0
    if plan.ddp_impl is DdpImpl.MEGATRON_CORE and dp_cp_size(plan) == 1:
        return 0.0  # a scaling factor of 1 is skipped
    return _BUFFER_ACCESSES[plan.ddp_impl] * grad_buffer_bytes


#: Reads + writes of the whole gradient buffer per step by each wrapper
#: (:func:`grad_average_bytes`).
_BUFFER_ACCESSES = {
    DdpImpl.MEGATRON_CORE: 2.0,
    DdpImpl.LOCAL: 2.0,
    DdpImpl.TORCH: 4.0,
    DdpImpl.AVERAGE_IN_COLLECTIVE: 0.0,
}


def logits_cast_bytes(activation_bytes: float) -> float:
    """HBM bytes a logit of the 16-bit -> fp32 cast before the loss (read 2, write 4), and as
    many for the cast of its gradient back; 0 when the logits are fp32 already.

    Raises:
        SpecError: ``activation_bytes`` is not 2 or 4.
    """
    if activation_bytes not in (2.0, 4.0):
        raise SpecError(f"activation_bytes must be 2 or 4 (got {activation_bytes})")
    return 6.0 if activation_bytes == 2.0 else 0.0


def cross_entropy_bytes(activation_bytes: float) -> tuple[float, float]:
    """HBM bytes per logit of the loss, forward and backward, kernel by kernel as Megatron-LM's
    ``_VocabParallelCrossEntropy`` (``megatron/mpu/cross_entropy.py``, later
    ``megatron/core/tensor_parallel/cross_entropy.py``) runs them on the logits the model casts
    to fp32 (``output.float()``, the default without ``--fp16-lm-cross-entropy``):

        forward: cast 16-bit -> fp32 (read 2, write 4), max (read 4), ``sub_`` (read, write:
        8), ``exp`` (8), sum (4), ``div_`` to the softmax kept for backward (8) = 38 B;
        backward: ``mul_`` by the loss gradient (8), cast back to 16-bit (read 4, write 2)
        = 14 B.

    With fp32 activations the casts are no-ops (32 and 8 B). PyTorch's eager
    ``F.cross_entropy`` under autocast (fp32 cast, log-softmax, NLL and their backward) moves
    about as much (~52 B in all), so the same count stands for eager frameworks; fused losses
    (Megatron-core ``--cross-entropy-loss-fusion``) move less and are not modelled.

    Raises:
        SpecError: ``activation_bytes`` is not 2 or 4.
    """
    cast = logits_cast_bytes(activation_bytes)
    return cast + 4.0 + 8.0 + 8.0 + 4.0 + 8.0, 8.0 + cast
