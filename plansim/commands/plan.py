"""plansim plan: rank every parallel layout of a model on a GPU cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plansim.commands.common import add_model_args, resolve
from plansim.errors import require_positive_int
from plansim.io.outputs import check_writable
from plansim.planner.enumerate import SearchSpace
from plansim.planner.search import SearchResult, search
from plansim.report.tables import evaluation_dict, ranked_table, render
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import AttentionKernel, Precision
from plansim.units import bytes_to_gib


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim plan``."""
    p = sub.add_parser(
        "plan",
        help="rank parallel layouts (tp, pp, dp, mbs, ZeRO, recompute, SP, schedule)",
        description="Enumerate every valid layout, reject what does not divide or fit (with "
        "the reason), simulate the best candidates as events, and rank them by step time.",
    )
    add_model_args(p)
    p.add_argument("--top", type=int, default=10, help="rows to show (default 10)")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    p.add_argument(
        "--simulate-top",
        type=int,
        default=64,
        help="simulate this many best analytic estimates as events (default 64)",
    )
    p.add_argument(
        "--attention",
        choices=[a.value for a in AttentionKernel],
        default="flash",
        help="attention kernel (default flash)",
    )
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="step time vs peak memory of the simulated plans, Pareto front marked (PNG)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the search and print the ranked table and the rejection counts."""
    for name in ("gpus", "gbs", "top", "simulate_top"):
        require_positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    plot = check_writable(args.plot, label="--plot") if args.plot else None
    model, profile = resolve(args)
    space = SearchSpace(
        precision=Precision(args.precision), attention=AttentionKernel(args.attention)
    )
    result = search(
        model,
        profile,
        num_gpus=args.gpus,
        global_batch_size=args.gbs,
        space=space,
        simulate_top=args.simulate_top,
    )
    if plot is not None:
        _write_pareto(plot, result, args=args, model=model, profile=profile)
    out = sys.stdout
    if args.format == "json":
        doc = {
            "model": model.name,
            "profile": profile.name,
            "num_gpus": args.gpus,
            "global_batch_size": args.gbs,
            "plans": [evaluation_dict(ev) for ev in result.ranked[: args.top]],
            "num_candidates": result.num_candidates,
            "num_feasible": result.num_feasible,
            "num_not_simulated": result.num_not_simulated,
            "rejections": result.rejection_counts,
            "rejection_examples": result.rejection_examples,
        }
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    table = ranked_table(result.ranked[: args.top])
    if args.format == "csv":
        out.write(render(table, "csv"))
        return 0
    out.write(
        f"{model.name} on {args.gpus} x {profile.name}, global batch {args.gbs} x "
        f"{model.seq_length} tokens, {args.precision}; usable memory "
        f"{bytes_to_gib(profile.hbm_capacity_bytes):.1f} GiB per GPU\n\n"
    )
    out.write(render(table, "table") if len(table) else "no feasible plan\n")
    out.write(_summary(result))
    return 0


def _summary(result: SearchResult) -> str:
    lines = [
        "",
        f"{result.num_candidates} candidates: {result.num_feasible} feasible, "
        f"{len(result.ranked)} simulated as events, {result.num_not_simulated} not simulated "
        "(analytic estimate below the simulated set), "
        f"{sum(result.rejection_counts.values())} rejected",
    ]
    for category, count in result.rejection_counts.items():
        lines.append(f"  {count:6d}  {category}, e.g. {result.rejection_examples[category]}")
    return "\n".join(lines) + "\n"


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
