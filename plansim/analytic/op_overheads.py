"""Fused-attention pricing and host per-op overhead of a layer pass (pure).

Two optional profile terms (``plansim.specs.compute_terms``), each used only when the
profile has it; without them these functions return what ``layer_cost`` computed before:

* **Fused attention** (FlashAttention, Dao et al. 2022; torch
  ``scaled_dot_product_attention``): QK^T, the causal mask, the softmax and PV run as one
  kernel whose measured rate (``HardwareProfile.attention_efficiency``) differs from a GEMM's
  of the same FLOPs. A layer's call covers all its local heads and sequences; its forward
  FLOPs are half of the two core GEMMs' (causal: the masked half is skipped,
  FlashAttention-2 §3.1.1), the backward's twice that. Without a curve (every datasheet
  profile: ``../shared/reference`` measures no attention kernel), the call is priced from its
  mechanism (:func:`flash_core_times`): IO-aware (Q, K, V and O cross HBM, never the s x s
  scores: Dao et al. 2022 §3), the causal FLOPs forward and 2.5x them backward
  (FlashAttention-2 §3.1.2: five GEMMs to the forward's two) at ``FLASH_FRACTION_OF_GEMM``
  of the profile's GEMM rate for a call of that size: FlashAttention-2 reaches 50-73% of an
  A100's peak (Dao 2023, arXiv:2307.08691, abstract) where cuBLAS reaches 87% (MAMF 271.2 of
  312 TFLOP/s, H04), and the bottom of that range over it is 0.575 (FlashAttention-3 reaches
  up to 75% of an H100's peak, Shah et al. 2024, arXiv:2407.08608, so later kernels do
  better). As a share of the GEMM rate it follows the job's sustained pace like the GEMMs.
  Pricing a fused call as the unfused GEMMs, which write the s x s scores, made it 2-4x
  slower than those kernels. The Triton FlashAttention of 2022 (``AttentionKernel.FLASH_TRITON``,
  :func:`triton_core_times`) is priced from the FlashAttention-2-class call: at most the
  profile's ``ampere_attention_fraction_of_peak`` of peak where it has one (a pre-Hopper
  kernel on Hopper), then 1.3x slower (FlashAttention-2 is 1.3-2.5x faster than it,
  arXiv:2307.08691 §4.1). Unfused attention keeps the GEMM pricing of its two batched
  GEMMs, backward 2x.
* **Host per-op overhead** (``HardwareProfile.host_overhead``): every eager op pays host
  time for its dispatch and autograd bookkeeping, forward and backward. The ops of a pass
  are counted from the cost model's own kernel lists (:func:`layer_ops`): one per weight
  GEMM (``plansim.analytic.flops.layer_forward_gemms``), one fused attention call (two
  batched GEMMs unfused), one per memory-bound kernel
  (``plansim.analytic.elementwise.layer_elementwise_traffic`` ``num_kernels``); backward
  runs one autograd node per forward op. With tp > 1 the weight GEMMs are tensor-parallel
  (DTensor) ops and pay the DTensor extra when the profile has one. How host and device
  time combine is :meth:`plansim.specs.compute_terms.HostOverhead.pass_s` (GPU: max; CPU:
  sum less the bare dispatch the device terms hold).

Limits: view/reshape ops (free on the device, a few microseconds each on the host) are not
counted; a Megatron-style fused QKV GEMM counts as one op where an implementation with
separate Q, K, V linears runs three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plansim.analytic import flops as fl
from plansim.specs.compute_terms import HostOverhead
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import PositionEmbedding
from plansim.specs.plan import AttentionKernel, ParallelPlan, Recompute

#: Ops of the first stage's embedding: the token lookup (learned positions: + lookup, add).
EMBEDDING_OPS = 1
#: Ops of the last stage's head: final norm, logits GEMM, cross-entropy (log-softmax, NLL).
HEAD_OPS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreTimes:
    """Seconds of one layer's attention core (QK^T, softmax, PV) on one rank."""

    forward_s: float
    backward_s: float


def attention_call_flops(gemms: Sequence[fl.Gemm]) -> float:
    """Forward FLOPs of one layer's fused attention call on one rank, causal: half of the
    attention-core GEMMs' FLOPs (``attn_scores`` + ``attn_over_v`` = 4*b*(s/cp)*s*h/tp, so
    2*b*(s/cp)*s*h/tp), counted as ``plansim calibrate`` counts its SDPA items."""
    core = sum(g.flops for g in gemms if g.name in fl.ATTENTION_CORE_GEMMS)
    return core / 2.0


