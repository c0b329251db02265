"""The inputs a plan's stage costing starts from, and each stage's compute seconds (pure).

:func:`pass_inputs` gives the per-layer pass times (``layer_cost.layer_pass_times``, and
those of a layer kept in bf16), the edge stages' times (``edge_cost.edge_times``) at the
GEMM rate the whole job sustains (``sustained.job_compute_profile``), the layout's groups and
the bf16 layers per stage, memoised per search. :func:`stage_compute_s` turns them into each
stage's forward and backward seconds on the compute stream (``stage_seconds``): what the
planner's cheap lower bound reads (``plansim.planner.bounds.compute_lower_bound_s``), without
building the pipeline work (``plansim.analytic.cost``).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.edge_cost import EdgeTimes, edge_times
from plansim.analytic.layer_cost import PassTimes, layer_pass_times
from plansim.analytic.memo import Memo, fields_getter, memoised
from plansim.analytic.moe_layer import stage_moe_layer_counts
from plansim.analytic.ranks import LayoutGroups, layout_groups
from plansim.analytic.stage_seconds import StageSeconds, stage_seconds
from plansim.analytic.sustained import job_compute_profile
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import stage_bf16_layers, stage_layer_counts
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import PLAN_FIELDS, ParallelPlan

#: Plan fields of the per-layer and edge pass times (``layer_cost``; groups tp and cp
#: follow from tp, cp and the profile; the gradient dtype sets the bytes of an unfused
#: gradient accumulation).
PASS_FIELDS = (
    "micro_batch_size", "tp", "cp", "attention", "precision", "recompute",
    "recompute_modules", "sequence_parallel", "tp_comm_overlap", "gradient_accumulation_fusion",
    "grad_reduce_in_bf16", "fused_elementwise", "persist_layer_norm",
)  # fmt: skip
#: Plan fields the compute-stream seconds of the stages (:func:`stage_compute_s`) do not
#: depend on: orderings, overlap and the DP / ZeRO / offload traffic and state placement
#: (every other field counts, so a field added later is in the key until listed here).
NOT_IN_COMPUTE = (
    "global_batch_size", "zero_stage", "schedule", "overlap_p2p_comm", "overlap_grad_reduce",
    "overlap_param_gather", "scatter_gather_p2p", "dp_sync", "ps_servers",
    "offload_optimizer", "offload_param", "zero3_param_fetch", "use_torch_fsdp2", "dp_shard",
    "reshard_after_forward",
)  # fmt: skip
COMPUTE_FIELDS = tuple(f for f in PLAN_FIELDS if f not in NOT_IN_COMPUTE)
_pass_key = fields_getter(PASS_FIELDS)
_compute_key = fields_getter(COMPUTE_FIELDS)


@dataclass(frozen=True, slots=True)
class PassInputs:
    """What :func:`pass_inputs` gives (see the module docstring)."""

    groups: LayoutGroups
    layer: PassTimes
    layer16: PassTimes  # the layer with bf16 GEMMs (``layer`` when no layer is kept in bf16)
    edges: EdgeTimes
    bf16_ends: tuple[tuple[int, int], ...]  # per stage (stage_bf16_layers)
    moe: PassTimes | None = None  # a MoE layer's times (models with experts)
    moe_counts: tuple[int, ...] = ()  # MoE layers per stage, MTP modules' on the last
    mtp: int = 0  # MTP modules (on the last stage)

    def stage_seconds(self, stage: int, *, num_layers: int, plan: ParallelPlan) -> StageSeconds:
        """``stage_seconds.stage_seconds`` of pipeline stage ``stage`` (``num_layers``
        layers): its edge work, bf16 layers, MoE layers and MTP modules."""
        last = stage == plan.num_stages - 1
        return stage_seconds(
            num_layers, first=stage == 0, last=last, plan=plan, layer=self.layer,
            layer16=self.layer16, bf16_ends=self.bf16_ends[stage], edges=self.edges,
            moe=self.moe, moe_layers=self.moe_counts[stage] if self.moe_counts else 0,
            mtp_layers=self.mtp if last else 0,
        )  # fmt: skip

    def stage_key(self, stage: int) -> tuple[int, int]:
        """What besides first/last, layers and bf16 ends tells stages' seconds apart: the
        MoE layers and MTP modules they hold."""
        if not self.moe_counts:
            return (0, 0)
        return (self.moe_counts[stage], self.mtp if stage == len(self.moe_counts) - 1 else 0)


def pass_inputs(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, memo: Memo | None
) -> PassInputs:
    """The per-layer and edge pass times of ``plan`` (memoised per distinct pass input)."""
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    gpus = plan.num_gpus  # sets the GEMM rate the job sustains (plansim.analytic.sustained)
    job = memoised(memo, ("job", gpus), lambda: job_compute_profile(profile, gpus))
    pass_key = (gpus, *_pass_key(plan))
    layer = memoised(memo, ("layer", *pass_key), lambda: layer_pass_times(model, plan, job, groups))
    edges = memoised(memo, ("edges", *pass_key), lambda: edge_times(model, plan, job, groups))
    bf16_ends = stage_bf16_layers(model.num_layers, plan)
    layer16 = layer
    if any(head or tail for head, tail in bf16_ends):  # the same layer with bf16 GEMMs
        plan16 = plan.bf16_layer_plan()
        key16 = (gpus, *_pass_key(plan16))
        layer16 = memoised(
            memo, ("layer", *key16), lambda: layer_pass_times(model, plan16, job, groups)
        )
    if is_dense(model):
        return PassInputs(groups, layer, layer16, edges, bf16_ends)
    moe = None
    if model.moe is not None:
        moe_key = ("moe_layer", *pass_key, plan.ep, plan.etp, plan.expert_load_imbalance)
        moe = memoised(
            memo, moe_key, lambda: layer_pass_times(model, plan, job, groups, moe_layer=True)
        )
    counts = list(stage_moe_layer_counts(model, plan))
    mtp = model.mtp_num_layers or 0
    if mtp and model.moe is not None and model.moe.is_moe_layer(model.num_layers - 1):
        counts[-1] += mtp  # each MTP module's layer is like the last one (moe_layer)
    return PassInputs(
        groups, layer, layer16, edges, bf16_ends, moe=moe, moe_counts=tuple(counts), mtp=mtp
    )


def stage_compute_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, memo: Memo | None = None
) -> tuple[tuple[float, float], ...]:
    """Per pipeline stage (model chunk), stage 0 first: (forward, backward) seconds of one
    micro-batch that hold the rank's compute stream (kernels and blocking TP collectives,
    :class:`plansim.analytic.stage_seconds.StageSeconds` totals). The work
    ``plansim.analytic.cost.build_pipeline_work`` builds has these segments and more
    (ZeRO-3, CP and pipeline transfers), so bounds from these are bounds on it; much
    cheaper than building it.

    Raises:
        SpecError: as :func:`plansim.analytic.cost.build_pipeline_work`.
    """
    key = ("stage_compute", *_compute_key(plan))
    return memoised(memo, key, lambda: _stage_compute_s(model, plan, profile, memo))


def _stage_compute_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, memo: Memo | None
) -> tuple[tuple[float, float], ...]:
    inputs = pass_inputs(model, plan, profile, memo)
    counts = stage_layer_counts(model.num_layers, plan)
    last_stage = plan.num_stages - 1
    kinds: dict[tuple[bool, bool, int, tuple[int, int], tuple[int, int]], tuple[float, float]]
    kinds = {}
    out = []
    for s, layers in enumerate(counts):
        key = (s == 0, s == last_stage, layers, inputs.bf16_ends[s], inputs.stage_key(s))
        if key not in kinds:
            sec = inputs.stage_seconds(s, num_layers=layers, plan=plan)
            kinds[key] = (sec.forward_total_s, sec.backward_total_s)
        out.append(kinds[key])
    return tuple(out)
