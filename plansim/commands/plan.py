"""plansim plan: rank every parallel layout of a model on a GPU cluster."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from plansim.analytic.sustained import dtype_pace_fraction
from plansim.commands.common import (
    add_bf16_layer_args,
    add_dp_sync_args,
    add_eager_elementwise_arg,
    add_model_args,
    add_persist_layer_norm_arg,
    resolve,
)
from plansim.commands.empty_search import empty_search_lines
from plansim.commands.plan_counts import check_range_args, run_counts
from plansim.commands.plan_phases import phase_plans, phase_plans_dict, phase_plans_text
from plansim.commands.plan_space import add_constraint_args, search_from_args, search_spaces
from plansim.commands.run_options import RunInputs, add_objective_arg, add_run_args, run_inputs
from plansim.commands.simulate_report import shown_window
from plansim.errors import SpecError, require_positive_int
from plansim.io.outputs import check_writable
from plansim.io.plan_file import PlanFile, write_plan_file
from plansim.io.result_cache import CACHE_DIR_ENV
from plansim.planner.evaluate import Evaluation
from plansim.planner.lookups import out_of_range_lookups
from plansim.planner.parallel import default_jobs
from plansim.planner.robustness import ranking_trust
from plansim.planner.search import SearchResult
from plansim.planner.space import SearchSpace
from plansim.planner.training_run import Objective, RunEstimate, order_by_objective, run_columns
from plansim.report.sensitivity_table import (
    outside_dicts,
    outside_text,
    trust_dict,
    trust_text,
)
from plansim.report.tables import evaluation_dict, ranked_table, render
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    AttentionKernel,
    Zero3ParamFetch,
)
from plansim.units import bytes_to_gib


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim plan``: the search-mode and the search-space flags in their own
    groups so ``--help`` reads by topic."""
    p = sub.add_parser(
        "plan",
        help="rank parallel layouts (tp, pp, dp, mbs, ZeRO, recompute, SP, schedule)",
        description="Enumerate every valid layout, reject what does not divide or fit (with "
        "the reason), simulate the best candidates as events, and rank them by step time. "
        "Exit status 0 with a feasible plan, 1 when no layout is feasible, 2 for bad input.",
    )
    add_model_args(p, gpu_range=True)
    p.add_argument("--top", type=int, default=10, help="rows to show (default 10)")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    add_search_args(p)
    _add_search_mode_args(p.add_argument_group("search mode"))
    p.add_argument(
        "--attention",
        choices=[a.value for a in AttentionKernel],
        default="flash",
        help="attention kernel (default flash)",
    )
    add_dp_sync_args(p, allow_all=True)
    add_bf16_layer_args(p)
    space = p.add_argument_group("search space (framework options also tried)")
    _add_space_args(space)
    _add_sharding_space_args(space)
    add_constraint_args(p)
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="step time vs peak memory of the simulated plans, Pareto front marked (PNG); "
        "with --gpus A:B, days to train vs cost of each count's plan",
    )
    p.add_argument(
        "--report",
        metavar="OUT.html",
        help="one self-contained HTML page (opens offline): the ranked table (sortable), the "
        "rejection counts, step time vs peak memory of the simulated plans, and rank 1's "
        "bubble Gantt chart, memory over time and memory breakdown (one --gpus count)",
    )
    add_save_plan_args(p)
    add_run_args(p)
    add_objective_arg(
        p,
        help_text="rank the search's --top plans (found by step time) by step time (default), "
        "or, with --tokens, by the whole run's expected time to train, cost (needs --prices) "
        "or energy",
    )
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also report what the best plan's step time rests on (its elasticity to each "
        "profile term, as 'plansim simulate --sensitivity') and whether another of the top "
        f"{ROBUSTNESS_PLANS} plans would rank first with any one term 10%% faster or slower",
    )
    p.set_defaults(func=run)


