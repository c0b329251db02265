"""Evaluate one plan: feasibility checks, memory, costing, event simulation, metrics.

Infeasible plans are results (:class:`Rejected` with a reason and a category for counts),
not exceptions; a feasible plan becomes an :class:`Evaluation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.flops import FWD_BWD_MULTIPLIER, hardware_flops_per_step, model_flops_per_step
from plansim.analytic.memo import Memo
from plansim.analytic.memory import MemoryBreakdown, rank_memory, worst_rank_memory
from plansim.analytic.moe_counts import forward_flops_per_token
from plansim.analytic.moe_layer import moe_option_reason, moe_split_reason
from plansim.analytic.offload import host_memory_rejection, offloads, require_host
from plansim.analytic.recompute_modules import recompute_modules_reason
from plansim.schedule.actions import PerRankActions
from plansim.schedule.builders import build_actions
from plansim.sim.engine import simulate
from plansim.sim.result import SimResult
from plansim.sim.steady_state import extrapolate, plan_steady_state
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import model_split_reason, stage_layer_counts
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import ParallelPlan, Recompute
from plansim.specs.work import PipelineWork

#: The rejection category of a plan whose worst rank needs more than the GPU's memory.
OUT_OF_MEMORY = "out of memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A plan that cannot run, with a human-readable reason and a category for counts.

    Attributes:
        need_bytes: with category "out of memory", the bytes its worst rank needs (so a search
            can name the plan closest to fitting); 0 for the other categories.
    """

    plan: ParallelPlan
    category: str
    reason: str
    need_bytes: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A simulated plan and its headline metrics.

    Attributes:
        step_time_s: simulated seconds per optimizer step.
        tokens_per_s: global_batch_size * seq_length / step_time_s.
        mfu: model FLOPs per step / (step time * GPUs * dense peak) (Korthikanti App. A).
        hfu: the same with hardware FLOPs (recompute included).
        bubble_fraction: pipeline idle fraction measured on the simulated events.
        peak_memory_bytes: highest per-GPU peak over the pipeline ranks (simulated events).
        memory: analytic breakdown of the worst rank.
        result: the simulation (timeline and memory samples; with many micro-batches its
            figures extrapolated from two shorter runs, ``plansim.sim.steady_state``).
        exposed_comm_s_by_kind: communication not hidden behind compute, by kind, summed
            over the pipeline ranks (``SimResult.exposed_s_by_kind``).
        num_grad_buckets: DP gradient buckets per pipeline replica (0 unless
            ``plan.overlap_grad_reduce``; see ``plansim.analytic.grad_buckets.grad_buckets``).
    """

    plan: ParallelPlan
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    bubble_fraction: float
    peak_memory_bytes: float
    memory: MemoryBreakdown
    result: SimResult = field(repr=False)
    exposed_comm_s_by_kind: dict[str, float] = field(default_factory=dict)
    num_grad_buckets: int = 0


def check_plan(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, memo: Memo | None = None
) -> Rejected | None:
    """Why ``plan`` cannot run ``model`` on ``profile`` (divisibility, dtype, GPU memory,
    host memory of offloaded states), or None. ``memo``: a search's cache (one model and
    profile) for the memory model's activation pricing; same result without.

    Raises:
        SpecError: the plan offloads and the profile has no host section (or no NVMe
            figures for ``nvme``): a usage error, not an infeasible plan
            (``plansim.analytic.offload.require_host``).
    """
    if offloads(plan):
        require_host(plan, profile)
    why = _layout_rejection(model, plan, profile)
    if why is not None:
        return Rejected(plan=plan, category=why[0], reason=why[1])
    worst = worst_rank_memory(model, plan, profile, memo=memo)
    if worst.total_bytes > profile.hbm_capacity_bytes:
        return Rejected(
            plan=plan,
            category=OUT_OF_MEMORY,
            reason=worst.describe(capacity_bytes=profile.hbm_capacity_bytes),
            need_bytes=worst.total_bytes,
        )
    host = host_memory_rejection(model, plan, profile)
    if host is not None:
        return Rejected(plan=plan, category="host out of memory", reason=host)
    return None


def _layout_rejection(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> tuple[str, str] | None:
    """(category, reason) when the layout cannot run before memory is looked at: it does not
    divide the model, a TP group would straddle nodes, TP overlap spans nodes, or the
    profile has no GEMM data for the precision; else None."""
    reason = model_split_reason(plan, model)
    if reason:
        return "layout does not divide the model", reason
    reason = moe_split_reason(model, plan)
    if reason:
        return "layout does not divide the experts", reason
    reason = moe_option_reason(model, plan)
    if reason:
        return "not modelled with experts", reason
    reason = recompute_modules_reason(model, plan)
    if reason:
        return "recompute module does not apply", reason
    if model.ffn_hidden_size % plan.tp:
        return (
            "layout does not divide the model",
            f"ffn_hidden_size({model.ffn_hidden_size}) is not divisible by tp({plan.tp})",
        )
    g = profile.gpus_per_node
    if plan.num_gpus > g and g % plan.tp and plan.tp % g:
        # Megatron numbers ranks TP-first: groups of tp consecutive ranks, so with tp = 3 on
        # 8-GPU nodes ranks 6, 7 and 8 form a group across two nodes, and with tp = 12 every
        # other group holds 4 GPUs of one node and 8 of the next (within one node, or one
        # scale-up domain, no group can). A tp that whole nodes make up (16 on 8-GPU nodes)
        # is priced: its collectives pay the inter-node tier (``plansim.analytic.comm``).
        return (
            "tp straddles nodes",
            f"tp({plan.tp}) neither divides nor is a multiple of GPUs per node({g}) of "
            f"{profile.name}: some TP groups would hold part of a node",
        )
    if plan.tp_comm_overlap and plan.tp > g:
        # Transformer Engine's userbuffers overlap registers its buffers with CUDA IPC /
        # multicast handles, which reach only the GPUs of one NVLink domain (TE maintainers,
        # NVIDIA/TransformerEngine issue #1071, 2024: "only possible with single-node
        # tensor-parallelism").
        return (
            "tp comm overlap across nodes",
            f"tp_comm_overlap needs the TP group inside one node; tp({plan.tp}) > GPUs "
            f"per node({g}) of {profile.name}",
        )
    if plan.precision.value not in profile.matmul_efficiency:
        return (
            "precision not supported",
            f"{profile.name} has no {plan.precision.value} matmul data "
            f"(has: {', '.join(profile.dtypes())})",
        )
    return None


def evaluate(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    checked: bool = False,
    memo: Memo | None = None,
    whole: bool = False,
) -> Evaluation | Rejected:
    """Check, cost and simulate ``plan``; a Rejected when it cannot run.

    A step of many more micro-batches than its schedule's warm-up is simulated twice with
    fewer and extrapolated (``plansim.sim.steady_state``: exact for the 1F1B family up to
    rounding); ``whole`` simulates every micro-batch (for a timeline of the whole step).

    Args:
        checked: ``check_plan`` already passed (skip it).
        memo: a search's cache (``build_pipeline_work``'s memo; action lists are kept in it
            too, keyed by schedule, pp, m and vpp). Same results with or without it.
        whole: simulate all ``plan.num_microbatches`` micro-batches.

    Raises:
        SpecError: the schedule builder does not support the plan's schedule/vpp.
    """
    if not checked:
        rejected = check_plan(model, plan, profile, memo=memo)
        if rejected is not None:
            return rejected
    sizes = None if whole else plan_steady_state(plan)
    if sizes is None:
        result, work = _simulated(model, plan, profile, memo)
    else:
        short, work = _simulated(model, _with_microbatches(plan, sizes.short), profile, memo)
        long, _ = _simulated(model, _with_microbatches(plan, sizes.long), profile, memo)
        result = extrapolate(short, long, repeats=sizes.repeats)
    peak = max(result.peak_memory_bytes)
    if peak > profile.hbm_capacity_bytes:
        worst_rank = result.peak_memory_bytes.index(peak)
        breakdown = rank_memory(model, plan, profile, rank=worst_rank, memo=memo)
        return Rejected(
            plan=plan,
            category=OUT_OF_MEMORY,
            reason=breakdown.describe(capacity_bytes=profile.hbm_capacity_bytes),
            need_bytes=peak,
        )
    num_buckets = sum(len(stage.grad_buckets) for stage in work.stages)
    return _metrics(model, plan, profile, result, num_grad_buckets=num_buckets)


def _with_microbatches(plan: ParallelPlan, num_microbatches: int) -> ParallelPlan:
    """``plan`` with a global batch of ``num_microbatches`` per pipeline."""
    gbs = num_microbatches * plan.micro_batch_size * plan.dp
    return plan.with_fields(global_batch_size=gbs)


def _simulated(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, memo: Memo | None
) -> tuple[SimResult, PipelineWork]:
    work = build_pipeline_work(model, plan, profile, memo=memo)
    return simulate(_actions(plan, memo), work), work


def _actions(plan: ParallelPlan, memo: Memo | None) -> PerRankActions:
    """The plan's action lists, built once per (schedule, pp, m, vpp) when memoised."""
    key = ("actions", plan.schedule, plan.pp, plan.num_microbatches, plan.vpp)
    found = memo.get(key) if memo is not None else None
    if found is None:
        found = build_actions(
            plan.schedule, num_ranks=plan.pp, num_microbatches=plan.num_microbatches, vpp=plan.vpp
        )
        if memo is not None:
            memo[key] = found
    return found  # type: ignore[return-value]


