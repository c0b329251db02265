"""Megatron-Core's recompute modules (``--recompute-modules``): what each saves in stored
activations and costs in recompute, per layer and micro-batch on one rank (pure).

With selective recompute the attention core is always recomputed (``core_attn``,
``plansim.analytic.activations``); ``plan.recompute_modules`` adds (Megatron-Core
``TransformerConfig.recompute_modules``; DeepSeek-V3 report arXiv:2412.19437 §3.2.3,
"Recomputation of RMSNorm and MLA Up-Projection"):

- ``layernorm``: the pre-attention and pre-MLP norms run again in backward, so their outputs,
  the inputs of the QKV (MLA down-) projection and of the MLP / router, are not kept:
  2 x T x h x (GEMM-input bytes), T the rank's tokens (/tp with sequence parallelism).
  Recompute: both norms' forward, read and write T x h 16-bit values each.
- ``mla_up_proj``: MLA's query and key/value up-projections run again from the latents,
  so the per-head queries, keys and values (what the dense proxy of
  ``plansim.analytic.moe_layer`` keeps for the attention kernel, 2 x T x (h + 2 x kv_size)
  bytes / tp) give way to the latents, 2 x T x (q_lora + kv_lora + rope) bytes. Recompute:
  the ``q_up`` and ``kv_up`` GEMMs (or ``q``) forward.
- ``moe_act``: the routed experts' activation function runs again, so its output (the
  experts' second GEMM input, T x top_k x expert FFN x GEMM-input bytes / tp) is not kept.
  Recompute: SwiGLU/GELU forward over those rows, reading the first GEMM's output and
  writing its own.

Bytes are in the 16-bit convention of ``plansim.analytic.stored_activations`` (fp32 training
scales them after).
"""

from __future__ import annotations

from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import Activation, ModelSpec
from plansim.specs.plan import ParallelPlan, Recompute

#: 16-bit element.
_HALF = 2.0
#: MLA's up-projection GEMMs (``moe_layer.mla_attention_gemms``), re-run by ``mla_up_proj``.
UP_GEMMS = ("q", "q_up", "kv_up")


def recompute_modules_reason(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why ``plan``'s recompute modules do not apply to ``model``, or None: ``mla_up_proj``
    needs MLA, ``moe_act`` routed experts."""
    modules = plan.recomputation.modules
    if "mla_up_proj" in modules and model.mla is None:
        return f"recompute module mla_up_proj needs MLA; {model.name} has none"
    if "moe_act" in modules and model.moe is None:
        return f"recompute module moe_act needs routed experts; {model.name} has none"
    return None


def _tokens(model: ModelSpec, plan: ParallelPlan) -> float:
    """Tokens one TP rank's layer sees: b x s / cp."""
    return plan.micro_batch_size * model.seq_length / plan.cp


def saved_bytes(
    model: ModelSpec, plan: ParallelPlan, *, gemm_input_bytes: float, kv_size: int
) -> float:
    """Stored bytes one layer keeps fewer with ``plan``'s recompute modules (module
    docstring); ``kv_size``: the K (and V) width the stored-activation model priced (the
    dense proxy's for MLA). 0 without modules."""
    modules = plan.recomputation.modules
    if not modules or plan.recompute is not Recompute.SELECTIVE:
        return 0.0
    tokens, h, tp = _tokens(model, plan), model.hidden_size, plan.tp
    sp_div = tp if plan.sequence_parallel else 1
    saved = 0.0
    if "layernorm" in modules:
        saved += 2.0 * gemm_input_bytes * tokens * h / sp_div
    mla = model.mla
    if "mla_up_proj" in modules and mla is not None:
        qkv = _HALF * tokens * (h + 2 * kv_size) / tp
        latents = (
            _HALF * tokens * ((mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim)
        )
        saved += max(0.0, qkv - latents)
    moe = model.moe
    if "moe_act" in modules and moe is not None:
        saved += gemm_input_bytes * tokens * moe.top_k * moe.expert_ffn_hidden_size / tp
    return saved


def recompute_s(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    gemm_forward_s: dict[str, float],
    moe_layer: bool,
) -> float:
    """Seconds one layer's recompute modules add to its backward (module docstring);
    ``gemm_forward_s``: the layer's forward GEMM seconds by name; ``moe_layer``: a layer
    with experts (``moe_act`` applies)."""
    modules = plan.recomputation.modules
    if not modules or plan.recompute is not Recompute.SELECTIVE:
        return 0.0
    tokens, h, tp = _tokens(model, plan), model.hidden_size, plan.tp
    sp_div = tp if plan.sequence_parallel else 1
    rate = profile.elementwise_bytes_per_s(backward=False)
    launch = profile.kernel_launch_s
    seconds = 0.0
    if "layernorm" in modules:
        seconds += 2 * (2.0 * _HALF * tokens * h / sp_div / rate + launch)
    if "mla_up_proj" in modules and model.mla is not None:
        seconds += sum(gemm_forward_s.get(name, 0.0) for name in UP_GEMMS)
    moe = model.moe
    if "moe_act" in modules and moe is not None and moe_layer:
        gated = model.activation is Activation.SWIGLU
        width = moe.top_k * moe.expert_ffn_hidden_size / tp
        moved = _HALF * tokens * width * (3 if gated else 2)
        seconds += moved / rate + launch
    return seconds
