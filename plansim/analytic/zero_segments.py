"""Where ZeRO-2/3 communication sits in a stage's actions and a rank's step (pure).

The per-unit traffic (a layer's or a stage's edge parameters: gathers and reduce-scatters)
is ``plansim.analytic.zero3.unit_traffic``'s; this module turns it into the segments
``plansim.analytic.cost`` puts into each action (:func:`zero_segments`: before the forward,
before the recompute and backward, after the backward or the weight-gradient pass, with the
exposure ``zero3`` gives each fetch mode), into ZeRO-3 ``per-step``'s once-per-step
reduce-scatter and gather on each rank (:func:`with_per_step_traffic`), and into the seconds
per action the planner's cheap bound adds (:func:`sharded_action_s`).
"""

from __future__ import annotations

from dataclasses import replace

from plansim.analytic.layer_cost import PassTimes
from plansim.analytic.memo import Memo, fields_getter, memoised
from plansim.analytic.memory import plan_state_bytes
from plansim.analytic.rank_work import segments
from plansim.analytic.ranks import LayoutGroups, dp_cp_size
from plansim.analytic.stage_compute import COMPUTE_FIELDS, pass_inputs
from plansim.analytic.zero3 import (
    NO_TRAFFIC,
    Zero3Traffic,
    edge_param_tensors,
    exposed_backward_s,
    exposed_gather_s,
    layer_param_tensors,
    unit_traffic,
)
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import stage_layer_counts
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import ParallelPlan, Recompute, Schedule, Zero3ParamFetch
from plansim.specs.work import RankWork

#: Plan fields of one layer's ZeRO-3 traffic (``plansim.analytic.zero3``).
_ZERO3_FIELDS = (
    "tp", "cp", "dp", "dp_shard", "zero_stage", "zero3_param_fetch", "precision",
    "grad_reduce_in_bf16", "use_torch_fsdp2",
)  # fmt: skip

#: Plan fields of :func:`sharded_action_s`: the stages' pass times (``COMPUTE_FIELDS``) and
#: what places and overlaps the ZeRO-2/3 segments.
_sharded_key = fields_getter(
    (*COMPUTE_FIELDS, "zero_stage", "schedule", "overlap_grad_reduce", "zero3_param_fetch",
     "dp_shard", "use_torch_fsdp2", "reshard_after_forward")
)  # fmt: skip
_zero3_key = fields_getter(_ZERO3_FIELDS)


