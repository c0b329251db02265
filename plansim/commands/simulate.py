"""plansim simulate: simulate one plan as events and report its metrics and memory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plansim.analytic.layer_timing import layer_wall_times
from plansim.catalog import resolve_model
from plansim.commands.common import (
    add_bf16_layer_args,
    add_dispatcher_arg,
    add_dp_sync_args,
    add_eager_elementwise_arg,
    add_model_args,
    add_offload_args,
    add_persist_layer_norm_arg,
    add_pipeline_split_args,
    add_recompute_args,
    bf16_layers_from_args,
    check_no_plan_flags,
    dp_syncs_from_args,
    plan_flag_defaults,
    require_args,
    resolve,
    shared_plan_fields,
)
from plansim.commands.run_options import RUN_FLAGS, RunInputs, add_run_args, run_inputs
from plansim.commands.simulate_report import (
    SimulateReport,
    json_doc,
    json_text,
    rejected_text,
    shown_window,
    table_text,
    write_html_report,
)
from plansim.errors import SpecError, require_positive_int
from plansim.io.outputs import check_writable
from plansim.io.plan_file import read_plan_file
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.planner.lookups import out_of_range, recording_profile
from plansim.planner.sensitivity import sensitivity
from plansim.planner.training_run import estimate_run
from plansim.report.run_report import run_dict, run_text
from plansim.report.trace import chrome_trace, write_trace
from plansim.sim import timeline as tl
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import require_plan_divides_model
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    AttentionKernel,
    DdpImpl,
    OffloadDevice,
    ParallelPlan,
    Precision,
    Schedule,
    Zero3ParamFetch,
    plan_from_fields,
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim simulate``: its flags in groups (layout, overlap, framework
    behaviour, ZeRO-3, outputs) so ``--help`` reads by topic."""
    p = sub.add_parser("simulate", help="simulate one plan", description=__doc__)
    p.add_argument(
        "--plan",
        metavar="PLAN.yaml",
        help="simulate the plan of a plan file ('plansim plan --save-plan'): it gives the "
        "model, GPUs and every plan field, so no layout flag goes with it (--gpu may "
        "price it on another profile)",
    )
    add_model_args(p, required=False)
    _add_layout_args(p.add_argument_group("layout"))
    add_recompute_args(p)
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron SP (tp > 1)")
    p.add_argument("--schedule", choices=[s.value for s in Schedule], default="1f1b")
    _add_overlap_args(p.add_argument_group("communication overlap"))
    add_dp_sync_args(p, allow_all=False)
    _add_framework_args(p.add_argument_group("framework behaviour"))
    p.add_argument("--attention", choices=[a.value for a in AttentionKernel], default="flash")
    add_offload_args(p)
    _add_sharding_args(p.add_argument_group("ZeRO-3 and sharding"))
    add_pipeline_split_args(p)
    add_bf16_layer_args(p)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also report what the step time rests on: its elasticity to each profile term "
        "(GEMM rate, HBM, NVLink, network, kernel launch, collective latency, host, PCIe; "
        "each made 10%% faster and the plan simulated again) and the provenance of the "
        "figures behind each",
    )
    out = p.add_argument_group("outputs (written only when the plan fits)")
    out.add_argument(
        "--trace",
        metavar="OUT.json",
        help="Chrome/Perfetto trace of the step (open in ui.perfetto.dev or chrome://tracing)",
    )
    out.add_argument("--plot", metavar="OUT.png", help="pipeline Gantt chart (PNG)")
    out.add_argument("--memory-plot", metavar="OUT.png", help="memory over time per rank (PNG)")
    out.add_argument(
        "--report",
        metavar="OUT.html",
        help="one self-contained HTML page (opens offline): the summary, interactive bubble "
        "Gantt chart, memory over time and memory breakdown",
    )
    out.add_argument(
        "--whole-step",
        action="store_true",
        help="trace, draw and report every micro-batch of a long step (default: a step of "
        "thousands of micro-batches shows its warm-up, steady-state windows and cool-down, "
        "which the rest repeats, so memory stays flat in the micro-batch count)",
    )
    add_run_args(p)
    keep = (
        "plan",
        "gpu",
        "format",
        "sensitivity",
        "trace",
        "plot",
        "memory_plot",
        "report",
        "whole_step",
        *RUN_FLAGS,
    )
    p.set_defaults(func=run, plan_flag_defaults=plan_flag_defaults(p, keep=keep))


