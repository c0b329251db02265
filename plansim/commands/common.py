"""Arguments and resolution shared by the plan, simulate, validate and backtest commands."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.specs.cluster_network import with_node_nics
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import DdpImpl, DpSync, OffloadDevice, Precision, Recompute, Schedule
from plansim.specs.stage_placement import StagePlacement

#: Largest GPU count a command takes: 100x the largest training jobs published (about 10^5
#: GPUs, Llama 3's 16K H100 and xAI's 100K-GPU cluster); bounds the planner's divisor
#: enumeration, which a 20-digit count would never finish.
MAX_GPUS = 10_000_000
#: Largest global batch (sequences) and sequence length (tokens) a command takes: far above
#: any published run (DeepSeek-V3: 15,360 sequences; 1M-token contexts), below counts whose
#: enumeration or arithmetic would run away.
MAX_GLOBAL_BATCH = 100_000_000
MAX_SEQ_LENGTH = 100_000_000


def bounded_int(flag: str, maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer in [1, maximum], else one error naming ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} must be an integer from 1 to {maximum:,}, got {text!r}"
            ) from None
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"{flag} must be an integer from 1 to {maximum:,}, got {value}"
            )
        return value

    return parse


#: ``--gpus`` (1 to MAX_GPUS).
gpu_count = bounded_int("--gpus", MAX_GPUS)


def doubling_range(flag: str, text: str) -> tuple[int, ...]:
    """``A:B`` as A, 2A, 4A, ... up to B (GPU counts of a scaling study).

    Raises:
        SpecError: not two positive integers A <= B within 1..MAX_GPUS (names ``flag``).
    """
    low_text, _, high_text = text.partition(":")
    if not (low_text.isdigit() and high_text.isdigit()):
        raise SpecError(
            f"{flag}: {text!r}: a range A:B (A, 2A, 4A, ... up to B) takes two positive integers"
        )
    low, high = int(low_text), int(high_text)
    if not 1 <= low <= high <= MAX_GPUS:
        raise SpecError(f"{flag}: {text!r}: a range A:B needs 1 <= A <= B <= {MAX_GPUS:,}")
    counts = []
    while low <= high:
        counts.append(low)
        low *= 2
    return tuple(counts)


def gpu_count_or_range(text: str) -> int | tuple[int, ...]:
    """An argparse type for ``plansim plan --gpus``: a count, or ``A:B``
    (:func:`doubling_range`)."""
    if ":" not in text:
        return gpu_count(text)
    try:
        return doubling_range("--gpus", text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_dispatcher_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--moe-token-dispatcher-type`` (Megatron-Core's flag; ``deepep`` for ``flex`` with
    ``--moe-enable-deepep``)."""
    parser.add_argument(
        "--moe-token-dispatcher-type",
        choices=[d.value for d in MoeTokenDispatcher],
        default=MoeTokenDispatcher.ALLTOALL.value,
        help="models with experts: the token dispatcher: alltoall (Megatron-Core's, default: "
        "one network row per token and remote expert) or deepep (DeepEP, flex with "
        "--moe-enable-deepep, as DeepSeek-V3 trained: one row per token and remote node, "
        "forwarded over NVLink; fp8 dispatch with --precision fp8)",
    )


