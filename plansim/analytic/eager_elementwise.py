"""HBM traffic a layer's elementwise work adds when it runs as eager PyTorch ops (pure).

``plansim.analytic.elementwise`` counts Megatron-LM's fused kernels: one kernel per norm,
RoPE, activation. Meta's reference Llama code, which torchtitan trained with in 2024
(``torchtitan/models/llama/model.py``: ``apply_rotary_emb`` on complex numbers,
``repeat_kv``, ``w2(F.silu(w1(x)) * w3(x))``; ``torchtitan/models/norms.py`` ``RMSNorm``,
the ``norm_type = "rmsnorm"`` of its Llama train configs; ``--training.compile`` off by
default), writes those steps as separate eager ops: each is a kernel that reads its inputs
from HBM and writes its output back. Counted per element in bytes (bf16 2 B, fp32 4 B; read +
write), autograd's kernels for the backward, against the fused count:

    op (where the model has it)       eager forward                eager backward      fused
    RMSNorm, each of the two norms    float() 2+4, pow 4+4,        weight-mul grad 2+2,  4 / 6
      (RMSNorm):                      mean 4, x * rsqrt 4+4,       weight grad 2+2+2+2,
      _norm(x.float()).type_as(x)     type_as 4+2, * weight 2+2:   type_as grad 2+4,
      * weight                        36                           x * rsqrt grads 4+4
                                                                   and 4+4+4+4, mean
                                                                   grad 4, pow grad
                                                                   4+4+4, sum of the two
                                                                   paths 4+4+4, float()
                                                                   grad 4+2: 76
    RoPE on q and k (RoPE)            float() 2+4, complex mul     type_as grad 2+4,     4 / 4
                                      4+4, type_as 4+2: 20         mul grad 4+4,
                                                                   float() grad 4+2: 20
    repeat_kv of k and v (GQA: fewer  copy: read 2 kv, write 2 h   sum of the copies:    0 / 0
      K/V heads than query heads)     per tensor                   read 2 h, write 2 kv
    SwiGLU silu(w1 x) * w3 x          silu 2+2, mul 2+2+2: 10      mul grads 2+2+2 x 2,  6 / 10
      (SwiGLU, per FFN element)                                    silu grad 2+2+2: 18
    attention output                  copy 2+2: 4                  its gradient's copy   0 / 0
      transpose(1, 2).contiguous()                                 2+2: 4
    LayerNorm, each of the two norms  one kernel: 4                input-gradient        4 / 6
      (LayerNorm): F.layer_norm                                    kernel 2+2+2, then
                                                                   the weight and bias
                                                                   gradients' kernel,
                                                                   reading dy and x
                                                                   again 2+2: 10

Per token, eager beyond fused: forward 64h + 16(h + kv) + 4(h + kv) + 4f + 4h, backward
140h + 16(h + kv) + 4(h + kv) + 8f + 4h for a Llama layer, forward 4h and backward 8h + 4h
for a GPT layer (h = hidden, kv = K (= V) width, f = FFN width; the RMSNorm, LayerNorm, RoPE,
GQA and SwiGLU terms only where the model has them). Residual adds, GELU (``F.gelu``, one
kernel), a LayerNorm's forward and the loss move what the fused count has. A LayerNorm's
backward is two kernels in PyTorch (``layer_norm_backward_cuda``: the input gradient, then
``GammaBetaBackwardCUDAKernel`` for the weight and bias gradients), where the fused count
is one pass, as Megatron-LM's persistent layer norm computes both gradients; measured on an
H100 (``benchmarks/gpu_runs/h100-2026-11-27-bf16/kernels_gpt_names.csv``, bf16, 4096 tokens,
h 2048): 0.019 ms for the input-gradient kernel and 0.027 ms for the second one. Its
launch is left out of the kernel count, which applies to both directions. Per-token
reductions (mean, rsqrt) and the broadcast RoPE table are left out (1/h of the rest), and
pow's gradient is counted as one multiply where PyTorch's ``pow_backward``
(grad * (2 * x.pow(1))) may make two more passes: a lower bound. Kernels, each direction:
7 more per RMSNorm (8 ops for 1), 5 for RoPE (3 per tensor for 1 in all), 2 for repeat_kv,
1 for SwiGLU, 1 for the output copy.

Limit, known: the tensors autograd keeps for these ops (the fp32 copies in RMSNorm, the
complex RoPE inputs, repeat_kv's copies) are not added to the memory model.
"""

from __future__ import annotations

from plansim.analytic.elementwise import (
    ElementwiseTraffic,
    norm_second_pass_traffic,
    rank_traffic,
)
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding

#: Bytes per element of one eager RMSNorm beyond the fused kernel's (forward 36 - 4,
#: backward 76 - 6; module table).
RMSNORM_EXTRA = (32.0, 70.0)
#: Per element of q and k: eager complex-number RoPE beyond the fused kernel's (20 - 4).
ROPE_EXTRA = (16.0, 16.0)
#: Per element of h + kv: repeat_kv's copies of k and v (forward) and their sum (backward).
REPEAT_KV_EXTRA = (4.0, 4.0)
#: Per FFN element: silu and mul beyond the fused SwiGLU kernel's (10 - 6, 18 - 10).
SWIGLU_EXTRA = (4.0, 8.0)
#: Per element of h: the attention output's ``.contiguous()`` copy and its gradient's.
CONTIGUOUS_EXTRA = (4.0, 4.0)


def eager_extra_traffic(
    model: ModelSpec, *, micro_batch_size: int, tp: int, sequence_parallel: bool
) -> ElementwiseTraffic:
    """HBM bytes, forward and backward, and kernels per direction that eager PyTorch ops
    (Meta's reference Llama code; module table) add to one layer's fused elementwise work on
    one TP rank. The norms are replicated over TP (split by tp with sequence parallelism),
    the rest split over TP, as in ``elementwise.layer_elementwise_traffic``."""
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_size
    rep_fwd = rep_bwd = 0.0
    split_fwd, split_bwd = CONTIGUOUS_EXTRA[0] * h, CONTIGUOUS_EXTRA[1] * h
    kernels = 1
    if model.normalization is Normalization.RMSNORM:
        rep_fwd, rep_bwd = 2 * RMSNORM_EXTRA[0] * h, 2 * RMSNORM_EXTRA[1] * h
        kernels += 2 * 7
    parts = (
        (model.position_embedding is PositionEmbedding.ROPE, ROPE_EXTRA, h + kv, 5),
        (kv < h, REPEAT_KV_EXTRA, h + kv, 2),
        (model.activation is Activation.SWIGLU, SWIGLU_EXTRA, f, 1),
    )
    for present, (fwd, bwd), width, count in parts:
        if present:
            split_fwd += fwd * width
            split_bwd += bwd * width
            kernels += count
    traffic = rank_traffic(
        model.seq_length * micro_batch_size,
        replicated=(rep_fwd, rep_bwd),
        split=(split_fwd, split_bwd),
        tp=tp,
        sequence_parallel=sequence_parallel,
        num_kernels=kernels,
    )
    if model.normalization is Normalization.LAYERNORM:  # PyTorch's two-pass backward
        traffic = traffic + norm_second_pass_traffic(
            model, micro_batch_size=micro_batch_size, tp=tp, sequence_parallel=sequence_parallel
        )
    return traffic