def _add_layout_args(g: argparse._ArgumentGroup) -> None:
    """--tp, --pp, --dp, --cp, --vpp, --mbs, --zero."""
    g.add_argument("--tp", type=int, help="tensor-parallel size (required without --plan)")
    g.add_argument("--pp", type=int, help="pipeline-parallel size (required without --plan)")
    g.add_argument("--dp", type=int, default=None, help="data-parallel size (default: derived)")
    g.add_argument(
        "--cp",
        type=int,
        default=1,
        help="context-parallel size (ring attention; the sequence length must split into "
        "2 * cp chunks; needs --attention flash)",
    )
    g.add_argument(
        "--vpp",
        type=int,
        default=None,
        help="virtual pipeline stages (model chunks) per rank; > 1 needs "
        f"--schedule {Schedule.INTERLEAVED_1F1B.value}, or 2 with zb-v / dualpipev "
        "(their default; 1 otherwise)",
    )
    g.add_argument("--mbs", type=int, help="micro-batch size (required without --plan)")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (default 0)")


def _add_overlap_args(g: argparse._ArgumentGroup) -> None:
    """The Megatron-LM overlap flags: pipeline sends, TP, DP gradients, parameter gathers."""
    g.add_argument(
        "--overlap-p2p-comm",
        action="store_true",
        help="asynchronous pipeline sends beside compute (interleaved-1f1b only)",
    )
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="TP all-gathers/reduce-scatters split and pipelined with their GEMMs (Megatron "
        "--tp-comm-overlap, Transformer Engine userbuffers; needs --sequence-parallel)",
    )
    g.add_argument(
        "--overlap-grad-reduce",
        action="store_true",
        help="DP gradient reduction in buckets overlapped with backward (Megatron flag)",
    )
    g.add_argument(
        "--overlap-param-gather",
        action="store_true",
        help="ZeRO-1/2 parameter all-gather in buckets hidden behind the next forward "
        "(Megatron flag; needs --zero 1 or 2 and --overlap-grad-reduce)",
    )


def _add_framework_args(g: argparse._ArgumentGroup) -> None:
    """Flags that say how the framework runs the step (gradient accumulation, reduction
    dtype, checkpoint early stop, pipeline scatter/gather)."""
    g.add_argument(
        "--no-gradient-accumulation-fusion",
        dest="gradient_accumulation_fusion",
        action="store_false",
        help="add each micro-batch's weight gradients in a separate pass (pre-2022 Megatron)",
    )
    add_eager_elementwise_arg(g)
    add_persist_layer_norm_arg(g)
    g.add_argument(
        "--grad-reduce-in-bf16",
        action="store_true",
        help="accumulate and reduce gradients in bf16 instead of an fp32 main-gradient buffer "
        "(Megatron flag; precision bf16, fp8 or fp4)",
    )
    g.add_argument(
        "--recompute-early-stop",
        action="store_true",
        help="full recompute through torch's non-reentrant checkpoint, which stops early "
        "(torch.utils.checkpoint use_reentrant=False: torchtitan, checkpoint_wrapper): a "
        "layer's MLP down projection and the TP collective after it are not rerun (models "
        "without dropout; needs --recompute full)",
    )
    g.add_argument(
        "--recompute-modules",
        default=None,
        metavar="LIST",
        help="with --recompute selective, what Megatron-Core also recomputes, comma-separated: "
        "mla_up_proj, layernorm, moe_act (--recompute-modules; DeepSeek-V3 recomputes "
        "RMSNorm and the MLA up-projections)",
    )
    g.add_argument("--ep", type=int, default=1, help="expert-parallel size (models with experts)")
    add_dispatcher_arg(g)
    g.add_argument(
        "--etp",
        type=int,
        default=None,
        help="expert tensor-parallel size (default: tp, as Megatron-Core)",
    )
    g.add_argument(
        "--expert-load-imbalance",
        type=float,
        default=1.0,
        help="routed rows on the busiest EP rank over the mean (>= 1; default 1.0, balanced)",
    )
    g.add_argument(
        "--pipeline-model-parallel-layout",
        default=None,
        metavar="LAYOUT",
        help="every pipeline stage's layers, Megatron-Core's syntax (e.g. 'Et|(tt|)*30L': E "
        "embedding, t layer, L loss, | between stages)",
    )
    g.add_argument(
        "--no-scatter-gather-tensors-in-pipeline",
        dest="scatter_gather_p2p",
        action="store_false",
        help="without --sequence-parallel every TP rank sends the whole pipeline tensor "
        "(Megatron 2020) instead of a 1/tp slice re-formed by an all-gather",
    )