def step_flops(model: ModelSpec, plan: ParallelPlan) -> tuple[float, float]:
    """(model, hardware) FLOPs of one step of ``plan`` (``flops.model_flops_per_step`` and
    ``hardware_flops_per_step``). A model with experts, MLA or MTP modules: 3 x its forward
    GEMM FLOPs per token (``moe_counts.model_flops_per_token``, attention over all keys as
    for dense models, MTP modules included as they are trained) x the step's tokens; full
    recompute adds one forward (the per-layer recompute of selective modes is left out of
    its HFU)."""
    if not is_dense(model):
        tokens = plan.global_batch_size * model.seq_length
        forward = forward_flops_per_token(model).total_with_mtp * tokens
        model_flops = float(FWD_BWD_MULTIPLIER * forward)
        full = plan.recompute is Recompute.FULL
        return model_flops, model_flops + (float(forward) if full else 0.0)
    counts = stage_layer_counts(model.num_layers, plan)
    hw_flops = hardware_flops_per_step(
        model,
        global_batch_size=plan.global_batch_size,
        recompute=plan.recompute,
        recomputed_layers=sum(plan.recomputed_layers(c) for c in counts),
    )
    return model_flops_per_step(model, global_batch_size=plan.global_batch_size), hw_flops


def _metrics(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    result: SimResult,
    *,
    num_grad_buckets: int = 0,
) -> Evaluation:
    step = result.step_time_s
    peak_flops = profile.peak_flops_per_s[plan.precision.value] * plan.num_gpus
    model_flops, hw_flops = step_flops(model, plan)
    return Evaluation(
        plan=plan,
        step_time_s=step,
        tokens_per_s=plan.global_batch_size * model.seq_length / step,
        mfu=model_flops / (step * peak_flops),
        hfu=hw_flops / (step * peak_flops),
        bubble_fraction=result.bubble_fraction,
        peak_memory_bytes=max(result.peak_memory_bytes),
        memory=worst_rank_memory(model, plan, profile),
        result=result,
        exposed_comm_s_by_kind=dict(result.exposed_s_by_kind),
        num_grad_buckets=num_grad_buckets,
    )
