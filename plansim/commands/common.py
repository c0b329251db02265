"""Arguments and resolution shared by the plan, simulate and backtest commands."""

from __future__ import annotations

import argparse

from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import Precision


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--model, --gpu/--profile, --gpus, --gbs, --seq-len, --precision."""
    parser.add_argument(
        "--model", required=True, help="preset name (see 'plansim models') or a config.json path"
    )
    parser.add_argument(
        "--gpu",
        "--profile",
        dest="gpu",
        required=True,
        help="hardware profile name (see 'plansim profiles list') or a YAML path",
    )
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    parser.add_argument("--gbs", type=int, required=True, help="global batch size (sequences)")
    parser.add_argument("--seq-len", type=int, default=None, help="override sequence length")
    parser.add_argument(
        "--precision",
        choices=[p.value for p in Precision],
        default="bf16",
        help="matmul precision (default bf16)",
    )


def resolve(args: argparse.Namespace) -> tuple[ModelSpec, HardwareProfile]:
    """The model and profile named on the command line."""
    return resolve_model(args.model, seq_length=args.seq_len), load_profile(args.gpu)
