"""Run the micro-batches of one step: torch.distributed.pipelining driven by OUR action lists.

With pp > 1, every rank builds one ``PipelineStage`` per model chunk it holds
(``ParallelPlan.stages_of_rank``: looped, or the V of ZB-V and DualPipeV) and a
``_PipelineScheduleRuntime`` whose compute order is loaded from
``plansim.schedule.builders.build_actions`` (the simulator's lists, in torch's ``"0F1"``
alphabet; DualPipeV's overlapped pairs as torch's ``"(0F3;1B2)OVERLAP_F_B"``); torch lowers
it with its own passes (send/recv, FSDP unshard/reshard, gradient reduction). Two checks,
in :attr:`PipelineExecutor.torch_order`: the torch schedule class that matches the plan
(``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) is built
too and its compute order compared with ours (``matches``), and the compute the stages ran
in each step, in order, with our list's actions (``executed_matches``; an overlap's two
sub-actions run one after the other, torch's ``_perform_action``). With pp == 1 a plain loop
runs forward and backward per micro-batch (the 1F1B order of one rank).

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

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from plansim.calibrate.bench_pipeline import plansim_runtime
from plansim.specs.plan import ParallelPlan, Schedule
from plansim.validate.measure import Recorder, wrap_method
from plansim.validate.model import loss_fn

#: torch's schedule class per plan schedule, and whether it takes a single stage.
TORCH_SCHEDULES: dict[Schedule, tuple[str, bool]] = {
    Schedule.GPIPE: ("ScheduleGPipe", True),
    Schedule.ONE_F_ONE_B: ("Schedule1F1B", True),
    Schedule.INTERLEAVED_1F1B: ("ScheduleInterleaved1F1B", False),
    Schedule.ZB_H1: ("ScheduleInterleavedZeroBubble", False),
    Schedule.ZB_V: ("ScheduleZBVZeroBubble", False),
    Schedule.DUALPIPE_V: ("ScheduleDualPipeV", False),
}
_BACKWARD_KIND = {True: "backward", False: "backward_input"}
_BACKWARD_LETTER = {True: "B", False: "I"}
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


def compute_order(order: Mapping[int, Sequence[Any]]) -> dict[int, list[str]]:
    """The compute items of torch ``_Action`` lists per rank as strings (``"0F1"``,
    ``"(0F3;1B2)OVERLAP_F_B"``): F, B, I, W and OVERLAP_F_B (``_Action.is_compute_op``);
    idle steps (None) and communication dropped."""
    return {
        rank: [str(a) for a in actions if a is not None and a.is_compute_op]
        for rank, actions in order.items()
    }


def sub_action_order(actions: Sequence[Any]) -> list[str]:
    """One rank's torch ``_Action`` list as the compute actions it runs, in order: an
    ``OVERLAP_F_B`` item as its sub-actions (torch's runtime performs them one after the
    other), communication dropped."""
    out = []
    for action in actions:
        if action is None or not action.is_compute_op:
            continue
        out += [str(a) for a in action.sub_actions or (action,)]
    return out


def order_check(mine: Sequence[str], theirs: Sequence[str], *, label: str) -> dict[str, Any]:
    """``{"matches": bool, "note"?: str}``: whether ``theirs`` is ``mine``, item for item. An
    empty ``mine`` never matches (nothing was compared); the note names the first difference
    and ``label`` (what was compared)."""
    if list(mine) == list(theirs) and mine:
        return {"matches": True}
    if not mine:
        return {"matches": False, "note": f"{label}: no actions to compare"}
    at = next(
        (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
        min(len(mine), len(theirs)),
    )
    return {
        "matches": False,
        "note": f"{label}: first difference at position {at}: ours {list(mine[at : at + 4])} "
        f"vs {list(theirs[at : at + 4])} ({len(mine)} vs {len(theirs)} actions)",
    }


class PipelineExecutor:
    """pp > 1: ``_PipelineScheduleRuntime`` on our action lists, instrumented per action.

    Args:
        modules: ``{stage index: module}`` of the chunks this rank holds (parallelized;
            ``plan.stages_of_rank(pp_rank)``).
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
        self.pp_rank = pp_rank
        self.torch_order = self._compare_with_torch(order)
        #: the compute actions this rank must run each step, in order (our list)
        self.expected = sub_action_order(order[pp_rank])
        #: the compute actions the stages ran in the current step (``"0F1"``, ...)
        self.executed: list[str] = []
        self.steps_run = 0
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        self._pending_wait: tuple[Any, Any] | None = None
        self._instrument()

    def _compare_with_torch(self, ours: dict[int, list[Any]]) -> dict[str, Any]:
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
        theirs = compute_order(sched.pipeline_order or {}).get(self.pp_rank, [])
        mine = compute_order(ours)[self.pp_rank]
        return {"schedule": name, **order_check(mine, theirs, label=f"rank {self.pp_rank} torch")}

    def _check_executed(self) -> None:
        """Compare the step's executed compute with our list: ``executed_matches`` in
        :attr:`torch_order` (every step so far), ``executed_note`` (the first that differed)."""
        label = f"rank {self.pp_rank} executed in step {self.steps_run}"
        self.steps_run += 1
        check = order_check(self.expected, self.executed, label=label)
        if check["matches"]:
            self.torch_order.setdefault("executed_matches", True)
            return
        if self.torch_order.get("executed_matches") is not False:
            self.torch_order["executed_note"] = check["note"]
        self.torch_order["executed_matches"] = False

    def _instrument(self) -> None:
        """Time each stage's forward/backward/weight-grad, the loss, recv waits, grad reduce."""
        rec = self.recorder
        for stage in self.stages:
            idx = stage.stage_index

            def fwd(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                self._flush_wait("recv_forward", _i, mb)
                self.executed.append(f"{_i}F{mb}")
                with rec.interval(stream="compute", kind="forward", stage=_i, microbatch=mb):
                    return orig(mb, *a, **k)

            def bwd(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                self._flush_wait("recv_backward", _i, mb)
                full = bool(k.get("full_backward", True))
                self.executed.append(f"{_i}{_BACKWARD_LETTER[full]}{mb}")
                with rec.interval(
                    stream="compute", kind=_BACKWARD_KIND[full], stage=_i, microbatch=mb
                ):
                    return orig(mb, *a, **k)

            def wgt(orig: Callable[..., Any], mb: int, *a: Any, _i: int = idx, **k: Any) -> Any:
                self.executed.append(f"{_i}W{mb}")
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
        self.executed = []
        with self._observe_waits():
            self.schedule.step(*args, return_outputs=False, **kwargs)
        self._check_executed()
        return [float(x.detach()) for x in losses]