def _add_search_mode_args(g: argparse._ArgumentGroup) -> None:
    """--simulate-top (heuristic) and --exhaustive; the default is the exact search."""
    g.add_argument(
        "--simulate-top",
        type=int,
        metavar="N",
        help="heuristic mode: simulate only the N best analytic estimates (fast, not exact; "
        "default: the exact search, which simulates every plan that can reach the top rows)",
    )
    g.add_argument(
        "--exhaustive",
        action="store_true",
        help="simulate every feasible plan (slow; the reference the default search equals)",
    )


def _add_space_args(g: argparse._ArgumentGroup) -> None:
    """The Megatron-LM options the search also tries or prices its plans with (parameter
    gather overlap, bf16 reduction, early-stop recompute, TP overlap)."""
    g.add_argument(
        "--overlap-param-gather",
        action="store_true",
        help="also try Megatron's --overlap-param-gather for the ZeRO-1/2 plans that overlap "
        "the gradient reduction (parameter all-gather hidden behind the next forward)",
    )
    g.add_argument(
        "--grad-reduce-in-bf16",
        action="store_true",
        help="also try Megatron's --grad-reduce-in-bf16 (bf16 gradient buffer and reduction "
        "instead of fp32; with --precision bf16, fp8 or fp4)",
    )
    g.add_argument(
        "--recompute-early-stop",
        action="store_true",
        help="price the full-recompute plans as torch's non-reentrant checkpoint, which stops "
        "early (torchtitan, checkpoint_wrapper): a layer's MLP down projection and the TP "
        "collective after it are not rerun (models without dropout)",
    )
    add_eager_elementwise_arg(g)
    add_persist_layer_norm_arg(g)
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="also try Megatron's --tp-comm-overlap for the sequence-parallel plans (TP "
        "collectives pipelined with their GEMMs; Transformer Engine userbuffers)",
    )


def _add_sharding_space_args(g: argparse._ArgumentGroup) -> None:
    """ZeRO-3 and sharding options (FSDP, parameter fetch, resharding, HSDP), torchtitan's
    per-op selective recompute and the context-parallel sizes."""
    g.add_argument(
        "--use-torch-fsdp2",
        action="store_true",
        help="price the ZeRO-3 plans as PyTorch FSDP (Megatron flag): fp32 sharded parameters "
        "are the master weights, 16 bytes per parameter instead of DeepSpeed's 18",
    )
    g.add_argument(
        "--zero3-param-fetch",
        choices=[f.value for f in Zero3ParamFetch],
        default=Zero3ParamFetch.LAYER_PREFETCH.value,
        help="how the ZeRO-3 plans gather parameters (as plansim simulate): per layer with "
        "prefetch (default), per tensor synchronously (DeepSpeed 2021), per layer without "
        "prefetch, or per-step (FSDP2 under torch.distributed.pipelining, torchtitan: once "
        "per step for plans with pp > 1; pp = 1 plans gather per layer)",
    )
    g.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="also try the ZeRO-3 plans with each layer kept gathered from its forward to "
        "its backward (PyTorch FSDP2 reshard_after_forward=False, FSDP1 SHARD_GRAD_OP)",
    )
    g.add_argument(
        "--hsdp",
        action="store_true",
        help="also try hybrid sharding: ZeRO states sharded within one node and replicated "
        "across nodes (ZeRO-3: HSDP; ZeRO-1/2: Megatron's partial distributed optimizer; "
        "--dp-shard in simulate)",
    )
    g.add_argument(
        "--recompute-selective-op",
        action="store_true",
        help="also try torchtitan's per-op selective activation checkpointing (--recompute "
        "selective-op: every second matmul and all non-matmul ops recomputed; needs "
        "--attention flash)",
    )
    g.add_argument(
        "--cp",
        default="1",
        metavar="LIST",
        help="context-parallel sizes to try, comma-separated (default 1; e.g. 1,2,4,8 for "
        "long sequences: ring attention splits each sequence over cp ranks; needs "
        "--attention flash)",
    )


#: Plans compared by ``--sensitivity``'s ranking check (each simulated twice per profile term).
ROBUSTNESS_PLANS = 5


