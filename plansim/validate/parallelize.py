"""Apply a ParallelPlan to the model with PyTorch's own parallelism (torch).

One function per dimension, applied in a fixed order (torchtitan's
``models/llama3/parallelize.py`` order): :func:`build_mesh` (DeviceMesh ``pp x dp x tp``)
-> :func:`apply_tp` (DTensor ``parallelize_module``) -> :func:`apply_recompute`
(activation checkpointing) -> :func:`apply_zero` (FSDP2 ``fully_shard`` for ZeRO-2/3) ->
pipelining (``plansim.validate.pipeline``). ZeRO-0/1 keep whole gradients and reduce them
with one all-reduce per stage (:func:`all_reduce_grads`); ZeRO-1 shards the optimizer with
``ZeroRedundancyOptimizer`` (:func:`build_optimizer`).

Rank layout: the mesh is ``arange(world).reshape(pp, dp, tp)``, so global rank =
``tp_rank + tp * (dp_rank + dp * pp_rank)``, the tp -> cp -> dp -> pp order of
``plansim.analytic.ranks`` (cp = 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from plansim.calibrate.op_sac import op_selective_checkpoint
from plansim.errors import SpecError
from plansim.specs.layer_split import pipeline_layer_counts
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Recompute
from plansim.validate.executed_fsdp import reshard_after_forward
from plansim.validate.expert_support import check_moe_supported
from plansim.validate.mixed_precision import fsdp_policy, local
from plansim.validate.model import Block, StageModule
from plansim.validate.moe_layer import RoutedExperts
from plansim.validate.result import ValidateError
from plansim.validate.run_dtype import uses_fsdp

#: AdamW hyper-parameters of every validation run (the reference uses the same). AdamW runs
#: fused (one kernel over all tensors, as Megatron-LM's and Apex's FusedAdam): the unfused
#: per-tensor loop costs ~4x more on CPU, which is Python overhead, not memory traffic.
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
#: Plain SGD learning rate (tests: unlike Adam, SGD is not invariant to the gradient scale,
#: so a wrong 1/dp or 1/m factor changes the losses).
SGD_LEARNING_RATE = 1.0
OPTIMIZERS = ("adamw", "sgd")


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The torch optimizer class and its keyword arguments for ``adamw`` or ``sgd``."""
    if name == "sgd":
        return torch.optim.SGD, {"lr": SGD_LEARNING_RATE}
    return torch.optim.AdamW, {"lr": LEARNING_RATE, "weight_decay": WEIGHT_DECAY, "fused": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class Coords:
    """This rank's place in the mesh: pipeline, data and tensor-parallel indices."""

    pp: int
    dp: int
    tp: int

    @property
    def representative(self) -> bool:
        """True on the replica the Timeline describes (dp index 0, tp index 0)."""
        return self.dp == 0 and self.tp == 0


def check_supported(model: ModelSpec, plan: ParallelPlan) -> None:
    """Raise ValidateError for what the runner cannot execute, naming the field."""
    if plan.cp > 1:
        raise ValidateError(f"plan.cp({plan.cp}) > 1 is not supported by the validator")
    if plan.dp_shard is not None and (plan.tp > 1 or plan.zero_stage != 3):
        raise ValidateError(
            f"plan.dp_shard({plan.dp_shard}) (hybrid sharding) is supported by the validator "
            f"with zero_stage 3 and tp 1 only (got zero_stage {plan.zero_stage}, tp "
            f"{plan.tp}); leave dp_shard unset"
        )
    try:
        pipeline_layer_counts(model.num_layers, plan)
    except SpecError as exc:
        raise ValidateError(f"model.{exc}") from None
    for field in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        if getattr(model, field) % plan.tp:
            raise ValidateError(
                f"model.{field}({getattr(model, field)}) is not divisible by tp({plan.tp})"
            )
    if plan.sequence_parallel and model.seq_length % plan.tp:
        raise ValidateError(
            f"model.seq_length({model.seq_length}) is not divisible by tp({plan.tp}) "
            "(sequence parallelism splits the sequence)"
        )
    if plan.zero_stage == 1 and plan.tp > 1 and plan.dp > 1:
        raise ValidateError(
            "plan.zero_stage 1 with tp > 1 is not supported: ZeroRedundancyOptimizer does not "
            "handle DTensor parameters; use zero_stage 0 or 2"
        )
    check_moe_supported(model, plan)


def build_mesh(plan: ParallelPlan, *, device: str) -> tuple[DeviceMesh, Coords]:
    """The ``(pp, dp, tp)`` DeviceMesh of all ranks and this rank's coordinates."""
    mesh = init_device_mesh(device, (plan.pp, plan.dp, plan.tp), mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank()
    tp_rank, rest = rank % plan.tp, rank // plan.tp
    coords = Coords(pp=rest // plan.dp, dp=rest % plan.dp, tp=tp_rank)
    return mesh, coords


def _block_plan(plan: ParallelPlan) -> dict[str, Any]:
    """Megatron-LM's split of one block (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4.2.2
    for sequence parallelism, as torchtitan writes it)."""
    sp = plan.sequence_parallel
    rowwise = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
    layout: dict[str, Any] = {
        "attention.q": ColwiseParallel(),
        "attention.k": ColwiseParallel(),
        "attention.v": ColwiseParallel(),
        "attention.o": rowwise,
        "mlp.up": ColwiseParallel(),
        "mlp.gate": ColwiseParallel(),
        "mlp.down": rowwise,
    }
    if sp:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        layout |= {
            "attention_norm": SequenceParallel(),
            "mlp_norm": SequenceParallel(),
            "attention": gather,
            "mlp": gather,
        }
    return layout


def apply_tp(stage: StageModule, plan: ParallelPlan, *, mesh: DeviceMesh) -> None:
    """Shard the blocks' linear layers over the ``tp`` mesh dimension (in place).

    q, k, v, up, gate column-wise, o and down row-wise; embedding, norms and output layer stay
    replicated. With sequence parallelism the residual stream between blocks (and between
    pipeline stages) is split along the sequence: the embedding output is sliced, block norms
    run on the slice, the head gathers it back.
    """
    if plan.tp == 1:
        return
    tp_mesh = mesh["tp"]
    for block in stage.blocks.values():
        layout = _block_plan(plan)
        if cast(Block, block).mlp.gate is None:
            del layout["mlp.gate"]
        parallelize_module(block, tp_mesh, layout)
    if plan.sequence_parallel:
        if stage.embedding is not None:
            to_seq = PrepareModuleOutput(
                output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
                use_local_output=True,
            )
            parallelize_module(stage.embedding, tp_mesh, to_seq)
        if stage.head is not None:
            gather = PrepareModuleInput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_output=True,
            )
            parallelize_module(stage.head, tp_mesh, gather)


def apply_recompute(stage: StageModule, plan: ParallelPlan) -> None:
    """Activation checkpointing (Korthikanti et al. 2022 §5): full wraps every block (with
    ``plan.recompute_num_layers``, Megatron's block method, only the stage's first N),
    selective only the attention core softmax(QK^T)V, selective-op every block with
    torchtitan's per-op policy (``plansim.calibrate.op_sac``); in place, non-reentrant."""
    if plan.recompute is Recompute.NONE:
        return
    wrapped = plan.recomputed_layers(len(stage.blocks))
    for index, (name, block) in enumerate(list(stage.blocks.items())):
        if plan.recompute is Recompute.FULL:
            if index < wrapped:
                stage.blocks[name] = checkpoint_wrapper(block)
        elif plan.recompute is Recompute.SELECTIVE_OP:
            stage.blocks[name] = op_selective_checkpoint(block)
        else:
            attention = cast(Block, block).attention
            attention.core = checkpoint_wrapper(attention.core)


def apply_zero(
    stage: StageModule,
    plan: ParallelPlan,
    *,
    dp_mesh: DeviceMesh,
    dtype: str = "fp32",
    expert_mesh: DeviceMesh | None = None,
) -> StageModule:
    """FSDP2 ``fully_shard`` over ``dp_mesh`` (:func:`zero_mesh`) for ZeRO-2/3 (dp > 1).

    ZeRO-3 without pipelining reshards parameters after forward
    (``reshard_after_forward=True``); ZeRO-2, and ZeRO-3 with pp > 1 (torchtitan's choice:
    the pipeline stage gathers once per step and reduces after its last backward), keep them
    (``plansim.validate.executed_fsdp.reshard_after_forward``). Each block is a unit, then
    the stage root. ``dtype`` bf16: FSDP2's mixed precision (``mixed_precision.fsdp_policy``).
    With ``expert_mesh`` (a MoE run: the expert-data-parallel mesh,
    ``plansim.validate.expert_parallel``) each layer's routed experts are a unit of their own,
    sharded over it first (torchtitan's ``apply_fsdp`` for MoE).
    """
    if not uses_fsdp(plan):
        return stage
    from torch.distributed.fsdp import fully_shard

    options: dict[str, Any] = {"reshard_after_forward": reshard_after_forward(plan)}
    policy = fsdp_policy(dtype)
    if policy is not None:
        options["mp_policy"] = policy
    if expert_mesh is not None:
        for experts in [m for m in stage.modules() if isinstance(m, RoutedExperts)]:
            fully_shard(experts, mesh=expert_mesh, **options)
    for block in stage.blocks.values():
        fully_shard(block, mesh=dp_mesh, **options)
    fully_shard(stage, mesh=dp_mesh, **options)
    return stage


def zero_mesh(plan: ParallelPlan, mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over, built once per rank: ``mesh["dp"]``, or with hybrid
    sharding (``plan.dp_shard``) a 2-D ``(dp_replicate, dp_shard)`` mesh (FSDP2 on a 2-D mesh
    replicates over the first dimension and shards over the second). Ranks are numbered as
    in :func:`build_mesh` with the DP index split as replicate * dp_shard + shard, so a shard
    group is dp_shard consecutive DP ranks (``plansim.analytic.ranks``); tp is 1 then
    (:func:`check_supported`)."""
    if plan.dp_shard is None:
        return mesh["dp"]
    hybrid = init_device_mesh(
        mesh.device_type,
        (plan.pp, plan.dp // plan.dp_shard, plan.dp_shard),
        mesh_dim_names=("pp", "dp_replicate", "dp_shard"),
    )
    return hybrid["dp_replicate", "dp_shard"]


def all_reduce_grads(params: Iterable[nn.Parameter], *, group: Any) -> int:
    """Average the gradients over ``group`` in one flat all-reduce; returns bytes reduced.

    Used for ZeRO-0/1 (ZeRO-2/3 reduce inside FSDP2). ReduceOp.AVG (gloo has no PREMUL_SUM).
    """
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return 0
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel() * flat.element_size()


def build_optimizer(
    params: list[nn.Parameter], plan: ParallelPlan, *, dp_group: Any, name: str
) -> Any:
    """The optimizer :func:`optimizer_class` names; ZeroRedundancyOptimizer over dp for ZeRO-1."""
    cls, hyper = optimizer_class(name)
    if plan.zero_stage == 1 and plan.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=dp_group, **hyper)
    return cls(_param_groups(params), **hyper)


def _param_groups(params: list[nn.Parameter]) -> list[dict[str, Any]]:
    """One group per kind of parameter: plain tensors, and DTensors per (mesh, placements);
    the fused AdamW kernel refuses to mix them in one group."""
    groups: dict[str, list[nn.Parameter]] = {}
    for param in params:
        key = repr((param.device_mesh, param.placements)) if isinstance(param, DTensor) else ""
        groups.setdefault(key, []).append(param)
    return [{"params": group} for group in groups.values()]
