"""HBM traffic of the memory-bound (non-GEMM) kernels of one transformer layer (pure).

Counted per token in bytes, 16-bit tensors, for Megatron-LM's fused kernels (fused
layer-norm, fused bias-dropout-add, fused bias-GELU / SwiGLU, fused scale-mask-softmax); each
kernel reads its inputs and writes its outputs once. The tensors are the ones Korthikanti et
al. 2022 (§4.1, Table 2) count as stored activations, so the two models agree term by term:

    replicated over TP (split by t with sequence parallelism), per token:
        2 layer norms: read 2h, write 2h each                                 8h
        2 bias-dropout-add: read 2h (input) + 2h (residual), write 2h + 1h mask  14h
    split over TP:
        activation: GELU read 2f write 2f = 4f;  SwiGLU read 4f write 2f = 6f   (f = ffn)
        RoPE on Q and K (RoPE models): read and write 2(h + kv)               4(h + kv)
        unfused attention only: scale-mask-softmax read 2s write 2s, dropout read 2s,
        write 2s + 1s mask, per head                                          9 a s

The backward pass reads the saved inputs and the incoming gradient and writes the outgoing
gradient of each kernel: twice the forward traffic (same convention as the GEMMs' 2x).
Launch overhead: one kernel per entry above.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.specs.model import Activation, ModelSpec, PositionEmbedding


@dataclass(frozen=True, slots=True, kw_only=True)
class ElementwiseTraffic:
    """Forward HBM traffic of a layer's memory-bound kernels on one GPU."""

    forward_bytes: float
    num_kernels: int

    @property
    def backward_bytes(self) -> float:
        """Backward traffic: twice the forward (see module docstring)."""
        return 2.0 * self.forward_bytes


def layer_elementwise_traffic(
    model: ModelSpec,
    *,
    micro_batch_size: int,
    tp: int,
    sequence_parallel: bool,
    unfused_attention: bool,
) -> ElementwiseTraffic:
    """Forward HBM bytes and kernel count of one layer's elementwise work on one TP rank."""
    tokens = model.seq_length * micro_batch_size
    h, f = model.hidden_size, model.ffn_hidden_size
    replicated = 22.0 * h
    sharded = (6.0 if model.activation is Activation.SWIGLU else 4.0) * f
    kernels = 5
    if model.position_embedding is PositionEmbedding.ROPE:
        sharded += 4.0 * (h + model.kv_size)
        kernels += 1
    if unfused_attention:
        sharded += 9.0 * model.num_attention_heads * model.seq_length
        kernels += 2
    rep_div = tp if sequence_parallel else 1
    return ElementwiseTraffic(
        forward_bytes=tokens * (replicated / rep_div + sharded / tp), num_kernels=kernels
    )


def adam_step_bytes(num_params: float) -> float:
    """HBM bytes of one mixed-precision optimizer step over ``num_params`` local parameters.

    The passes of Megatron-LM's ``Float16OptimizerWithFloat16Params`` with apex multi-tensor
    kernels, per parameter: gradient L2 norm for clipping reads the fp32 grad (4 B); fused Adam
    reads fp32 param, grad, m, v (16 B) and writes param, m, v (12 B); the fp32 main params
    are copied into the 16-bit model params (read 4, write 2); the fp32 grad buffer is zeroed
    for the next step (write 4): 42 bytes per parameter.
    """
    return 42.0 * num_params
