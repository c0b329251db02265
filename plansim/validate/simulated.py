"""The simulated side of a validation: the plan simulated as torch executes it (pure).

Where it differs from ``plansim.planner.evaluate.evaluate``'s Megatron-LM defaults, it is to
simulate what the runner executes: the plan's precision is the run's dtype
(:func:`run_plan`; fp32 on the CPU: fp32 GEMM curve, 4-byte weights, gradients,
activations and messages, torch AdamW's 28 B/param step; ``plansim.specs.plan.Precision``),
pipeline sends are asynchronous (:func:`_resimulated`), tensor parallelism is
DTensor's over the validate model's separate projections (:func:`dtensor_backward_all_reduces`),
and ZeRO-0/1 gradients and parameters move as the runner moves them (one flat all-reduce,
ZeroRedundancyOptimizer's broadcasts: ``plansim.validate.executed_dp``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from plansim.analytic.comm import Collective, collective_time_s
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.ranks import layout_groups
from plansim.analytic.tp_comm import hidden_message_bytes
from plansim.errors import choice_error
from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.schedule.builders import build_actions
from plansim.sim import timeline as tl
from plansim.sim.engine import simulate
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import stage_layer_counts
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    DdpImpl,
    Framework,
    ParallelPlan,
    Precision,
    Recompute,
    Zero3ParamFetch,
)
from plansim.specs.work import PipelineWork, Segment, lengthen_first
from plansim.validate.eager_layer import LayerExtra, eager_layer_extra
from plansim.validate.executed_dp import executes_flat_all_reduce, with_executed_dp
from plansim.validate.executed_fsdp import executed_zero_plan, runs_per_step
from plansim.validate.executed_loss import (
    with_replicated_head,
    with_runner_loss,
    with_runner_loss_time,
)
from plansim.validate.framework_overhead import (
    Extra,
    fsdp_unit_extra,
    pipeline_action_extra,
    tp_all_reduce_extra,
)
from plansim.validate.result import ValidateError


def run_plan(plan: ParallelPlan, profile: HardwareProfile, *, dtype: str) -> ParallelPlan:
    """``plan`` as the run executes it: in ``dtype`` (``fp32`` on the CPU), and without
    gradient-accumulation fusion (autograd's ``AccumulateGrad`` adds each micro-batch's weight
    gradients into ``.grad`` in a separate kernel). On a profile whose host and device are
    one processor (``host_overhead.serial``: a CPU device) ZeRO-3 is ``layer-sync``: FSDP2
    has no side stream there, so each unit's all-gather and reduce-scatter is waited for
    where it is issued (measured with torch.profiler on a dp2 ZeRO-3 gloo run: every
    ``FSDP::all_gather`` and ``FSDP::post_backward_reduce`` spends about one collective's
    time in the main thread). Under pipelining (pp > 1) ZeRO-2/3 runs FSDP2 once per step,
    priced as ZeRO-3 ``per-step``; without, ZeRO-2 is FSDP2 without resharding after
    forward (``executed_fsdp``). The runner's ZeRO-0/1 gradient
    all-reduce runs after the last backward (``overlap_grad_reduce`` off; ``executed_dp``).
    Full recompute is torch's non-reentrant ``checkpoint_wrapper``, which stops early
    (``ParallelPlan.recompute_early_stop``). On a GPU the model's ``nn.LayerNorm`` /
    ``nn.RMSNorm`` backward is two kernels, the weight gradients' (``GammaBetaBackward``,
    the H100 kernel profile in ``benchmarks/gpu_runs/h100-2026-11-27-bf16/``) re-reading dy
    and x after the input gradient's, so ``persist_layer_norm`` is off there; torch's CPU
    kernel computes both in one pass over each row (``LayerNormBackwardKernelImpl``), so a
    serial-host profile keeps the plan's.

    Raises:
        ValidateError: ``dtype`` is not a precision plansim models, or ``profile`` has no
            GEMM data for it (a profile needs ``matmul_efficiency.<dtype>`` to price the run;
            ``plansim calibrate`` measures fp32, bf16 and fp16).
    """
    allowed = [p.value for p in Precision]
    if dtype not in allowed:
        raise ValidateError(str(choice_error("dtype", dtype, allowed)))
    precision = Precision(dtype)
    if dtype not in profile.matmul_efficiency:
        raise ValidateError(
            f"profile {profile.name} has no matmul data for the run's dtype {dtype!r}; "
            f"has: {', '.join(profile.dtypes())}"
        )
    per_step = runs_per_step(plan)
    plan = executed_zero_plan(plan)
    serial = profile.serial_host and not per_step
    fetch = Zero3ParamFetch.LAYER_SYNC if serial else plan.zero3_param_fetch
    return plan.with_fields(
        framework=Framework.PYTORCH,  # the validator's own runner: plain torch.distributed
        precision=precision,
        recompute_early_stop=plan.recompute is Recompute.FULL,
        gradient_accumulation_fusion=False,
        persist_layer_norm=plan.persist_layer_norm and profile.serial_host,
        zero3_param_fetch=fetch,
        overlap_grad_reduce=plan.overlap_grad_reduce and not executes_flat_all_reduce(plan),
    )


def executed_model(model: ModelSpec) -> ModelSpec:
    """``model`` as the run executes it: without dropout (``plansim.validate.model`` has no
    dropout module; a model with ``dropout`` would be priced for mask kernels the run never
    launches, and its full recompute could not stop early)."""
    return dataclasses.replace(model, dropout=False) if model.dropout else model


def simulation_profile(profile: HardwareProfile, *, dtype: str, precision: str) -> HardwareProfile:
    """``profile`` with ``dtype``'s GEMM peak and curve under the name ``precision``.

    Kept for callers that price a run in one dtype under another precision's name; the
    validator itself simulates the run's own precision (:func:`run_plan`). Unchanged when
    ``dtype == precision``.

    Raises:
        ValidateError: the profile has no GEMM data for ``dtype``.
    """
    if dtype == precision:
        return profile
    if dtype not in profile.matmul_efficiency:
        raise ValidateError(
            f"profile {profile.name} has no matmul data for the run's dtype {dtype!r}; "
            f"has: {', '.join(profile.dtypes())}"
        )
    return dataclasses.replace(
        profile,
        peak_flops_per_s={**profile.peak_flops_per_s, precision: profile.peak_flops_per_s[dtype]},
        matmul_efficiency={
            **profile.matmul_efficiency,
            precision: profile.matmul_efficiency[dtype],
        },
    )


def simulate_plan(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, dtype: str
) -> Evaluation:
    """The simulated Evaluation of ``plan`` on ``profile`` as the run executed it: in the
    run's precision ``dtype`` (:func:`run_plan`) and with asynchronous pipeline sends
    (:func:`_resimulated`) and DTensor's TP all-reduces.

    Raises:
        ValidateError: the plan is rejected on that profile (the reason is in the message),
            or the profile lacks ``dtype``.
    """
    executed = run_plan(plan, profile, dtype=dtype)
    model = executed_model(model)
    outcome = evaluate(model, executed, profile, whole=True)  # compared event by event
    if isinstance(outcome, Rejected):
        raise ValidateError(
            f"cannot simulate {plan.label()} in {dtype} on {profile.name}: "
            f"{outcome.category}: {outcome.reason}"
        )
    backward_all_reduces = dtensor_backward_all_reduces(model, executed)
    extra = backward_all_reduces - MEGATRON_BACKWARD_ALL_REDUCES
    added = Added(
        layer=eager_layer_extra(model, executed, profile),
        tp=tp_all_reduce_extra(executed, profile, backward_all_reduces=backward_all_reduces),
        fsdp=fsdp_unit_extra(executed, profile),
        pipeline=pipeline_action_extra(executed, profile),
    )
    return _resimulated(outcome, model, profile, extra_all_reduces=extra, added=added)


@dataclass(frozen=True, slots=True, kw_only=True)
class Added:
    """Seconds the executed run adds to plansim's stage work: per layer the eager layer
    (``eager_layer``, on compute), DTensor's all-reduces (on the TP segments) and FSDP2's
    units (``framework_overhead``, per layer and for the stage root, on the ZeRO-3
    segments); per pipeline action torch.distributed.pipelining's own cost
    (``framework_overhead.pipeline_action_extra``, on compute)."""

    layer: LayerExtra
    tp: Extra
    fsdp: Extra
    pipeline: Extra


#: TP all-reduces of one layer's backward in Megatron-LM (Shoeybi et al. 2019 §3: the ``f``
#: operator before the fused QKV projection and before the first MLP matrix).
MEGATRON_BACKWARD_ALL_REDUCES = 2


def dtensor_backward_all_reduces(model: ModelSpec, plan: ParallelPlan) -> int:
    """TP all-reduces of one layer's backward in the validate model (without sequence
    parallelism; 0 with tp == 1).

    The validate model (``plansim.validate.model``) keeps q, k and v, and the MLP's up (and
    gate, SwiGLU) as separate column-parallel ``nn.Linear`` modules
    (``plansim.validate.parallelize``: ``ColwiseParallel`` on each). DTensor turns the
    gradient of each one's replicated input into its own all-reduce, where Megatron-LM sums
    them locally first (one per fused projection): 3 + (1 or 2) per layer instead of 2
    (measured with torch.profiler on a tp2 CPU run: 24 all-reduces per micro-batch of a
    4-layer GELU model = 2 forward + 4 backward per layer). With sequence parallelism the
    count is left at Megatron's.
    """
    if plan.tp == 1:
        return 0
    if plan.sequence_parallel:
        return MEGATRON_BACKWARD_ALL_REDUCES
    return 3 + (model.activation.num_ffn_matrices - 1)


def _resimulated(
    ev: Evaluation,
    model: ModelSpec,
    profile: HardwareProfile,
    *,
    extra_all_reduces: int,
    added: Added,
) -> Evaluation:
    """``ev`` re-simulated as torch runs it: asynchronous pipeline sends,
    ``extra_all_reduces`` more TP all-reduces per layer in backward (DTensor,
    :func:`dtensor_backward_all_reduces`), and what the executed run adds (``added``:
    the eager layer's extra compute, DTensor's all-reduce and FSDP2's unit overheads) on
    the stage's forward and backward (its forward figures again in backward under full
    recomputation), and the runner's output layer and loss on the last stage (replicated over
    TP, torch's cross-entropy time and memory: ``executed_loss``).

    ``torch.distributed.pipelining`` posts each send with ``isend`` (``_batch_p2p``) and
    waits for the sends only later in the step, so the sender goes straight on; the
    simulator's default for 1F1B/GPipe is Megatron-LM's synchronous send (the sender waits
    for the transfer). Receives block in both. The extra all-reduces lengthen each stage's
    backward ``tp_comm`` segment by layers x extra x one all-reduce of the b*s*h activation
    gradient on the TP group. DualPipeV's overlapped pairs run their forward, then their
    backward (``PipelineWork.overlap_fb`` False: torch's runtime performs an
    ``OVERLAP_F_B``'s sub-actions in turn unless a custom overlap function is registered,
    and the validator registers none). Figures read from the events are replaced; MFU and
    HFU scale with the step time.
    """
    plan = ev.plan
    if executes_flat_all_reduce(plan):  # the run's all-reduce averages (ReduceOp.AVG)
        plan = plan.with_fields(ddp_impl=DdpImpl.AVERAGE_IN_COLLECTIVE)
    work = dataclasses.replace(
        build_pipeline_work(model, plan, profile), blocking_p2p=False, overlap_fb=False
    )
    if extra_all_reduces:
        work = _with_tp_all_reduces(work, model, plan, profile, extra_all_reduces)
    layers = stage_layer_counts(model.num_layers, plan)
    work = _with_added(work, plan, added, layers=layers)
    work = _with_per_step_units(work, plan, added.fsdp, layers=layers)
    work = with_executed_dp(work, model, plan, profile)
    work = with_runner_loss(work, model, plan)
    work = with_replicated_head(work, model, plan, profile)
    work = with_runner_loss_time(work, model, plan, profile)
    actions = build_actions(
        plan.schedule, num_ranks=plan.pp, num_microbatches=plan.num_microbatches, vpp=plan.vpp
    )
    result = simulate(actions, work)
    ratio = ev.step_time_s / result.step_time_s
    return dataclasses.replace(
        ev,
        step_time_s=result.step_time_s,
        tokens_per_s=ev.tokens_per_s * ratio,
        mfu=ev.mfu * ratio,
        hfu=ev.hfu * ratio,
        bubble_fraction=result.bubble_fraction,
        peak_memory_bytes=max(result.peak_memory_bytes),
        result=result,
        exposed_comm_s_by_kind=dict(result.exposed_s_by_kind),
    )


def _with_added(
    work: PipelineWork, plan: ParallelPlan, added: Added, *, layers: tuple[int, ...]
) -> PipelineWork:
    """``work`` with ``added`` for ``layers[s]`` layers on stage s: on the first compute, TP and
    ZeRO-3 (``dp_comm``) segment of each stage's forward and backward (and input-gradient
    backward); FSDP2's for ``layers`` + 1 units (the stage root is one more). Under full
    recomputation the layer's and the all-reduces' forward figures count again in backward.
    The pipeline action's figures go into a compute segment of their own
    (:data:`PIPELINE_ACTION_KIND`) before each stage forward and backward: the schedule's
    work between actions, which the run's forward/backward intervals do not contain."""

    def kind_of(stream: str, kind: str = "") -> Callable[[Segment], bool]:
        return lambda seg: seg.stream == stream and (not kind or seg.kind == kind)

    stages = []
    for st, n in zip(work.stages, layers, strict=True):
        again = plan.recomputed_layers(n)  # layers whose forward the backward runs again
        parts = (  # (segments, how many, seconds, how many repeated by a recompute forward)
            (kind_of("compute"), n, added.layer, again),
            (kind_of("tp", "tp_comm"), n, added.tp, again),
            (kind_of("dp", "dp_comm"), n + 1, added.fsdp, 0),  # one unshard serves both
        )
        forward, backward, backward_input = st.forward, st.backward, st.backward_input
        for match, count, extra, repeated in parts:
            fwd_s = count * extra.forward_s
            bwd_s = count * extra.backward_s + repeated * extra.forward_s
            forward = lengthen_first(forward, fwd_s, match)
            backward = lengthen_first(backward, bwd_s, match)
            backward_input = lengthen_first(backward_input, bwd_s, match)
        forward = _action_first(forward, added.pipeline.forward_s)
        backward = _action_first(backward, added.pipeline.backward_s)
        backward_input = _action_first(backward_input, added.pipeline.backward_s)
        stages.append(
            dataclasses.replace(
                st, forward=forward, backward=backward, backward_input=backward_input
            )
        )
    return dataclasses.replace(work, stages=tuple(stages))