def _add_sharding_args(g: argparse._ArgumentGroup) -> None:
    """ZeRO-3 flags: PyTorch FSDP, resharding, parameter fetch, hybrid sharding."""
    g.add_argument(
        "--use-torch-fsdp2",
        action="store_true",
        help="ZeRO-3 through PyTorch FSDP (Megatron flag): fp32 sharded parameters are the "
        "master weights, 16 bytes per parameter instead of 18 (needs --zero 3)",
    )
    g.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="keep each ZeRO-3 unit gathered from its forward to its backward (PyTorch FSDP2 "
        "reshard_after_forward=False, FSDP1 SHARD_GRAD_OP): no gather before backward; needs "
        "--zero 3 with layer-prefetch or layer-sync",
    )
    g.add_argument(
        "--zero3-param-fetch",
        choices=[f.value for f in Zero3ParamFetch],
        default=None,
        help="ZeRO-3: one prefetched all-gather per layer overlapped with compute (FSDP; "
        "default), one synchronous collective per parameter tensor (DeepSpeed 2021), one "
        "synchronous collective per layer (FSDP without prefetch, e.g. on a CPU device), or "
        "one gather and one reduce-scatter per step, parameters and gradients unsharded "
        "across the micro-batches (per-step: FSDP2 under torch.distributed.pipelining, "
        "torchtitan with pp > 1)",
    )
    g.add_argument(
        "--dp-shard",
        type=int,
        default=None,
        metavar="N",
        help="hybrid sharding: shard the ZeRO states over N * cp ranks (e.g. one node) and "
        "replicate over dp / N (ZeRO-3: HSDP, FSDP HYBRID_SHARD; ZeRO-1/2: Megatron's "
        "--num-distributed-optimizer-instances = dp / N); default: shard over all dp",
    )


def plan_from_args(args: argparse.Namespace) -> ParallelPlan:
    """Build the ParallelPlan the flags describe; SpecError names inconsistent values."""
    dp = _data_parallel_size(args)
    fetch = _zero3_fetch(args)
    bf16_start, bf16_end = bf16_layers_from_args(args)
    return plan_from_fields(
        **shared_plan_fields(args, dp=dp),
        cp=args.cp,
        recompute_early_stop=args.recompute_early_stop,
        recompute_modules=args.recompute_modules,
        ep=args.ep,
        etp=args.etp,
        expert_load_imbalance=args.expert_load_imbalance,
        moe_token_dispatcher_type=MoeTokenDispatcher(args.moe_token_dispatcher_type),
        pipeline_model_parallel_layout=args.pipeline_model_parallel_layout,
        precision=Precision(args.precision),
        attention=AttentionKernel(args.attention),
        dp_sync=dp_syncs_from_args(args)[0],
        ps_servers=args.ps_servers,
        ddp_impl=DdpImpl(args.ddp_impl),
        overlap_p2p_comm=args.overlap_p2p_comm,
        tp_comm_overlap=args.tp_comm_overlap,
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        gradient_accumulation_fusion=args.gradient_accumulation_fusion,
        fused_elementwise=args.fused_elementwise,
        persist_layer_norm=args.persist_layer_norm,
        grad_reduce_in_bf16=args.grad_reduce_in_bf16,
        scatter_gather_p2p=args.scatter_gather_p2p,
        offload_optimizer=OffloadDevice(args.offload_optimizer),
        offload_param=OffloadDevice(args.offload_param),
        zero3_param_fetch=fetch,
        use_torch_fsdp2=args.use_torch_fsdp2,
        reshard_after_forward=args.reshard_after_forward,
        num_layers_at_start_in_bf16=bf16_start,
        num_layers_at_end_in_bf16=bf16_end,
    )