def zero_segments(
    n: int,
    *,
    plan: ParallelPlan,
    layer: PassTimes,
    unit: Zero3Traffic,
    edge: Zero3Traffic,
    slowdown: float,
) -> dict[str, tuple[str, str, float, float]]:
    """ZeRO-3 (and ZeRO-2: reduce-scatters only) communication segments of a stage of ``n``
    layers, by where they go: before F ("forward"), before the recompute/backward of B and I
    ("gather_b"), after B ("scatter_b"), after W ("scatter_w"); ``plansim.analytic.zero3``
    gives the overlap: ZeRO-3 by ``plan.zero3_param_fetch``, ZeRO-2 overlapped with the
    backward as ``layer-prefetch`` with ``plan.overlap_grad_reduce``, else serial."""
    if plan.zero_stage == 3 and plan.zero3_param_fetch is Zero3ParamFetch.PER_STEP:
        unit = edge = NO_TRAFFIC  # once per step instead (with_per_step_traffic)
    g, r = unit.gather_s, unit.scatter_s
    # ZeRO-3 gathers again before backward unless the units stay gathered since forward
    # (FSDP's reshard_after_forward False); ZeRO-2 gathers nothing per micro-batch
    g_b, edge_g_b = (g, edge.gather_s) if plan.reshard_after_forward else (0.0, 0.0)
    full = plan.recompute is Recompute.FULL
    fwd_c = layer.forward_s + layer.tp_forward_s + layer.cp_forward_s
    rec_c = layer.recompute_s + layer.tp_recompute_s + layer.cp_recompute_s
    bin_c = layer.backward_input_s + layer.tp_backward_s + layer.cp_backward_s
    bw_c = layer.backward_weight_s
    if plan.zero_stage == 2:
        overlapped = plan.overlap_grad_reduce
    else:
        overlapped = plan.zero3_param_fetch is Zero3ParamFetch.LAYER_PREFETCH
    if overlapped:
        s = slowdown
        forward = edge.gather_s + exposed_gather_s(n, gather_s=g, compute_s=fwd_c, slowdown=s)
        gather_b = edge_g_b + exposed_gather_s(n, gather_s=g_b, compute_s=rec_c + bin_c, slowdown=s)
        full_b = edge_g_b + edge.scatter_s
        full_b += exposed_backward_s(
            n, gather_s=g_b, scatter_s=r, compute_s=rec_c + bin_c + bw_c, slowdown=s
        )
        scatter_b = full_b - gather_b
        scatter_w = edge.scatter_s + exposed_gather_s(n, gather_s=r, compute_s=bw_c, slowdown=s)
        regather = int(plan.reshard_after_forward)
    else:  # layer-sync, per-tensor-sync, ZeRO-2 without overlap: every collective serial
        per_tensor = plan.zero3_param_fetch is Zero3ParamFetch.PER_TENSOR_SYNC
        regather = 2 if full and per_tensor and plan.zero_stage == 3 else 1
        regather *= int(plan.reshard_after_forward)
        forward = edge.gather_s + n * g
        gather_b = edge_g_b + n * g_b * regather
        scatter_b = scatter_w = edge.scatter_s + n * r
    gather_bytes = edge.gather_bytes + n * unit.gather_bytes
    scatter_bytes = edge.scatter_bytes + n * unit.scatter_bytes
    return {
        "forward": ("dp_comm", "dp", forward, gather_bytes),
        "gather_b": ("dp_comm", "dp", gather_b, gather_bytes * regather),
        "scatter_b": ("dp_comm", "dp", scatter_b, scatter_bytes),
        "scatter_w": ("dp_comm", "dp", scatter_w, scatter_bytes),
    }


def sharded_traffic(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    first: bool,
    last: bool,
    memo: Memo | None,
) -> tuple[Zero3Traffic, Zero3Traffic]:
    """ZeRO-2/3 traffic of one layer (memoised) and of a stage's edge parameters (16-bit
    gathers; ``plansim.analytic.zero3.unit_traffic``). Reduce-scatters per micro-batch in 16
    bits (DeepSpeed's ZeRO-2/3 reduce in the model's dtype), except in the gradient dtype
    (``plan_state_bytes(plan).grad``: fp32 for bf16 training, 16-bit with
    ``plan.grad_reduce_in_bf16``) with ``per-step`` (the step's accumulated gradients) and with
    PyTorch FSDP (``plan.use_torch_fsdp2``), whose ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)`` casts the unsharded gradients to fp32 for the reduce-scatter
    (torchtitan's default ``mixed_precision_reduce = "float32"``; ``reduce_dtype=bf16`` is
    ``grad_reduce_in_bf16``)."""
    if plan.zero_stage < 2 and not is_dense(model):  # none; ZeRO-2/3 are refused for
        return NO_TRAFFIC, NO_TRAFFIC  # such models (moe_layer.moe_option_reason)
    per_param = plan_state_bytes(plan)
    per_step = plan.zero3_param_fetch is Zero3ParamFetch.PER_STEP and plan.zero_stage == 3
    grad_bytes = per_param.grad if per_step or plan.use_torch_fsdp2 else per_param.param
    # the backward leaves gradients in the parameters' dtype; per-step accumulates them
    # in the reduce dtype
    source = grad_bytes if per_step else per_param.param
    z3_bytes = {
        "param_bytes": per_param.param,
        "grad_bytes": grad_bytes,
        "source_grad_bytes": source,
    }
    layer = memoised(
        memo,
        ("zero3", *_zero3_key(plan)),
        lambda: unit_traffic(
            layer_param_tensors(model, plan), plan=plan, profile=profile, groups=groups, **z3_bytes
        ),
    )
    edge = memoised(
        memo,
        ("zero3_edge", first, last, *_zero3_key(plan)),
        lambda: unit_traffic(
            edge_param_tensors(model, plan, first=first, last=last),
            plan=plan,
            profile=profile,
            groups=groups,
            **z3_bytes,
        ),
    )
    return layer, edge