def attention_core_times(
    gemms: Sequence[fl.Gemm],
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    dtype: str,
    gemm_forward_s: float,
) -> CoreTimes:
    """Attention-core seconds of one layer: from the profile's fused-attention curve for
    ``dtype`` when the plan's kernel is fused and the profile has one, from
    :func:`flash_core_times` when fused without one, else (unfused) from the GEMM pricing
    ``gemm_forward_s`` of the two core GEMMs, backward 2x.

    Forward: F / (peak * forward_fraction(F)); backward: 2F / (peak * backward_fraction(F)),
    F = :func:`attention_call_flops`.
    """
    if not plan.attention.fused:
        return CoreTimes(forward_s=gemm_forward_s, backward_s=2.0 * gemm_forward_s)
    if dtype not in profile.attention_efficiency:
        times = flash_core_times(gemms, profile, dtype=dtype)
    else:
        call = attention_call_flops(gemms)
        if call <= 0:
            return CoreTimes(forward_s=0.0, backward_s=0.0)
        times = CoreTimes(
            forward_s=call / profile.attention_flops_per_s(dtype, call, backward=False),
            backward_s=2.0 * call / profile.attention_flops_per_s(dtype, call, backward=True),
        )
    if plan.attention is AttentionKernel.FLASH_TRITON:
        return triton_core_times(times, gemms, profile, dtype=dtype)
    return times


def triton_core_times(
    flash2: CoreTimes, gemms: Sequence[fl.Gemm], profile: HardwareProfile, *, dtype: str
) -> CoreTimes:
    """Seconds of the Triton FlashAttention of 2022 (``AttentionKernel.FLASH_TRITON``) from
    those of a FlashAttention-2-class call ``flash2``: on a profile with
    ``ampere_attention_fraction_of_peak`` c (Hopper: such kernels cannot use its warpgroup
    instructions) a call first takes at least F / (c x peak) forward and 2.5 F / (c x peak)
    backward (F = :func:`attention_call_flops`, FlashAttention-2's FLOP count), then
    FLASH2_OVER_TRITON_SPEEDUP times that."""
    forward_s, backward_s = flash2.forward_s, flash2.backward_s
    cap = profile.ampere_attention_fraction_of_peak
    if cap is not None:
        rate = cap * profile.peak_flops_per_s[dtype]
        call = attention_call_flops(gemms)
        forward_s = max(forward_s, call / rate)
        backward_s = max(backward_s, FLASH_BACKWARD_FLOPS_RATIO * call / rate)
    slower = FLASH2_OVER_TRITON_SPEEDUP
    return CoreTimes(forward_s=forward_s * slower, backward_s=backward_s * slower)


#: Backward FLOPs of a fused attention call over its forward's: five GEMMs (dV, dP, dS->dQ,
#: dK, and the recomputed scores) to the forward's two (FlashAttention-2 §3.1.2).
FLASH_BACKWARD_FLOPS_RATIO = 2.5
#: A fused attention kernel's rate over the GEMM rate without a measured curve: the bottom of
#: the 50-73% of an A100's peak FlashAttention-2 reaches (Dao 2023, arXiv:2307.08691,
#: abstract; FLOPs counted causal, the backward as 2.5x the forward) over the 271.2 / 312 of
#: it cuBLAS reaches there (MAMF, H04). Later kernels reach more (FlashAttention-3: up to 75%
#: of an H100's peak, arXiv:2407.08608), earlier ones less.
FLASH_FRACTION_OF_GEMM = 0.50 / (271.2 / 312.0)
#: How much faster FlashAttention-2 runs than the Triton FlashAttention of 2022
#: (``flash_attn/flash_attn_triton.py``, ``AttentionKernel.FLASH_TRITON``): "1.3-2.5x faster
#: than FlashAttention in Triton" on an A100, forward and backward (Dao 2023,
#: arXiv:2307.08691 §4.1); the low end, the least of the measured gaps. The kernel's own
#: docstring puts it near FlashAttention-1 ("Overall Triton forward + backward is slightly
#: slower than CUDA forward + backward"), which FlashAttention-2 beats by 1.7-3.0x (§4.1).
FLASH2_OVER_TRITON_SPEEDUP = 1.3


