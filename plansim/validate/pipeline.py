"""Run the micro-batches of one step: torch.distributed.pipelining driven by OUR action lists.

With pp > 1, every rank builds one ``PipelineStage`` per model chunk it holds and a
``_PipelineScheduleRuntime`` whose compute order is loaded from
``plansim.schedule.builders.build_actions`` (the simulator's lists, in torch's ``"0F1"``
alphabet); torch lowers it with its own passes (send/recv, FSDP unshard/reshard, gradient
reduction), so the executed order is the simulated order. The torch schedule class that
matches the plan (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``) is built too and its compute order compared with ours
(:attr:`PipelineExecutor.torch_order`). With pp == 1 a plain loop runs forward and backward
per micro-batch (the 1F1B order of one rank).

Measured per action: forward (with the loss on the last stage), backward, or
backward-input / backward-weight (zero bubble), FSDP's gradient reduction (``REDUCE_GRAD``,
stream ``dp``), the receiver's blocking wait for a pipeline transfer (``recv_forward`` /
``recv_backward`` on ``pp_recv``, the stage that receives, the activation's bytes) and the
moment the sender posted it (markers the runner uses to cut the wait to the part after the
send was posted).

Losses are the mean cross-entropy of each micro-batch; gradients are scaled by 1 / m, so
they are those of the mean over the rank's batch (``scale_grads=True`` under pipelining).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from plansim.calibrate.bench_pipeline import plansim_runtime
from plansim.schedule.actions import ActionKind
from plansim.specs.plan import ParallelPlan, Schedule
from plansim.validate.measure import Recorder, wrap_method
from plansim.validate.model import loss_fn

#: torch's schedule class per plan schedule, and whether it takes a single stage.
TORCH_SCHEDULES: dict[Schedule, tuple[str, bool]] = {
    Schedule.GPIPE: ("ScheduleGPipe", True),
    Schedule.ONE_F_ONE_B: ("Schedule1F1B", True),
    Schedule.INTERLEAVED_1F1B: ("ScheduleInterleaved1F1B", False),
    Schedule.ZB_H1: ("ScheduleInterleavedZeroBubble", False),
}
_BACKWARD_KIND = {True: "backward", False: "backward_input"}
#: Marker kinds of the moment a stage posts its sends (not Timeline rows: the runner pairs
#: them with the receivers' waits, ``plansim.validate.runner``).
SEND_POST = {"get_fwd_send_ops": "post_send_forward", "get_bwd_send_ops": "post_send_backward"}
_SINGLE_NOTE = (
    "not compared: torch's single-stage classes run their own loop; their pipeline_order IR "
    "is for visualisation (in torch 2.13 Schedule1F1B's IR starts the last rank at "
    "micro-batch 1); our builder follows the loop (plansim.schedule.builders)"
)


class LoopExecutor:
    """pp == 1: forward (with the loss) then backward of each micro-batch in turn."""

    def __init__(self, module: nn.Module, *, plan: ParallelPlan, recorder: Recorder) -> None:
        self.module = module
        self.plan = plan
        self.recorder = recorder
        self.torch_order: dict[str, Any] = {"schedule": "loop", "matches": None}

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> list[float]:
        """Run the step's micro-batches; returns their losses."""
        m = self.plan.num_microbatches
        losses = []
        rec = self.recorder
        for j, (tok, tgt) in enumerate(zip(tokens.chunk(m), targets.chunk(m), strict=True)):
            with rec.interval(stream="compute", kind="forward", stage=0, microbatch=j):
                loss = loss_fn(self.module(tok), tgt)
            with rec.interval(stream="compute", kind="backward", stage=0, microbatch=j):
                (loss / m).backward()  # type: ignore[no-untyped-call]
            losses.append(loss.detach())
        return [float(x) for x in losses]


def _torch_compute_order(order: dict[int, list[Any]]) -> dict[int, list[str]]:
    letters = {kind.value for kind in ActionKind}
    return {
        rank: [str(a) for a in actions if a is not None and a.computation_type.value in letters]
        for rank, actions in order.items()
    }


