"""Expert parallelism of the validator's MoE layers: groups, placement, gradients (torch).

Rank layout (MoE parallel folding, Liu et al. 2025, arXiv 2504.14960 §3; Megatron-Core's
expert ``RankGenerator``, order etp -> ep -> edp -> pp): the attention layers of a pipeline
stage run over its tp x cp x dp ranks (``parallelize.build_mesh``, tp -> cp -> dp -> pp), the
expert layers over the same ranks folded as etp x ep x edp. The runner's MoE layer has no
expert tensor parallelism (etp = tp = 1) and cp is 1, so a stage's dp ranks are
``d = ep_rank + ep * edp_rank``: an EP group is ep consecutive DP ranks, an EDP group the DP
ranks with the same ep_rank. The mesh is ``(pp, edp, ep)`` (:class:`ExpertLayout`).

What each group does (Megatron-Core; torchtitan ``parallelize_deepseekv3``): the EP group
dispatches and combines tokens (``plansim.validate.moe_layer``); the routed experts'
gradients are averaged over the EDP group only (ZeRO-0/1: one all-reduce,
:meth:`ExpertLayout.all_reduce_grads`; ZeRO-2/3: FSDP2 shards the experts over the EDP mesh,
``parallelize.apply_zero``), the other parameters' over dp as in a dense run. ZeRO-1 shards
the two sets separately (:class:`PairedOptimizer`: Megatron-Core's distributed optimizer
keeps one instance for the dense and one for the expert parameters).

Timing: the MoE layers' all-to-alls become ``ep_comm`` rows of the action running them;
:class:`ActionContext` follows which (stage, micro-batch) that is from the executors' compute
intervals. Which layouts run: ``plansim.validate.expert_support``. Used only with ep > 1 (at
ep 1 every rank holds every expert and a MoE model runs as a dense one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from plansim.specs.plan import ParallelPlan
from plansim.validate import parallelize as par
from plansim.validate.measure import Recorder, wrap_method
from plansim.validate.moe_layer import ExpertParallel, MoELayer, RoutedExperts

#: Timeline stream and kind of an expert-parallel all-to-all (it blocks compute, as a TP
#: collective does: ``plansim.specs.work.STREAMS``).
EP_STREAM = "tp"
EP_KIND = "ep_comm"


def moe_layers(module: nn.Module) -> list[MoELayer]:
    """The MoE layers inside ``module``, in module order."""
    return [m for m in module.modules() if isinstance(m, MoELayer)]


def expert_parameter_ids(modules: Iterable[nn.Module]) -> set[int]:
    """``id`` of every routed-expert parameter in ``modules`` (the ones reduced over edp)."""
    return {
        id(p)
        for module in modules
        for sub in module.modules()
        if isinstance(sub, RoutedExperts)
        for p in sub.parameters()
    }


class ActionContext:
    """The (stage, micro-batch) of the pipeline action running now on this rank.

    Wraps ``recorder.interval`` (instance only): a ``compute`` interval with a stage >= 0 is
    an action's forward, loss or backward (``plansim.validate.pipeline``), and whatever runs
    inside it, the backward's autograd Functions included, belongs to that action.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.current: tuple[int, int] | None = None
        wrap_method(recorder, "interval", self._interval)

    @contextlib.contextmanager
    def _interval(self, original: Callable[..., Any], **kwargs: Any) -> Iterator[None]:
        outer = self.current
        if kwargs["stream"] == "compute" and kwargs["stage"] >= 0:
            self.current = (kwargs["stage"], kwargs["microbatch"])
        try:
            with original(**kwargs):
                yield
        finally:
            self.current = outer


