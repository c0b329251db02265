"""One rank of a validation run (torch): build, parallelize, train, measure, report.

The rank writes its result to ``rank-<r>.json`` in the run directory (atomically: temp file
+ ``os.replace``), its progress to ``progress-<r>.txt`` (``<count> <label>``) and, when it
fails, a traceback summary to ``error-<r>.txt``. The launcher judges the run by these
files, not by exit codes (FSDP/DDP can abort at interpreter exit after finishing).

Test-only fault injection: ``PLANSIM_VALIDATE_FAULT=die:R`` makes rank R exit with status
3 at the start of step 1 (``die:R:S`` at step S), ``hang:R`` makes it sleep forever there.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.validate import parallelize as par
from plansim.validate.expert_parallel import ExpertLayout, expert_parameter_ids
from plansim.validate.expert_parallel import build_optimizer as build_expert_optimizer
from plansim.validate.measure import (
    Interval,
    Recorder,
    cpu_peak_bytes,
    cuda_peak_bytes,
    state_tensors,
)
from plansim.validate.mixed_precision import TORCH_DTYPES, MasterWeights, local
from plansim.validate.model import StageModule, build_model, split_stage, synthetic_batches
from plansim.validate.pipeline import LoopExecutor, PipelineExecutor
from plansim.validate.run_config import RunConfig
from plansim.validate.run_dtype import uses_fsdp

FAULT_ENV = "PLANSIM_VALIDATE_FAULT"
#: Exit status of a rank killed by the ``die`` fault.
FAULT_EXIT_STATUS = 3


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Progress:
    """Writes ``progress-<rank>.txt``: how far this rank got (count and label)."""

    def __init__(self, run_dir: Path | None, rank: int) -> None:
        self.path = None if run_dir is None else run_dir / f"progress-{rank}.txt"
        self.count = 0

    def __call__(self, label: str) -> None:
        self.count += 1
        if self.path is not None:
            _write_atomic(self.path, f"{self.count} {label}\n")


def run_queue_wait_s() -> float:
    """Seconds this process's main thread has spent runnable but not running (waiting for a
    CPU behind other work), from Linux's ``/proc/self/schedstat`` (second field, ns); NaN
    where the kernel does not provide it."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def _fault(rank: int, step: int) -> None:
    """Test-only fault injection (see module docstring)."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    parts = spec.split(":")
    what, who = parts[0], int(parts[1])
    at = int(parts[2]) if len(parts) > 2 else 1
    if who != rank or step != at:
        return
    if what == "die":
        os._exit(FAULT_EXIT_STATUS)
    if what == "hang":
        while True:
            time.sleep(60)


def versions(backend: str) -> dict[str, str]:
    """Software versions of the run."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    if backend == "nccl" and torch.cuda.is_available():
        out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    return out