def add_model_args(
    parser: argparse.ArgumentParser, *, required: bool = True, gpu_range: bool = False
) -> None:
    """--model, --gpu/--profile, --gpus, --gbs, --seq-len, --precision; ``required`` False
    where a plan file may give them (the command then checks :func:`require_args`);
    ``gpu_range``: --gpus may be a range A:B (:func:`gpu_count_or_range`)."""
    parser.add_argument(
        "--model",
        required=required,
        help="preset name (see 'plansim models') or a config.json path",
    )
    parser.add_argument(
        "--gpu",
        "--profile",
        dest="gpu",
        required=required,
        help="hardware profile name (see 'plansim profiles list') or a YAML path",
    )
    parser.add_argument(
        "--gpus",
        type=gpu_count_or_range if gpu_range else gpu_count,
        required=required,
        help=f"number of GPUs (1 to {MAX_GPUS:,})"
        + ("; A:B: each of A, 2A, 4A, ... up to B (one best plan per count)" if gpu_range else ""),
    )
    parser.add_argument(
        "--gbs",
        type=bounded_int("--gbs", MAX_GLOBAL_BATCH),
        required=required,
        help="global batch size (sequences)",
    )
    parser.add_argument(
        "--seq-len",
        type=bounded_int("--seq-len", MAX_SEQ_LENGTH),
        default=None,
        help="override sequence length",
    )
    parser.add_argument(
        "--precision",
        choices=[p.value for p in Precision],
        default="bf16",
        help="matmul precision (default bf16)",
    )
    parser.add_argument(
        "--nics-per-node",
        type=bounded_int("--nics-per-node", 64),
        default=None,
        help="the cluster's inter-node NICs per node (with --nic-gbit-per-s; default: the "
        "profile's network)",
    )
    parser.add_argument(
        "--nic-gbit-per-s",
        type=float,
        default=None,
        help="line rate of one NIC in Gb/s (e.g. 100 for Omni-Path, 400 for NDR)",
    )


def cluster_profile(args: argparse.Namespace, profile: HardwareProfile) -> HardwareProfile:
    """``profile`` with the network of --nics-per-node and --nic-gbit-per-s
    (``plansim.specs.cluster_network.with_node_nics``); unchanged without them.

    Raises:
        SpecError: one flag without the other, or a line rate that is not a positive number.
    """
    nics = getattr(args, "nics_per_node", None)
    gbit = getattr(args, "nic_gbit_per_s", None)
    if nics is None and gbit is None:
        return profile
    if nics is None or gbit is None:
        raise SpecError("--nics-per-node and --nic-gbit-per-s go together: give both or neither")
    if not math.isfinite(gbit) or gbit <= 0:
        raise SpecError(f"--nic-gbit-per-s must be a positive number of Gb/s, got {gbit!r}")
    return with_node_nics(profile, nics_per_node=nics, nic_line_bits_per_s=gbit * 1e9)


def require_args(args: argparse.Namespace, flags: tuple[str, ...], *, unless: str) -> None:
    """Each of ``flags`` (``--tp``) must be given when ``unless`` (``--plan``) is not.

    Raises:
        SpecError: names the missing flags and the alternative.
    """
    missing = [flag for flag in flags if getattr(args, flag[2:].replace("-", "_")) is None]
    if missing:
        raise SpecError(f"the following arguments are required: {', '.join(missing)} (or {unless})")


def plan_flag_defaults(
    parser: argparse.ArgumentParser, *, keep: tuple[str, ...]
) -> dict[str, tuple[Any, str]]:
    """Destination -> (default, flag) of ``parser``'s flags that describe a plan: every
    one but ``keep`` (outputs, formats, ``--plan`` itself), for :func:`check_no_plan_flags`."""
    skip = {"help", "func", *keep}
    return {
        a.dest: (a.default, a.option_strings[0])
        for a in parser._actions
        if a.dest not in skip and a.option_strings
    }


def check_no_plan_flags(args: argparse.Namespace, defaults: dict[str, tuple[Any, str]]) -> None:
    """With a plan file, no flag that describes a plan may be given: the file says it.

    Raises:
        SpecError: names the first such flag.
    """
    for dest, (default, flag) in defaults.items():
        if getattr(args, dest, default) != default:
            raise SpecError(
                f"{flag} is given with --plan: the plan file sets the whole plan and what it "
                f"was planned for; leave {flag} out (or leave out --plan)"
            )


def resolve(args: argparse.Namespace) -> tuple[ModelSpec, HardwareProfile]:
    """The model and profile named on the command line."""
    model = resolve_model(args.model, seq_length=args.seq_len)
    return model, cluster_profile(args, load_profile(args.gpu))