def flash_core_times(
    gemms: Sequence[fl.Gemm], profile: HardwareProfile, *, dtype: str
) -> CoreTimes:
    """Seconds of one layer's fused (FlashAttention) call on one rank from its mechanism, for
    profiles without a measured ``attention_efficiency`` curve (module docstring).

    Forward: max(F / R, B_f / HBM), F = :func:`attention_call_flops` (causal), R =
    ``FLASH_FRACTION_OF_GEMM`` x the profile's GEMM rate for one call of F FLOPs, B_f the
    16-bit Q, K, V read and O written (2 B per element, K and V counted per query head: an
    upper bound under GQA). Backward: max(2.5 F / R, B_b / HBM), B_b
    reading Q, K, V, O, dO and writing dQ, dK, dV.
    """
    call = attention_call_flops(gemms)
    if call <= 0:
        return CoreTimes(forward_s=0.0, backward_s=0.0)
    scores = next(g for g in gemms if g.name == "attn_scores")
    queries, keys, head = scores.count * scores.m, scores.count * scores.n, scores.k
    io_fwd = 2.0 * head * (2 * queries + 2 * keys)  # Q, O; K, V
    io_bwd = 2.0 * head * (4 * queries + 4 * keys)  # Q, O, dO, dQ; K, V, dK, dV
    rate = FLASH_FRACTION_OF_GEMM * profile.matmul_flops_per_s(dtype, call)
    hbm = profile.streaming_bytes_per_s()
    return CoreTimes(
        forward_s=max(call / rate, io_fwd / hbm),
        backward_s=max(FLASH_BACKWARD_FLOPS_RATIO * call / rate, io_bwd / hbm),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PassOps:
    """Eager ops of one pass: all of them, the tensor-parallel (DTensor) ones among them, and
    those inside a region checkpointed with torchtitan's per-op selective policy."""

    num_ops: int
    num_dtensor_ops: int = 0
    num_sac_ops: int = 0


def layer_ops(gemms: Sequence[fl.Gemm], plan: ParallelPlan, *, num_kernels: int) -> PassOps:
    """Ops of one layer's forward (= autograd nodes of its backward) on one rank.

    Weight GEMMs (every GEMM but the attention core), the attention core (one fused call,
    or its two batched GEMMs unfused) and ``num_kernels`` memory-bound kernels; with
    tp > 1 the weight GEMMs are DTensor ops; with ``Recompute.SELECTIVE_OP`` every op is in
    the checkpointed region.
    """
    weights = sum(1 for g in gemms if g.name not in fl.ATTENTION_CORE_GEMMS)
    core = 1 if plan.attention.fused else 2
    ops = weights + core + num_kernels
    return PassOps(
        num_ops=ops,
        num_dtensor_ops=weights if plan.tp > 1 else 0,
        num_sac_ops=ops if plan.recompute is Recompute.SELECTIVE_OP else 0,
    )


def edge_ops(position_embedding: PositionEmbedding) -> tuple[PassOps, PassOps]:
    """Ops of the first stage's embedding and of the last stage's head (:data:`HEAD_OPS`)."""
    learned = position_embedding is PositionEmbedding.LEARNED
    return PassOps(num_ops=EMBEDDING_OPS + (2 if learned else 0)), PassOps(num_ops=HEAD_OPS)


def host_seconds(ops: PassOps, host: HostOverhead, *, backward: bool) -> float:
    """Host seconds of ``ops`` in one pass: ops * per-op seconds + DTensor ops * the DTensor
    extra + ops in a per-op selective checkpoint region * its extra, forward or backward
    figures (an extra the profile lacks counts 0)."""
    per_op = host.backward_op_s if backward else host.forward_op_s
    dtensor = host.dtensor_backward_op_s if backward else host.dtensor_forward_op_s
    sac = host.sac_backward_op_s if backward else host.sac_forward_op_s
    return (
        ops.num_ops * per_op
        + ops.num_dtensor_ops * (dtensor or 0.0)
        + ops.num_sac_ops * (sac or 0.0)
    )


def with_host_s(
    device_s: float, ops: PassOps, profile: HardwareProfile, *, backward: bool
) -> float:
    """Seconds of a pass whose device work takes ``device_s``, with the host cost of its
    ``ops`` (``device_s`` unchanged when the profile has no ``host_overhead``).

    Host seconds = ops * per-op seconds (+ DTensor ops * the DTensor extra + ops in a per-op
    selective checkpoint region * its extra, which in backward holds the recompute), forward
    or backward figure; combined by :meth:`HostOverhead.pass_s` with the profile's
    ``kernel_launch_s`` as the bare dispatch.
    """
    host = profile.host_overhead
    if host is None or ops.num_ops == 0:
        return device_s
    host_s = host_seconds(ops, host, backward=backward)
    return host.pass_s(
        device_s, host_s=host_s, num_ops=ops.num_ops, dispatch_s=profile.kernel_launch_s
    )