class Trainer:
    """The parallelized model of one rank and its training step (see module docstring)."""

    def __init__(
        self,
        *,
        model: ModelSpec,
        plan: ParallelPlan,
        device: str,
        seed: int,
        optimizer: str,
        dtype: str = "fp32",
    ) -> None:
        self.model_spec, self.plan, self.device_type, self.dtype = model, plan, device, dtype
        index = torch.cuda.current_device() if device == "cuda" else None
        self.device = torch.device(device, index)
        mesh, self.coords = par.build_mesh(plan, device=device)
        self.dp_group = mesh["dp"].get_group()
        self.recorder = Recorder(device=device)
        #: the expert groups of a MoE model with ep > 1 (plansim.validate.expert_parallel);
        #: None otherwise (ep 1: every rank holds every expert, reduced over dp as the rest)
        moe_ep = model.moe is not None and plan.ep > 1
        self.experts = ExpertLayout(plan, device=device, recorder=self.recorder) if moe_ep else None
        full = build_model(model, seed=seed)
        self.modules: dict[int, StageModule] = {}
        dp_mesh = par.zero_mesh(plan, mesh)
        expert_mesh = None if self.experts is None else self.experts.edp_mesh
        # bf16 without FSDP: bf16 weights, fp32 master weights (plansim.validate.mixed_precision)
        cast_model = dtype != "fp32" and not uses_fsdp(plan)
        for stage in plan.stages_of_rank(self.coords.pp):
            part = split_stage(full, model, plan, stage).to(self.device)
            if cast_model:
                part = part.to(TORCH_DTYPES[dtype])
            if self.experts is not None:
                self.experts.apply(part)
            par.apply_tp(part, plan, mesh=mesh)
            par.apply_recompute(part, plan)
            self.modules[stage] = par.apply_zero(
                part, plan, dp_mesh=dp_mesh, dtype=dtype, expert_mesh=expert_mesh
            )
        del full
        self.params = [p for m in self.modules.values() for p in m.parameters()]
        # pipelining scales .grad by 1/m after the step; the loop of pp 1 scales the loss
        scale = 1.0 / plan.num_microbatches if plan.pp > 1 else 1.0
        self.master = MasterWeights(self.params, grad_scale=scale) if cast_model else None
        #: what the optimizer and the DP all-reduce work on: the fp32 masters in bf16
        self.grad_params = self.master.masters if self.master is not None else self.params
        self._split_expert_params()
        self.optimizer = self._build_optimizer(optimizer)
        self.tied_group = self._tied_group()
        self.executor = self._executor(mesh)

    def _split_expert_params(self) -> None:
        """The gradient parameters reduced over dp (:attr:`dense_grad_params`: all of a dense
        model's) and over edp (:attr:`expert_grad_params`: the routed experts')."""
        ids = expert_parameter_ids(self.modules.values())
        self.is_expert = [id(p) in ids for p in self.params]
        pairs = list(zip(self.grad_params, self.is_expert, strict=True))
        self.dense_grad_params = [p for p, e in pairs if not e]
        self.expert_grad_params = [p for p, e in pairs if e]

    def _build_optimizer(self, name: str) -> Any:
        if self.experts is None:
            return par.build_optimizer(
                self.grad_params, self.plan, dp_group=self.dp_group, name=name
            )
        return build_expert_optimizer(
            self.grad_params,
            is_expert=self.is_expert,
            plan=self.plan,
            dp_group=self.dp_group,
            layout=self.experts,
            name=name,
        )

    def _executor(self, mesh: Any) -> LoopExecutor | PipelineExecutor:
        plan = self.plan
        if plan.pp == 1:
            return LoopExecutor(self.modules[0], plan=plan, recorder=self.recorder)
        seq = self.model_spec.seq_length // (plan.tp if plan.sequence_parallel else 1)
        element_bytes = TORCH_DTYPES[self.dtype].itemsize
        act_bytes = plan.micro_batch_size * seq * self.model_spec.hidden_size * element_bytes
        return PipelineExecutor(
            self.modules,
            plan=plan,
            pp_rank=self.coords.pp,
            pp_group=mesh["pp"].get_group(),
            device=self.device,
            recorder=self.recorder,
            activation_bytes=float(act_bytes),
        )

    def _tied_group(self) -> Any:
        """Process group of the first and last pipeline ranks of this (dp, tp) position, which
        hold the two copies of a tied embedding (Megatron-LM's embedding group); None where
        one rank holds both (pp 1; the V placement: :meth:`_sum_local_tied_grads`)."""
        plan = self.plan
        if not self.model_spec.tied_embeddings or plan.pp == 1 or self._tied_local():
            return None
        mine = None
        stride = plan.tp * plan.dp
        for base in range(stride):  # every rank creates every group, in the same order
            group = dist.new_group([base, base + stride * (plan.pp - 1)])
            if self.coords.tp + plan.tp * self.coords.dp == base:
                mine = group
        return mine if self.coords.pp in (0, plan.pp - 1) else None

    def _tied_local(self) -> bool:
        """True when one pipeline rank holds both copies of a tied embedding (pp > 1 under
        the V placement of ZB-V and DualPipeV: rank 0 holds stages 0 and 2 pp - 1)."""
        plan = self.plan
        holds_both = plan.rank_holds_stage(0, plan.num_stages - 1)
        return self.model_spec.tied_embeddings and plan.pp > 1 and holds_both

    def _sum_local_tied_grads(self) -> None:
        """Both copies of a tied embedding on this rank (:meth:`_tied_local`): each gets the
        sum of their gradients, as the embedding group's all-reduce gives them elsewhere."""
        first: Any = self.modules.get(0)
        last: Any = self.modules.get(self.plan.num_stages - 1)
        if first is None or last is None:
            return
        weights = [first.embedding.tokens.weight, last.head.output.weight]
        if self.master is not None:
            weights = [self.master.master_of(w) for w in weights]
        grads = [local(w.grad) for w in weights]
        total = grads[0] + grads[1]
        for grad in grads:
            grad.copy_(total)

    def _tied_weight(self) -> torch.Tensor | None:
        first: Any = self.modules.get(0)
        last: Any = self.modules.get(self.plan.num_stages - 1)
        if first is not None and first.embedding is not None:
            return cast(torch.Tensor, first.embedding.tokens.weight)
        if last is not None and last.head is not None:
            return cast(torch.Tensor, last.head.output.weight)
        return None

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> list[float]:
        """One training step: micro-batches, gradient sync, optimizer; returns mb losses."""
        rec = self.recorder
        losses = self.executor.step(tokens, targets)
        if self.master is not None:
            self.master.fold_in_grads()
        if self._tied_local():
            self._sum_local_tied_grads()
        if self.tied_group is not None:
            weight = self._tied_weight()
            if weight is not None and self.master is not None:
                weight = self.master.master_of(weight)  # bf16: its fp32 main gradient
            assert weight is not None and weight.grad is not None
            grad = local(weight.grad)
            nbytes = float(grad.numel() * grad.element_size())
            with rec.interval(
                stream="dp", kind="embedding_grad_comm", stage=-1, microbatch=-1, num_bytes=nbytes
            ):
                dist.all_reduce(grad, group=self.tied_group)
        if self.plan.dp > 1 and self.plan.zero_stage < 2:
            start = rec.mark()
            nbytes = par.all_reduce_grads(self.dense_grad_params, group=self.dp_group)
            if self.experts is not None:
                nbytes += self.experts.all_reduce_grads(self.expert_grad_params)
            rec.add(
                stream="dp",
                kind="dp_comm",
                stage=-1,
                microbatch=-1,
                start=start,
                end=rec.mark(),
                num_bytes=float(nbytes),
            )
        self._optimizer_step()
        return losses

    def _optimizer_step(self) -> None:
        """The optimizer step; ZeroRedundancyOptimizer's is split into the local step (on
        ``compute``) and the parameter broadcast (``dp_comm`` on ``dp``)."""
        rec, opt = self.recorder, self.optimizer
        sharded = hasattr(opt, "_sync_params")
        with rec.interval(stream="compute", kind="optimizer", stage=-1, microbatch=-1):
            opt._local_step() if sharded else opt.step()
            if self.master is None:
                opt.zero_grad(set_to_none=True)
            else:  # Megatron-LM: masters into the bf16 weights, the main-gradient buffer zeroed
                self.master.copy_to_model()
                self.master.zero_main_grads()
        if sharded:
            with rec.interval(stream="dp", kind="dp_comm", stage=-1, microbatch=-1):
                opt._sync_params()


