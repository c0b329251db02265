"""Seconds of one transformer layer's passes (pure); the edge stages' extra work (embedding,
logits, loss) is ``plansim.analytic.edge_cost``.

* GEMMs (``plansim.analytic.flops``): roofline per GEMM, max(FLOPs / achievable FLOP/s at that
  GEMM's size (launch overhead included in the curve), bytes of A, B and C / streaming HBM
  bandwidth). Backward: input-grad and weight-grad GEMMs each cost one forward (2x forward in
  all). FlashAttention's backward runs five GEMMs to the forward's two (Dao 2023,
  FlashAttention-2 §3.1.2): 2.5x the forward attention-core GEMMs, the recompute included.
* Memory-bound kernels (``plansim.analytic.elementwise``): bytes / streaming HBM bandwidth.
* TP collectives per layer (Megatron-LM, Shoeybi et al. 2019 §3; Korthikanti §4.2.2):
  forward 2 all-reduces of b*s*h 16-bit values (with SP: 2 all-gathers + 2 reduce-scatters);
  backward the same, plus with SP 2 all-gathers re-forming the inputs of the column-parallel
  weight gradients; full recompute repeats the forward ones. TP is blocking (on the critical
  path).
* Context parallelism (cp; Megatron-LM / Transformer Engine, Llama 3 §3.3.2): a rank computes
  s/cp tokens of every sequence, so every per-token cost above (GEMM m = b*s/cp, elementwise
  traffic, TP messages, logits) is that of s/cp tokens (:func:`cp_local_model`). Attention
  runs as a ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): cp steps,
  each a blockwise attention of the local queries with one (s/cp)-token K/V chunk, so the
  core GEMMs are the local queries over all s keys, 1/cp of the full sequence's FLOPs (the
  2*cp load-balanced chunks give every rank and every step an equal share of the causal
  work; :func:`layer_gemms`). The exposed ring traffic is
  ``plansim.analytic.ring_attention``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from plansim.analytic import flops as fl
from plansim.analytic.comm import (
    Collective,
    all_to_all_time_s,
    collective_time_s,
    deduplicated_all_to_all_time_s,
)
from plansim.analytic.eager_elementwise import eager_extra_traffic
from plansim.analytic.elementwise import (
    QUANTIZED_ELEMENT_BYTES,
    ElementwiseTraffic,
    layer_elementwise_traffic,
    norm_second_pass_traffic,
    quantize_traffic,
)
from plansim.analytic.memory import plan_state_bytes
from plansim.analytic.moe_layer import (
    FP8_DISPATCH_ELEMENT_BYTES,
    ROUTING_KERNELS,
    TOKEN_ELEMENT_BYTES,
    ExpertTraffic,
    dedup_traffic,
    dense_proxy,
    expert_traffic,
    layer_kind_gemms,
)
from plansim.analytic.op_overheads import (
    attention_core_times,
    layer_ops,
    with_host_s,
)
from plansim.analytic.params import count_parameters
from plansim.analytic.ranks import LayoutGroups, group_span
from plansim.analytic.recompute_modules import UP_GEMMS
from plansim.analytic.recompute_modules import recompute_s as module_recompute_s
from plansim.analytic.ring_attention import ring_attention_times
from plansim.analytic.tp_comm import tp_pass_times
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import AttentionKernel, ParallelPlan, Precision, Recompute


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTimes:
    """Seconds of one layer for one micro-batch on one GPU, by part.

    ``cp_*_s``: exposed (not hidden behind attention compute) ring-attention transfers of the
    forward, backward and full-recompute passes; ``cp_*_bytes``: bytes each rank sends in
    that pass (``ring_attention.ring_attention_times``). Zero with cp == 1.

    ``ep_*_s``: a MoE layer's token dispatch and combine all-to-alls (and with etp > 1 the
    expert-TP gathers) in forward, backward and full recompute, blocking as Megatron-Core's
    ``alltoall`` dispatcher runs them; ``ep_*_bytes``: bytes each rank sends in that pass
    (``plansim.analytic.moe_layer``). Zero in a dense layer.
    """

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    recompute_s: float
    tp_forward_s: float
    tp_backward_s: float
    tp_recompute_s: float
    cp_forward_s: float = 0.0
    cp_backward_s: float = 0.0
    cp_recompute_s: float = 0.0
    cp_forward_bytes: float = 0.0
    cp_backward_bytes: float = 0.0
    ep_forward_s: float = 0.0
    ep_backward_s: float = 0.0
    ep_recompute_s: float = 0.0
    ep_forward_bytes: float = 0.0
    ep_backward_bytes: float = 0.0


def cp_local_model(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one of ``cp`` context-parallel ranks computes it: s/cp tokens a sequence.

    For per-token costs only (GEMM m, elementwise traffic, TP and pipeline messages, logits).
    Never for parameters (learned position embeddings hold s x h) nor for the attention
    core's key length (see :func:`layer_gemms`). ``ParallelPlan`` allows cp > 1 only with
    FlashAttention, whose elementwise traffic has no per-key term.
    """
    if cp == 1:
        return model
    return dataclasses.replace(model, seq_length=model.seq_length // cp)


def layer_gemms(
    model: ModelSpec, plan: ParallelPlan, *, moe_layer: bool = False
) -> tuple[fl.Gemm, ...]:
    """Per-GPU forward GEMMs of one layer on one TP rank of one of ``plan.cp`` CP ranks.

    Linear layers: :func:`plansim.analytic.flops.layer_forward_gemms` with m = b*s/cp.
    Attention core: the rank's s/cp queries attend over all s keys of the ring, per head
    ``attn_scores`` m = s/cp, n = s and ``attn_over_v`` m = s/cp, k = s: 4*b*(s/cp)*s*h/tp
    FLOPs forward, 1/cp of the full sequence's. The cp ring steps split this into blocks of
    (s/cp) x (s/cp) without changing the FLOPs; one GEMM per head over the whole ring keeps
    the efficiency lookup as at cp = 1 (each step's FlashAttention kernel covers every head
    and sequence of the micro-batch, so pricing (s/cp)^2 blocks as separate small GEMMs
    would understate its efficiency).

    A model with experts or MLA: ``moe_layer.layer_kind_gemms`` (its dense layers, or with
    ``moe_layer`` its MoE layers), with the same key-length change.
    """
    local = cp_local_model(model, plan.cp)
    if is_dense(model):
        gemms = fl.layer_forward_gemms(local, micro_batch_size=plan.micro_batch_size, tp=plan.tp)
    else:
        gemms = layer_kind_gemms(model, plan, local=local, moe_layer=moe_layer)
    if plan.cp == 1:
        return gemms
    keys = model.seq_length
    return tuple(
        dataclasses.replace(g, n=keys)
        if g.name == "attn_scores"
        else dataclasses.replace(g, k=keys)
        if g.name == "attn_over_v"
        else g
        for g in gemms
    )


def _element_bytes(dtype: str) -> float:
    """Bytes of one GEMM operand element: 4 for fp32/tf32, else 2 (fp8 and fp4 GEMMs are
    priced with 16-bit operand traffic, as before fp32 existed)."""
    return 4.0 if dtype in ("fp32", "tf32") else 2.0


def gemm_time_s(gemm: fl.Gemm, profile: HardwareProfile, *, dtype: str) -> float:
    """Roofline time of ``gemm`` (all ``count`` instances): compute- or HBM-bound."""
    single_flops = 2.0 * gemm.m * gemm.n * gemm.k
    compute_s = gemm.flops / profile.matmul_flops_per_s(dtype, single_flops)
    elements = gemm.count * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
    moved = _element_bytes(dtype) * elements
    # The profile's efficiency curve already includes the launch overhead (roofline + launch).
    return max(compute_s, moved / profile.streaming_bytes_per_s())


def matmul_dtype(plan: ParallelPlan) -> str:
    """The dtype name of the plan's weight GEMMs: its precision's value (``bf16``, ``fp8``)."""
    return plan.precision.value


def unquantized_dtype(plan: ParallelPlan) -> str:
    """The dtype of the matmuls Transformer Engine leaves unquantized (the attention core,
    and the logits: Megatron-core's output layer is a PyTorch matmul outside TE): bf16 under
    fp8 / fp4 precision, else the plan's :func:`matmul_dtype`."""
    return "bf16" if plan.precision in QUANTIZED_ELEMENT_BYTES else matmul_dtype(plan)


@dataclass(frozen=True, slots=True)
class _GemmSeconds:
    """One layer's forward GEMM seconds on one rank: all of them, the weight GEMMs (each
    one weight-gradient GEMM in backward), the attention core's, and by GEMM name, whole and
    (with ``tp_comm_overlap``) in tp pieces of m / tp rows."""

    forward_s: float
    weight_s: float
    core_s: float
    by_name: dict[str, float]
    chunked: dict[str, float]


def _gemm_seconds(
    gemms: tuple[fl.Gemm, ...],
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    dtype: str,
    core_dtype: str,
) -> _GemmSeconds:
    """The layer's forward GEMMs priced one by one (:func:`gemm_time_s`): the weight GEMMs
    in ``dtype``, the attention core's in ``core_dtype``."""
    fwd_gemm = wgrad = core_fwd = 0.0
    by_name: dict[str, float] = {}
    chunked: dict[str, float] = {}
    for gemm in gemms:
        is_core = gemm.name in fl.ATTENTION_CORE_GEMMS
        t = gemm_time_s(gemm, profile, dtype=core_dtype if is_core else dtype)
        by_name[gemm.name] = by_name.get(gemm.name, 0.0) + t
        if plan.tp_comm_overlap and not is_core:  # tp pieces of m / tp rows (tp_comm)
            pieces = dataclasses.replace(gemm, m=-(-gemm.m // plan.tp), count=gemm.count * plan.tp)
            chunked[gemm.name] = gemm_time_s(pieces, profile, dtype=dtype)
        fwd_gemm += t
        if is_core:
            core_fwd += t
        else:
            wgrad += t
    return _GemmSeconds(fwd_gemm, wgrad, core_fwd, by_name, chunked)


def _elementwise_seconds(
    local: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, traffic: ElementwiseTraffic
) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's memory-bound kernels: their bytes at the
    plan's activation width over the profile's elementwise rate, a launch each, and with fp8
    or fp4 Transformer Engine's casts of the GEMM operands (``quantize_traffic``)."""
    width = plan.precision.activation_bytes / 2.0
    ew_fwd = width * traffic.forward_bytes / profile.elementwise_bytes_per_s(backward=False)
    ew_bwd = width * traffic.backward_bytes / profile.elementwise_bytes_per_s(backward=True)
    ew_fwd += traffic.num_kernels * profile.kernel_launch_s
    ew_bwd += traffic.num_kernels * profile.kernel_launch_s
    if plan.precision in QUANTIZED_ELEMENT_BYTES:
        quant = quantize_traffic(
            local,
            precision=plan.precision,
            micro_batch_size=plan.micro_batch_size,
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
        )
        launches_s = quant.num_kernels * profile.kernel_launch_s
        ew_fwd += quant.forward_bytes / profile.elementwise_bytes_per_s(backward=False)
        ew_bwd += quant.backward_bytes / profile.elementwise_bytes_per_s(backward=True)
        ew_fwd, ew_bwd = ew_fwd + launches_s, ew_bwd + launches_s
    return ew_fwd, ew_bwd


def _layer_elementwise(
    local: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> tuple[float, float, int]:
    """Forward and backward seconds of one layer's memory-bound kernels on the cp-local
    model ``local``, and their kernel count (``elementwise.layer_elementwise_traffic``; with
    ``plan.fused_elementwise`` off, plus ``eager_elementwise.eager_extra_traffic``; else with
    ``plan.persist_layer_norm`` off, plus ``elementwise.norm_second_pass_traffic``)."""
    traffic = layer_elementwise_traffic(
        local,
        micro_batch_size=plan.micro_batch_size,
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        unfused_attention=plan.attention is AttentionKernel.UNFUSED,
    )
    if not plan.fused_elementwise:  # its norms' passes are in the eager count
        traffic = traffic + eager_extra_traffic(
            local,
            micro_batch_size=plan.micro_batch_size,
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
        )
    elif not plan.persist_layer_norm:
        traffic = traffic + norm_second_pass_traffic(
            local,
            micro_batch_size=plan.micro_batch_size,
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
        )
    ew_fwd, ew_bwd = _elementwise_seconds(local, plan, profile, traffic)
    return ew_fwd, ew_bwd, traffic.num_kernels


def layer_pass_times(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    moe_layer: bool = False,
) -> PassTimes:
    """Forward, backward (input/weight), recompute and TP-collective seconds of one layer.

    Compute = GEMMs (:func:`gemm_time_s`) + attention core
    (``op_overheads.attention_core_times``: the profile's fused-attention curve when it has
    one for the dtype, else a fused call priced from its mechanism, or the two core GEMMs when
    unfused) + memory-bound kernels (their bytes scale with the plan's activation width:
    16-bit in ``elementwise``, fp32 moves twice as many; moved at the profile's measured
    elementwise rate, else its streaming bandwidth; with fp8 or fp4 also Transformer Engine's
    casts of the GEMM operands, ``elementwise.quantize_traffic``), then the host cost of the
    pass's eager ops (``op_overheads.with_host_s``; nothing when the
    profile has no ``host_overhead``). The backward's host cost is in ``backward_input_s``.

    A model with experts, MLA or MTP modules: its GEMMs from ``moe_layer.layer_kind_gemms``
    (a MoE layer's with ``moe_layer``), its memory-bound kernels, TP messages and recompute
    from ``moe_layer.dense_proxy``, and in a MoE layer the routing kernels and the dispatch
    and combine all-to-alls (:func:`moe_pass_extras`). With ``plan.recompute_modules``, the
    modules' recompute on top (``recompute_modules.recompute_s``).
    """
    gemms = layer_gemms(model, plan, moe_layer=moe_layer)
    if not is_dense(model):
        proxy = dense_proxy(model, moe_layer=moe_layer)
        times = _pass_times(proxy, plan, profile, groups, gemms=gemms, proxy=True)
        if moe_layer:
            times = moe_pass_extras(model, plan, profile, groups, times)
    else:
        times = _pass_times(model, plan, profile, groups, gemms=gemms)
    if plan.recompute_modules is None:
        return times
    dtype = matmul_dtype(plan)
    up = {g.name: gemm_time_s(g, profile, dtype=dtype) for g in gemms if g.name in UP_GEMMS}
    extra = module_recompute_s(model, plan, profile, gemm_forward_s=up, moe_layer=moe_layer)
    return dataclasses.replace(times, recompute_s=times.recompute_s + extra)


def _pass_times(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    gemms: tuple[fl.Gemm, ...],
    proxy: bool = False,
) -> PassTimes:
    """:func:`layer_pass_times` of a dense ``model`` (or, ``proxy``, the dense proxy of a
    model with experts or MLA) with its ``gemms``."""
    local = cp_local_model(model, plan.cp)
    dtype = matmul_dtype(plan)
    core_dtype = unquantized_dtype(plan)  # 16-bit beside fp8 / fp4 GEMMs
    g = _gemm_seconds(gemms, plan, profile, dtype=dtype, core_dtype=core_dtype)
    core = attention_core_times(gemms, plan, profile, dtype=core_dtype, gemm_forward_s=g.core_s)
    # Input-grad GEMMs: one forward each; the attention core's backward from ``core``.
    dgrad = (g.forward_s - g.core_s) + core.backward_s
    ew_fwd, ew_bwd, num_kernels = _layer_elementwise(local, plan, profile)
    ops = layer_ops(gemms, plan, num_kernels=num_kernels)
    forward_s = with_host_s(
        g.forward_s + (core.forward_s - g.core_s) + ew_fwd, ops, profile, backward=False
    )
    wgrad = g.weight_s + _grad_accumulation_s(model, plan, profile, gemms=gemms if proxy else None)
    device_bwd = dgrad + ew_bwd + wgrad
    host_bwd = with_host_s(device_bwd, ops, profile, backward=True) - device_bwd
    tp_pass, tp_backward = tp_pass_times(
        model, plan, profile, groups, gemm_s=g.by_name, chunked_gemm_s=g.chunked
    )
    ring = ring_attention_times(
        model, plan, profile, groups, core_forward_s=core.forward_s, core_backward_s=core.backward_s
    )
    recompute_s, tp_recompute, cp_recompute = _recompute_times(
        model,
        plan,
        profile,
        local=local,
        g=g,
        core_forward_s=core.forward_s,
        forward_s=forward_s,
        ew_forward_s=ew_fwd,
        tp_pass_s=tp_pass,
        ring_forward_s=ring.forward_s,
    )
    return PassTimes(
        forward_s=forward_s,
        backward_input_s=dgrad + ew_bwd + host_bwd,
        backward_weight_s=wgrad,
        recompute_s=recompute_s,
        tp_forward_s=tp_pass,
        tp_backward_s=tp_backward,
        tp_recompute_s=tp_recompute,
        cp_forward_s=ring.forward_s,
        cp_backward_s=ring.backward_s,
        cp_recompute_s=cp_recompute,
        cp_forward_bytes=ring.forward_bytes,
        cp_backward_bytes=ring.backward_bytes,
    )


def _recompute_times(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    local: ModelSpec,
    g: _GemmSeconds,
    core_forward_s: float,
    forward_s: float,
    ew_forward_s: float,
    tp_pass_s: float,
    ring_forward_s: float,
) -> tuple[float, float, float]:
    """(compute, TP-collective, CP-ring) seconds one layer runs again before its backward,
    by the plan's recompute: full (its forward, or with early stop without the MLP down
    projection), selective (unfused: the attention core's GEMMs and softmax bytes; fused: the
    attention call and its KV ring), torchtitan's per-op selective (its GEMMs, every
    non-matmul op and the unsaved collectives), none. ``local``: the model as one cp rank
    sees it (``cp_local_model``)."""
    if plan.recompute is Recompute.FULL:
        if plan.recompute_early_stop and not model.dropout:
            recompute_s, tp_recompute = early_stop_recompute(
                forward_s,
                tp_pass_s,
                down_projection_s=g.by_name.get("mlp_down", 0.0)
                + g.by_name.get("expert_down", 0.0),
                plan=plan,
            )
            return recompute_s, tp_recompute, ring_forward_s
        return forward_s, tp_pass_s, ring_forward_s
    if plan.recompute is Recompute.SELECTIVE and plan.attention is AttentionKernel.UNFUSED:
        queries_x_keys = local.seq_length * model.seq_length
        width = plan.precision.activation_bytes / 2.0
        softmax_bytes = (
            9.0 * model.num_attention_heads * queries_x_keys * plan.micro_batch_size * width
        )
        return g.core_s + softmax_bytes / plan.tp / profile.streaming_bytes_per_s(), 0.0, 0.0
    if plan.recompute is Recompute.SELECTIVE:
        # Megatron-core checkpoints the fused attention call (recompute module "core_attn"):
        # its forward, and with cp its KV ring, run again before its backward
        return core_forward_s, 0.0, ring_forward_s
    if plan.recompute is Recompute.SELECTIVE_OP:
        # torchtitan's per-op policy: its GEMMs, every non-matmul op and the unsaved
        # collectives again (SP: the all-gathers, half the pass; else the all-reduces)
        again = fl.op_selective_recompute_gemms(
            local, micro_batch_size=plan.micro_batch_size, tp=plan.tp
        )
        dtype = matmul_dtype(plan)
        recompute_s = sum(gemm_time_s(x, profile, dtype=dtype) for x in again) + ew_forward_s
        return recompute_s, tp_pass_s / 2 if plan.sequence_parallel else tp_pass_s, 0.0
    return 0.0, 0.0, 0.0


def early_stop_recompute(
    forward_s: float, tp_forward_s: float, *, down_projection_s: float, plan: ParallelPlan
) -> tuple[float, float]:
    """(compute, TP) seconds of a layer's full recompute under torch's non-reentrant checkpoint
    with early stop (``ParallelPlan.recompute_early_stop``).

    The recompute runs the layer's forward only until every tensor its backward saved is
    back (torch ``torch.utils.checkpoint``: "stops recomputation as soon as it has computed
    all needed Tensors"). The last op that saves anything is the MLP down projection, which
    saves its input; its output feeds only the residual add, which saves nothing. So the
    down-projection GEMM is not rerun, and with tp > 1 neither is the collective that
    completes it: one of the forward's two all-reduces, or one of its four equal-sized
    sequence-parallel collectives (its reduce-scatter). The residual add's few bytes are
    kept in the recompute. Not for a model with hidden dropout (the caller checks): the
    dropout after the down projection saves its mask, so the recompute runs to the end and
    early stop saves nothing. Measured on an H100 (``benchmarks/bench_gpu_mechanisms.py``,
    fp32, 8 layers, h 2048, s 2048, b 2): recompute 52.7 ms with early stop, 74.3 ms
    without and 74.1 ms reentrant; the down projection is 1/3 of the layer's weight FLOPs.
    """
    share = 0.25 if plan.sequence_parallel else 0.5
    return forward_s - down_projection_s, tp_forward_s * (1.0 - share)


def _grad_accumulation_s(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    gemms: tuple[fl.Gemm, ...] | None,
) -> float:
    """Unfused gradient accumulation of one layer for one micro-batch: read the fresh weight
    gradient (in the working precision: 2 B, fp32 4 B), read and write the accumulation buffer
    (fp32 main grad for bf16, as Megatron-LM; 16-bit for fp16; fp32 for fp32): param bytes +
    2 x grad bytes per local parameter. Zero with ``gradient_accumulation_fusion`` (the
    weight-gradient GEMM accumulates in its epilogue). With ``gemms`` (a model with experts
    or MLA) the local weights are those of the layer's weight GEMMs."""
    if plan.gradient_accumulation_fusion:
        return 0.0
    if gemms is not None:
        local = float(sum(g.k * g.n * g.count for g in gemms if g.has_weight))
    else:
        counts = count_parameters(model)
        local = (
            counts.attention_per_layer + counts.mlp_per_layer
        ) / plan.tp + counts.norms_per_layer
    per_param = plan_state_bytes(plan)
    return local * (per_param.param + 2.0 * per_param.grad) / profile.streaming_bytes_per_s()


def moe_pass_extras(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    times: PassTimes,
) -> PassTimes:
    """``times`` of a MoE layer with its routing kernels and expert-parallel traffic added
    (``plansim.analytic.moe_layer``, module docstring).

    Routing: the router's probabilities, permute, unpermute and gate scaling,
    ``ExpertTraffic.routing_bytes`` at the profile's elementwise rate and
    ``ROUTING_KERNELS`` launches, in forward and again in backward. Dispatch and combine:
    two all-to-alls of ``dispatch_bytes`` over the EP group (``comm.all_to_all_time_s``) in
    forward and two in backward; with etp > 1 an all-gather and a reduce-scatter of the
    received rows over the etp ranks (consecutive ranks, stride 1) beside each pair. Full
    recompute repeats the forward ones.
    """
    traffic = expert_traffic(model, plan)
    launches = ROUTING_KERNELS * profile.kernel_launch_s
    route_fwd = traffic.routing_bytes / profile.elementwise_bytes_per_s(backward=False)
    route_bwd = traffic.routing_bytes / profile.elementwise_bytes_per_s(backward=True)
    etp = plan.dims.expert_tensor_parallel_size
    etp_s = 0.0
    if etp > 1:
        span = group_span(size=etp, stride=1, gpus_per_node=profile.gpus_per_node)
        for kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
            etp_s += collective_time_s(
                profile, collective=kind, message_bytes=traffic.etp_gather_bytes, span=span
            )
    ep = _ep_passes(model, plan, profile, groups, traffic)
    etp_sent = 2.0 * traffic.etp_gather_bytes * (etp - 1) / etp
    full = plan.recompute is Recompute.FULL
    return dataclasses.replace(
        times,
        forward_s=times.forward_s + route_fwd + launches,
        backward_input_s=times.backward_input_s + route_bwd + launches,
        recompute_s=times.recompute_s + (route_fwd + launches if full else 0.0),
        ep_forward_s=ep.forward_s + etp_s,
        ep_backward_s=ep.backward_s + etp_s,
        ep_recompute_s=ep.forward_s + etp_s if full else 0.0,
        ep_forward_bytes=ep.forward_bytes + etp_sent,
        ep_backward_bytes=ep.backward_bytes + etp_sent,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _EpPasses:
    """Seconds and bytes sent of a MoE layer's dispatch + combine in forward and backward."""

    forward_s: float
    backward_s: float
    forward_bytes: float
    backward_bytes: float


def _ep_passes(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    traffic: ExpertTraffic,
) -> _EpPasses:
    """Dispatch and combine of one MoE layer: two all-to-alls of ``dispatch_bytes`` a pass
    (Megatron-Core's alltoall dispatcher), or with ``MoeTokenDispatcher.DEEPEP`` over more
    than one node the node-deduplicated transfers of ``moe_layer.dedup_traffic``
    (``comm.deduplicated_all_to_all_time_s``), the forward dispatch in fp8 when the plan
    trains in fp8 or fp4 (``moe_layer.FP8_DISPATCH_ELEMENT_BYTES``), the rest in bf16."""
    span = groups.ep
    if plan.moe_token_dispatcher_type is not MoeTokenDispatcher.DEEPEP or span.num_nodes == 1:
        a2a = all_to_all_time_s(profile, message_bytes=traffic.dispatch_bytes, span=span)
        sent = 2.0 * traffic.dispatch_bytes * (plan.ep - 1) / plan.ep
        return _EpPasses(
            forward_s=2 * a2a, backward_s=2 * a2a, forward_bytes=sent, backward_bytes=sent
        )

    def one(element_bytes: float) -> tuple[float, float]:
        t = dedup_traffic(
            model,
            plan,
            num_nodes=span.num_nodes,
            members_per_node=span.members_per_node,
            element_bytes=element_bytes,
        )
        seconds = deduplicated_all_to_all_time_s(
            profile,
            network_bytes=t.network_bytes,
            nvlink_bytes=t.nvlink_bytes,
            message_bytes=traffic.dispatch_bytes,
            span=span,
        )
        return seconds, t.network_bytes + t.nvlink_bytes

    low = plan.precision in (Precision.FP8, Precision.FP4)
    dispatch = one(FP8_DISPATCH_ELEMENT_BYTES if low else TOKEN_ELEMENT_BYTES)
    bf16 = one(TOKEN_ELEMENT_BYTES)
    return _EpPasses(
        forward_s=dispatch[0] + bf16[0],
        backward_s=2 * bf16[0],
        forward_bytes=dispatch[1] + bf16[1],
        backward_bytes=2 * bf16[1],
    )
