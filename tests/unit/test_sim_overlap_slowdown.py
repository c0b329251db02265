"""The engine slows compute while a rank's asynchronous communication is in flight.

Hand-worked on test_overlap's one-rank case: actions 0F0 0B0 0F1 0B1, forward 1 ms, backward
2 ms, optimizer 0.5 ms, so F0 [0, 1], B0 [1, 3], F1 [3, 4], B1 [4, 6]. Slowdown s = 0.25:
overlapped compute runs at 1 / 1.25 = 0.8 of its speed. Times in milliseconds.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from plansim.errors import SpecError
from plansim.sim import simulate
from tests.unit.test_overlap import MS, ONE_RANK, acts, bucket, optimizer_ms, rows, stage, work


def test_bucket_beside_the_last_backward_slows_it() -> None:
    # The bucket is ready halfway through B1, at 5, and runs [5, 5.5]. B1 did 1 ms of its 2 by
    # 5; during [5, 5.5] it does 0.5 * 0.8 = 0.4 ms; the last 0.6 ms alone: B1 ends at 6.1.
    slowed = replace(work((stage(bucket(0.5, 0.5)),), overlap=True), overlap_slowdown=0.25)
    result = simulate(ONE_RANK, slowed)
    b1 = [r for r in rows(result, "compute") if r[0] == "backward"][-1]
    assert b1[2:] == pytest.approx((4.0, 6.1))
    assert optimizer_ms(result) == pytest.approx((6.1, 6.6))
    assert rows(result, "dp") == [pytest.approx(("dp_comm", 0, 5.0, 5.5))]  # type: ignore[comparison-overlap]


def test_a_bucket_outlasting_the_compute_still_ends_on_time() -> None:
    # Bucket [5, 8]: B1's last 1 ms runs at 0.8 for 1.25 ms, ending at 6.25; the optimizer
    # waits for the bucket anyway: [8, 8.5], as without slowdown.
    slowed = replace(work((stage(bucket(3.0, 0.5)),), overlap=True), overlap_slowdown=0.25)
    result = simulate(ONE_RANK, slowed)
    b1 = [r for r in rows(result, "compute") if r[0] == "backward"][-1]
    assert b1[3] == pytest.approx(6.25)
    assert optimizer_ms(result) == pytest.approx((8.0, 8.5))


def test_no_overlap_no_slowdown_bit_identical() -> None:
    base = work((stage(bucket(0.5, 0.5)),), overlap=False)  # the bucket runs after B1
    a = simulate(ONE_RANK, base)
    b = simulate(ONE_RANK, replace(base, overlap_slowdown=0.25))
    assert a.step_time_s == b.step_time_s == pytest.approx(7.0 * MS)
    overlapped = work((stage(bucket(0.5, 0.5)),), overlap=True)
    assert simulate(ONE_RANK, overlapped).step_time_s == pytest.approx(6.5 * MS, abs=1e-15)


def test_asynchronous_pipeline_sends_slow_compute_at_both_ends() -> None:
    # GPipe on two ranks, two micro-batches, 1 ms sends beside compute (not blocking).
    # Alone: r0 F0 [0, 1] F1 [1, 2]; sends [1, 2] [2, 3]; r1 F0 [2, 3] F1 [3, 4] B0 [4, 6]
    # B1 [6, 8]; sends back [6, 7] [8, 9]; r0 B0 [7, 9] B1 [9, 11]; optimizer [11, 11.5].
    # Slowed: r0's F1 overlaps the F0 send: 0.8 in [1, 2], 0.2 alone: ends 2.2, its send
    # [2.2, 3.2]; r1's F0 [2, 3.2] (receiving from 2.2: 0.2 + 1.0 x 0.8); F1 [3.2, 4.2];
    # B0 [4.2, 6.2]; B1 beside the B0 send [6.2, 7.2]: 0.8, then 1.2 alone: ends 8.4; r0's
    # B0 [7.2, 9.4] (receiving B1 from 8.4: 1.2 + 1.0 x 0.8); B1 [9.4, 11.4]; optimizer
    # [11.4, 11.9]; r1's optimizer runs beside its last send: [8.4, 9.025].
    gpipe = acts("0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1")
    base = work(
        (stage(p2p_ms=1.0), stage(p2p_ms=1.0)), overlap=False, num_ranks=2, num_microbatches=2
    )
    assert not base.blocking_p2p
    assert simulate(gpipe, base).step_time_s == pytest.approx(11.5 * MS)
    result = simulate(gpipe, replace(base, overlap_slowdown=0.25))
    compute = [(r, k, st, round(a, 9), round(b, 9)) for (k, st, a, b), r in _ranked(result)]
    assert compute == [
        (0, "forward", 0, 0.0, 1.0),
        (0, "forward", 0, 1.0, 2.2),
        (0, "backward", 0, 7.2, 9.4),
        (0, "backward", 0, 9.4, 11.4),
        (0, "optimizer", -1, 11.4, 11.9),
        (1, "forward", 1, 2.0, 3.2),
        (1, "forward", 1, 3.2, 4.2),
        (1, "backward", 1, 4.2, 6.2),
        (1, "backward", 1, 6.2, 8.4),
        (1, "optimizer", -1, 8.4, 9.025),  # beside the B1 send [8.4, 9.4]: 0.5 / 0.8
    ]
    assert result.step_time_s == pytest.approx(11.9 * MS)
    # blocking sends never run beside compute: no slowdown
    blocking = replace(base, blocking_p2p=True)
    assert simulate(gpipe, replace(blocking, overlap_slowdown=0.25)).step_time_s == (
        simulate(gpipe, blocking).step_time_s
    )


def _ranked(result):  # type: ignore[no-untyped-def]
    df = result.timeline[result.timeline["stream"] == "compute"].sort_values(["rank", "start_s"])
    return [
        ((k, st, a / MS, b / MS), r)
        for r, k, st, a, b in zip(
            df["rank"], df["kind"], df["stage"], df["start_s"], df["end_s"], strict=True
        )
    ]


def test_overlap_slowdown_is_checked() -> None:
    with pytest.raises(SpecError, match="overlap_slowdown"):
        replace(work((stage(),), overlap=True), overlap_slowdown=1.0)