@dataclass(slots=True)
class _History:
    """What the steps of one rank measured."""

    step_times_s: list[float] = field(default_factory=list)
    run_queue_fractions: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    intervals: list[list[Interval]] = field(default_factory=list)
    peak_memory_bytes: int = 0


def _train(
    trainer: Trainer, *, num_warmup_steps: int, num_steps: int, seed: int, progress: Progress
) -> _History:
    """Warm-up steps, measured steps, then (CPU) the untimed memory step."""
    plan, device, coords = trainer.plan, trainer.device_type, trainer.coords
    rows_per_dp = plan.global_batch_size // plan.dp
    rows = slice(coords.dp * rows_per_dp, (coords.dp + 1) * rows_per_dp)
    batches = synthetic_batches(
        trainer.model_spec, global_batch_size=plan.global_batch_size, seed=seed
    )
    history = _History()
    total = num_warmup_steps + num_steps
    for step in range(total + (1 if device == "cpu" else 0)):
        _fault(dist.get_rank(), step)
        progress(f"step {step}")
        batch = next(batches)
        tokens, targets = (t[rows].to(trainer.device) for t in (batch.tokens, batch.targets))
        if device == "cuda" and step == num_warmup_steps:
            torch.cuda.reset_peak_memory_stats()
        dist.barrier()
        trainer.recorder.enabled = num_warmup_steps <= step < total
        trainer.recorder.start_step()
        if step == total:  # the extra CPU memory step
            baseline = state_tensors(trainer.modules.values(), trainer.optimizer)
            history.peak_memory_bytes = cpu_peak_bytes(
                functools.partial(trainer.step, tokens, targets), baseline=baseline
            )
            break
        waited_start_s = run_queue_wait_s()
        mb_losses = trainer.step(tokens, targets)
        step_s, intervals = trainer.recorder.finish_step()
        waited_s = run_queue_wait_s() - waited_start_s
        history.losses.append(sum(mb_losses) / len(mb_losses) if mb_losses else None)
        if step >= num_warmup_steps:
            history.step_times_s.append(step_s)
            if device == "cpu" and not math.isnan(waited_s):  # NaN: no schedstat here
                history.run_queue_fractions.append(waited_s / step_s if step_s > 0 else 0.0)
            history.intervals.append(intervals)
    if device == "cuda":
        history.peak_memory_bytes = cuda_peak_bytes()
    return history


