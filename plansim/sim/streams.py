"""FIFO streams (one transfer at a time) and the rendezvous of a collective across streams.

A :class:`FifoStream` carries a rank's queued transfers in order (pipeline sends, the dp
stream); a gate (:func:`rendezvous_gate`) makes one transfer wait until every side of the same
collective has reached it on its own stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

import simpy

from plansim.sim.links import Done, Link, Network
from plansim.specs.work import RENDEZVOUS_KINDS, PipelineWork

#: ``gate(proceed)``: calls ``proceed()`` when the transfer may start (see ``FifoStream.put``).
Gate = Callable[[Callable[[], None]], None]


def rendezvous_gate(sides: int) -> Gate:
    """A gate for one collective of ``sides`` streams: every side proceeds, at the same
    simulated time, once the last one has arrived."""
    waiting: list[Callable[[], None]] = []

    def arrive(proceed: Callable[[], None]) -> None:
        waiting.append(proceed)
        if len(waiting) == sides:
            for go in waiting:
                go()

    return arrive


def rendezvous_gates(work: PipelineWork) -> dict[str, Gate]:
    """Per kind of ``RENDEZVOUS_KINDS`` carried by two or more ranks' ``grad_sync``: a gate
    that lets every side start once all of them have arrived (one collective per step)."""
    gates: dict[str, Gate] = {}
    for kind in RENDEZVOUS_KINDS:
        sides = sum(1 for rank in work.ranks for seg in rank.grad_sync if seg.kind == kind)
        if sides > 1:
            gates[kind] = rendezvous_gate(sides)
    return gates


class FifoStream:
    """A stream that carries one transfer at a time, first come first served.

    Gives the start and end times of ``simpy.Resource(capacity=1)`` with one process per
    transfer that requests, holds for its duration and releases (a transfer starts when it
    is queued, or exactly when the previous one ends), but costs one Timeout per transfer
    instead of a process, a request and a release (measured: simulate() about 40% faster
    at p=16, m=256). A transfer with links goes through the :class:`Network` once it
    starts, so it may take longer than its duration when it shares a link.
    """

    __slots__ = ("_busy", "_env", "_network", "_queue")

    def __init__(self, env: simpy.Environment, network: Network) -> None:
        self._env = env
        self._network = network
        self._queue: deque[
            tuple[float, float, tuple[Link, ...], Done, Gate | None, Callable[[], None] | None]
        ] = deque()
        self._busy = False

    def put(
        self,
        duration_s: float,
        on_done: Done,
        *,
        links: tuple[Link, ...] = (),
        latency_s: float = 0.0,
        gate: Gate | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """Queue a transfer of ``duration_s`` alone over ``links`` (none: a plain delay);
        ``on_done(start_s, end_s)`` runs at its end.

        ``gate``: the transfer is one side of a collective with other streams. When it
        reaches the head of this stream, ``gate(proceed)`` is called; the stream stays busy
        until the gate calls ``proceed()`` (once every side has arrived), and ``start_s`` is
        the arrival: the time the rank waited for its peers counts as the collective's, as
        a blocking collective's call does.

        ``on_start()`` runs when the transfer starts moving (after the gate, if any).
        """
        self._queue.append((duration_s, latency_s, links, on_done, gate, on_start))
        if not self._busy:
            self._start_next()

    def _start_next(self) -> None:
        duration_s, latency_s, links, on_done, gate, on_start = self._queue.popleft()
        self._busy = True
        run = partial(self._run, duration_s, latency_s, links, on_done, self._env.now, on_start)
        if gate is None:
            run()
        else:
            gate(run)

    def _run(
        self,
        duration_s: float,
        latency_s: float,
        links: tuple[Link, ...],
        on_done: Done,
        arrived_s: float,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        if on_start is not None:
            on_start()
        if links:
            finish = partial(self._finish_linked, on_done, arrived_s)
            self._network.start(links, duration_s=duration_s, latency_s=latency_s, on_done=finish)
            return
        timeout = self._env.timeout(duration_s)
        timeout.callbacks.append(lambda _event: self._finish(arrived_s, on_done))

    def _finish_linked(self, on_done: Done, arrived_s: float, _start: float, _end: float) -> None:
        self._finish(arrived_s, on_done)

    def _finish(self, start: float, on_done: Done) -> None:
        self._busy = False
        on_done(start, self._env.now)
        if self._queue:
            self._start_next()
