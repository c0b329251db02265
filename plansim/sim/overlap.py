"""Compute slowed by communication overlapping it on the same GPU (thin over SimPy).

While a rank has communication in flight beside its compute (asynchronous pipeline sends and
receives with ``overlap_p2p_comm``, gradient buckets with ``overlap_grad_reduce``), the
communication kernels take SMs and HBM bandwidth from the compute kernels, which then run
``1 + s`` times longer, s = ``PipelineWork.overlap_slowdown`` (the profile's
``overlap_compute_slowdown_fraction``; Lee et al. 2025, arXiv:2507.03114, measured compute
18.9% slower on average while overlapped with communication). The communication keeps its
own duration (what was measured is the compute's slowdown).

A compute segment is a fluid: it progresses at rate 1 alone and 1 / (1 + s) while its rank
has communication in flight, and its end is re-timed whenever that changes. A segment that
never overlaps ends exactly ``duration_s`` after it started (one timeout, the same float as
a plain delay). Blocking communication (TP collectives, synchronous pipeline sends, ZeRO-3
gathers that hold the compute stream) never runs beside compute and is not counted here;
ZeRO-3's prefetched gathers are priced analytically (``plansim.analytic.zero3``).

Limit: a bucket's release time (``ready_fraction`` of its backward action) is taken on the
action's unslowed duration.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy


class ComputeSlowdown:
    """Per-rank count of overlapping transfers and the fluid compute that they slow."""

    __slots__ = ("_busy", "_changed", "_env", "_slow")

    def __init__(self, env: simpy.Environment, num_ranks: int, slowdown: float) -> None:
        self._env = env
        self._slow = 1.0 + slowdown
        self._busy = [0] * num_ranks
        self._changed = [env.event() for _ in range(num_ranks)]

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
        if (before == 0) != (self._busy[rank] == 0):
            changed = self._changed[rank]
            self._changed[rank] = self._env.event()
            changed.succeed()

    def run(self, rank: int, duration_s: float) -> Generator[simpy.Event, Any, None]:
        """Compute of ``duration_s`` seconds alone on ``rank``, slowed while it overlaps."""
        env = self._env
        remaining = duration_s
        while remaining > 0.0:
            rate = 1.0 / self._slow if self._busy[rank] else 1.0
            started = env.now
            finish = env.timeout(remaining / rate)
            yield env.any_of((finish, self._changed[rank]))
            if finish.processed:
                return
            remaining -= (env.now - started) * rate