def run_rank(config: RunConfig, progress: Progress) -> dict[str, Any]:
    """Train ``config.num_warmup_steps + config.num_steps`` steps on this rank; returns its
    result dict (JSON-ready: step times, losses on the rank holding the last stage with tp
    index 0, intervals on the representative replica, peak memory, schedule check,
    versions)."""
    plan = config.plan
    progress("building")
    trainer = Trainer(
        model=config.model,
        plan=plan,
        device=config.device,
        seed=config.seed,
        optimizer=config.optimizer,
        dtype=config.dtype,
    )
    coords = trainer.coords
    history = _train(
        trainer,
        num_warmup_steps=config.num_warmup_steps,
        num_steps=config.num_steps,
        seed=config.seed,
        progress=progress,
    )
    progress("done")
    holds_last = plan.rank_holds_stage(coords.pp, plan.num_stages - 1)
    return {
        "rank": dist.get_rank(),
        "coords": {"pp": coords.pp, "dp": coords.dp, "tp": coords.tp},
        "step_times_s": history.step_times_s,
        "run_queue_fractions": history.run_queue_fractions,
        "losses": history.losses if holds_last and coords.tp == 0 else None,
        "intervals": history.intervals if coords.representative else None,
        "peak_memory_bytes": history.peak_memory_bytes,
        "torch_order": trainer.executor.torch_order,
        "versions": versions(config.backend),
    }


def init_process_group(
    *, backend: str, rank: int, world: int, init_method: str, timeout_s: float
) -> None:
    """init_process_group with a bounded timeout (every collective then fails after it).

    With nccl the process group is bound to this rank's current CUDA device (``device_id``,
    set by the caller): without it NCCL guesses the device from the global rank and warns
    that a heterogeneous rank-to-GPU mapping can hang (seen on the H100 runs).
    """
    options: dict[str, Any] = {}
    if backend == "nccl":
        options["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        **options,
    )


def spawned_main(
    rank: int,
    config: RunConfig,
    world: int,
    run_dir: str,
    init_method: str,
    fault: str,
) -> None:
    """Entry point of a launched rank (``torch.multiprocessing``): run, write files, exit.

    ``fault`` is the launcher's ``PLANSIM_VALIDATE_FAULT`` (a forkserver child inherits the
    environment of the fork server, not the launcher's, so it is passed explicitly).
    """
    if fault:
        os.environ[FAULT_ENV] = fault
    out = Path(run_dir)
    progress = Progress(out, rank)
    try:
        if config.device == "cpu":
            torch.set_num_threads(1)
        else:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        progress("init_process_group")
        # the launcher's deadline decides hangs; collectives wait a bit longer than it
        init_process_group(
            backend=config.backend,
            rank=rank,
            world=world,
            init_method=init_method,
            timeout_s=config.timeout_s + 60.0,
        )
        result = run_rank(config, progress)
        _write_atomic(out / f"rank-{rank}.json", json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # report every failure, then let the process fail
        summary = "".join(traceback.format_exception(exc)[-12:])
        _write_atomic(out / f"error-{rank}.txt", f"{type(exc).__name__}: {exc}\n{summary}")
        raise
