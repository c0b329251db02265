"""The search space of ``plansim plan`` from its flags: the knobs it tries and the constraint
flags that restrict them (``--tp``, ``--pp``, ``--dp``, ``--vpp``, ``--mbs``, ``--zero``,
``--recompute``, ``--schedule``)."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from plansim.analytic.offload import offload_choices
from plansim.commands.common import (
    add_dispatcher_arg,
    bf16_layers_from_args,
    choice_list_arg,
    dp_syncs_from_args,
    int_list_arg,
)
from plansim.errors import SpecError
from plansim.io.result_cache import cache_from
from plansim.planner.enumerate import divisors
from plansim.planner.progress import progress_bar
from plansim.planner.search import SearchResult, search
from plansim.planner.space import SearchSpace
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    AttentionKernel,
    DdpImpl,
    DpSync,
    ExecutionSpec,
    OffloadDevice,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)

#: Search constraints: flag -> (SearchSpace field, what it fixes).
_INT_CONSTRAINTS = {
    "tp": ("tp", "tensor-parallel sizes"),
    "pp": ("pp", "pipeline-parallel sizes"),
    "dp": ("dp", "data-parallel sizes"),
    "vpp": ("vpps", "virtual pipeline sizes (1: no interleaving)"),
    "mbs": ("micro_batch_size", "micro-batch sizes"),
}


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    """--tp, --pp, --dp, --vpp, --mbs, --zero, --recompute, --schedule: restrict the search
    to the listed values (comma-separated; default: every value)."""
    for flag, (_, what) in _INT_CONSTRAINTS.items():
        p.add_argument(
            f"--{flag}", metavar="LIST", help=f"only these {what}, comma-separated (default: all)"
        )
    p.add_argument("--zero", metavar="LIST", help="only these ZeRO stages (0-3), comma-separated")
    p.add_argument(
        "--ep",
        metavar="LIST",
        help="models with experts: only these expert-parallel sizes, comma-separated "
        "(default: every divisor of the routed experts)",
    )
    p.add_argument(
        "--etp",
        metavar="LIST",
        help="models with experts: expert tensor-parallel sizes, comma-separated, 'tp' for "
        "etp = tp (default: 1, as Megatron-Bridge's MoE recipes set it)",
    )
    add_dispatcher_arg(p)
    p.add_argument(
        "--expert-load-imbalance",
        type=float,
        default=1.0,
        metavar="X",
        help="models with experts: routed rows on the busiest EP rank over the mean (>= 1; "
        "default 1.0 = balanced, as forced-balance benchmarks route)",
    )
    p.add_argument(
        "--recompute",
        metavar="LIST",
        help="only these recompute modes (none, selective, full, selective-op), comma-separated",
    )
    p.add_argument(
        "--schedule",
        metavar="LIST",
        help="only these pipeline schedules, comma-separated (default gpipe, 1f1b, "
        "interleaved-1f1b, zb-h1; zb-v, dualpipev and dualpipe are searched when named: "
        "vpp 2 for the first two, an even pp and m >= 2 pp for the DualPipes)",
    )


def constrained_space(space: SearchSpace, args: argparse.Namespace) -> SearchSpace:
    """``space`` restricted by the constraint flags that were given (and with torchtitan's
    per-op selective recompute added under ``--recompute-selective-op``).

    Raises:
        SpecError: a flag's list has a value outside its allowed ones.
    """
    changes: dict[str, Any] = {}
    for flag, (field_name, _) in _INT_CONSTRAINTS.items():
        text = getattr(args, flag)
        if text is not None:
            changes[field_name] = int_list_arg(f"--{flag}", text)
    if args.zero is not None:
        stages = choice_list_arg("--zero", args.zero, ("0", "1", "2", "3"))
        changes["zero_stages"] = tuple(sorted(int(z) for z in stages))
    recomputes = space.recomputes
    if args.recompute is not None:
        modes = choice_list_arg("--recompute", args.recompute, tuple(r.value for r in Recompute))
        recomputes = tuple(Recompute(m) for m in modes)
    if args.recompute_selective_op and Recompute.SELECTIVE_OP not in recomputes:
        recomputes += (Recompute.SELECTIVE_OP,)  # the flag adds it to the list or the default
    if recomputes != space.recomputes:
        changes["recomputes"] = recomputes
    if args.schedule is not None:
        names = choice_list_arg("--schedule", args.schedule, tuple(s.value for s in Schedule))
        changes["schedules"] = tuple(Schedule(n) for n in names)
    return replace(space, **changes)


def search_spaces(
    args: argparse.Namespace, model: ModelSpec, profile: HardwareProfile
) -> tuple[SearchSpace, SearchSpace]:
    """(the search without its constraint flags, the search with them) for ``plansim plan``'s
    ``args``: the first says, when the second enumerates nothing, what each constraint left
    out (``plansim.commands.empty_search``); it has every context-parallel size where ring
    attention applies unless ``--cp`` was left at 1, and ring DP sync.

    Raises:
        SpecError: a flag's value is outside its allowed ones, or flags contradict each other
            (``--cp`` above 1 without flash attention, :func:`_check_flags`).
    """
    cps = int_list_arg("--cp", args.cp)
    if max(cps) > 1 and args.attention != AttentionKernel.FLASH.value:
        raise SpecError(
            f"--cp {args.cp} needs --attention {AttentionKernel.FLASH.value} (got "
            f"{args.attention}): context parallelism exchanges key/value blocks between the "
            f"ranks of a fused ring-attention kernel"
        )
    base = SearchSpace(
        cp=cps,
        precision=Precision(args.precision),
        execution=ExecutionSpec(
            attention=AttentionKernel(args.attention),
            ddp_impl=DdpImpl(args.ddp_impl),
            fused_elementwise=args.fused_elementwise,
            persist_layer_norm=args.persist_layer_norm,
        ),
        dp_syncs=dp_syncs_from_args(args),
        ps_servers=args.ps_servers,
        offloads=offload_choices(profile),
        tp_comm_overlap=(False, True) if args.tp_comm_overlap else (False,),
        overlap_param_gather=(False, True) if args.overlap_param_gather else (False,),
        grad_reduce_in_bf16=(False, True) if args.grad_reduce_in_bf16 else (False,),
        zero3_param_fetch=Zero3ParamFetch(args.zero3_param_fetch),
        use_torch_fsdp2=args.use_torch_fsdp2,
        recompute_early_stop=args.recompute_early_stop,
        reshard_after_forward=(True,) if args.reshard_after_forward else (True, False),
        hsdp_shard_gpus=profile.gpus_per_node if args.hsdp else None,
        bf16_layers=bf16_layers_from_args(args),
    )
    base = expert_space(base, model, args)
    space = constrained_space(base, args)
    _check_flags(args, model, space)
    every_cp = None if args.attention == AttentionKernel.FLASH.value else (1,)
    unconstrained = replace(
        base, cp=base.cp if args.cp == "1" else every_cp, dp_syncs=(DpSync.RING,)
    )
    return unconstrained, space


def expert_space(space: SearchSpace, model: ModelSpec, args: argparse.Namespace) -> SearchSpace:
    """``space`` with the expert degrees of ``--ep`` / ``--etp`` / ``--expert-load-imbalance``
    for a model with experts (default: every ep dividing the routed experts, etp 1, ZeRO
    0-1, the stages plansim models with experts); a dense model's space unchanged.

    Raises:
        SpecError: an expert flag is given for a dense model, or a value is not allowed.
    """
    dispatcher = MoeTokenDispatcher(args.moe_token_dispatcher_type)
    given = args.ep is not None or args.etp is not None or args.expert_load_imbalance != 1.0
    given = given or dispatcher is not MoeTokenDispatcher.ALLTOALL
    if model.moe is None:
        if given:
            raise SpecError(
                f"--ep / --etp / --expert-load-imbalance / --moe-token-dispatcher-type need a "
                f"model with experts; {model.name} is dense"
            )
        return space
    imbalance = args.expert_load_imbalance
    if not math.isfinite(imbalance) or imbalance < 1.0:
        raise SpecError(f"--expert-load-imbalance must be a finite number >= 1, got {imbalance}")
    experts = model.moe.num_experts
    eps = int_list_arg("--ep", args.ep) if args.ep is not None else tuple(divisors(experts))
    bad = [ep for ep in eps if experts % ep]
    if bad:
        raise SpecError(
            f"--ep {args.ep}: {', '.join(map(str, bad))} does not divide the {experts} routed "
            f"experts of {model.name} (each EP rank holds E/ep of them)"
        )
    etps: tuple[int | None, ...] = (1,)
    if args.etp is not None:
        etps = tuple(
            None if item.strip() == "tp" else int_list_arg("--etp", item)[0]
            for item in args.etp.split(",")
        )
    zero = tuple(z for z in space.zero_stages if z <= 1)
    return replace(
        space,
        ep=eps,
        etp=etps,
        expert_load_imbalance=args.expert_load_imbalance,
        execution=replace(space.execution, moe_token_dispatcher_type=dispatcher),
        zero_stages=zero,
        offloads=((OffloadDevice.NONE, OffloadDevice.NONE),),
        sequence_parallel=(True,),  # Megatron-Core needs it with tp > 1 and experts
        pipeline_layouts=True,
    )


def _check_flags(args: argparse.Namespace, model: ModelSpec, space: SearchSpace) -> None:
    """Raise SpecError for per-op selective recompute without flash attention, and for bf16
    edge layers beyond the model's layers or without fp8 / fp4."""
    if Recompute.SELECTIVE_OP in space.recomputes and args.attention != AttentionKernel.FLASH.value:
        flag = (
            "--recompute-selective-op"
            if args.recompute_selective_op
            else "--recompute selective-op"
        )
        raise SpecError(
            f"{flag} needs --attention {AttentionKernel.FLASH.value} "
            f"(got {args.attention}): torchtitan's per-op policy saves the fused attention "
            f"kernel's output"
        )
    if sum(space.bf16_layers) > model.num_layers:
        start, end = space.bf16_layers
        raise SpecError(
            f"--num-layers-at-start-in-bf16({start}) + --num-layers-at-end-in-bf16({end}) > "
            f"{model.name}'s {model.num_layers} layers"
        )
    if any(space.bf16_layers) and space.precision not in (Precision.FP8, Precision.FP4):
        raise SpecError(
            f"--first-last-layers-bf16 needs --precision fp8 or fp4 (got {args.precision})"
        )


def search_from_args(
    args: argparse.Namespace,
    model: ModelSpec,
    profile: HardwareProfile,
    *,
    space: SearchSpace,
    num_gpus: int,
    global_batch_size: int,
    top_k: int,
    jobs: int,
    progress: bool = True,
) -> SearchResult:
    """``planner.search`` with the search-mode flags of ``plansim plan`` (``--simulate-top``,
    ``--exhaustive``, ``--progress``): one search of ``space`` for ``num_gpus`` GPUs and a
    global batch of ``global_batch_size``; ``progress`` False draws no bar."""
    return search(
        model,
        profile,
        num_gpus=num_gpus,
        global_batch_size=global_batch_size,
        space=space,
        top_k=top_k,
        simulate_top=args.simulate_top,
        exhaustive=args.exhaustive,
        jobs=jobs,
        progress=progress_bar(forced=args.progress) if progress else None,
        cache=cache_from(args.cache_dir),
    )