def add_search_args(p: argparse.ArgumentParser) -> None:
    """--jobs and --progress (shared with ``plansim sweep``)."""
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="worker processes (default: all cores); results are identical for any N",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="always draw the progress bar on stderr (default: only on a terminal, "
        "after about a second)",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="keep simulated plans and whole searches in DIR and read them back when asked "
        f"again (keyed on plansim's code and every input; default: ${CACHE_DIR_ENV} if set, "
        "else no cache)",
    )


def resolve_jobs(jobs: int | None) -> int:
    """--jobs, or every core this process may use when not given."""
    if jobs is None:
        return default_jobs()
    require_positive_int("--jobs", jobs)
    return int(jobs)


def add_save_plan_args(p: argparse.ArgumentParser) -> None:
    """--save-plan FILE and --rank N (which ranked plan it writes)."""
    p.add_argument(
        "--save-plan",
        metavar="PLAN.yaml",
        help="write the chosen plan as a plan file (for 'plansim simulate --plan', "
        "'plansim validate --plan' and 'plansim export')",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=1,
        metavar="N",
        help="with --save-plan: the plan of rank N in the table (default 1, the best)",
    )


def save_ranked_plan(
    path: Path, ranked: Sequence[Evaluation], *, rank: int, args: argparse.Namespace
) -> None:
    """Write the plan of ``rank`` (1 = best) with its predicted figures; noted on stderr.

    Raises:
        SpecError: fewer than ``rank`` plans are ranked (the search keeps --top of them).
    """
    if rank > len(ranked):
        raise SpecError(
            f"--rank {rank}: the search ranked {len(ranked)} plan(s) (it keeps --top, "
            f"{args.top}); give a rank from 1 to {len(ranked)}"
            if ranked
            else f"--save-plan: no feasible plan to save (--rank {rank})"
        )
    ev = ranked[rank - 1]
    prediction = {
        "step_time_s": round(ev.step_time_s, 6),
        "tokens_per_s": round(ev.tokens_per_s, 3),
        "mfu": round(ev.mfu, 6),
        "peak_memory_gib": round(bytes_to_gib(ev.peak_memory_bytes), 3),
    }
    plan_file = PlanFile(
        plan=ev.plan,
        model=args.model,
        gpu=args.gpu,
        num_gpus=args.gpus,
        seq_length=args.seq_len,
        prediction=prediction,
    )
    write_plan_file(path, plan_file, label="--save-plan")
    sys.stderr.write(f"plansim: wrote plan of rank {rank} ({ev.plan.label()}) to {path}\n")


def _check_args(args: argparse.Namespace) -> None:
    """The flags' own checks, before any work.

    Raises:
        SpecError: a count is not a positive integer, or two flags exclude each other.
    """
    for name in ("gbs", "top", "rank"):
        require_positive_int(f"--{name}", getattr(args, name))
    if isinstance(args.gpus, tuple):
        check_range_args(args)
    else:
        require_positive_int("--gpus", args.gpus)
    if args.rank != 1 and not args.save_plan:
        raise SpecError(f"--rank {args.rank} says which plan --save-plan writes: give --save-plan")
    if args.simulate_top is not None:
        require_positive_int("--simulate-top", args.simulate_top)
        if args.exhaustive:
            raise SpecError("--simulate-top and --exhaustive exclude each other; give one")
    if args.save_plan and args.nics_per_node is not None:
        raise SpecError(
            "--save-plan writes the profile by name, not the cluster's NICs: leave out "
            "--nics-per-node/--nic-gbit-per-s, or put the network in a profile YAML "
            "(nic_gb_per_s) and give it as --gpu"
        )
    if args.objective != Objective.STEP_TIME.value and args.tokens is None:
        raise SpecError(
            f"--objective {args.objective} ranks by the whole run: give --tokens (the tokens "
            "to train)"
        )
    if args.report and isinstance(args.gpus, tuple):
        raise SpecError(
            "--report shows one search: give one --gpus count, not a range (--plot draws "
            "the range's days to train vs cost)"
        )
    if args.sensitivity and args.format == "csv":
        raise SpecError(
            "--sensitivity reports in the table or in JSON, not in CSV: give --format table "
            "or json, or leave out --sensitivity"
        )