def add_dp_sync_args(parser: argparse.ArgumentParser, *, allow_all: bool) -> None:
    """--dp-sync, --ps-servers and --ddp-impl (``ParallelPlan.dp_sync`` / ``ps_servers`` /
    ``ddp_impl``); ``allow_all`` adds the choice ``all`` to --dp-sync (the planner then
    tries both synchronisations)."""
    choices = [s.value for s in DpSync] + (["all"] if allow_all else [])
    parser.add_argument(
        "--dp-sync",
        choices=choices,
        default=DpSync.RING.value,
        help="DP synchronisation: ring collectives (default) or parameter-server (push "
        "gradients to server shards, servers run Adam, pull weights; needs --zero 0)"
        + ("; all: rank both" if allow_all else ""),
    )
    parser.add_argument(
        "--ps-servers",
        type=int,
        default=0,
        metavar="K",
        help="with parameter-server: 0 = servers colocated on the DP ranks (default), "
        "K > 0 = K dedicated server processes with one GPU NIC's bandwidth each",
    )
    parser.add_argument(
        "--ddp-impl",
        choices=[d.value for d in DdpImpl],
        default=DdpImpl.MEGATRON_CORE.value,
        help="data-parallel wrapper of ZeRO-0/1 gradients, which sets the per-step gradient-"
        "average passes: megatron-core (default; scales the buffer when dp * cp > 1), local "
        "(Megatron-LM --DDP-impl local, 2020-2023: divides it every step), torch (PyTorch "
        "DDP: copies into its buckets and back) or average-in-collective (Megatron-core "
        "--ddp-average-in-collective: no pass)",
    )


def dp_syncs_from_args(args: argparse.Namespace) -> tuple[DpSync, ...]:
    """The synchronisations --dp-sync names; SpecError when --ps-servers is negative or
    given without a parameter server."""
    if isinstance(args.ps_servers, bool) or args.ps_servers < 0:
        raise SpecError(f"--ps-servers must be an integer >= 0, got {args.ps_servers}")
    syncs = tuple(DpSync) if args.dp_sync == "all" else (DpSync(args.dp_sync),)
    if args.ps_servers and DpSync.PARAMETER_SERVER not in syncs:
        raise SpecError(
            f"--ps-servers {args.ps_servers} needs --dp-sync {DpSync.PARAMETER_SERVER.value}"
            f" (got --dp-sync {args.dp_sync})"
        )
    return syncs


def add_bf16_layer_args(p: argparse.ArgumentParser) -> None:
    """Megatron-LM's --first-last-layers-bf16 with --num-layers-at-start/end-in-bf16."""
    p.add_argument(
        "--first-last-layers-bf16",
        action="store_true",
        help="with --precision fp8 or fp4: run the first and last transformer layers in bf16 "
        "(Megatron-LM flag; Megatron-Bridge's FP8 current-scaling preset sets it)",
    )
    for edge in ("start", "end"):
        p.add_argument(
            f"--num-layers-at-{edge}-in-bf16",
            type=int,
            metavar="N",
            help=f"with --first-last-layers-bf16: layers at the model's {edge} kept in bf16 "
            "(default 1, as Megatron-LM)",
        )


def add_eager_elementwise_arg(g: argparse._ArgumentGroup) -> None:
    """--eager-elementwise (``ParallelPlan.fused_elementwise`` off), for plan and simulate."""
    g.add_argument(
        "--eager-elementwise",
        dest="fused_elementwise",
        action="store_false",
        help="price the norms, RoPE, SwiGLU as eager PyTorch ops (Meta's reference Llama code, "
        "torchtitan without torch.compile) instead of fused kernels",
    )


def add_persist_layer_norm_arg(g: argparse._ArgumentGroup) -> None:
    """--no-persist-layer-norm (``ParallelPlan.persist_layer_norm`` off), for plan and
    simulate."""
    g.add_argument(
        "--no-persist-layer-norm",
        dest="persist_layer_norm",
        action="store_false",
        help="price each norm's backward as two passes over dy and x (Megatron-LM's flag; "
        "its non-persistent kernel, which runs before PyTorch 1.11 used)",
    )