def _with_per_step_units(
    work: PipelineWork, plan: ParallelPlan, fsdp: Extra, *, layers: tuple[int, ...]
) -> PipelineWork:
    """``work`` with FSDP2's per-unit figures once per step for a ``per-step`` run
    (``executed_fsdp.runs_per_step``; unchanged otherwise): the forward figure per unit on
    the rank's gather (the ``dp_comm`` segment of its optimizer work), the backward figure
    on its reduce-scatter (the first ``dp_comm`` segment of its ``grad_sync``). A rank's
    units are its stages' layers plus one stage root each. The hooks that run in the other
    micro-batches, without a collective, are not priced."""
    if not runs_per_step(plan) or (fsdp.forward_s, fsdp.backward_s) == (0.0, 0.0):
        return work

    def dp_comm(seg: Segment) -> bool:
        return seg.kind == "dp_comm"

    ranks = []
    for r, rank in enumerate(work.ranks):
        units = sum(layers[s] + 1 for s in plan.stages_of_rank(r))
        ranks.append(
            dataclasses.replace(
                rank,
                grad_sync=lengthen_first(rank.grad_sync, units * fsdp.backward_s, dp_comm),
                optimizer=lengthen_first(rank.optimizer, units * fsdp.forward_s, dp_comm),
            )
        )
    return dataclasses.replace(work, ranks=tuple(ranks))


