"""The validate model's layer as eager torch runs it, against the Megatron-LM layer plansim
prices (pure).

plansim's layer cost (``plansim.analytic.layer_cost``) describes Megatron-LM: one fused QKV
GEMM, fused elementwise kernels (one per norm, bias-dropout-add, activation, RoPE). The
validate model (``plansim.validate.model.Block``) is plain PyTorch: separate q, k and v
``nn.Linear`` modules (each its own GEMM, and with tp > 1 its own DTensor op), RoPE as a dozen
small ops per tensor, GQA's ``repeat_interleave``, SwiGLU as silu and mul. This module counts
the difference per layer and prices it with the profile's own terms:

* host: the eager compute ops beyond plansim's count (:func:`eager_layer_ops` minus
  ``op_overheads.layer_ops``), at the profile's host seconds per op, forward and backward,
  and the linears beyond plansim's weight GEMMs at the DTensor extra per op when tp > 1
  (``HardwareProfile.host_overhead``; nothing without it). Views, transposes and reshapes
  launch no kernel and are not counted. Where host and device are one processor (a CPU,
  ``host_overhead.serial``) that time adds to the layer; on a GPU the host issues kernels
  ahead of the device, so it shows only as far as it makes the pass host-bound:
  max(device, host + extra) - max(device, host), with the layer's device and priced host
  seconds as ``layer_cost`` has them (``HostOverhead.pass_s``).
* device: q, k and v as three GEMMs instead of one (``layer_cost.gemm_time_s`` of each),
  forward once and backward twice (input and weight gradients).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from plansim.analytic import flops as fl
from plansim.analytic.elementwise import layer_elementwise_traffic
from plansim.analytic.layer_cost import gemm_time_s, layer_gemms, layer_pass_times
from plansim.analytic.op_overheads import PassOps, host_seconds, layer_ops
from plansim.analytic.ranks import layout_groups
from plansim.analytic.sustained import job_compute_profile
from plansim.specs.compute_terms import HostOverhead
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import Activation, ModelSpec, PositionEmbedding
from plansim.specs.plan import ParallelPlan, Recompute

#: Compute ops of ``model._rope`` on one tensor: the angle table (arange, div, pow, div,
#: arange, outer, cos, sin) and the rotation (4 mul, sub, add, cat).
ROPE_OPS = 15


@dataclass(frozen=True, slots=True, kw_only=True)
class EagerLayer:
    """Compute ops (kernels launched from Python) and ``nn.Linear`` calls of one layer's
    forward in the validate model."""

    num_ops: int
    num_linears: int


def eager_layer_ops(model: ModelSpec) -> EagerLayer:
    """Ops of ``plansim.validate.model.Block.forward`` for ``model``: two norms; q, k, v, o,
    the MLP's linears (up, gate for SwiGLU, down); attention (SDPA), RoPE on q and k
    (:data:`ROPE_OPS` each), ``repeat_interleave`` of k and v under GQA; the activation
    (GELU or ReLU: 1; SwiGLU: silu and mul; squared ReLU: relu and square); two residual
    adds. (A test counts the same with a TorchFunctionMode on the real Block.)"""
    linears = 4 + model.activation.num_ffn_matrices
    activation = 1 if model.activation in (Activation.GELU, Activation.RELU) else 2
    rope = 2 * ROPE_OPS if model.position_embedding is PositionEmbedding.ROPE else 0
    gqa = 2 if model.num_query_groups < model.num_attention_heads else 0
    return EagerLayer(num_ops=2 + linears + 1 + rope + gqa + activation + 2, num_linears=linears)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerExtra:
    """Seconds one layer of the validate model takes beyond plansim's layer, per micro-batch."""

    forward_s: float
    backward_s: float


def eager_layer_extra(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> LayerExtra:
    """Extra forward and backward seconds per layer and micro-batch (module docstring).

    ``plan`` is the executed plan (its precision the run's dtype).
    """
    gemms = layer_gemms(model, plan)
    traffic = layer_elementwise_traffic(
        model,
        micro_batch_size=plan.micro_batch_size,
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        unfused_attention=False,
    )
    priced = layer_ops(gemms, plan, num_kernels=traffic.num_kernels)
    eager = eager_layer_ops(model)
    weights = sum(1 for g in gemms if g.name not in fl.ATTENTION_CORE_GEMMS)
    extra_ops = max(0, eager.num_ops - priced.num_ops)
    extra_linears = max(0, eager.num_linears - weights) if plan.tp > 1 else 0
    split = _qkv_split_s(model, plan, profile, gemms)
    host = profile.host_overhead
    if host is None:
        return LayerExtra(forward_s=split, backward_s=2.0 * split)
    sac = plan.recompute is Recompute.SELECTIVE_OP  # the extra ops are in the region too
    extra = PassOps(
        num_ops=extra_ops, num_dtensor_ops=extra_linears, num_sac_ops=extra_ops if sac else 0
    )
    forward_s = host_seconds(extra, host, backward=False)
    backward_s = host_seconds(extra, host, backward=True)
    if not host.serial:  # GPU: the extra host time hides behind the device's work
        device = _device_s(model, plan, profile)
        priced_fwd, priced_bwd = (host_seconds(priced, host, backward=b) for b in (False, True))
        forward_s = _exposed(host, device[0] + split, priced_fwd, forward_s)
        backward_s = _exposed(host, device[1] + 2.0 * split, priced_bwd, backward_s)
    return LayerExtra(forward_s=forward_s + split, backward_s=backward_s + 2.0 * split)


def _device_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> tuple[float, float]:
    """Device seconds of plansim's layer, forward and backward, at the job's sustained rate
    (``layer_cost.layer_pass_times`` on the profile without its host terms)."""
    bare = dataclasses.replace(job_compute_profile(profile, plan.num_gpus), host_overhead=None)
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    times = layer_pass_times(model, plan, bare, groups)
    return times.forward_s, times.backward_input_s + times.backward_weight_s


def _exposed(host: HostOverhead, device_s: float, host_s: float, extra_s: float) -> float:
    """Seconds ``extra_s`` more host work adds to a pass whose device and host take
    ``device_s`` and ``host_s`` when the host runs ahead: the difference of two
    ``HostOverhead.pass_s`` (asynchronous; its op count and bare dispatch enter only the
    serial case)."""

    def pass_s(host_total_s: float) -> float:
        return host.pass_s(device_s, host_s=host_total_s, num_ops=0, dispatch_s=0.0)

    return pass_s(host_s + extra_s) - pass_s(host_s)


def _qkv_split_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, gemms: tuple[fl.Gemm, ...]
) -> float:
    """Seconds of q, k and v as three GEMMs less the fused QKV GEMM (forward)."""
    dtype = plan.precision.value
    fused = next(g for g in gemms if g.name == "qkv")
    q_width = model.num_attention_heads * model.head_dim // plan.tp
    kv_width = (fused.n - q_width) // 2
    parts = (
        dataclasses.replace(fused, n=q_width),
        dataclasses.replace(fused, n=kv_width),
        dataclasses.replace(fused, n=kv_width),
    )
    split = sum(gemm_time_s(g, profile, dtype=dtype) for g in parts)
    return split - gemm_time_s(fused, profile, dtype=dtype)