def bf16_layers_from_args(args: argparse.Namespace) -> tuple[int, int]:
    """(start, end) layers kept in bf16: (0, 0) without --first-last-layers-bf16, else the
    counts given (1 each by default). SpecError when a count comes without the flag."""
    counts = (args.num_layers_at_start_in_bf16, args.num_layers_at_end_in_bf16)
    if not args.first_last_layers_bf16:
        for edge, count in zip(("start", "end"), counts, strict=True):
            if count is not None:
                raise SpecError(
                    f"--num-layers-at-{edge}-in-bf16({count}) needs --first-last-layers-bf16"
                )
        return 0, 0
    start, end = (1 if count is None else count for count in counts)
    return start, end


def comma_items(flag: str, text: str) -> list[str]:
    """``a, b,a`` -> ['a', 'b']: the stripped items of a comma-separated option, in the
    order given, without repeats.

    Raises:
        SpecError: an item is empty (names ``flag``).
    """
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise SpecError(f"{flag}={text!r}: empty item in the comma-separated list")
    return list(dict.fromkeys(items))


def int_list_arg(flag: str, text: str) -> tuple[int, ...]:
    """``--tp 4,8`` -> (4, 8): positive integers, sorted, without repeats.

    Raises:
        SpecError: an item is empty or not a positive integer (names ``flag``).
    """
    items = comma_items(flag, text)
    if not all(item.isdigit() and int(item) >= 1 for item in items):
        raise SpecError(
            f"{flag} must be positive integers separated by commas, e.g. 1,2,4 (got {text!r})"
        )
    return tuple(sorted({int(item) for item in items}))


def choice_list_arg(flag: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``--recompute none,full`` -> ('none', 'full'): each entry one of ``allowed``, in the
    order given, without repeats.

    Raises:
        SpecError: an entry is empty or not allowed (names ``flag`` and the allowed values).
    """
    chosen = comma_items(flag, text)
    bad = [c for c in chosen if c not in allowed]
    if bad:
        raise SpecError(
            f"{flag} {bad[0]!r} is not allowed; choose from {', '.join(allowed)} "
            f"(several separated by commas)"
        )
    return tuple(chosen)


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


def _vpp(args: argparse.Namespace) -> int:
    """--vpp, or when not given the schedule's own: 2 for the V schedules (ZB-V, DualPipeV
    hold exactly two chunks per rank), else 1."""
    if args.vpp is not None:
        return int(args.vpp)
    return 2 if Schedule(args.schedule).placement is StagePlacement.V else 1


def shared_plan_fields(args: argparse.Namespace, *, dp: int) -> dict[str, Any]:
    """The plan fields of the flags ``plansim simulate`` and ``plansim validate`` share
    (sizes, batch, ZeRO stage and hybrid sharding, recompute, sequence parallelism, schedule,
    uneven pipeline split), by their plan-field names: each command adds its own and builds
    the plan with ``plansim.specs.plan.plan_from_fields``, as the plan files do."""
    return {
        "dp": dp,
        "tp": args.tp,
        "pp": args.pp,
        "vpp": _vpp(args),
        "micro_batch_size": args.mbs,
        "global_batch_size": args.gbs,
        "zero_stage": args.zero,
        "dp_shard": args.dp_shard,
        "recompute": Recompute(args.recompute),
        "recompute_num_layers": args.recompute_num_layers,
        "sequence_parallel": args.sequence_parallel,
        "schedule": Schedule(args.schedule),
        "decoder_first_pipeline_num_layers": args.decoder_first_pipeline_num_layers,
        "decoder_last_pipeline_num_layers": args.decoder_last_pipeline_num_layers,
        "account_for_embedding_in_pipeline_split": args.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": args.account_for_loss_in_pipeline_split,
    }
