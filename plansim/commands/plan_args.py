"""Argument groups that several commands share (``simulate``, ``validate``): recompute,
Megatron-LM's uneven pipeline split and DeepSpeed's offload devices. Parsing into a
``ParallelPlan`` stays with each command."""

from __future__ import annotations

import argparse

from plansim.specs.plan import OffloadDevice, Recompute


def add_recompute_args(p: argparse.ArgumentParser) -> None:
    """``--recompute`` and Megatron-LM's ``--recompute-num-layers`` (block method)."""
    p.add_argument("--recompute", choices=[r.value for r in Recompute], default="none")
    p.add_argument(
        "--recompute-num-layers",
        type=int,
        default=None,
        metavar="N",
        help="with --recompute full: recompute only the first N layers of every model chunk "
        "(Megatron-LM --recompute-method block); default every layer",
    )


def add_pipeline_split_args(p: argparse.ArgumentParser) -> None:
    """--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-
    split (Megatron-LM's uneven pipeline splits)."""
    for edge in ("first", "last"):
        p.add_argument(
            f"--decoder-{edge}-pipeline-num-layers",
            type=int,
            metavar="N",
            help=f"layers on the {edge} pipeline rank (uneven split, Megatron-LM flag); the "
            "other ranks share the rest evenly",
        )
    for part, what in (("embedding", "the input embedding"), ("loss", "the output layer + loss")):
        p.add_argument(
            f"--account-for-{part}-in-pipeline-split",
            action="store_true",
            help=f"{what} takes one layer's place in the pipeline split (Megatron-LM flag): "
            "the layers plus these slots split evenly over pp * vpp stages",
        )


def add_offload_args(p: argparse.ArgumentParser) -> None:
    """--offload-optimizer and --offload-param (DeepSpeed ``zero_optimization``
    ``offload_optimizer.device`` / ``offload_param.device``)."""
    devices = [d.value for d in OffloadDevice]
    p.add_argument(
        "--offload-optimizer",
        choices=devices,
        default="none",
        help="ZeRO-Offload: optimizer states + Adam step on the host (cpu, ZeRO 1-3) or "
        "states on NVMe (nvme, ZeRO 3); needs a host section in the profile",
    )
    p.add_argument(
        "--offload-param",
        choices=devices,
        default="none",
        help="ZeRO-Infinity: 16-bit parameter shards in host memory (cpu) or on NVMe (nvme), "
        "fetched for every forward and backward; ZeRO 3 only",
    )