def _with_tp_all_reduces(
    work: PipelineWork,
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    extra: int,
) -> PipelineWork:
    """``work`` with ``extra`` more all-reduces per layer in each stage's backward TP segment."""
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    message = hidden_message_bytes(model, plan)
    one = collective_time_s(
        profile, collective=Collective.ALL_REDUCE, message_bytes=message, span=groups.tp
    )
    per_layer_s = extra * one

    def tp(seg: Segment) -> bool:
        return seg.kind == "tp_comm"

    stages = tuple(
        dataclasses.replace(
            st,
            backward=lengthen_first(st.backward, n * per_layer_s, tp),
            backward_input=lengthen_first(st.backward_input, n * per_layer_s, tp),
        )
        for st, n in zip(work.stages, stage_layer_counts(model.num_layers, plan), strict=True)
    )
    return dataclasses.replace(work, stages=stages)


#: Timeline kind of a pipeline action's own work (torch.distributed.pipelining's per-action
#: cost, ``framework_overhead.pipeline_action_extra``); the run records no such interval.
PIPELINE_ACTION_KIND = tl.TimelineKind.PIPELINE_ACTION.value


def _action_first(segments: tuple[Segment, ...], seconds: float) -> tuple[Segment, ...]:
    """``segments`` behind a :data:`PIPELINE_ACTION_KIND` compute segment of ``seconds``
    (unchanged when ``seconds`` is 0 or there are no segments)."""
    if seconds <= 0 or not segments:
        return segments
    return (Segment(kind=PIPELINE_ACTION_KIND, stream="compute", duration_s=seconds), *segments)
