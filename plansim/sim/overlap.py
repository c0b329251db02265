"""Compute slowed by communication overlapping it on the same GPU (thin over SimPy).

While a rank has communication in flight beside its compute (asynchronous pipeline sends and
receives with ``overlap_p2p_comm``, gradient buckets with ``overlap_grad_reduce``), the
communication kernels take SMs and HBM bandwidth from the compute kernels, which then run
``1 + s`` times longer, s = ``PipelineWork.overlap_slowdown`` (the profile's
``overlap_compute_slowdown_fraction``; Lee et al. 2025, arXiv:2507.03114, measured compute
18.9% slower on average while overlapped with communication). The communication keeps its
own duration (what was measured is the compute's slowdown).

A compute segment is a fluid: it progresses at rate 1 alone and 1 / (1 + s) while its rank
has communication in flight, and its end is re-timed whenever that changes (at the change,
from the transfer's own start or end callback: a new end timer, the earlier one left stale
by a generation count, so a segment costs one timer and one event instead of a SimPy
``AnyOf`` condition per segment; outputs identical, simulation about 1.5x faster with
overlap on). A segment that never overlaps ends exactly ``duration_s`` after it started (one
timeout, the same float as a plain delay). Blocking communication (TP collectives,
synchronous pipeline sends, ZeRO-3 gathers that hold the compute stream) never runs beside
compute and is not counted here; ZeRO-3's prefetched gathers are priced analytically
(``plansim.analytic.zero3``).

Limit: a bucket's release time (``ready_fraction`` of its backward action) is taken on the
action's unslowed duration.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy


class _Fluid:
    """The compute segment a rank is running: what is left of it (seconds at rate 1), since
    when, at what rate, the event its process waits on, and the generation of its end timer
    (a re-timed segment's earlier timers are stale and do nothing)."""

    __slots__ = ("done", "generation", "rate", "remaining", "started")

    def __init__(self, remaining: float, started: float, rate: float, done: simpy.Event) -> None:
        self.remaining = remaining
        self.started = started
        self.rate = rate
        self.done = done
        self.generation = 0


class ComputeSlowdown:
    """Per-rank count of overlapping transfers and the fluid compute that they slow."""

    __slots__ = ("_busy", "_env", "_fluid", "_slow")

    def __init__(self, env: simpy.Environment, num_ranks: int, slowdown: float) -> None:
        self._env = env
        self._slow = 1.0 + slowdown
        self._busy = [0] * num_ranks
        self._fluid: list[_Fluid | None] = [None] * num_ranks

    def start(self, *ranks: int) -> None:
        """A transfer involving ``ranks`` began."""
        for rank in ranks:
            self._delta(rank, 1)

    def end(self, *ranks: int) -> None:
        """A transfer involving ``ranks`` ended."""
        for rank in ranks:
            self._delta(rank, -1)

    def _delta(self, rank: int, delta: int) -> None:
        before = self._busy[rank]
        self._busy[rank] = before + delta
        fluid = self._fluid[rank]
        if fluid is not None and (before == 0) != (self._busy[rank] == 0):
            now = self._env.now
            fluid.remaining -= (now - fluid.started) * fluid.rate
            fluid.started = now
            fluid.rate = self._rate(rank)
            fluid.generation += 1
            self._time_end(rank, fluid)

    def _rate(self, rank: int) -> float:
        return 1.0 / self._slow if self._busy[rank] else 1.0

    def _time_end(self, rank: int, fluid: _Fluid) -> None:
        """Schedule the segment's end at its current rate; a later re-timing makes it stale.
        At its end the segment stops being the rank's (later changes no longer touch it)."""
        generation = fluid.generation
        timer = self._env.timeout(fluid.remaining / fluid.rate)

        def end(_event: simpy.Event) -> None:
            if fluid.generation == generation and self._fluid[rank] is fluid:
                self._fluid[rank] = None
                fluid.done.succeed()

        timer.callbacks.append(end)

    def run(self, rank: int, duration_s: float) -> Generator[simpy.Event, Any, None]:
        """Compute of ``duration_s`` seconds alone on ``rank``, slowed while it overlaps."""
        if duration_s <= 0.0:
            return
        fluid = _Fluid(duration_s, self._env.now, self._rate(rank), self._env.event())
        self._fluid[rank] = fluid
        self._time_end(rank, fluid)
        yield fluid.done
