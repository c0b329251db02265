"""Discrete-event execution of per-rank action lists over a PipelineWork (thin over SimPy).

Model (one representative pipeline replica, one optimizer step):

- One SimPy process per rank runs its actions in order on the **compute** stream. An
  action's segments (``StageWork.forward`` / ``backward`` / ``backward_input`` /
  ``backward_weight``) run one after another; a ``tp`` segment holds the compute stream too
  (Megatron's TP collectives are synchronous) but is recorded on stream ``tp``. Any other
  segment inside an action blocks the compute stream the same way and is recorded on its
  own stream (it then counts as idle compute in the bubble).
- F(s, j), s > 0, starts once the activation of F(s-1, j) has been **received**; B(s, j) or
  I(s, j), s < last, once the gradient of B/I(s+1, j) has. After F(s, j) ends, the sender's
  ``pp_send`` stream (FIFO, one transfer at a time, per rank: ``links.FifoStream``) carries
  ``stages[s].send_forward``; after B/I(s, j) ends it carries ``stages[s].send_backward``.
  The transfer is recorded on the sender (``pp_send``) and the receiver (``pp_recv``).
  Zero-length transfers still order the events. Adjacent stages on the same rank
  (vpp > 1 placements) hand over locally, without a transfer (as torch does).
- With ``work.blocking_p2p`` the sender waits for its transfer to end before its next
  action (synchronous send, Megatron-LM's default); otherwise it goes straight on.
- Same-rank dependencies (F before B/I, I before W) hold by the list order, which
  :func:`plansim.schedule.checks.check_structure` verifies before the run. "Previous" and
  "next" stage follow the micro-batch's path (``PipelineWork.graph``: the looped, V or
  dual placement).
- An **overlapped F&B** item (DualPipe's, ``plansim.schedule.actions.OverlapFB``) starts
  once both its inputs have arrived and runs its forward and its backward as two processes
  sharing the rank's GPU: compute segments take the GPU one at a time (FIFO), communication
  segments (TP, EP all-to-all, CP) run beside the other's compute, and both are cut into
  ``StageWork.num_layers`` slices interleaved layer by layer, as the DualPipe repository
  overlaps them. Compute runs ``1 + overlap_slowdown`` times longer while the other's
  communication is in flight (the profile's overlap term). The item ends when both have.
  Without ``work.overlap_fb`` the halves run one after the other (as torch's runtime does
  without an overlap function).
- Gradient reduction runs on the rank's ``dp`` stream, FIFO like ``pp_send``: the stages'
  ``grad_buckets``, then the rank's ``grad_sync`` segments. With
  ``work.overlap_grad_reduce`` (Megatron-LM ``--overlap-grad-reduce``; PyTorch DDP buckets,
  Li et al. VLDB 2020) bucket k of stage s is queued ``ready_fraction`` of the way through
  the stage's last backward action (B, or W when split) of the step, beside the rank's
  remaining work, and always after bucket k-1; ``grad_sync`` is queued after the rank's last
  action. Without it, all of them are queued after the rank's last action (stages in the
  order of their last backward). Bucket rows carry their stage (micro-batch -1); the
  ``grad_sync`` rows stage -1. The rank's ``optimizer`` segments start when the ``dp``
  stream has carried all of them. In-action ``dp`` segments (ZeRO-3 gathers) hold the
  compute stream and do not go through that queue.
- **Contention** (``plansim.sim.links``): a transfer that names a link (``Segment.link``,
  ``P2P.link``: the rank's NVLink, NIC or PCIe) takes its ``duration_s`` only while alone on
  it; transfers active on one link at once share it equally (processor sharing; the
  ``latency_s`` part never stretches). That covers the queued ``pp_send`` and ``dp``
  transfers once they leave their FIFO and the in-action ``tp``/``dp`` segments (blocking
  TP collectives load NVLink beside a DP bucket). Transfers without a link, and any
  transfer that never overlaps another on a link, keep their durations exactly; links only
  one issuer can use (``links.declare_sources``) are plain delays, with no bookkeeping.
- **Overlap slowdown** (``plansim.sim.overlap``): with ``work.overlap_slowdown`` s > 0, a
  rank's compute segments run 1 + s times longer while it has a ``dp`` stream transfer or
  (without ``blocking_p2p``) a pipeline send or receive in flight.
- Memory per rank = ``static_bytes`` + ``activation_bytes`` of every (s, j) whose F has
  started and whose B (or W, when split) has not ended; sampled at every change.

Determinism: SimPy orders simultaneous events by scheduling order, which here depends only
on the inputs; no global state, no randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from functools import partial
from typing import Any

import simpy

from plansim.schedule.actions import (
    Action,
    ActionKind,
    OverlapFB,
    PerRankActions,
    format_grid,
    parts,
)
from plansim.schedule.checks import (
    ScheduleError,
    Signal,
    SignalKey,
    check_structure,
    describe_wait,
    item_needs,
    provides,
)
from plansim.sim import timeline as tl
from plansim.sim.links import Link, Network, declare_sources
from plansim.sim.overlap import ComputeSlowdown
from plansim.sim.result import SimResult, summarise
from plansim.sim.streams import FifoStream, rendezvous_gates
from plansim.specs.work import P2P, PipelineWork, Segment

_SEGMENTS = {
    ActionKind.FORWARD: "forward",
    ActionKind.FULL_BACKWARD: "backward",
    ActionKind.BACKWARD_INPUT: "backward_input",
    ActionKind.BACKWARD_WEIGHT: "backward_weight",
}
#: (sender's, receiver's) Timeline kind of an activation and of a gradient transfer.
_ACTIVATION_KINDS = (tl.TimelineKind.SEND_FORWARD.value, tl.TimelineKind.RECV_FORWARD.value)
_GRADIENT_KINDS = (tl.TimelineKind.SEND_BACKWARD.value, tl.TimelineKind.RECV_BACKWARD.value)
_PP_SEND, _PP_RECV = tl.Stream.PP_SEND.value, tl.Stream.PP_RECV.value
#: Kinds whose end frees the activations of their (stage, micro-batch).
_FREES = (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT)

_Process = Generator[simpy.Event, Any, None]


class _Run:
    """Mutable state of one simulation; created, executed and summarised by simulate()."""

    def __init__(self, actions: PerRankActions, work: PipelineWork) -> None:
        self.actions = actions
        self.work = work
        self.env = simpy.Environment()
        self.rows: list[tl.TimelineRow] = []
        self.memory = [rank.static_bytes for rank in work.ranks]
        self.memory_rows = [(r, 0.0, b) for r, b in enumerate(self.memory)]
        self.peak = list(self.memory)
        self.arrived: dict[SignalKey, simpy.Event] = {}
        nodes = [work.node_of_rank(rank) for rank in range(work.num_ranks)]
        self.network = Network(self.env, rank_nodes=nodes)
        declare_sources(self.network, work)
        self.pp_send = [FifoStream(self.env, self.network) for _ in work.ranks]
        self.dp = [FifoStream(self.env, self.network) for _ in work.ranks]
        self.dp_last: list[simpy.Event | None] = [None] * work.num_ranks
        self.gates = rendezvous_gates(work)
        self.graph = work.graph
        self.last_backward = _last_backwards(actions, work)
        self.position = [0] * work.num_ranks
        self.finished = [False] * work.num_ranks
        self.gpu: list[simpy.Resource | None] = [None] * work.num_ranks
        paired = any(isinstance(item, OverlapFB) for row in actions for item in row)
        overlaps = work.overlap_grad_reduce or not work.blocking_p2p or paired
        self.slowdown = (
            ComputeSlowdown(self.env, work.num_ranks, work.overlap_slowdown)
            if work.overlap_slowdown > 0 and overlaps
            else None
        )

    def run(self) -> None:
        for rank in range(self.work.num_ranks):
            self.env.process(self._rank(rank))
        self.env.run()

    def _arrival(self, key: SignalKey) -> simpy.Event:
        event = self.arrived.get(key)
        if event is None:
            event = self.arrived[key] = self.env.event()
        return event

    def _rank(self, rank: int) -> _Process:
        num_stages = self.work.num_stages
        for index, item in enumerate(self.actions[rank]):
            self.position[rank] = index
            for need in item_needs(item, num_stages=num_stages, graph=self.graph):
                event = self._arrival(need)
                if not event.processed:
                    yield event
            if isinstance(item, OverlapFB):
                yield from self._overlapped(rank, index, item)
                continue
            sent = yield from self._action(rank, index, item, None)
            if sent is not None and self.work.blocking_p2p and not sent.processed:
                yield sent
        self.position[rank] = len(self.actions[rank])
        yield from self._tail(rank)
        self.finished[rank] = True

    def _action(
        self, rank: int, index: int, action: Action, gpu: simpy.Resource | None
    ) -> Generator[simpy.Event, Any, simpy.Event | None]:
        """Run one action's segments (sharing ``gpu`` with an overlapped partner when given);
        returns the event of the transfer it queued, if any."""
        stage = self.work.stages[action.stage]
        if action.kind is ActionKind.FORWARD:
            self._add_memory(rank, stage.activation_bytes)
        segments = getattr(stage, _SEGMENTS[action.kind])
        release = None
        if self.work.overlap_grad_reduce and (index, action.stage) in self.last_backward[rank]:
            release = self._release_buckets(rank, action.stage, segments)
        if gpu is None:
            yield from self._segments(rank, segments, action.stage, action.microbatch)
        else:
            yield from self._shared_segments(rank, segments, action, gpu, stage.num_layers)
        if release is not None:
            release()
        if action.kind in _FREES:
            self._add_memory(rank, -stage.activation_bytes)
        return self._hand_over(rank, action)

    def _overlapped(self, rank: int, index: int, item: OverlapFB) -> _Process:
        """Forward and backward of ``item`` as two processes on the rank's one GPU (or one
        after the other without ``work.overlap_fb``)."""
        if not self.work.overlap_fb:
            for part in item.parts:
                sent = yield from self._action(rank, index, part, None)
                if sent is not None and self.work.blocking_p2p and not sent.processed:
                    yield sent
            return
        gpu = self.gpu[rank]
        if gpu is None:
            gpu = self.gpu[rank] = simpy.Resource(self.env, capacity=1)
        halves = [self.env.process(self._action(rank, index, a, gpu)) for a in item.parts]
        yield self.env.all_of(halves)
        if self.work.blocking_p2p:
            for half in halves:
                sent = half.value
                if sent is not None and not sent.processed:
                    yield sent

    def _shared_segments(
        self,
        rank: int,
        segments: Sequence[Segment],
        action: Action,
        gpu: simpy.Resource,
        num_slices: int,
    ) -> _Process:
        """Segments of one half of an overlapped pair, cut into ``num_slices`` layer slices:
        compute holds ``gpu``; communication runs beside the partner's compute and slows it
        (``overlap_slowdown``) while in flight."""
        env, slowdown = self.env, self.slowdown
        stage, microbatch = action.stage, action.microbatch
        for piece in range(num_slices):
            for seg in segments:
                duration_s = seg.duration_s / num_slices
                if duration_s <= 0 and piece:
                    continue
                start = env.now
                if seg.stream == tl.COMPUTE and duration_s > 0:
                    with gpu.request() as turn:
                        yield turn
                        start = env.now
                        if slowdown is not None:
                            yield from slowdown.run(rank, duration_s)
                        else:
                            yield env.timeout(duration_s)
                elif duration_s > 0:
                    if slowdown is not None:
                        slowdown.start(rank)
                    yield from self._communicate(rank, seg, duration_s, seg.latency_s / num_slices)
                    if slowdown is not None:
                        slowdown.end(rank)
                self.rows.append(
                    (rank, seg.stream, seg.kind, stage, microbatch, start, env.now,
                     seg.num_bytes / num_slices)
                )  # fmt: skip

    def _communicate(
        self, rank: int, seg: Segment, duration_s: float, latency_s: float
    ) -> _Process:
        """A communication segment of ``duration_s`` (sharing its link when it names one)."""
        links = self._links(rank, seg.link) if seg.link else ()
        if not links:
            yield self.env.timeout(duration_s)
            return
        yield from self._on_links(links, duration_s, latency_s)

    def _on_links(self, links: tuple[Link, ...], duration_s: float, latency_s: float) -> _Process:
        """A transfer over ``links``, sharing them (``plansim.sim.links``)."""
        transfer = self.network.start(links, duration_s=duration_s, latency_s=latency_s)
        while not transfer.finished:  # its end moves while it shares a link
            yield transfer.end_event

    def _segments(
        self, rank: int, segments: Sequence[Segment], stage: int, microbatch: int
    ) -> _Process:
        """Run segments back to back, recording each on its own stream; a segment with a
        link shares it with the rank's other transfers (``plansim.sim.links``)."""
        env = self.env
        for seg in segments:
            start = env.now
            if seg.duration_s > 0:
                links = self._links(rank, seg.link) if seg.link else ()
                if not links:
                    if self.slowdown is not None and seg.stream == tl.COMPUTE:
                        yield from self.slowdown.run(rank, seg.duration_s)
                    else:
                        yield env.timeout(seg.duration_s)
                else:
                    yield from self._on_links(links, seg.duration_s, seg.latency_s)
            self.rows.append(
                (rank, seg.stream, seg.kind, stage, microbatch, start, env.now, seg.num_bytes)
            )

    def _links(self, rank: int, tier: str) -> tuple[Link, ...]:
        return self.network.route(self.network.collective_links(rank, tier))

    def _add_memory(self, rank: int, delta_bytes: float) -> None:
        self.memory[rank] += delta_bytes
        self.memory_rows.append((rank, self.env.now, self.memory[rank]))
        self.peak[rank] = max(self.peak[rank], self.memory[rank])

    def _hand_over(self, rank: int, action: Action) -> simpy.Event | None:
        """Deliver what ``action`` produced to the neighbouring stage.

        Returns the event of a queued transfer's end (None when nothing was sent)."""
        key = provides(action)
        if key is None:
            return None
        signal, stage, _ = key
        graph = self.graph
        consumer = (
            graph.next_stage(stage) if signal is Signal.ACTIVATION else graph.previous_stage(stage)
        )
        if consumer is None:
            return None
        dst = self.work.rank_of_stage(consumer)
        if dst == rank:
            self._arrival(key).succeed()
            return None
        return self._transfer(rank, dst, key, consumer)

    def _transfer(self, src: int, dst: int, key: SignalKey, consumer: int) -> simpy.Event:
        """Queue one P2P transfer on the sender's pp_send stream; on its end, the arrival."""
        signal, stage, microbatch = key
        if signal is Signal.ACTIVATION:
            p2p: P2P = self.work.stages[stage].send_forward
            send_kind, recv_kind = _ACTIVATION_KINDS
        else:
            p2p = self.work.stages[stage].send_backward
            send_kind, recv_kind = _GRADIENT_KINDS
        arrival = self._arrival(key)

        slowdown = None if self.work.blocking_p2p else self.slowdown

        def done(start: float, end: float) -> None:
            nbytes = p2p.num_bytes
            self.rows.append((src, _PP_SEND, send_kind, stage, microbatch, start, end, nbytes))
            self.rows.append((dst, _PP_RECV, recv_kind, consumer, microbatch, start, end, nbytes))
            if slowdown is not None:
                slowdown.end(src, dst)
            arrival.succeed()

        links = self.network.route(self.network.p2p_links(src, dst, p2p.link)) if p2p.link else ()
        self.pp_send[src].put(
            p2p.duration_s,
            done,
            links=links,
            latency_s=p2p.latency_s,
            on_start=None if slowdown is None else partial(slowdown.start, src, dst),
        )
        return arrival

    def _queue_dp(self, rank: int, seg: Segment, stage: int) -> None:
        """Queue ``seg`` on the rank's FIFO ``dp`` stream; it becomes the rank's last dp item."""
        done = self.env.event()
        slowdown = self.slowdown

        def finished(start: float, end: float) -> None:
            row = (rank, seg.stream, seg.kind, stage, tl.NOT_TIED, start, end, seg.num_bytes)
            self.rows.append(row)
            if slowdown is not None:
                slowdown.end(rank)
            done.succeed()

        links = self._links(rank, seg.link) if seg.link else ()
        gate = self.gates.get(seg.kind)
        self.dp[rank].put(
            seg.duration_s,
            finished,
            links=links,
            latency_s=seg.latency_s,
            gate=gate,
            on_start=None if slowdown is None else partial(slowdown.start, rank),
        )
        self.dp_last[rank] = done

    def _release_buckets(
        self, rank: int, stage: int, segments: Sequence[Segment]
    ) -> Callable[[], None]:
        """Queue ``stage``'s gradient buckets as its last backward action (starting now,
        running ``segments``) produces them; returns what releases the rest at its end.

        Bucket k is released ``ready_fraction`` x the action's duration after its start,
        together with any earlier bucket still held, so the dp queue keeps bucket order.
        """
        buckets = self.work.stages[stage].grad_buckets
        released = [0]

        def release_upto(last: int, _event: object = None) -> None:
            while released[0] <= last:
                self._queue_dp(rank, buckets[released[0]].segment, stage)
                released[0] += 1

        duration_s = sum(seg.duration_s for seg in segments)
        for k, bucket in enumerate(buckets):
            fraction = bucket.ready_fraction
            next_fraction = buckets[k + 1].ready_fraction if k + 1 < len(buckets) else None
            if fraction < 1.0 and fraction != next_fraction:  # one timeout per ready time
                timeout = self.env.timeout(fraction * duration_s)
                timeout.callbacks.append(partial(release_upto, k))
        return partial(release_upto, len(buckets) - 1)

    def _tail(self, rank: int) -> _Process:
        """Once-per-step work after the rank's last action: the rest of the gradient
        reduction on the dp stream, then the optimizer once the dp stream has carried it."""
        rank_work = self.work.ranks[rank]
        if not self.work.overlap_grad_reduce:
            for stage in self.last_backward[rank].values():  # in order of their last backward
                for bucket in self.work.stages[stage].grad_buckets:
                    self._queue_dp(rank, bucket.segment, stage)
        for seg in rank_work.grad_sync:
            self._queue_dp(rank, seg, tl.NOT_TIED)
        last = self.dp_last[rank]
        if last is not None and not last.processed:
            yield last
        no = tl.NOT_TIED
        yield from self._segments(rank, rank_work.optimizer, no, no)

    def raise_if_stuck(self) -> None:
        """ScheduleError with the grid when some rank did not get through its actions."""
        if all(self.finished):
            return
        num_stages, num_ranks = self.work.num_stages, self.work.num_ranks
        stuck = [
            (rank, self.position[rank])
            for rank in range(num_ranks)
            if self.position[rank] < len(self.actions[rank])
        ]
        waits = "; ".join(
            describe_wait(
                self.actions[r][i], r, num_ranks=num_ranks, num_stages=num_stages, graph=self.graph
            )
            for r, i in stuck
        )
        table = format_grid(self.actions, flagged=stuck)
        raise ScheduleError(
            f"simulation stopped at t={self.env.now:.6g} s with actions left: {waits}\n\n"
            f"Pipeline schedule (step x rank, stuck actions in brackets):\n{table}"
        )