#: Flags a simulation needs when no plan file gives them.
REQUIRED_FLAGS = ("--model", "--gpu", "--gpus", "--gbs", "--tp", "--pp", "--mbs")


def plan_and_context(args: argparse.Namespace) -> tuple[ParallelPlan, ModelSpec, HardwareProfile]:
    """The plan, model and profile: from ``--plan`` (``--gpu`` may replace the file's
    profile) or from the flags (:func:`plan_from_args`).

    Raises:
        SpecError: a required flag is missing without --plan, or a plan flag is given with it.
        InputFileError: the plan file is unreadable or invalid (names the file and key).
    """
    if args.plan is None:
        require_args(args, REQUIRED_FLAGS, unless="--plan")
        plan = plan_from_args(args)
        model, profile = resolve(args)
        return plan, model, profile
    check_no_plan_flags(args, args.plan_flag_defaults)
    plan_file = read_plan_file(args.plan)
    model = resolve_model(plan_file.model, seq_length=plan_file.seq_length)
    return plan_file.plan, model, load_profile(args.gpu or plan_file.gpu)


def _data_parallel_size(args: argparse.Namespace) -> int:
    """dp = --gpus / (tp * pp * cp), checked against --dp when given.

    Raises:
        SpecError: a size that is not a positive integer, or sizes that do not multiply out.
    """
    for name in ("gpus", "gbs", "tp", "pp", "cp", "mbs"):
        require_positive_int(f"--{name}", getattr(args, name))
    if args.vpp is not None:
        require_positive_int("--vpp", args.vpp)
    model_parallel = args.tp * args.pp * args.cp
    if args.gpus % model_parallel:
        raise SpecError(
            f"--gpus({args.gpus}) is not divisible by tp({args.tp}) * pp({args.pp}) * "
            f"cp({args.cp}) = {model_parallel}"
        )
    dp: int = args.gpus // model_parallel
    if args.dp is not None and args.dp != dp:
        raise SpecError(
            f"tp({args.tp}) * pp({args.pp}) * dp({args.dp}) * cp({args.cp}) = "
            f"{model_parallel * args.dp} != --gpus({args.gpus})"
        )
    return dp


def _zero3_fetch(args: argparse.Namespace) -> Zero3ParamFetch:
    """--zero3-param-fetch (default layer-prefetch).

    Raises:
        SpecError: given without --zero 3.
    """
    if args.zero3_param_fetch is not None and args.zero != 3:
        raise SpecError(
            f"--zero3-param-fetch {args.zero3_param_fetch} needs --zero 3 (got --zero "
            f"{args.zero}): it says how ZeRO-3 gathers parameters"
        )
    return Zero3ParamFetch(args.zero3_param_fetch or Zero3ParamFetch.LAYER_PREFETCH.value)


def run(args: argparse.Namespace) -> int:
    """Simulate and print; exit 1 when the plan is rejected (e.g. out of memory).

    Raises:
        SpecError: the flags describe a layout that cannot split the model (layers over
            pp * vpp, heads over tp, the sequence over 2 * cp): a usage error (exit 2), not
            an infeasible plan.
    """
    plan, model, profile = plan_and_context(args)
    outputs = _outputs(args)
    require_plan_divides_model(plan, model)
    inputs = run_inputs(args, model=model, global_batch_size=plan.global_batch_size)
    recorded, lookups = recording_profile(profile)  # same prices, lookups logged
    # the figures may come from the steady state; a trace or plot of a long step shows the
    # longer of its two shorter simulations unless --whole-step asks for every micro-batch
    outcome = evaluate(model, plan, recorded, whole=bool(outputs) and args.whole_step)
    if isinstance(outcome, Rejected):
        for flag in outputs:
            sys.stderr.write(f"plansim: {flag} not written: the plan was rejected\n")
        sys.stdout.write(rejected_text(outcome, args.format))
        return 1
    title = f"{model.name} on {plan.num_gpus} x {profile.name}: {plan.label()}"
    shown = _shown_note(plan, outcome) if outputs else ""
    report = SimulateReport(
        model=model,
        plan=plan,
        profile=profile,
        outcome=outcome,
        outside=out_of_range(profile, lookups),
        layer=layer_wall_times(model, plan, profile),
        sens=sensitivity(model, plan, profile, base=outcome) if args.sensitivity else None,
    )
    _write_outputs(outputs, report, title=title, shown=shown)
    if inputs is None:
        sys.stdout.write(json_text(report) if args.format == "json" else table_text(report))
        return 0
    return _whole_run(args, report, inputs)