def with_per_step_traffic(
    ranks: list[RankWork],
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    layer: PassTimes,
    memo: Memo | None,
) -> list[RankWork]:
    """ZeRO-3 ``per-step`` (``plansim.analytic.zero3``): each rank reduce-scatters its stages'
    accumulated gradients once, after its last backward (first in ``grad_sync``), and
    all-gathers their parameters once for the next step, after the optimizer, the gather of
    each layer beside the previous layer's first forward (FSDP2's implicit prefetch). On a
    profile whose host and device are one processor (``host_overhead.serial``: a CPU device)
    nothing runs ahead of the thread that computes, so every gather is waited for."""
    counts = stage_layer_counts(model.num_layers, plan)
    fwd_c = (
        0.0 if profile.serial_host else layer.forward_s + layer.tp_forward_s + layer.cp_forward_s
    )
    slowdown = profile.overlap_compute_slowdown_fraction
    out = []
    for r, rank in enumerate(ranks):
        rs_s = rs_bytes = ag_s = ag_bytes = 0.0
        for s in range(r, plan.num_stages, plan.pp):
            first, last, n = s == 0, s == plan.num_stages - 1, counts[s]
            unit, edge = sharded_traffic(
                model, plan, profile, groups, first=first, last=last, memo=memo
            )
            rs_s += edge.scatter_s + n * unit.scatter_s
            rs_bytes += edge.scatter_bytes + n * unit.scatter_bytes
            ag_s += edge.gather_s + exposed_gather_s(
                n, gather_s=unit.gather_s, compute_s=fwd_c, slowdown=slowdown
            )
            ag_bytes += edge.gather_bytes + n * unit.gather_bytes
        scatter = segments(("dp_comm", "dp", rs_s, rs_bytes))
        gather = segments(("dp_comm", "dp", ag_s, ag_bytes))
        out.append(
            replace(rank, grad_sync=scatter + rank.grad_sync, optimizer=rank.optimizer + gather)
        )
    return out


def sharded_action_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, memo: Memo | None = None
) -> tuple[tuple[float, float], ...]:
    """Per pipeline stage, stage 0 first: (forward, backward) seconds of the ZeRO-2/3
    segments one micro-batch's actions hold (:func:`zero_segments`): the gathers before F, and
    before and after the backward (B; with ZB-H1 its I and W together), exactly as
    ``plansim.analytic.cost.build_pipeline_work`` places them, so adding them to
    ``stage_compute.stage_compute_s`` keeps the planner's cheap bound a bound on the work.
    All zero below ZeRO-2 or with dp * cp == 1.
    """
    if plan.zero_stage < 2 or dp_cp_size(plan) == 1:
        return ((0.0, 0.0),) * plan.num_stages
    return memoised(
        memo,
        ("sharded_action_s", *_sharded_key(plan)),
        lambda: _sharded_action_s(model, plan, profile, memo),
    )


def _sharded_action_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, memo: Memo | None
) -> tuple[tuple[float, float], ...]:
    inputs = pass_inputs(model, plan, profile, memo)
    after = "scatter_w" if plan.schedule is Schedule.ZB_H1 else "scatter_b"
    kinds: dict[tuple[bool, bool, int], tuple[float, float]] = {}
    out = []
    for s, layers in enumerate(stage_layer_counts(model.num_layers, plan)):
        key = (s == 0, s == plan.num_stages - 1, layers)
        if key not in kinds:
            unit, edge = sharded_traffic(
                model, plan, profile, inputs.groups, first=key[0], last=key[1], memo=memo
            )
            z3 = zero_segments(
                layers,
                plan=plan,
                layer=inputs.layer,
                unit=unit,
                edge=edge,
                slowdown=profile.overlap_compute_slowdown_fraction,
            )
            kinds[key] = (z3["forward"][2], z3["gather_b"][2] + z3[after][2])
        out.append(kinds[key])
    return tuple(out)