def _last_backwards(
    actions: PerRankActions, work: PipelineWork
) -> list[dict[tuple[int, int], int]]:
    """Per rank: {(list index of the stage's last B/W action, stage): stage} for stages with
    grad buckets, in list order (``check_structure`` keeps each stage's actions on its own
    rank; an overlapped item holds at most one backward)."""
    out = []
    for rank_actions in actions:
        last: dict[int, int] = {}
        for index, item in enumerate(rank_actions):
            for action in parts(item):
                if action.kind in _FREES and work.stages[action.stage].grad_buckets:
                    last[action.stage] = index
        ordered = sorted(last.items(), key=lambda x: x[1])
        out.append({(index, stage): stage for stage, index in ordered})
    return out


def simulate(actions: PerRankActions, work: PipelineWork) -> SimResult:
    """Simulate one optimizer step of one pipeline replica.

    Args:
        actions: per-rank action lists (``plansim.schedule.builders.build_actions``).
        work: seconds and bytes of every segment, transfer and activation.

    Returns:
        The timeline, memory samples and the figures read from them.

    Raises:
        ScheduleError: rank count mismatch, a broken invariant (missing or misplaced
            action, see ``check_structure``), or a dependency never met (deadlock).
    """
    if len(actions) != work.num_ranks:
        raise ScheduleError(
            f"{len(actions)} ranks of actions for a pipeline of {work.num_ranks} ranks"
        )
    check_structure(
        actions,
        num_stages=work.num_stages,
        num_microbatches=work.num_microbatches,
        placement=work.placement,
    )
    run = _Run(actions, work)
    run.run()
    run.raise_if_stuck()
    return summarise(
        run.rows,
        run.memory_rows,
        peak=run.peak,
        num_ranks=run.work.num_ranks,
        num_microbatches=work.num_microbatches,
    )