def _whole_run(args: argparse.Namespace, report: SimulateReport, inputs: RunInputs) -> int:
    """Print the step report with the whole run (``--tokens``); exit 1 when a ramp phase
    cannot run the layout."""
    est = estimate_run(
        report.model,
        report.plan,
        report.profile,
        inputs.run,
        failures=inputs.failures,
        facility=inputs.facility,
        prices=inputs.prices,
    )
    if isinstance(est, Rejected):
        sys.stdout.write(rejected_text(est, args.format))
        return 1
    facility = inputs.facility is not None
    if args.format == "json":
        doc = json_doc(report)
        doc["run"] = run_dict(est, facility=facility)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    source = "" if inputs.failures is None else inputs.failures.source
    sys.stdout.write(table_text(report))
    sys.stdout.write(
        run_text(est, tokens=inputs.run.tokens, facility=facility, failures_source=source)
    )
    return 0


_OUTPUT_FLAGS = {
    "trace": "--trace",
    "plot": "--plot",
    "memory_plot": "--memory-plot",
    "report": "--report",
}


def _shown_note(plan: ParallelPlan, ev: Evaluation) -> str:
    """'' when the outputs show the whole step, else which micro-batches they show
    (``shown_window``; also said on stderr)."""
    shown = shown_window(plan, ev, hint="--whole-step for all")
    if shown:
        sys.stderr.write(
            f"plansim: the outputs show micro-batches 0-{ev.result.simulated_microbatches - 1} "
            f"of {plan.num_microbatches}\n"
        )
    return shown


def _outputs(args: argparse.Namespace) -> dict[str, Path]:
    """The requested output files by flag, checked writable before any simulation.

    Raises:
        OutputFileError: a folder is missing or not writable (names the flag and the path).
    """
    return {
        flag: check_writable(getattr(args, dest), label=flag)
        for dest, flag in _OUTPUT_FLAGS.items()
        if getattr(args, dest)
    }


def _write_outputs(
    outputs: dict[str, Path], report: SimulateReport, *, title: str, shown: str
) -> None:
    """Write the trace, plots and HTML report that were asked for (atomically), each noted
    on stderr; ``title`` names the plan, ``shown`` which micro-batches they show ('' when
    all, else added to the title)."""
    result = report.outcome.result
    capacity_bytes = report.profile.hbm_capacity_bytes
    if "--report" in outputs:
        write_html_report(outputs["--report"], report, title=title, shown_note=shown)
    title += f" [{shown}]" if shown else ""
    if "--trace" in outputs:
        trace = chrome_trace(result.timeline, memory=result.memory, title=title)
        write_trace(outputs["--trace"], trace, label="--trace")
    if "--plot" in outputs or "--memory-plot" in outputs:
        from plansim.report import plots  # matplotlib only when a plot is asked for

        if "--plot" in outputs:
            plots.plot_gantt(result.timeline, outputs["--plot"], title=title, label="--plot")
        if "--memory-plot" in outputs:
            plots.plot_memory(
                result.memory,
                outputs["--memory-plot"],
                title=title,
                capacity_bytes=capacity_bytes,
                end_s=float(result.timeline[tl.END_S].max()),
                label="--memory-plot",
            )
    for flag, path in outputs.items():
        sys.stderr.write(f"plansim: wrote {flag} {path}\n")