def run(args: argparse.Namespace) -> int:
    """Run the search and print the ranked table and the rejection counts."""
    _check_args(args)
    jobs = resolve_jobs(args.jobs)
    plot = check_writable(args.plot, label="--plot") if args.plot else None
    saved = check_writable(args.save_plan, label="--save-plan") if args.save_plan else None
    report = check_writable(args.report, label="--report") if args.report else None
    model, profile = resolve(args)
    inputs = run_inputs(args, model=model, global_batch_size=args.gbs)
    if isinstance(args.gpus, tuple):
        assert inputs is not None  # check_range_args asked for --tokens
        return run_counts(args, model, profile, inputs, jobs=jobs, plot=plot)
    unconstrained, space = search_spaces(args, model, profile)
    result = search_from_args(
        args,
        model,
        profile,
        space=space,
        num_gpus=args.gpus,
        global_batch_size=args.gbs,
        top_k=args.top,
        jobs=jobs,
    )
    if plot is not None:
        _write_pareto(plot, result, args=args, model=model, profile=profile)
    ranked, runs, run_notes = _whole_runs(args, model, profile, result.ranked[: args.top], inputs)
    per_phase = None if inputs is None else phase_plans(args, model, profile, inputs, jobs=jobs)
    if saved is not None:
        save_ranked_plan(saved, ranked, rank=args.rank, args=args)
    out = sys.stdout
    leading = result.ranked[: min(args.top, ROBUSTNESS_PLANS)]
    trust = ranking_trust(model, leading, profile) if args.sensitivity and leading else None
    read_outside = leading and args.format != "csv"  # CSV is the ranked table alone
    outside = out_of_range_lookups(model, leading[0].plan, profile) if read_outside else ()
    table = _with_run_columns(ranked_table(ranked), runs) if inputs else ranked_table(ranked)
    if report is not None:
        notes = [*run_notes, outside_text(outside, profile_name=profile.name, reader=_READER)]
        if result.batch_indivisible_dps:
            notes.insert(0, batch_note(result.batch_indivisible_dps, args.gbs))
        notes += [phase_plans_text(per_phase)] if per_phase is not None else []
        notes += [trust_text(trust, profile_name=profile.name)] if trust is not None else []
        _write_report(
            report,
            (result, ranked, table),
            model=model,
            profile=profile,
            heading=_heading(args, model, profile, space),
            notes=notes,
            args=args,
        )
    if args.format == "json":
        doc = _json_doc(args, model, profile, result)
        doc["plans"] = [_plan_json(ev, est) for ev, est in zip(ranked, runs, strict=True)]
        doc["objective"] = args.objective
        if per_phase is not None:
            doc["per_phase_plans"] = phase_plans_dict(per_phase)
        doc["out_of_range_lookups_of_best"] = outside_dicts(outside)
        doc.update(trust_dict(trust) if trust is not None else {})
        out.write(json.dumps(doc, indent=2) + "\n")
        return _exit_status(result)
    if args.format == "csv":
        out.write(render(table, "csv"))
        return _exit_status(result)
    out.write(_heading(args, model, profile, space))
    out.write(render(table, "table") if len(table) else "no feasible plan\n")
    out.write(_summary(result, global_batch_size=args.gbs))
    out.write("".join(f"{note}\n" for note in run_notes))
    if per_phase is not None:
        out.write(phase_plans_text(per_phase))
    if result.num_candidates == 0:
        out.write(_empty_search_text(args, space, unconstrained, num_layers=model.num_layers))
    out.write(outside_text(outside, profile_name=profile.name, reader=_READER))
    if trust is not None:
        out.write(trust_text(trust, profile_name=profile.name))
    return _exit_status(result)


#: Whose lookups the out-of-range note lists.
_READER = " by rank 1's pricing"


