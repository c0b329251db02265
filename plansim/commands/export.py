"""``plansim export PLAN.yaml --to megatron|torchtitan|deepspeed``: a plan file as a
training framework's launch configuration (Megatron-LM arguments, a torchtitan TOML job
config, a DeepSpeed JSON config). A plan field the framework cannot express is an error that
names it; nothing is dropped silently."""

from __future__ import annotations

import argparse
import sys

from plansim.catalog import resolve_model
from plansim.export import ExportTarget, export_plan
from plansim.io.outputs import write_text_atomic
from plansim.io.plan_file import read_plan_file


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim export``."""
    p = sub.add_parser(
        "export",
        help="write a plan file as Megatron-LM arguments, a torchtitan or DeepSpeed config",
        description=__doc__,
    )
    p.add_argument("plan", metavar="PLAN.yaml", help="plan file ('plansim plan --save-plan')")
    p.add_argument(
        "--to",
        choices=[t.value for t in ExportTarget],
        default=None,
        help="target framework (default: the plan's execution.framework)",
    )
    p.add_argument("--out", metavar="FILE", help="write here (atomically) instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export; the text goes to stdout or --out."""
    plan_file = read_plan_file(args.plan)
    model = resolve_model(plan_file.model, seq_length=plan_file.seq_length)
    exported = export_plan(plan_file.plan, model, to=ExportTarget(args.to) if args.to else None)
    target = exported.target
    if args.out:
        write_text_atomic(args.out, exported.text, label="--out")
        sys.stderr.write(f"plansim: wrote the {target.value} configuration to {args.out}\n")
    else:
        sys.stdout.write(exported.text)
    return 0
