"""ParallelPlan: one training layout, composed of the plan vocabulary's groups (pure).

A plan is :class:`~plansim.specs.parallel_dims.ParallelDims` (the degrees) plus option groups,
each a frozen dataclass in its own module: :class:`~plansim.specs.batch.BatchOptions`,
:class:`~plansim.specs.sharding.ShardingOptions` (ZeRO / FSDP / HSDP / offload / parameter
servers), :class:`~plansim.specs.recompute.RecomputeOptions`,
:class:`~plansim.specs.pipeline.PipelineOptions` (schedule and layer split),
:class:`~plansim.specs.overlap.OverlapOptions`,
:class:`~plansim.specs.precision.MixedPrecisionOptions` and the
:class:`~plansim.specs.execution.ExecutionSpec` (framework, version and its implementation
facts). Each group checks its own fields; the plan checks the rules that span groups.

Every field of every group is also readable on the plan under its own name (``plan.tp``,
``plan.zero_stage``, ``plan.schedule``: Megatron-LM's argument names where one exists); the
names are unique across groups (:data:`PLAN_FIELDS`). :func:`plan_from_fields` builds a plan from
those flat names and :meth:`ParallelPlan.with_fields` changes some of them: the one builder
behind the command-line flags, the plan files and the planner's enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from plansim.errors import SpecError
from plansim.specs.batch import BatchOptions
from plansim.specs.choice_enum import parse_enum
from plansim.specs.execution import (
    AttentionKernel,
    DdpImpl,
    ExecutionSpec,
    Framework,
    MoeTokenDispatcher,
)
from plansim.specs.overlap import OverlapOptions
from plansim.specs.parallel_dims import ParallelDims
from plansim.specs.pipeline import PipelineOptions, Schedule
from plansim.specs.pipeline_layout import layout_stage_layers
from plansim.specs.precision import MixedPrecisionOptions, Precision
from plansim.specs.recompute import Recompute, RecomputeOptions
from plansim.specs.sharding import (
    DpSync,
    OffloadDevice,
    ShardingOptions,
    Zero3ParamFetch,
    hsdp_problems,
    offload_devices,
)
from plansim.specs.stage_placement import StagePlacement, plan_stages_of_rank, rank_of_stage

__all__ = [
    "GROUPS",
    "PLAN_FIELDS",
    "AttentionKernel",
    "BatchOptions",
    "DdpImpl",
    "DpSync",
    "ExecutionSpec",
    "Framework",
    "MixedPrecisionOptions",
    "OffloadDevice",
    "OverlapOptions",
    "ParallelDims",
    "ParallelPlan",
    "PipelineOptions",
    "Precision",
    "Recompute",
    "RecomputeOptions",
    "Schedule",
    "ShardingOptions",
    "Zero3ParamFetch",
    "offload_devices",
    "parse_enum",
    "plan_from_fields",
]

#: The plan's groups: (attribute of :class:`ParallelPlan`, group class), in file order.
GROUPS: tuple[tuple[str, type], ...] = (
    ("dims", ParallelDims),
    ("batch", BatchOptions),
    ("sharding", ShardingOptions),
    ("recomputation", RecomputeOptions),
    ("pipeline", PipelineOptions),
    ("overlap", OverlapOptions),
    ("mixed_precision", MixedPrecisionOptions),
    ("execution", ExecutionSpec),
)
#: Each flat field name -> the group attribute that holds it.
FIELD_GROUP: dict[str, str] = {
    name: attr
    for attr, cls in GROUPS
    for name in cls.__dataclass_fields__  # type: ignore[attr-defined]
}
#: Every plan field by its flat name, in a fixed order (memo keys, compact rows).
PLAN_FIELDS: tuple[str, ...] = (
    "dp", "tp", "pp", "cp", "vpp", "micro_batch_size", "global_batch_size", "zero_stage",
    "recompute", "sequence_parallel", "schedule", "precision", "attention", "overlap_p2p_comm",
    "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather",
    "gradient_accumulation_fusion", "fused_elementwise", "grad_reduce_in_bf16",
    "persist_layer_norm", "scatter_gather_p2p", "dp_sync", "ps_servers", "ddp_impl",
    "offload_optimizer", "offload_param", "zero3_param_fetch", "use_torch_fsdp2",
    "reshard_after_forward", "dp_shard", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout",
    "recompute_num_layers", "recompute_early_stop", "recompute_modules",
    "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "ep", "etp",
    "expert_load_imbalance", "framework", "framework_version", "moe_token_dispatcher_type",
)  # fmt: skip
#: The dotted path of each flat field (``"tp"`` -> ``"dims.tp"``), for ``operator.attrgetter``.
FIELD_PATHS: dict[str, str] = {name: f"{FIELD_GROUP[name]}.{name}" for name in PLAN_FIELDS}
_REQUIRED = ("dp", "tp", "pp", "micro_batch_size", "global_batch_size")
_GROUP_TYPES = tuple(cls for _, cls in GROUPS)


# The option groups a plan takes when not given: one shared frozen instance each.
_NO_SHARDING = ShardingOptions()
_NO_RECOMPUTE = RecomputeOptions()
_ONE_F_ONE_B = PipelineOptions()
_NO_OVERLAP = OverlapOptions()
_BF16 = MixedPrecisionOptions()
_MEGATRON_CORE = ExecutionSpec()


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelPlan:
    """A parallel layout for data (dp), tensor (tp), pipeline (pp), context (cp) and expert
    (ep) parallelism, with its batch, sharding, recompute, schedule, overlap, precision and
    execution options.

    Rank order is tp -> cp -> dp -> pp (Megatron-LM ``RankGenerator`` default), so a TP group
    holds consecutive ranks and stays inside a node when tp <= GPUs per node. Context
    parallelism (Llama 3, Dubey et al. 2024 §3.3.2) gives each of cp ranks s/cp tokens of
    every sequence and runs attention as a ring (Liu et al. 2023); weights are replicated
    over cp and gradients reduced over the dp * cp ranks (``plansim.analytic.ranks``). The
    micro-batch count does not depend on cp (the cp ranks of a replica share its sequences).

    Attributes:
        dims, batch, sharding, recomputation, pipeline, overlap, mixed_precision, execution:
            the groups (:data:`GROUPS`); each field's meaning is documented on its group.

    Raises:
        SpecError: a group is not of its class, or a rule across groups fails: the global
            batch does not split into micro-batches over dp, overlap_p2p_comm without
            interleaving, tp_comm_overlap without sequence parallelism, overlap_param_gather
            without ZeRO-1/2 and overlap_grad_reduce, hybrid sharding that does not fit dp
            and cp, vpp and the schedule do not go together, an uneven split with pp == 1,
            selective-op recompute or cp > 1 without FlashAttention (Megatron-LM supports
            context parallelism only in Transformer Engine's attention).
    """

    dims: ParallelDims
    batch: BatchOptions
    sharding: ShardingOptions = _NO_SHARDING
    recomputation: RecomputeOptions = _NO_RECOMPUTE
    pipeline: PipelineOptions = _ONE_F_ONE_B
    overlap: OverlapOptions = _NO_OVERLAP
    mixed_precision: MixedPrecisionOptions = _BF16
    execution: ExecutionSpec = _MEGATRON_CORE

    def __post_init__(self) -> None:
        groups = (
            self.dims,
            self.batch,
            self.sharding,
            self.recomputation,
            self.pipeline,
            self.overlap,
            self.mixed_precision,
            self.execution,
        )
        if tuple(map(type, groups)) != _GROUP_TYPES:
            for (attr, cls), group in zip(GROUPS, groups, strict=True):
                if type(group) is not cls:
                    raise SpecError(
                        f"plan.{attr} must be a {cls.__name__}, got {type(group).__name__}"
                    )
        per_step = self.batch.micro_batch_size * self.dims.dp
        if self.batch.global_batch_size % per_step:
            raise SpecError(
                f"plan.global_batch_size({self.batch.global_batch_size}) is not divisible by "
                f"micro_batch_size({self.batch.micro_batch_size}) * dp({self.dims.dp}) = "
                f"{per_step}"
            )
        _check_overlap(self)
        _check_hsdp(self)
        _check_schedule(self)
        _check_uneven_split(self)
        _check_attention(self)

    @property
    def uneven_pipeline(self) -> bool:
        """The layers do not split evenly: the first or the last pipeline rank (or stage)
        has its own layer count (:attr:`PipelineOptions.uneven`)."""
        return self.pipeline.uneven

    def recomputed_layers(self, chunk_layers: int) -> int:
        """:meth:`RecomputeOptions.recomputed_layers`."""
        return self.recomputation.recomputed_layers(chunk_layers)

    def bf16_layer_plan(self) -> ParallelPlan:
        """The plan a layer kept in bf16 (``num_layers_at_start/end_in_bf16``) runs as: this
        one with precision bf16 and no bf16-layer counts."""
        numerics = replace(
            self.mixed_precision,
            precision=Precision.BF16,
            num_layers_at_start_in_bf16=0,
            num_layers_at_end_in_bf16=0,
        )
        return replace(self, mixed_precision=numerics)

    @property
    def recompute_label(self) -> str:
        """:attr:`RecomputeOptions.recompute_label`."""
        return self.recomputation.recompute_label

    @property
    def num_gpus(self) -> int:
        """dp * tp * pp * cp."""
        return self.dims.num_gpus

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step = gradient-accumulation steps."""
        return self.batch.global_batch_size // (self.batch.micro_batch_size * self.dims.dp)

    @property
    def num_stages(self) -> int:
        """Pipeline stages (model chunks) = pp * vpp, of one model copy (DualPipe holds two
        copies of these stages: ``plansim.specs.stage_placement``)."""
        return self.dims.pp * self.dims.vpp

    def stages_of_rank(self, rank: int) -> tuple[int, ...]:
        """The plan stages (model chunks, ``0 .. num_stages - 1``) pipeline rank ``rank``
        holds: ``rank, rank + pp, ...`` (looped), ``rank, 2 pp - 1 - rank`` (ZB-V,
        DualPipeV), ``rank, pp - 1 - rank`` (DualPipe: one chunk of each model copy)."""
        return plan_stages_of_rank(
            self.pipeline.schedule.placement,
            rank=rank,
            num_ranks=self.dims.pp,
            num_stages=self.num_stages,
        )

    def rank_of_stage(self, stage: int) -> int:
        """The pipeline rank holding plan stage ``stage`` (DualPipe: the copy fed at rank 0)."""
        return rank_of_stage(self.pipeline.schedule.placement, stage, num_ranks=self.dims.pp)

    def rank_holds_stage(self, rank: int, stage: int) -> bool:
        """Whether pipeline rank ``rank`` holds plan stage ``stage`` (:meth:`stages_of_rank`)."""
        if self.pipeline.schedule.placement is StagePlacement.LOOP:
            return stage % self.dims.pp == rank
        return stage in self.stages_of_rank(rank)

    def label(self) -> str:
        """Compact one-line description: the knobs that differ from the defaults, in a fixed
        order, as the planner's tables, the back-test and the traces print them, e.g.
        'tp8 pp16 dp8 mbs1 zero1 selective sp 1f1b' or 'tp8 pp8 dp1 vpp3 mbs1 zero0 full
        interleaved-1f1b' (vpp shown when > 1); a parameter server adds 'ps' (colocated) or
        'ps4' (4 dedicated servers)."""
        parts = _layout_parts(self) + _framework_parts(self) + _sharding_parts(self)
        return " ".join(parts + _split_parts(self))

    def with_fields(self, **fields: Any) -> ParallelPlan:
        """This plan with the named flat fields (:data:`PLAN_FIELDS`) changed, validated as
        any plan.

        Raises:
            SpecError: a name is not a plan field (the message lists them), or the new plan
                is invalid.
        """
        changes: dict[str, dict[str, Any]] = {}
        for name, value in fields.items():
            changes.setdefault(_group_of(name), {})[name] = value
        groups = {attr: replace(getattr(self, attr), **kw) for attr, kw in changes.items()}
        return replace(self, **groups)

    # Flat read access to every group field (PLAN_FIELDS), named as the groups name them.

    @property
    def dp(self) -> int:
        """:attr:`ParallelDims.dp`."""
        return self.dims.dp

    @property
    def tp(self) -> int:
        """:attr:`ParallelDims.tp`."""
        return self.dims.tp

    @property
    def pp(self) -> int:
        """:attr:`ParallelDims.pp`."""
        return self.dims.pp

    @property
    def cp(self) -> int:
        """:attr:`ParallelDims.cp`."""
        return self.dims.cp

    @property
    def vpp(self) -> int:
        """:attr:`ParallelDims.vpp`."""
        return self.dims.vpp

    @property
    def micro_batch_size(self) -> int:
        """:attr:`BatchOptions.micro_batch_size`."""
        return self.batch.micro_batch_size

    @property
    def global_batch_size(self) -> int:
        """:attr:`BatchOptions.global_batch_size`."""
        return self.batch.global_batch_size

    @property
    def zero_stage(self) -> int:
        """:attr:`ShardingOptions.zero_stage`."""
        return self.sharding.zero_stage

    @property
    def recompute(self) -> Recompute:
        """:attr:`RecomputeOptions.recompute`."""
        return self.recomputation.recompute

    @property
    def sequence_parallel(self) -> bool:
        """:attr:`ParallelDims.sequence_parallel`."""
        return self.dims.sequence_parallel

    @property
    def schedule(self) -> Schedule:
        """:attr:`PipelineOptions.schedule`."""
        return self.pipeline.schedule

    @property
    def precision(self) -> Precision:
        """:attr:`MixedPrecisionOptions.precision`."""
        return self.mixed_precision.precision

    @property
    def attention(self) -> AttentionKernel:
        """:attr:`ExecutionSpec.attention`."""
        return self.execution.attention

    @property
    def overlap_p2p_comm(self) -> bool:
        """:attr:`OverlapOptions.overlap_p2p_comm`."""
        return self.overlap.overlap_p2p_comm

    @property
    def tp_comm_overlap(self) -> bool:
        """:attr:`OverlapOptions.tp_comm_overlap`."""
        return self.overlap.tp_comm_overlap

    @property
    def overlap_grad_reduce(self) -> bool:
        """:attr:`OverlapOptions.overlap_grad_reduce`."""
        return self.overlap.overlap_grad_reduce

    @property
    def overlap_param_gather(self) -> bool:
        """:attr:`OverlapOptions.overlap_param_gather`."""
        return self.overlap.overlap_param_gather

    @property
    def gradient_accumulation_fusion(self) -> bool:
        """:attr:`ExecutionSpec.gradient_accumulation_fusion`."""
        return self.execution.gradient_accumulation_fusion

    @property
    def fused_elementwise(self) -> bool:
        """:attr:`ExecutionSpec.fused_elementwise`."""
        return self.execution.fused_elementwise

    @property
    def grad_reduce_in_bf16(self) -> bool:
        """:attr:`MixedPrecisionOptions.grad_reduce_in_bf16`."""
        return self.mixed_precision.grad_reduce_in_bf16

    @property
    def persist_layer_norm(self) -> bool:
        """:attr:`ExecutionSpec.persist_layer_norm`."""
        return self.execution.persist_layer_norm

    @property
    def scatter_gather_p2p(self) -> bool:
        """:attr:`ExecutionSpec.scatter_gather_p2p`."""
        return self.execution.scatter_gather_p2p

    @property
    def dp_sync(self) -> DpSync:
        """:attr:`ShardingOptions.dp_sync`."""
        return self.sharding.dp_sync

    @property
    def ps_servers(self) -> int:
        """:attr:`ShardingOptions.ps_servers`."""
        return self.sharding.ps_servers

    @property
    def ddp_impl(self) -> DdpImpl:
        """:attr:`ExecutionSpec.ddp_impl`."""
        return self.execution.ddp_impl

    @property
    def moe_token_dispatcher_type(self) -> MoeTokenDispatcher:
        """:attr:`ExecutionSpec.moe_token_dispatcher_type`."""
        return self.execution.moe_token_dispatcher_type

    @property
    def offload_optimizer(self) -> OffloadDevice:
        """:attr:`ShardingOptions.offload_optimizer`."""
        return self.sharding.offload_optimizer

    @property
    def offload_param(self) -> OffloadDevice:
        """:attr:`ShardingOptions.offload_param`."""
        return self.sharding.offload_param

    @property
    def zero3_param_fetch(self) -> Zero3ParamFetch:
        """:attr:`ShardingOptions.zero3_param_fetch`."""
        return self.sharding.zero3_param_fetch

    @property
    def use_torch_fsdp2(self) -> bool:
        """:attr:`ShardingOptions.use_torch_fsdp2`."""
        return self.sharding.use_torch_fsdp2

    @property
    def reshard_after_forward(self) -> bool:
        """:attr:`ShardingOptions.reshard_after_forward`."""
        return self.sharding.reshard_after_forward

    @property
    def dp_shard(self) -> int | None:
        """:attr:`ShardingOptions.dp_shard`."""
        return self.sharding.dp_shard

    @property
    def decoder_first_pipeline_num_layers(self) -> int | None:
        """:attr:`PipelineOptions.decoder_first_pipeline_num_layers`."""
        return self.pipeline.decoder_first_pipeline_num_layers

    @property
    def decoder_last_pipeline_num_layers(self) -> int | None:
        """:attr:`PipelineOptions.decoder_last_pipeline_num_layers`."""
        return self.pipeline.decoder_last_pipeline_num_layers

    @property
    def account_for_embedding_in_pipeline_split(self) -> bool:
        """:attr:`PipelineOptions.account_for_embedding_in_pipeline_split`."""
        return self.pipeline.account_for_embedding_in_pipeline_split

    @property
    def account_for_loss_in_pipeline_split(self) -> bool:
        """:attr:`PipelineOptions.account_for_loss_in_pipeline_split`."""
        return self.pipeline.account_for_loss_in_pipeline_split

    @property
    def recompute_modules(self) -> str | None:
        """:attr:`RecomputeOptions.recompute_modules`."""
        return self.recomputation.recompute_modules

    @property
    def pipeline_model_parallel_layout(self) -> str | None:
        """:attr:`PipelineOptions.pipeline_model_parallel_layout`."""
        return self.pipeline.pipeline_model_parallel_layout

    @property
    def recompute_num_layers(self) -> int | None:
        """:attr:`RecomputeOptions.recompute_num_layers`."""
        return self.recomputation.recompute_num_layers

    @property
    def recompute_early_stop(self) -> bool:
        """:attr:`RecomputeOptions.recompute_early_stop`."""
        return self.recomputation.recompute_early_stop

    @property
    def num_layers_at_start_in_bf16(self) -> int:
        """:attr:`MixedPrecisionOptions.num_layers_at_start_in_bf16`."""
        return self.mixed_precision.num_layers_at_start_in_bf16

    @property
    def num_layers_at_end_in_bf16(self) -> int:
        """:attr:`MixedPrecisionOptions.num_layers_at_end_in_bf16`."""
        return self.mixed_precision.num_layers_at_end_in_bf16

    @property
    def ep(self) -> int:
        """:attr:`ParallelDims.ep`."""
        return self.dims.ep

    @property
    def etp(self) -> int | None:
        """:attr:`ParallelDims.etp`."""
        return self.dims.etp

    @property
    def expert_load_imbalance(self) -> float:
        """:attr:`ParallelDims.expert_load_imbalance`."""
        return self.dims.expert_load_imbalance

    @property
    def framework(self) -> Framework:
        """:attr:`ExecutionSpec.framework`."""
        return self.execution.framework

    @property
    def framework_version(self) -> str | None:
        """:attr:`ExecutionSpec.framework_version`."""
        return self.execution.framework_version


def _group_of(name: str) -> str:
    """The group attribute holding flat field ``name``; SpecError lists the fields."""
    try:
        return FIELD_GROUP[name]
    except KeyError:
        raise SpecError(
            f"plan field {name!r} is not known; choose from: {', '.join(PLAN_FIELDS)}"
        ) from None


def plan_from_fields(**fields: Any) -> ParallelPlan:
    """A plan from flat field names (:data:`PLAN_FIELDS`, Megatron-LM's argument names where
    one exists); fields not given take their group's default.

    Example: ``plan_from_fields(dp=32, tp=4, pp=8, vpp=6, micro_batch_size=1,
    global_batch_size=1536, zero_stage=1, sequence_parallel=True,
    schedule=Schedule.INTERLEAVED_1F1B)``.

    Raises:
        SpecError: a required field (dp, tp, pp, micro_batch_size, global_batch_size) is
            missing, a name is not a plan field, or a value is invalid (each names the field
            and the allowed values).
    """
    missing = [name for name in _REQUIRED if name not in fields]
    if missing:
        raise SpecError(f"plan needs {', '.join(missing)} (required plan fields)")
    by_group: dict[str, dict[str, Any]] = {attr: {} for attr, _ in GROUPS}
    for name, value in fields.items():
        by_group[_group_of(name)][name] = value
    return ParallelPlan(**{attr: cls(**by_group[attr]) for attr, cls in GROUPS})


def _check_overlap(plan: ParallelPlan) -> None:
    """What each overlap switch needs of the schedule, TP and ZeRO (Megatron-LM's rules)."""
    overlap = plan.overlap
    if overlap.overlap_p2p_comm and not plan.pipeline.schedule.interleaved:
        raise SpecError(
            f"plan.overlap_p2p_comm needs schedule {Schedule.INTERLEAVED_1F1B.value} "
            f"(got {plan.schedule.value}), as in Megatron-LM"
        )
    if overlap.tp_comm_overlap and not plan.dims.sequence_parallel:
        raise SpecError(
            f"plan.tp_comm_overlap needs sequence_parallel and tp > 1 (got tp={plan.tp}, "
            "sequence_parallel=False), as Megatron-LM's --tp-comm-overlap does"
        )
    if overlap.overlap_param_gather and not (
        plan.zero_stage in (1, 2) and overlap.overlap_grad_reduce
    ):
        raise SpecError(
            "plan.overlap_param_gather needs zero_stage 1 or 2 and overlap_grad_reduce (got "
            f"zero_stage={plan.zero_stage}, overlap_grad_reduce={overlap.overlap_grad_reduce}), "
            "as Megatron-LM's --overlap-param-gather"
        )


def _check_hsdp(plan: ParallelPlan) -> None:
    """Hybrid sharding (``dp_shard``, :class:`ShardingOptions`): :func:`hsdp_problems`."""
    shard = plan.sharding.dp_shard
    if shard is None:
        return
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


def _check_schedule(plan: ParallelPlan) -> None:
    """vpp, pp and micro-batch count against the schedule (Megatron-LM's rules; ZB-H1:
    Qi et al. 2024 §2.1 needs a pipeline, pp > 1; the V and dual schedules:
    :func:`_check_v_or_dual`)."""
    schedule, vpp, pp = plan.pipeline.schedule, plan.dims.vpp, plan.dims.pp
    name = schedule.value
    if schedule.placement is not StagePlacement.LOOP:
        _check_v_or_dual(plan)
        return
    if not schedule.interleaved:
        if vpp != 1:
            raise SpecError(
                f"schedule {name} needs vpp == 1 (got vpp={vpp}); "
                f"use {Schedule.INTERLEAVED_1F1B.value}"
            )
        if schedule is Schedule.ZB_H1 and pp == 1:
            raise SpecError(
                f"schedule {name} needs pp > 1 (got pp=1): one stage has no pipeline "
                f"bubble for the deferred weight gradients to fill; use "
                f"{Schedule.ONE_F_ONE_B.value}"
            )
        return
    if vpp == 1:
        raise SpecError(f"schedule {name} needs vpp > 1 (got vpp=1); use 1f1b")
    if pp == 1:
        raise SpecError(f"schedule {name} needs pp > 1 (got pp=1, vpp={vpp})")
    if plan.num_microbatches % pp:
        raise SpecError(
            f"schedule {name} needs num_microbatches({plan.num_microbatches}) = "
            f"global_batch_size({plan.global_batch_size}) / (micro_batch_size"
            f"({plan.micro_batch_size}) * dp({plan.dp})) to be a multiple of pp({pp})"
        )


def _check_v_or_dual(plan: ParallelPlan) -> None:
    """ZB-V and DualPipeV: vpp == 2 and pp > 1 (torch's ``ScheduleZBVZeroBubble`` and
    ``ScheduleDualPipeV`` take exactly two stages per rank), DualPipeV also m >= 2 pp (torch);
    DualPipe: vpp == 1 (each of its two model copies splits into pp stages), an even pp and
    an even m >= 2 pp (deepseek-ai/DualPipe's asserts)."""
    schedule, vpp, pp, m = plan.schedule, plan.vpp, plan.pp, plan.num_microbatches
    name = schedule.value
    pipeline = plan.pipeline
    if (pipeline.decoder_first_pipeline_num_layers, pipeline.decoder_last_pipeline_num_layers) != (
        None,
        None,
    ):
        raise SpecError(
            f"schedule {name} splits the layers evenly over its stages: leave "
            "decoder_first/last_pipeline_num_layers unset (account_for_*_in_pipeline_split "
            "and pipeline_model_parallel_layout work per stage)"
        )
    batch = (
        f"num_microbatches({m}) = global_batch_size({plan.global_batch_size}) / "
        f"(micro_batch_size({plan.micro_batch_size}) * dp({plan.dp}))"
    )
    if schedule is Schedule.DUALPIPE:
        if vpp != 1:
            raise SpecError(
                f"schedule {name} needs vpp == 1 (got vpp={vpp}): each rank holds one chunk of "
                "each of the two model copies"
            )
        if pp < 2 or pp % 2:
            raise SpecError(f"schedule {name} needs an even pp >= 2 (got pp={pp})")
        if m % 2 or m < 2 * pp:
            raise SpecError(
                f"schedule {name} needs {batch} to be even and >= 2 * pp = {2 * pp}: half of "
                "the micro-batches enter at each end of the pipeline"
            )
        return
    if vpp != 2:
        raise SpecError(
            f"schedule {name} needs vpp == 2 (got vpp={vpp}): two model chunks per rank, "
            "placed as a V"
        )
    if pp < 2:
        raise SpecError(f"schedule {name} needs pp > 1 (got pp={pp})")
    if schedule is Schedule.DUALPIPE_V and m < 2 * pp:
        raise SpecError(f"schedule {name} needs {batch} >= the stages 2 * pp = {2 * pp}")


def _check_uneven_split(plan: ParallelPlan) -> None:
    """An uneven split needs a pipeline, and takes one way of splitting (Megatron-LM's)."""
    pipeline = plan.pipeline
    if not pipeline.uneven:
        return  # an even split: the common case, checked fast
    layer_counts = (
        pipeline.decoder_first_pipeline_num_layers,
        pipeline.decoder_last_pipeline_num_layers,
    )
    for edge in ("embedding", "loss"):
        field = f"account_for_{edge}_in_pipeline_split"
        value = getattr(pipeline, field)
        if value and plan.pp == 1:
            raise SpecError(f"plan.{field} needs pp > 1 (got pp=1)")
        if value and layer_counts != (None, None):
            raise SpecError(
                f"plan.{field} does not combine with decoder_first/last_pipeline_num_layers "
                f"(Megatron-LM takes one way of splitting unevenly): choose one"
            )
    layout = pipeline.pipeline_model_parallel_layout
    if layout is not None:
        if plan.pp == 1:
            raise SpecError(f"plan.pipeline_model_parallel_layout({layout!r}) needs pp > 1")
        layout_stage_layers(layout, num_stages=plan.num_stages)
    for edge, value in zip(("first", "last"), layer_counts, strict=True):
        if value is not None and plan.pp == 1:
            raise SpecError(
                f"plan.decoder_{edge}_pipeline_num_layers({value}) needs pp > 1 (got pp=1): "
                f"one pipeline rank holds every layer; leave it unset"
            )


def _check_attention(plan: ParallelPlan) -> None:
    """What needs FlashAttention: torchtitan's per-op selective recompute (it saves the
    fused kernel's output) and context parallelism (Transformer Engine's attention)."""
    attention = plan.execution.attention
    if attention is AttentionKernel.FLASH:
        return
    if plan.recompute is Recompute.SELECTIVE_OP:
        raise SpecError(
            f"plan.recompute {Recompute.SELECTIVE_OP.value} needs attention "
            f"{AttentionKernel.FLASH.value} (got {attention.value}): torchtitan's per-op "
            f"policy saves the fused attention kernel's output"
        )
    if plan.cp > 1:
        raise SpecError(
            f"plan.cp({plan.cp}) needs attention {AttentionKernel.FLASH.value} (got "
            f"{attention.value}): Megatron-LM runs context parallelism only through "
            f"Transformer Engine's fused attention (TEDotProductAttention)"
        )


def _layout_parts(plan: ParallelPlan) -> list[str]:
    """Sizes, micro-batch, ZeRO stage, recompute, SP and the schedule."""
    parts = [f"tp{plan.tp}", f"pp{plan.pp}", f"dp{plan.dp}"]
    if plan.cp > 1:
        parts.append(f"cp{plan.cp}")
    if plan.ep > 1:
        parts.append(f"ep{plan.ep}")
    if plan.etp is not None:
        parts.append(f"etp{plan.etp}")
    if plan.moe_token_dispatcher_type is MoeTokenDispatcher.DEEPEP:
        parts.append("deepep")
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
    if plan.pipeline_model_parallel_layout is not None:
        parts.append(f"layout-{plan.pipeline_model_parallel_layout}")
    if plan.num_layers_at_start_in_bf16 or plan.num_layers_at_end_in_bf16:
        start, end = plan.num_layers_at_start_in_bf16, plan.num_layers_at_end_in_bf16
        parts.append(f"bf16-layers-{start}-{end}")
    return parts
