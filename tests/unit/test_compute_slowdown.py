"""The fluid compute of plansim.sim.overlap: exact end times on round numbers, including a
transfer that starts or ends at the very instant a compute segment ends."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
import simpy

from plansim.sim.overlap import ComputeSlowdown


def _run(duration_s: float, changes: list[tuple[float, str]], slowdown: float = 1.0) -> float:
    """End time of one compute segment on rank 0 started at 0, with transfers starting
    ("start") or ending ("end") on rank 0 at the given times (slowdown 1: half speed)."""
    env = simpy.Environment()
    fluid = ComputeSlowdown(env, 1, slowdown)
    ended: list[float] = []

    def compute() -> Generator[simpy.Event, Any, None]:
        yield from fluid.run(0, duration_s)
        ended.append(env.now)

    def transfers() -> Generator[simpy.Event, Any, None]:
        for at, what in changes:
            yield env.timeout(at - env.now)
            (fluid.start if what == "start" else fluid.end)(0)

    env.process(compute())
    env.process(transfers())
    env.run()
    assert len(ended) == 1
    return ended[0]


def test_alone_it_takes_its_duration() -> None:
    assert _run(1.0, []) == 1.0


def test_overlapped_it_runs_at_half_speed_and_recovers() -> None:
    # 0.5 s alone, then half speed: 0.5 s of work left takes 1.0 s -> ends at 1.5
    assert _run(1.0, [(0.5, "start")]) == pytest.approx(1.5)
    # half speed from 0.5 to 1.0 does 0.25; the last 0.25 alone -> ends at 1.25
    assert _run(1.0, [(0.5, "start"), (1.0, "end")]) == pytest.approx(1.25)


@pytest.mark.parametrize("at", [1.0, 2.0])
def test_a_change_at_the_instant_it_ends_neither_moves_nor_repeats_the_end(at: float) -> None:
    # busy from 0: ends at 2.0 (half speed); alone: ends at 1.0; a change at that instant
    # (the transfer ending, or another starting) must not end the segment a second time
    busy = [(0.0, "start")] if at == 2.0 else []
    assert _run(1.0, [*busy, (at, "end" if busy else "start")]) == pytest.approx(at)
