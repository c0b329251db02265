"""Consistency rules of a :class:`plansim.specs.plan.ParallelPlan` beyond single fields:
schedule, uneven pipeline split, recompute, DP synchronisation and offload (called by its
``__post_init__``). Each raises ``SpecError`` naming the field and what it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plansim.errors import SpecError, choice_error, require_positive_int
from plansim.specs.plan_enums import (
    PER_LAYER_FETCH,
    AttentionKernel,
    DpSync,
    OffloadDevice,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)

if TYPE_CHECKING:
    from plansim.specs.plan import ParallelPlan


def check_schedule(plan: ParallelPlan) -> None:
    """vpp, pp and micro-batch count against the schedule (Megatron-LM's rules; ZB-H1:
    Qi et al. 2024 §2.1 needs a pipeline, pp > 1)."""
    name = plan.schedule.value
    if not plan.schedule.interleaved:
        if plan.vpp != 1:
            raise SpecError(
                f"schedule {name} needs vpp == 1 (got vpp={plan.vpp}); "
                f"use {Schedule.INTERLEAVED_1F1B.value}"
            )
        if plan.schedule is Schedule.ZB_H1 and plan.pp == 1:
            raise SpecError(
                f"schedule {name} needs pp > 1 (got pp=1): one stage has no pipeline "
                f"bubble for the deferred weight gradients to fill; use "
                f"{Schedule.ONE_F_ONE_B.value}"
            )
        return
    if plan.vpp == 1:
        raise SpecError(f"schedule {name} needs vpp > 1 (got vpp=1); use 1f1b")
    if plan.pp == 1:
        raise SpecError(f"schedule {name} needs pp > 1 (got pp=1, vpp={plan.vpp})")
    if plan.num_microbatches % plan.pp:
        raise SpecError(
            f"schedule {name} needs num_microbatches({plan.num_microbatches}) = "
            f"global_batch_size({plan.global_batch_size}) / (micro_batch_size"
            f"({plan.micro_batch_size}) * dp({plan.dp})) to be a multiple of pp({plan.pp})"
        )


def check_uneven_split(plan: ParallelPlan) -> None:
    """decoder_first/last_pipeline_num_layers: None or a positive integer, only with pp > 1;
    the account_for_* flags: booleans, only with pp > 1 and without the layer counts."""
    if (
        plan.account_for_embedding_in_pipeline_split is False
        and plan.account_for_loss_in_pipeline_split is False
        and plan.decoder_first_pipeline_num_layers is None
        and plan.decoder_last_pipeline_num_layers is None
    ):
        return  # an even split: the common case, checked fast
    for edge in ("embedding", "loss"):
        field = f"account_for_{edge}_in_pipeline_split"
        value = getattr(plan, field)
        if not isinstance(value, bool):
            raise choice_error(f"plan.{field}", value, [True, False])
        if value and plan.pp == 1:
            raise SpecError(f"plan.{field} needs pp > 1 (got pp=1)")
        if value and (
            plan.decoder_first_pipeline_num_layers is not None
            or plan.decoder_last_pipeline_num_layers is not None
        ):
            raise SpecError(
                f"plan.{field} does not combine with decoder_first/last_pipeline_num_layers "
                f"(Megatron-LM takes one way of splitting unevenly): choose one"
            )
    for edge in ("first", "last"):
        field = f"decoder_{edge}_pipeline_num_layers"
        value = getattr(plan, field)
        if value is None:
            continue
        require_positive_int(f"plan.{field}", value)
        if plan.pp == 1:
            raise SpecError(
                f"plan.{field}({value}) needs pp > 1 (got pp=1): one pipeline rank holds "
                f"every layer; leave it unset"
            )


def check_dp_sync(plan: ParallelPlan) -> None:
    """dp_sync and ps_servers (see the attributes); a parameter server replaces ZeRO."""
    if not isinstance(plan.dp_sync, DpSync):
        raise choice_error("plan.dp_sync", plan.dp_sync, [m.value for m in DpSync])
    if isinstance(plan.ps_servers, bool) or not isinstance(plan.ps_servers, int):
        raise SpecError(f"plan.ps_servers must be an integer >= 0, got {plan.ps_servers!r}")
    if plan.ps_servers < 0:
        raise SpecError(f"plan.ps_servers must be an integer >= 0, got {plan.ps_servers!r}")
    if plan.dp_sync is DpSync.RING and plan.ps_servers:
        raise SpecError(
            f"plan.ps_servers({plan.ps_servers}) needs dp_sync "
            f"{DpSync.PARAMETER_SERVER.value} (got {plan.dp_sync.value}); use 0 with ring"
        )
    if plan.dp_sync is DpSync.PARAMETER_SERVER and plan.zero_stage:
        raise SpecError(
            f"plan.dp_sync {DpSync.PARAMETER_SERVER.value} needs zero_stage 0 (got "
            f"{plan.zero_stage}): the servers hold the fp32 master weights and optimizer "
            f"states that ZeRO would shard (colocated servers, ps_servers=0, already shard "
            f"them over the dp * cp ranks like ZeRO-1)"
        )


def check_offload(plan: ParallelPlan) -> None:
    """Offload devices against the ZeRO stage (DeepSpeed ``offload_config.py``: optimizer
    offload "valid with stage 1, 2, and 3", parameter offload "valid only with stage 3";
    NVMe swapping exists only in the stage-3 optimizer, ZeRO-Infinity)."""
    if plan.offload_optimizer is plan.offload_param is OffloadDevice.NONE:
        return  # allowed with every stage and fetch (the planner's common case, checked fast)
    for field in ("offload_optimizer", "offload_param"):
        device = getattr(plan, field)
        allowed = offload_devices(field, plan.zero_stage)
        if device.value not in allowed:
            cpu_optimizer = field == "offload_optimizer" and device is OffloadDevice.CPU
            needs = "1, 2 or 3" if cpu_optimizer else "3"
            raise SpecError(
                f"plan.{field}={device.value} needs zero_stage {needs} (got zero_stage="
                f"{plan.zero_stage}); with zero_stage {plan.zero_stage} choose {field} "
                f"from: {', '.join(allowed)}"
            )
    offloaded = (plan.offload_optimizer, plan.offload_param) != (OffloadDevice.NONE,) * 2
    per_step = plan.zero3_param_fetch is Zero3ParamFetch.PER_STEP and plan.zero_stage == 3
    if per_step and offloaded:
        raise SpecError(
            "plan.zero3_param_fetch=per-step (FSDP2 under torch.distributed.pipelining) "
            "needs offload_optimizer none and offload_param none (DeepSpeed's offload); "
            f"got {plan.offload_optimizer.value} and {plan.offload_param.value}"
        )


def check_recompute(plan: ParallelPlan) -> None:
    """recompute_num_layers: None or a positive integer, only with recompute full (Megatron's
    block method recomputes whole layers); recompute_early_stop only with recompute full;
    recompute selective-op (torchtitan's per-op policy,
    which saves the fused attention kernel's output) only with flash attention."""
    if plan.recompute is Recompute.SELECTIVE_OP and plan.attention is not AttentionKernel.FLASH:
        raise SpecError(
            f"plan.recompute {Recompute.SELECTIVE_OP.value} needs attention "
            f"{AttentionKernel.FLASH.value} (got {plan.attention.value}): torchtitan's per-op "
            f"policy saves the fused attention kernel's output"
        )
    if plan.recompute_early_stop and plan.recompute is not Recompute.FULL:
        raise SpecError(
            f"plan.recompute_early_stop needs recompute {Recompute.FULL.value} (got "
            f"{plan.recompute.value}): it is how torch's checkpoint of a whole layer ends"
        )
    if plan.recompute_num_layers is None:
        return
    require_positive_int("plan.recompute_num_layers", plan.recompute_num_layers)
    if plan.recompute is not Recompute.FULL:
        raise SpecError(
            f"plan.recompute_num_layers({plan.recompute_num_layers}) needs recompute "
            f"{Recompute.FULL.value} (got {plan.recompute.value}): Megatron-LM's block "
            f"method recomputes whole layers"
        )


def check_tp_comm_overlap(plan: ParallelPlan) -> None:
    """TP communication overlap splits sequence-parallel all-gathers and reduce-scatters:
    Megatron-LM refuses ``--tp-comm-overlap`` without ``--sequence-parallel`` (and tp > 1)."""
    if plan.tp_comm_overlap and not plan.sequence_parallel:
        raise SpecError(
            f"plan.tp_comm_overlap needs sequence_parallel and tp > 1 (got tp={plan.tp}, "
            "sequence_parallel=False), as Megatron-LM's --tp-comm-overlap does"
        )


def check_overlap_param_gather(plan: ParallelPlan) -> None:
    """Megatron-LM overlaps the parameter all-gather only for its distributed optimizer
    (ZeRO 1/2 here) and only with ``--overlap-grad-reduce``."""
    if plan.overlap_param_gather and not (plan.zero_stage in (1, 2) and plan.overlap_grad_reduce):
        raise SpecError(
            "plan.overlap_param_gather needs zero_stage 1 or 2 and overlap_grad_reduce (got "
            f"zero_stage={plan.zero_stage}, overlap_grad_reduce={plan.overlap_grad_reduce}), "
            "as Megatron-LM's --overlap-param-gather"
        )


def check_grad_reduce_in_bf16(plan: ParallelPlan) -> None:
    """bf16 gradient reduction replaces an fp32 main-gradient buffer, which only the bf16 and
    the quantized (fp8, fp4) mixed-precision modes keep."""
    allowed = (Precision.BF16, Precision.FP8, Precision.FP4)
    if plan.grad_reduce_in_bf16 and plan.precision not in allowed:
        raise SpecError(
            f"plan.grad_reduce_in_bf16 needs precision "
            f"{', '.join(p.value for p in allowed)} (got {plan.precision.value}: its "
            "gradients are not kept in an fp32 buffer)"
        )


def check_torch_fsdp(plan: ParallelPlan) -> None:
    """PyTorch FSDP is a ZeRO-3 implementation here: stage 3, its own fetch (layer-prefetch,
    or layer-sync on a CPU device), none of DeepSpeed's offload paths."""
    if not plan.use_torch_fsdp2:
        return
    problems = []
    if plan.zero_stage != 3:
        problems.append(f"zero_stage 3 (got {plan.zero_stage})")
    if plan.zero3_param_fetch is Zero3ParamFetch.PER_TENSOR_SYNC:
        problems.append("zero3_param_fetch layer-prefetch or layer-sync (got per-tensor-sync)")
    if (plan.offload_optimizer, plan.offload_param) != (OffloadDevice.NONE, OffloadDevice.NONE):
        problems.append(
            "no offload (got offload_optimizer="
            f"{plan.offload_optimizer.value}, offload_param={plan.offload_param.value})"
        )
    if problems:
        raise SpecError(f"plan.use_torch_fsdp2 needs {'; '.join(problems)}")


def check_reshard_after_forward(plan: ParallelPlan) -> None:
    """Keeping units gathered between forward and backward (``reshard_after_forward`` False)
    is PyTorch FSDP's knob: ZeRO-3 gathering per layer (layer-prefetch or layer-sync)."""
    per_layer = plan.zero3_param_fetch in PER_LAYER_FETCH
    if plan.reshard_after_forward or (plan.zero_stage == 3 and per_layer):
        return
    raise SpecError(
        "plan.reshard_after_forward=False needs zero_stage 3 with zero3_param_fetch "
        f"layer-prefetch or layer-sync (got zero_stage {plan.zero_stage}, zero3_param_fetch "
        f"{plan.zero3_param_fetch.value})"
    )


def check_hsdp(plan: ParallelPlan) -> None:
    """Hybrid sharding (``dp_shard``, see :class:`ParallelPlan`): :func:`hsdp_problems`."""
    shard = plan.dp_shard
    if shard is None:
        return
    require_positive_int("plan.dp_shard", shard)
    problems = hsdp_problems(
        dp=plan.dp,
        cp=plan.cp,
        dp_shard=shard,
        zero_stage=plan.zero_stage,
        offload=(plan.offload_optimizer, plan.offload_param),
        fetch=plan.zero3_param_fetch,
    )
    if problems:
        raise SpecError(f"plan.dp_shard({shard}) needs {'; '.join(problems)}")


def hsdp_problems(
    *,
    dp: int,
    cp: int,
    dp_shard: int,
    zero_stage: int,
    offload: tuple[OffloadDevice, OffloadDevice],
    fetch: Zero3ParamFetch,
) -> list[str]:
    """What hybrid sharding over ``dp_shard`` of ``dp`` ranks lacks (empty: allowed): ZeRO
    1-3 over shard groups of dp_shard * cp >= 2 ranks, dp_shard a divisor of dp below it, no
    offload (DeepSpeed's ZeRO-Offload / Infinity shard over the whole group), no
    per-tensor-sync fetch. The planner asks it of its candidates (``planner.hsdp``)."""
    problems = []
    if zero_stage == 0:
        problems.append("zero_stage 1, 2 or 3 (got 0)")
    if dp % dp_shard or dp_shard >= dp:
        problems.append(
            f"a divisor of dp({dp}) below it (dp_shard = dp is full sharding: leave dp_shard unset)"
        )
    if dp_shard * cp < 2:
        problems.append(f"a shard group of at least 2 ranks (dp_shard * cp = {dp_shard * cp})")
    if offload != (OffloadDevice.NONE, OffloadDevice.NONE):
        problems.append("no offload")
    if fetch is Zero3ParamFetch.PER_TENSOR_SYNC:
        problems.append("zero3_param_fetch layer-prefetch or layer-sync (got per-tensor-sync)")
    return problems


def offload_devices(field: str, zero_stage: int) -> list[str]:
    """Devices ``field`` (``offload_optimizer`` or ``offload_param``) allows with
    ``zero_stage`` (DeepSpeed's rules, see :class:`ParallelPlan`)."""
    if zero_stage == 3:
        return [d.value for d in OffloadDevice]
    if field == "offload_optimizer" and zero_stage >= 1:
        return [OffloadDevice.NONE.value, OffloadDevice.CPU.value]
    return [OffloadDevice.NONE.value]


def check_bf16_layers(plan: ParallelPlan) -> None:
    """num_layers_at_start/end_in_bf16: integers >= 0, non-zero only with a quantized
    precision (Megatron-LM keeps layers in bf16 only out of fp8 or fp4 training)."""
    start, end = plan.num_layers_at_start_in_bf16, plan.num_layers_at_end_in_bf16
    if type(start) is int and type(end) is int and start == end == 0:
        return  # the common case, checked fast
    fields = ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")
    for field in fields:
        value = getattr(plan, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(f"plan.{field} must be an integer >= 0, got {value!r}")
    quantized = (Precision.FP8, Precision.FP4)
    if any(getattr(plan, f) for f in fields) and plan.precision not in quantized:
        raise SpecError(
            f"plan.num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 "
            f"({plan.num_layers_at_start_in_bf16} / {plan.num_layers_at_end_in_bf16}) need "
            f"precision fp8 or fp4 (got {plan.precision.value}): the other layers must be "
            f"quantized for some to stay in bf16"
        )
