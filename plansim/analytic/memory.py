"""Per-rank memory of a plan: model states, activations, transients, reserve (pure).

Model states follow the ZeRO paper (Rajbhandari et al. SC20, §5: stage 1 shards optimizer
states over DP, stage 2 also gradients, stage 3 also parameters) with the bytes per parameter
of Megatron-LM mixed precision (M02, ``docs/user-guide/features/dist_optimizer.md``):
fp16 params/grads: 2 + 2 + 16 (fp32 main params, fp32 grad copy, Adam m, v); bf16 params with
fp32 main grads: 2 + 4 + 12. Activations: ``plansim.analytic.activations`` times the
micro-batches in flight on the rank (GPipe: m; 1F1B: min(p - r, m), so stage 0 holds the
equivalent of all L layers, Korthikanti §4.2; interleaved 1F1B: L(1 + (p - 1)/(p v)) on
stage 0, Korthikanti §4.2.3; ``plansim.analytic.stored_activations``), plus the embedding
output on the first stage and logits on the last (Korthikanti §4.3). The profile's reserve
covers CUDA context, NCCL buffers and fragmentation.

Context parallelism (cp): activations, logits and the embedding output are those of the
rank's s/cp tokens (1/cp of the cp = 1 bytes); weights are replicated over cp, and the ZeRO
shards are taken over the dp * cp ranks that reduce gradients together (Megatron-LM's
distributed optimizer shards over ``get_data_parallel_group(with_context_parallel=True)``).

Parameter server (``plan.dp_sync``, ``plansim.analytic.param_server``): the servers hold the
fp32 master weights and Adam states; a colocated worker serves 1/(dp * cp) of them (as
ZeRO-1), a worker with dedicated servers none. Weights and gradients stay whole.

Offload (``plan.offload_optimizer`` / ``offload_param``, DeepSpeed ZeRO-Offload and
ZeRO-Infinity): the offloaded states leave the GPU (``model_state_bytes``); what the host
then holds, and the host-memory check, are in ``plansim.analytic.offload``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from plansim.analytic.activations import layer_activations, ring_kv_chunk_bytes
from plansim.analytic.memo import Memo, fields_getter, memoised
from plansim.analytic.moe_layer import dense_proxy, rank_parameter_split
from plansim.analytic.params import rank_parameters as dense_rank_parameters
from plansim.analytic.ranks import dp_cp_size, zero_shard_size
from plansim.analytic.stored_activations import (
    activation_key,
    saved_gemm_input_bytes,
    stored_activation_bytes,
)
from plansim.analytic.zero3 import gathered_bytes, unsharded_grad_bytes
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import stage_bf16_layers
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import (
    DpSync,
    Framework,
    OffloadDevice,
    ParallelPlan,
    Precision,
)
from plansim.units import bytes_to_gib


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytesPerParam:
    """Bytes per parameter of each model state before sharding."""

    param: float
    grad: float
    optimizer: float


def state_bytes_per_param(precision: Precision) -> StateBytesPerParam:
    """Megatron-LM mixed-precision Adam bytes per parameter (M02 dist_optimizer table).

    fp16: 2 (param) + 2 (grad) + 16 (fp32 param, fp32 grad, m, v) = 20;
    bf16, fp8 and fp4 (bf16 weights): 2 + 4 (fp32 main grad) + 12 (fp32 param, m, v) = 18;
    fp32 (no mixed precision): 4 (param) + 4 (grad) + 8 (Adam m, v; no master copy) = 16,
    the ZeRO paper's (Rajbhandari et al. SC20 §3.1) Adam states without the fp32 copy it
    counts for mixed precision (K = 12 = 4 + 4 + 4 there, K = 8 here).
    """
    if precision is Precision.FP32:
        return StateBytesPerParam(param=4.0, grad=4.0, optimizer=8.0)
    if precision is Precision.FP16:
        return StateBytesPerParam(param=2.0, grad=2.0, optimizer=16.0)
    return StateBytesPerParam(param=2.0, grad=4.0, optimizer=12.0)


def plan_state_bytes(plan: ParallelPlan) -> StateBytesPerParam:
    """:func:`state_bytes_per_param` of the plan's precision, with 2-byte gradients when the
    plan reduces them in bf16 (``plan.grad_reduce_in_bf16``, Megatron-LM
    ``--grad-reduce-in-bf16``: no fp32 main-gradient buffer)."""
    per_param = state_bytes_per_param(plan.precision)
    return replace(per_param, grad=2.0) if plan.grad_reduce_in_bf16 else per_param


#: Frameworks whose bf16 training runs DeepSpeed's ``BF16_Optimizer`` (ZeRO 0/1).
_DEEPSPEED_FRAMEWORKS = frozenset({Framework.DEEPSPEED, Framework.MEGATRON_DEEPSPEED})
#: Bytes per parameter of the bf16 gradients (``param.grad``) that DeepSpeed's BF16_Optimizer
#: keeps beside its fp32 accumulation buffer.
BF16_LP_GRAD_BYTES = 2.0


def memory_state_bytes(plan: ParallelPlan) -> StateBytesPerParam:
    """Bytes per parameter the rank holds at its peak: :func:`plan_state_bytes`, plus, for
    bf16 training on DeepSpeed (its pipeline engine or Megatron-DeepSpeed) with ZeRO 0 or 1,
    the 16-bit gradients autograd writes: DeepSpeed's ``BF16_Optimizer`` accumulates them
    into its fp32 gradient buffer after each micro-batch's backward but keeps them allocated
    until the step (``PipelineEngine._exec_backward_pass``: ``update_hp_grads(
    clear_lp_grads=False)``; ``clear_lp_grads`` runs in ``step``), so 2 + 4 bytes of gradient
    per parameter, unsharded (BigScience's BLOOM search: the BF16 optimizer "is more memory
    heavy ... not sharded across gpus", ``train/tr11-176B-ml/chronicles-prequel.md``).
    Memory only: the traffic and time of the gradients stay :func:`plan_state_bytes`'s."""
    per_param = plan_state_bytes(plan)
    if (
        plan.execution.framework in _DEEPSPEED_FRAMEWORKS
        and plan.precision is Precision.BF16
        and plan.zero_stage <= 1
        and not plan.grad_reduce_in_bf16
    ):
        return replace(per_param, grad=per_param.grad + BF16_LP_GRAD_BYTES)
    return per_param


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one rank."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float


def model_state_bytes(
    num_params: float,
    *,
    dp: int,
    zero_stage: int,
    per_param: StateBytesPerParam,
    offload_optimizer: OffloadDevice = OffloadDevice.NONE,
    offload_param: OffloadDevice = OffloadDevice.NONE,
) -> ModelStates:
    """Model-state bytes of ``num_params`` parameters on one DP rank's GPU (ZeRO paper §5).

    Baseline (stage 0) keeps everything; stage >= 1 divides optimizer states by dp,
    stage >= 2 also gradients, stage 3 also parameters. With per_param = (2, 2, 12) this is
    the ZeRO paper's 4*Psi + K*Psi/N_d, 2*Psi + (2+K)*Psi/N_d and (4+K)*Psi/N_d.

    Offload (DeepSpeed ``estimate_zero2/3_model_states_mem_needs``, reference memory.md §4):
    with ``offload_optimizer`` the optimizer states (fp32 master, Adam m and v) and the fp32
    gradients leave the GPU; the 16-bit gradients stay only with stage 1 (unsharded, 2 B per
    parameter: stage 1 does not partition gradients), stages 2/3 copy each reduced shard to
    the host (ZeRO-Offload §4.1), so the estimator's GPU bytes are 2*Psi (stage 2) and
    4*Psi_L + 2*Psi/N (stage 3). With ``offload_param`` (stage 3) the 16-bit parameter
    shards leave the GPU too; the gathered layers (``transient_bytes``) stay: 4*Psi_L.
    """
    opt_div = dp if zero_stage >= 1 else 1
    grad_div = dp if zero_stage >= 2 else 1
    param_div = dp if zero_stage >= 3 else 1
    weights = num_params * per_param.param / param_div
    gradients = num_params * per_param.grad / grad_div
    optimizer = num_params * per_param.optimizer / opt_div
    if offload_optimizer is not OffloadDevice.NONE:
        optimizer = 0.0
        gradients = num_params * per_param.param if zero_stage < 2 else 0.0
    if offload_param is not OffloadDevice.NONE:
        weights = 0.0
    return ModelStates(weights_bytes=weights, gradients_bytes=gradients, optimizer_bytes=optimizer)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Peak memory of one pipeline rank, by component (bytes)."""

    rank: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    reserve_bytes: float

    @property
    def total_bytes(self) -> float:
        """Sum of all components."""
        return sum(self.as_dict().values())

    @property
    def static_bytes(self) -> float:
        """Everything except stored activations (what does not depend on micro-batches).

        Summed from the other components, so it does not depend on the activations (not
        even in rounding): ranks with equal states get bit-identical static bytes.
        """
        return sum(v for k, v in self.as_dict().items() if k != "activations")

    def as_dict(self) -> dict[str, float]:
        """Path-keyed components in bytes, largest first order fixed for reports."""
        return {
            "activations": self.activations_bytes,
            "optimizer": self.optimizer_bytes,
            "weights": self.weights_bytes,
            "gradients": self.gradients_bytes,
            "transient": self.transient_bytes,
            "reserve": self.reserve_bytes,
        }

    def describe(self, *, capacity_bytes: float) -> str:
        """'stage 0 needs 93.1 GiB, 80.0 GiB available: activations 51.2, optimizer 28.0, ...';
        a need that rounds to the capacity gets more digits ('needs 80.02 GiB, 80.0 GiB')."""
        parts = ", ".join(f"{k} {bytes_to_gib(v):.1f}" for k, v in self.as_dict().items())
        need, have = bytes_to_gib(self.total_bytes), bytes_to_gib(capacity_bytes)
        digits = 1  # enough to show a need just above the capacity as above it
        while digits < 4 and f"{need:.{digits}f}" == f"{have:.{digits}f}":
            digits += 1
        return f"stage {self.rank} needs {need:.{digits}f} GiB, {have:.1f} GiB available: {parts}"


def rank_parameters(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> float:
    """Parameters held by pipeline rank ``rank`` on one GPU: ``params.rank_parameters`` for
    a dense model; with experts, MLA or MTP modules ``moe_layer.rank_parameter_split`` (the
    routed experts split over ep x etp, MTP modules on the last rank)."""
    if is_dense(model):
        return dense_rank_parameters(model, plan, rank=rank)
    return rank_parameter_split(model, plan, rank=rank).total


#: Plan fields a rank's parameter split depends on (``moe_layer.rank_parameter_split``): the
#: schedule sets which stages a rank holds (loop, V or dual placement), the layout string
#: how many layers each stage has.
_SPLIT_FIELDS = fields_getter(
    (
        "tp", "pp", "vpp", "ep", "etp", "decoder_first_pipeline_num_layers",
        "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split", "schedule", "pipeline_model_parallel_layout",
    )
)  # fmt: skip


def rank_model_states(
    model: ModelSpec, plan: ParallelPlan, *, rank: int, memo: Memo | None = None
) -> ModelStates:
    """Weights, gradients and optimizer states of pipeline rank ``rank`` on one GPU
    (:func:`model_state_bytes` of :func:`rank_parameters` sharded over the ZeRO shard group;
    with experts, their part sharded over edp instead: Megatron-Core's distributed
    optimizer shards expert states over the expert data-parallel group, arXiv:2504.14960
    §3). ``memo``: a search's cache (one model) for the parameter split."""
    fsdp = plan.use_torch_fsdp2  # PyTorch FSDP keeps fp32 training's states (plan docstring)
    per_param = state_bytes_per_param(Precision.FP32) if fsdp else memory_state_bytes(plan)

    def states(params: float, dp: int) -> ModelStates:
        return model_state_bytes(
            params,
            dp=dp,
            zero_stage=plan.zero_stage,
            per_param=per_param,
            offload_optimizer=plan.offload_optimizer,
            offload_param=plan.offload_param,
        )

    if is_dense(model):
        params = memoised(
            memo,
            ("rank_parameters", rank, *_SPLIT_FIELDS(plan)),
            lambda: dense_rank_parameters(model, plan, rank=rank),
        )
        return states(params, zero_shard_size(plan))
    split = memoised(
        memo,
        ("rank_parameter_split", rank, *_SPLIT_FIELDS(plan)),
        lambda: rank_parameter_split(model, plan, rank=rank),
    )
    dense, expert = states(split.dense, zero_shard_size(plan)), states(split.expert, plan.dims.edp)
    return ModelStates(
        weights_bytes=dense.weights_bytes + expert.weights_bytes,
        gradients_bytes=dense.gradients_bytes + expert.gradients_bytes,
        optimizer_bytes=dense.optimizer_bytes + expert.optimizer_bytes,
    )


def rank_memory(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    rank: int,
    memo: Memo | None = None,
) -> MemoryBreakdown:
    """Peak memory of pipeline rank ``rank`` (one GPU) under ``plan``; ZeRO shards over
    dp * cp ranks (with hybrid sharding, ``plan.dp_shard``, over dp_shard * cp). ``memo``:
    a search's cache (one model) for the activation pricing; same result without."""
    states = rank_model_states(model, plan, rank=rank, memo=memo)
    if plan.dp_sync is DpSync.PARAMETER_SERVER:  # the servers hold the optimizer states:
        # 1/(dp * cp) of them on a colocated worker (as ZeRO-1), none with dedicated servers
        share = 0.0 if plan.ps_servers else states.optimizer_bytes / dp_cp_size(plan)
        states = replace(states, optimizer_bytes=share)
    return MemoryBreakdown(
        rank=rank,
        weights_bytes=states.weights_bytes,
        gradients_bytes=states.gradients_bytes,
        optimizer_bytes=states.optimizer_bytes,
        activations_bytes=stored_activation_bytes(model, plan, rank=rank, memo=memo),
        transient_bytes=transient_bytes(model, plan, rank=rank, memo=memo),
        reserve_bytes=profile.memory_reserve_bytes,
    )


def transient_bytes(
    model: ModelSpec, plan: ParallelPlan, *, rank: int, memo: Memo | None = None
) -> float:
    """Short-lived buffers at the peak: recompute working set, logits, ZeRO-3 gathered layer,
    context-parallel ring buffers.

    Full recompute re-materialises one layer (Korthikanti §5); the last rank holds fp32
    logits 4*s*b*V/t for the cross-entropy plus the final-norm and output-layer inputs
    (Korthikanti §4.3); ZeRO-3 its gathered parameters (``zero3.gathered_bytes``; with
    ``per-step`` all its parameters and accumulated gradients, unsharded), ZeRO-2
    the 16-bit gradients of the layers it is reduce-scattering (``zero3.unsharded_grad_bytes``,
    the dtype ``plansim.analytic.zero_segments`` reduces them in). With cp,
    s is the rank's s/cp tokens, and one layer's ring attention holds max(cp, 4) K/V chunks
    (``ring_kv_chunk_bytes``): Transformer Engine's ``AttnFuncWithCPAndKVP2P`` keeps every
    received chunk until the layer's forward ends, and its backward double-buffers (K, V,
    dK, dV) = 2 x 2 chunks. ``memo``: a search's cache (one model) for the part before
    ZeRO-3, which depends only on the fields of ``stored_activations.activation_key``.
    """
    key = ("transient", rank, *activation_key(plan))
    total = memoised(memo, key, lambda: _working_bytes(model, plan, rank=rank))
    per_param = plan_state_bytes(plan)
    if plan.zero_stage == 3:
        total += gathered_bytes(
            model, plan, rank=rank, param_bytes=per_param.param, grad_bytes=per_param.grad
        )
    total += unsharded_grad_bytes(model, plan, grad_bytes=per_param.param)  # ZeRO-2 only
    return total


def _working_bytes(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> float:
    """:func:`transient_bytes` without the ZeRO-3 gathered parameters (a model with experts
    or MLA: its dense proxy's, ``moe_layer.dense_proxy``)."""
    model = dense_proxy(model, moe_layer=model.moe is not None)
    s, b, h = model.seq_length / plan.cp, plan.micro_batch_size, model.hidden_size
    all_ends = stage_bf16_layers(model.num_layers, plan)
    ends = [all_ends[s] for s in plan.stages_of_rank(rank)]
    bf16_here = any(head or tail for head, tail in ends)  # its working set is the larger
    act = layer_activations(
        model,
        micro_batch_size=b,
        tp=plan.tp,
        sequence_parallel=plan.sequence_parallel,
        recompute=plan.recompute,
        flash=plan.attention.fused,
        cp=plan.cp,
        gemm_input_bytes=2.0 if bf16_here else saved_gemm_input_bytes(plan),
    )
    total = act.working_bytes
    chunk = ring_kv_chunk_bytes(model, micro_batch_size=b, tp=plan.tp, cp=plan.cp)
    total += max(plan.cp, 4) * chunk
    if plan.rank_holds_stage(rank, plan.num_stages - 1):
        total += 4.0 * s * b * model.vocab_size / plan.tp + 4.0 * s * b * h / plan.tp
    return total


def worst_rank_memory(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, memo: Memo | None = None
) -> MemoryBreakdown:
    """The pipeline rank with the highest peak (ties: the lowest rank). Only the edge ranks
    can peak with an even split (rank 0 keeps the most micro-batches in flight, the last
    rank holds the logits); with an uneven one rank 1 too, the middle rank with the most
    micro-batches in flight; with bf16 layers ranks 1 and pp - 2 too, where they spill.
    ``memo`` as :func:`rank_memory`."""
    candidates = {0, plan.pp - 1}
    if plan.uneven_pipeline and plan.pp > 2:
        candidates.add(1)
    if plan.num_layers_at_start_in_bf16 or plan.num_layers_at_end_in_bf16:
        candidates |= {min(1, plan.pp - 1), max(0, plan.pp - 2)}  # bf16 layers spill over
    per_rank = [rank_memory(model, plan, profile, rank=r, memo=memo) for r in sorted(candidates)]
    return max(per_rank, key=lambda m: (m.total_bytes, -m.rank))
