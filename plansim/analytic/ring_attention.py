"""Exposed context-parallel ring-attention transfers of one layer (pure).

Context parallelism (cp; Megatron-LM / Transformer Engine, Llama 3 §3.3.2) runs attention as
a ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): the K/V chunks travel
between the cp ranks while each step's blockwise attention computes. ``layer_cost`` prices
the compute; this module the transfers the compute does not hide.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.activations import ring_kv_chunk_bytes
from plansim.analytic.comm import p2p_time_s
from plansim.analytic.ranks import LayoutGroups
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class RingTimes:
    """Ring attention of one layer and micro-batch on one GPU.

    Attributes:
        forward_s, backward_s: exposed transfer seconds (what attention compute does not hide).
        forward_bytes, backward_bytes: bytes the rank sends in that pass.
    """

    forward_s: float
    backward_s: float
    forward_bytes: float
    backward_bytes: float


def ring_attention_times(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    core_forward_s: float,
    core_backward_s: float,
) -> RingTimes:
    """Exposed context-parallel ring transfers of one layer (zero with cp == 1).

    Ring attention (Liu et al. 2023 §3) as Transformer Engine's ``AttnFuncWithCPAndKVP2P``
    runs it for Megatron-LM: cp steps; step i computes the blockwise attention of the local
    queries with K/V chunk i while the chunk for step i + 1 travels to the ring neighbour.
    With C = ``ring_kv_chunk_bytes`` (2 * (s/cp) * b * local KV width * 2 bytes), T(x) the
    neighbour send/recv time of x bytes (``p2p_time_s``: NVLink when the cp ring is inside a
    node, tp * cp <= GPUs per node, else one NIC rail) and c = core seconds / cp the
    attention compute of one step (equal for every step under the load-balanced causal
    split):

    - forward: cp - 1 transfers of C, each beside one step:
      (cp - 1) * max(0, T(C) - c_fwd); sends (cp - 1) * C bytes;
    - backward: K, V travel again together with the partial dK, dV: step 0 sends K, V (C),
      steps 1..cp-2 send K, V, dK, dV (2C), step cp - 1 sends dK, dV home (C):
      2 * max(0, T(C) - c_bwd) + (cp - 2) * max(0, T(2C) - c_bwd); sends 2(cp - 1) C bytes,
      twice the forward's.

    Step 0 works on the rank's own K/V, so no transfer precedes the first step (TE posts the
    first send beside step 0's compute). Limits: NCCL kernels and attention share the SMs
    (hidden transfers cost nothing here); the causal half-blocks are priced at the full-block
    GEMM efficiency.
    """
    cp = plan.cp
    if cp == 1:
        return RingTimes(forward_s=0.0, backward_s=0.0, forward_bytes=0.0, backward_bytes=0.0)
    chunk = ring_kv_chunk_bytes(model, micro_batch_size=plan.micro_batch_size, tp=plan.tp, cp=cp)
    inter = groups.cp.num_nodes > 1
    one = p2p_time_s(profile, message_bytes=chunk, inter_node=inter)
    two = p2p_time_s(profile, message_bytes=2.0 * chunk, inter_node=inter)
    step_fwd, step_bwd = core_forward_s / cp, core_backward_s / cp
    return RingTimes(
        forward_s=(cp - 1) * max(0.0, one - step_fwd),
        backward_s=2 * max(0.0, one - step_bwd) + (cp - 2) * max(0.0, two - step_bwd),
        forward_bytes=(cp - 1) * chunk,
        backward_bytes=2.0 * (cp - 1) * chunk,
    )
