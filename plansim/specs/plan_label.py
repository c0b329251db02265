"""A plan's compact one-line label (pure): the knobs that differ from the defaults, in a
fixed order, as the planner's tables, the back-test and the traces print them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plansim.specs.plan_enums import DdpImpl, DpSync, OffloadDevice, Zero3ParamFetch

if TYPE_CHECKING:
    from plansim.specs.plan import ParallelPlan


def plan_label(plan: ParallelPlan) -> str:
    """Compact one-line description, e.g. 'tp8 pp16 dp8 mbs1 zero1 selective sp 1f1b' or
    'tp8 pp8 dp1 vpp3 mbs1 zero0 full interleaved-1f1b' (vpp shown when > 1); a
    parameter server adds 'ps' (colocated) or 'ps4' (4 dedicated servers)."""
    parts = _layout_parts(plan) + _framework_parts(plan) + _sharding_parts(plan)
    return " ".join(parts + _split_parts(plan))


def _layout_parts(plan: ParallelPlan) -> list[str]:
    """Sizes, micro-batch, ZeRO stage, recompute, SP and the schedule."""
    parts = [f"tp{plan.tp}", f"pp{plan.pp}", f"dp{plan.dp}"]
    if plan.cp > 1:
        parts.append(f"cp{plan.cp}")
    if plan.vpp > 1:
        parts.append(f"vpp{plan.vpp}")
    parts += [f"mbs{plan.micro_batch_size}", f"zero{plan.zero_stage}", plan.recompute_label]
    if plan.sequence_parallel:
        parts.append("sp-overlap" if plan.tp_comm_overlap else "sp")
    parts.append(plan.schedule.value)
    return parts


def _framework_parts(plan: ParallelPlan) -> list[str]:
    """Overlap flags, gradient accumulation and reduction, pipeline sends, attention kernel
    and the DP synchronisation (parameter server or DDP implementation)."""
    parts = []
    if plan.overlap_p2p_comm:
        parts.append("overlap-p2p")
    if plan.overlap_grad_reduce:
        parts.append("overlap-grad")
    if plan.overlap_param_gather:
        parts.append("overlap-param")
    if not plan.gradient_accumulation_fusion:
        parts.append("unfused-grad-acc")
    if not plan.fused_elementwise:
        parts.append("eager-ops")
    if not plan.persist_layer_norm:
        parts.append("no-persist-ln")
    if plan.grad_reduce_in_bf16:
        parts.append("bf16-grads")
    if plan.pp > 1 and plan.tp > 1 and not (plan.scatter_gather_p2p or plan.sequence_parallel):
        parts.append("full-p2p")
    if plan.attention.label:
        parts.append(plan.attention.label)
    if plan.dp_sync is DpSync.PARAMETER_SERVER:
        parts.append(f"ps{plan.ps_servers or ''}")
    elif plan.zero_stage < 2 and plan.ddp_impl is not DdpImpl.MEGATRON_CORE:
        parts.append(f"ddp-{plan.ddp_impl.value}")
    return parts


def _sharding_parts(plan: ParallelPlan) -> list[str]:
    """Offload, ZeRO-3 parameter fetch, PyTorch FSDP, resharding and hybrid sharding."""
    parts = []
    if plan.offload_optimizer is not OffloadDevice.NONE:
        parts.append(f"offload-opt-{plan.offload_optimizer.value}")
    if plan.offload_param is not OffloadDevice.NONE:
        parts.append(f"offload-param-{plan.offload_param.value}")
    if plan.zero_stage == 3 and plan.zero3_param_fetch is not Zero3ParamFetch.LAYER_PREFETCH:
        parts.append(f"zero3-{plan.zero3_param_fetch.value}")
    if plan.use_torch_fsdp2:
        parts.append("torch-fsdp")
    if not plan.reshard_after_forward:
        parts.append("no-reshard")
    if plan.dp_shard is not None:  # HSDP, or a partial distributed optimizer
        parts.append(f"{'hsdp' if plan.zero_stage == 3 else 'shard'}{plan.dp_shard}")
    return parts


def _split_parts(plan: ParallelPlan) -> list[str]:
    """An uneven pipeline split and the bf16 layers at the ends (fp8 / fp4 plans)."""
    parts = []
    if plan.decoder_first_pipeline_num_layers is not None:
        parts.append(f"first-stage-{plan.decoder_first_pipeline_num_layers}")
    if plan.decoder_last_pipeline_num_layers is not None:
        parts.append(f"last-stage-{plan.decoder_last_pipeline_num_layers}")
    if plan.account_for_embedding_in_pipeline_split:
        parts.append("embedding-in-split")
    if plan.account_for_loss_in_pipeline_split:
        parts.append("loss-in-split")
    if plan.num_layers_at_start_in_bf16 or plan.num_layers_at_end_in_bf16:
        start, end = plan.num_layers_at_start_in_bf16, plan.num_layers_at_end_in_bf16
        parts.append(f"bf16-layers-{start}-{end}")
    return parts