class ExpertLayout:
    """This rank's expert groups and what it does with them (module docstring).

    Builds the ``(pp, edp, ep)`` DeviceMesh (every rank, collectively) and wraps the
    recorder (:class:`ActionContext`).

    Args:
        plan: the plan (ep, dp, pp; tp and cp 1).
        device: ``cpu`` or ``cuda``.
        recorder: the rank's recorder; the all-to-alls become its ``ep_comm`` rows.
    """

    def __init__(self, plan: ParallelPlan, *, device: str, recorder: Recorder) -> None:
        self.plan = plan
        self.edp = plan.dp // plan.ep
        self.mesh: DeviceMesh = init_device_mesh(
            device, (plan.pp, self.edp, plan.ep), mesh_dim_names=("pp", "edp", "ep")
        )
        self.ep_group = self.mesh["ep"].get_group()
        self.ep_rank = self.mesh["ep"].get_local_rank()
        self.edp_group = self.mesh["edp"].get_group()
        self.recorder = recorder
        self.context = ActionContext(recorder)

    @property
    def edp_mesh(self) -> DeviceMesh:
        """The expert-data-parallel mesh (FSDP2 shards the experts over it)."""
        return self.mesh["edp"]

    def _record(self, start: Any, end: Any, num_bytes: float) -> None:
        if self.context.current is None:  # not inside an action: pipelining's shape inference
            return
        stage, microbatch = self.context.current
        self.recorder.add(
            stream=EP_STREAM,
            kind=EP_KIND,
            stage=stage,
            microbatch=microbatch,
            start=start,
            end=end,
            num_bytes=num_bytes,
        )

    def apply(self, stage: nn.Module) -> None:
        """Keep this rank's E/ep experts in each MoE layer of ``stage`` (in place) and connect
        the layers to the EP group; the experts' gradients are scaled by edp / dp (the
        ``moe_layer`` module docstring says why)."""
        ep, rank = self.plan.ep, self.ep_rank
        for layer in moe_layers(stage):
            experts = layer.experts
            num_local = experts.num_experts // ep
            lo = rank * num_local
            for name, param in list(experts.named_parameters(recurse=False)):
                local = param.detach()[lo : lo + num_local].clone()
                setattr(experts, name, nn.Parameter(local, requires_grad=param.requires_grad))
            experts.grad_scale = self.edp / self.plan.dp
            layer.ep = ExpertParallel(
                group=self.ep_group,
                rank=rank,
                size=ep,
                mark=self.recorder.mark,
                record=self._record,
            )

    def all_reduce_grads(self, params: list[nn.Parameter]) -> int:
        """Average the experts' gradients over edp (ZeRO-0/1); bytes reduced (0 at edp 1)."""
        if self.edp == 1:
            return 0
        return par.all_reduce_grads(params, group=self.edp_group)


class PairedOptimizer:
    """Two optimizers stepped as one: the dense parameters' and the experts' (ZeRO-1 shards
    each over its own group). Offers what the worker and the memory count use of an
    optimizer: ``step``, ``zero_grad``, ZeroRedundancyOptimizer's ``_local_step`` /
    ``_sync_params``, ``param_groups`` and ``state`` (of the local shards)."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    @staticmethod
    def _inner(opt: Any) -> Any:
        return getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer wraps the local one

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.parts for g in self._inner(opt).param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for opt in self.parts:
            merged.update(self._inner(opt).state)
        return merged

    def step(self) -> None:
        for opt in self.parts:
            opt.step()

    def _local_step(self) -> None:
        for opt in self.parts:
            opt._local_step() if hasattr(opt, "_sync_params") else opt.step()

    def _sync_params(self) -> None:
        for opt in self.parts:
            if hasattr(opt, "_sync_params"):
                opt._sync_params()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)


def build_optimizer(
    params: list[nn.Parameter],
    *,
    is_expert: list[bool],
    plan: ParallelPlan,
    dp_group: Any,
    layout: ExpertLayout,
    name: str,
) -> Any:
    """``parallelize.build_optimizer`` for a MoE run (``is_expert[i]``: ``params[i]`` is a
    routed expert's): with ZeRO-1 over dp > 1 a :class:`PairedOptimizer` of the dense
    parameters sharded over dp and the experts' over edp (not sharded at edp 1); otherwise
    one optimizer over all, as in a dense run."""
    if not (plan.zero_stage == 1 and plan.dp > 1 and any(is_expert)):
        return par.build_optimizer(params, plan, dp_group=dp_group, name=name)
    dense = [p for p, e in zip(params, is_expert, strict=True) if not e]
    experts = [p for p, e in zip(params, is_expert, strict=True) if e]
    dense_opt = par.build_optimizer(dense, plan, dp_group=dp_group, name=name)
    cls, hyper = par.optimizer_class(name)
    if layout.edp == 1:
        return PairedOptimizer(dense_opt, cls(experts, **hyper))
    from torch.distributed.optim import ZeroRedundancyOptimizer

    expert_opt = ZeroRedundancyOptimizer(
        experts, optimizer_class=cls, process_group=layout.edp_group, **hyper
    )
    return PairedOptimizer(dense_opt, expert_opt)