class PipelineExecutor:
    """pp > 1: ``_PipelineScheduleRuntime`` on our action lists, instrumented per action.

    Args:
        modules: ``{stage index: module}`` of the chunks this rank holds (parallelized).
        plan: the plan (pp, vpp, schedule, micro-batches).
        pp_rank: this rank's pipeline index; pp_group: the pipeline process group.
        device: torch device of the stages.
        recorder: where the intervals go.
        activation_bytes: bytes of one activation between stages (for the recv rows).
    """

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        *,
        plan: ParallelPlan,
        pp_rank: int,
        pp_group: Any,
        device: torch.device,
        recorder: Recorder,
        activation_bytes: float,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage

        self.plan = plan
        self.recorder = recorder
        self.activation_bytes = activation_bytes
        self.stages = [
            PipelineStage(mod, idx, plan.num_stages, device, group=pp_group)
            for idx, mod in sorted(modules.items())
        ]
        self.schedule, order = plansim_runtime(
            self.stages,
            schedule=plan.schedule,
            num_ranks=plan.pp,
            num_microbatches=plan.num_microbatches,
            vpp=plan.vpp,
            loss_fn=loss_fn,
        )
        self.torch_order = self._compare_with_torch(order, pp_rank=pp_rank)
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        self._pending_wait: tuple[Any, Any] | None = None
        self._instrument()

    def _compare_with_torch(self, ours: dict[int, list[Any]], *, pp_rank: int) -> dict[str, Any]:
        """Build torch's own schedule class for the plan and compare its compute order."""
        from torch.distributed.pipelining import schedules

        name, single = TORCH_SCHEDULES[self.plan.schedule]
        if single:
            return {"schedule": name, "matches": None, "note": _SINGLE_NOTE}
        cls = getattr(schedules, name)
        try:
            sched = cls(self.stages, n_microbatches=self.plan.num_microbatches, loss_fn=loss_fn)
        except (ValueError, RuntimeError, AssertionError) as exc:
            return {"schedule": name, "matches": None, "note": f"torch refused: {exc}"}
        theirs = _torch_compute_order(sched.pipeline_order or {}).get(pp_rank, [])
        mine = _torch_compute_order(ours)[pp_rank]
        result: dict[str, Any] = {"schedule": name, "matches": theirs == mine}
        if theirs != mine:
            result["note"] = f"rank {pp_rank}: ours {mine} vs torch {theirs}"
        return result

    def _instrument(self) -> None:
        """Time each stage's forward/backward/weight-grad, the loss, recv waits, grad reduce."""
        rec = self.recorder
        for stage in self.stages:
            idx = stage.stage_index

            def fwd(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                self._flush_wait("recv_forward", _i, mb)
                with rec.interval(stream="compute", kind="forward", stage=_i, microbatch=mb):
                    return orig(mb, *a, **k)

            def bwd(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                self._flush_wait("recv_backward", _i, mb)
                kind = _BACKWARD_KIND[bool(k.get("full_backward", True))]
                with rec.interval(stream="compute", kind=kind, stage=_i, microbatch=mb):
                    return orig(mb, *a, **k)

            def wgt(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                with rec.interval(
                    stream="compute", kind="backward_weight", stage=_i, microbatch=mb
                ):
                    return orig(mb, *a, **k)

            def reduce(
                orig: Callable[..., Any], *a: Any, _i: int = idx, _s: Any = stage, **k: Any
            ) -> Any:
                if not isinstance(_s.submod, FSDPModule):  # only scales the gradients
                    return orig(*a, **k)
                with rec.interval(stream="dp", kind="dp_comm", stage=_i, microbatch=-1):
                    return orig(*a, **k)

            def post(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                kind = SEND_POST[orig.__name__]
                now = rec.mark()
                rec.add(stream="pp_send", kind=kind, stage=_i, microbatch=mb, start=now, end=now)
                return orig(mb, *a, **k)

            wrap_method(stage, "get_fwd_send_ops", post)
            wrap_method(stage, "get_bwd_send_ops", post)
            wrap_method(stage, "forward_one_chunk", fwd)
            wrap_method(stage, "backward_one_chunk", bwd)
            wrap_method(stage, "backward_weight_one_chunk", wgt)
            wrap_method(stage, "perform_reduce_grad", reduce)

        def loss(
            orig: Callable[..., Any], stage: Any, output: Any, tgt: Any, mb: int, *a: Any
        ) -> Any:
            if not stage.is_last:
                return orig(stage, output, tgt, mb, *a)
            with rec.interval(
                stream="compute", kind="forward", stage=stage.stage_index, microbatch=mb
            ):
                return orig(stage, output, tgt, mb, *a)

        wrap_method(self.schedule, "_maybe_compute_loss", loss)

    def _flush_wait(self, kind: str, stage: int, microbatch: int) -> None:
        """Attribute the p2p wait that just ended to the action that needed it."""
        if self._pending_wait is None:
            return
        start, end = self._pending_wait
        self._pending_wait = None
        self.recorder.add(
            stream="pp_recv",
            kind=kind,
            stage=stage,
            microbatch=microbatch,
            start=start,
            end=end,
            num_bytes=self.activation_bytes,
        )

    @contextmanager
    def _observe_waits(self) -> Iterator[None]:
        """Time torch's p2p waits (module function ``_wait_batch_p2p``) during one step."""
        from torch.distributed.pipelining import schedules

        original = schedules._wait_batch_p2p

        def timed(work: Any) -> Any:
            start = self.recorder.mark()
            out = original(work)
            self._pending_wait = (start, self.recorder.mark())
            return out

        schedules._wait_batch_p2p = timed
        try:
            yield
        finally:
            schedules._wait_batch_p2p = original
            self._pending_wait = None

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> list[float]:
        """Run one step's micro-batches; returns the losses on the last stage's rank."""
        losses: list[torch.Tensor] = []
        args = (tokens,) if self.has_first else ()
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if self.has_last else {}
        with self._observe_waits():
            self.schedule.step(*args, return_outputs=False, **kwargs)
        return [float(x.detach()) for x in losses]