def _write_report(
    path: Path,
    search: tuple[SearchResult, Sequence[Evaluation], pd.DataFrame],
    *,
    model: ModelSpec,
    profile: HardwareProfile,
    heading: str,
    notes: Sequence[str],
    args: argparse.Namespace,
) -> None:
    """Write the HTML report (``plansim.report.html_report``) of the search, its ranked plans
    and their table (``search``) atomically and note it on stderr; rank 1's timeline shows
    the micro-batches the search simulated (the steady-state window of a long step)."""
    from plansim.report.html_report import PlanPage, plan_report_html, write_report

    result, ranked, table = search
    best = ranked[0] if ranked else None
    hint = "'plansim simulate --whole-step' draws them all"
    page = PlanPage(
        title=f"{model.name} on {args.gpus} x {profile.name}, global batch {args.gbs}",
        heading=heading,
        table=table,
        labels=tuple(ev.plan.label() for ev in ranked),
        result=result,
        best=best,
        capacity_bytes=profile.hbm_capacity_bytes,
        shown_note="" if best is None else shown_window(best.plan, best, hint=hint),
        notes=tuple(notes),
    )
    write_report(path, plan_report_html(page), label="--report")
    sys.stderr.write(f"plansim: wrote --report {path}\n")


def _whole_runs(
    args: argparse.Namespace,
    model: ModelSpec,
    profile: HardwareProfile,
    ranked: Sequence[Evaluation],
    inputs: RunInputs | None,
) -> tuple[list[Evaluation], list[RunEstimate | None], list[str]]:
    """The ranked plans in ``--objective`` order with their whole runs (None each without
    ``--tokens``, or where the layout cannot take a ramp phase) and a note for each of
    those."""
    if inputs is None:
        return list(ranked), [None] * len(ranked), []
    outcomes = inputs.estimates(model, ranked, profile)
    pairs = order_by_objective(ranked, outcomes, Objective(args.objective))
    notes = [
        f"  rank {rank}: no run: {outcome.reason}"
        for rank, (_, outcome) in enumerate(pairs, start=1)
        if not isinstance(outcome, RunEstimate)
    ]
    runs = [o if isinstance(o, RunEstimate) else None for _, o in pairs]
    return [ev for ev, _ in pairs], runs, notes


def _with_run_columns(table: pd.DataFrame, runs: Sequence[RunEstimate | None]) -> pd.DataFrame:
    """The ranked table with the whole-run columns (empty where the run has no estimate)."""
    columns = [run_columns(est) if est is not None else {} for est in runs]
    extra = pd.DataFrame(columns, index=table.index).dropna(axis=1, how="all")
    return pd.concat([table, extra], axis=1)


def _plan_json(ev: Evaluation, est: RunEstimate | None) -> dict[str, object]:
    """One plan of the JSON document, with its whole run when there is one."""
    doc = evaluation_dict(ev)
    if est is not None:
        doc["run"] = run_columns(est)
    return doc


def _exit_status(result: SearchResult) -> int:
    """0 with a feasible plan; 1 when none is (an answer, but not a plan a script can use;
    bad input is 2)."""
    return 0 if result.ranked else 1


def _empty_search_text(
    args: argparse.Namespace, space: SearchSpace, unconstrained: SearchSpace, *, num_layers: int
) -> str:
    """Why a search had no candidate at all: what each constraint left (``empty_search``)."""
    lines = empty_search_lines(
        args,
        space,
        unconstrained,
        num_gpus=args.gpus,
        global_batch_size=args.gbs,
        num_layers=num_layers,
    )
    return "".join(line + "\n" for line in lines)


def _json_doc(
    args: argparse.Namespace, model: ModelSpec, profile: HardwareProfile, result: SearchResult
) -> dict[str, object]:
    """The ``--format json`` document: the job, the top plans, the search's counts."""
    return {
        "model": model.name,
        "profile": profile.name,
        "num_gpus": args.gpus,
        "global_batch_size": args.gbs,
        "gemm_pace_fraction": dtype_pace_fraction(profile, args.gpus, args.precision),
        "plans": [evaluation_dict(ev) for ev in result.ranked[: args.top]],
        "num_candidates": result.num_candidates,
        "num_feasible": result.num_feasible,
        "num_simulated": result.num_simulated,
        "num_not_simulated": result.num_not_simulated,
        "rejections": result.rejection_counts,
        "rejection_examples": result.rejection_examples,
        "batch_indivisible_dps": list(result.batch_indivisible_dps),
    }


def _heading(
    args: argparse.Namespace, model: ModelSpec, profile: HardwareProfile, space: SearchSpace
) -> str:
    """The table's first line: the job, its precision, the GPU's memory and GEMM pace."""
    return (
        f"{model.name} on {args.gpus} x {profile.name}, global batch {args.gbs} x "
        f"{model.seq_length} tokens, {args.precision}{_bf16_clause(space.bf16_layers)}"
        f"{'' if args.attention == 'flash' else f', {args.attention} attention'}; HBM "
        f"{bytes_to_gib(profile.hbm_capacity_bytes):.1f} GiB per GPU, "
        f"{bytes_to_gib(profile.memory_reserve_bytes):.1f} of it reserved"
        f"{_pace_clause(profile, args.gpus, args.precision)}\n\n"
    )


def _bf16_clause(bf16_layers: tuple[int, int]) -> str:
    """' (first 1 and last 1 layers in bf16)', or '' when every layer is quantized."""
    start, end = bf16_layers
    return f" (first {start} and last {end} layers in bf16)" if start or end else ""


def _pace_clause(profile: HardwareProfile, num_gpus: int, dtype: str) -> str:
    """'; GEMMs at 89.5% of the burst rate (...)' when the job computes below the profile's
    burst GEMM rate (``plansim.analytic.sustained``), else ''."""
    pace = dtype_pace_fraction(profile, num_gpus, dtype)
    if pace >= 1.0:
        return ""
    return (
        f"; GEMMs at {100 * pace:.1f}% of the burst rate (power limit, slowest of {num_gpus} GPUs)"
    )


def _summary(result: SearchResult, *, global_batch_size: int) -> str:
    lines = [
        "",
        f"{result.num_candidates} candidates: {result.num_feasible} feasible, "
        f"{result.num_simulated} simulated as events, {result.num_not_simulated} not simulated "
        + (
            f"(lower bound above the top {result.top_k}: those are exact), "
            if result.top_k
            else "(analytic estimate below the simulated set), "
        )
        + f"{sum(result.rejection_counts.values())} rejected",
    ]
    for category, count in result.rejection_counts.items():
        lines.append(f"  {count:6d}  {category}, e.g. {result.rejection_examples[category]}")
    if result.batch_indivisible_dps:
        lines.append(batch_note(result.batch_indivisible_dps, global_batch_size))
    return "\n".join(lines) + "\n"


def batch_note(dps: tuple[int, ...], global_batch_size: int) -> str:
    """One line on the layouts not enumerated because the batch does not split over dp."""
    shown = ", ".join(map(str, dps[:8])) + (", ..." if len(dps) > 8 else "")
    return (
        f"  not enumerated: layouts with dp in ({shown}): global batch {global_batch_size} "
        f"is not divisible by dp"
    )


def _write_pareto(
    path: Path,
    result: SearchResult,
    *,
    args: argparse.Namespace,
    model: ModelSpec,
    profile: HardwareProfile,
) -> None:
    """Write the Pareto plot of the simulated plans (atomically) and note it on stderr."""
    from plansim.report.plots import plot_pareto  # matplotlib only when a plot is asked for

    title = f"{model.name} on {args.gpus} x {profile.name}, global batch {args.gbs}"
    plot_pareto(
        result.ranked, path, title=title, capacity_bytes=profile.hbm_capacity_bytes, label="--plot"
    )
    sys.stderr.write(f"plansim: wrote --plot {path}\n")
