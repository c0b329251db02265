"""``plansim calibrate`` measures ``sustained_matmul_fraction`` (and, with enough ranks,
``gpu_matmul_spread_fraction``): the GPU plan's item, the terms from raw rows (worked by
hand), the merge into a profile, and the bench on this machine's CPU (a short soak; nothing
is launched: the collectives are stand-ins).

Worked oracle: a GEMM call takes 1.00 ms in the burst and 1.25 ms at the end of the soak:
the rank keeps 1.00 / 1.25 = 0.8 of its burst rate.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd
import pytest
import torch

from plansim.calibrate import bench_sustained
from plansim.calibrate.build import build_update
from plansim.calibrate.build_terms import sustained_term
from plansim.calibrate.plan import QUICK, SUSTAINED_SOAK_S, Item, build_plan, sustained_item
from plansim.calibrate.raw import frame
from plansim.calibrate.run_info import RunInfo
from plansim.io.profiles import load_profile, merge_profile

SHAPE = "8192x8192x8192x15000"
RUN = "20250101T000000.000Z"


def _row(op: str, rank: int, time_s: float, *, status: str = "ok") -> dict[str, Any]:
    return {
        "kind": "sustained",
        "op": op,
        "dtype": "bf16",
        "shape": SHAPE,
        "group_size": 8,
        "sweep": 0,
        "work": 2.0 * 8192**3,
        "work_unit": "flop",
        "rank": rank,
        "status": status,
        "reps": 1 if status == "ok" else 0,
        "inner": 10 if status == "ok" else 0,
        "median_s": time_s,
        "min_s": time_s,
        "max_s": time_s,
        "cpu_share": math.nan,
        "note": "",
    }


def _rows(burst_s: dict[int, float], soak_s: dict[int, float]) -> pd.DataFrame:
    rows = [_row("gemm_burst", r, t) for r, t in burst_s.items()]
    rows += [_row("gemm_sustained", r, t) for r, t in soak_s.items()]
    return frame(rows, run_id=RUN)


def _info() -> RunInfo:
    return RunInfo(
        run_id=RUN,
        date="2025-01-01",
        backend="nccl",
        device="cuda",
        nproc=8,
        quick=True,
        raw_file="x.raw.csv",
        env={"torch": "2.13.0", "device_name": "Test GPU", "cpu_count": "16"},
    )


@pytest.mark.parametrize("quick", [True, False])
def test_only_gpu_plans_have_one_sustained_item_over_every_rank(quick: bool) -> None:
    gpu = [
        i for i in build_plan(nproc=8, device="cuda", quick=quick).items if i.kind == "sustained"
    ]
    soak_ms = round(1000 * SUSTAINED_SOAK_S[0 if quick else 1])
    assert [(i.op, i.dtype, i.shape, i.group_size) for i in gpu] == [
        ("gemm_sustained", "bf16", (8192, 8192, 8192, soak_ms), 8)
    ]
    assert gpu[0].work == 2.0 * 8192**3 and gpu[0].work_unit == "flop"
    cpu = build_plan(nproc=2, device="cpu", quick=quick).items
    assert not [i for i in cpu if i.kind == "sustained"]


def test_fraction_worked_by_hand_and_no_spread_from_two_ranks() -> None:
    # rank 0: 1.00 / 1.25 = 0.8; rank 1: 1.00 / 1.20 = 0.8333; median 0.81667
    terms = sustained_term(_rows({0: 1e-3, 1: 1e-3}, {0: 1.25e-3, 1: 1.2e-3}), source="measured: t")
    assert terms.scalars == {"sustained_matmul_fraction": pytest.approx((0.8 + 1 / 1.2) / 2)}
    text = terms.provenance["sustained_matmul_fraction"]
    assert text.startswith("measured: t; bf16 GEMM 8192x8192x8192x15000 ") and "2 ranks" in text
    assert "gpu_matmul_spread_fraction" not in terms.scalars  # two ranks: too few


def test_spread_is_the_sample_sigma_of_the_ranks_sustained_rates_over_their_median() -> None:
    soak = {0: 1.00e-3, 1: 1.02e-3, 2: 1.04e-3, 3: 1.10e-3}
    terms = sustained_term(_rows(dict.fromkeys(soak, 0.9e-3), soak), source="s")
    rates = [1 / t for t in soak.values()]
    want = statistics.stdev(rates) / statistics.median(rates)
    assert terms.scalars["gpu_matmul_spread_fraction"] == pytest.approx(want)
    assert terms.scalars["sustained_matmul_fraction"] == pytest.approx(
        statistics.median(0.9e-3 / t for t in soak.values())
    )


def test_a_soak_faster_than_its_burst_is_clipped_to_one_and_failures_give_nothing() -> None:
    terms = sustained_term(_rows({0: 1.1e-3}, {0: 1.0e-3}), source="s")
    assert terms.scalars["sustained_matmul_fraction"] == 1.0
    assert "measured 1.1, clipped" in terms.provenance["sustained_matmul_fraction"]
    failed = frame([_row("gemm_sustained", 0, math.nan, status="unsupported")], run_id=RUN)
    assert sustained_term(failed, source="s").scalars == {}


def test_build_update_merges_both_keys_into_a_gpu_profile() -> None:
    soak = {r: 1.2e-3 + 0.01e-3 * r for r in range(8)}
    built = build_update(_rows(dict.fromkeys(soak, 1e-3), soak), _info(), base=None, name="x")
    assert set(built.update.scalars) == {"sustained_matmul_fraction", "gpu_matmul_spread_fraction"}
    merged = merge_profile(load_profile("h200-sxm-141gb"), built.update)
    assert merged.sustained_matmul_fraction == built.update.scalars["sustained_matmul_fraction"]
    assert merged.provenance["gpu_matmul_spread_fraction"].startswith("measured: Test GPU")


class _OneRank:
    """A stand-in for ``torch.distributed`` with one rank: a barrier waits for nobody."""

    @staticmethod
    def barrier() -> None:
        return None


def _one_rank(
    item: Item, *, timer: Any, row: Any, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    """``sustained_rows`` on one CPU rank (the collectives are identities)."""
    monkeypatch.setattr(bench_sustained, "dist", _OneRank)
    return bench_sustained.sustained_rows(
        item,
        device=torch.device("cpu"),
        timing=QUICK,
        timer=timer,
        agree_max=lambda v: v,
        row=row,
        note=lambda it, status, text: [{"op": it.op, "status": status, "note": text}],
    )


class _Clock:
    """A stand-in for ``time``: sleeping and timing advance a virtual clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_bench_times_a_burst_then_keeps_the_last_quarter_of_the_soak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device that slows from 1 ms per call to 1.25 ms over the soak (its power limit):
    the burst row has the fast time, the sustained row the last quarter's slow windows."""
    clock = _Clock()
    monkeypatch.setattr(bench_sustained, "time", clock)
    calls: list[int] = []

    def timer(fn: Any, inner: int) -> float:
        fn()  # the real GEMM runs (a tiny one), the time is the stand-in device's
        calls.append(inner)
        per_call = 1e-3 if clock.now < 2.0 else 1.25e-3
        clock.now += inner * per_call
        return per_call

    item = Item(
        kind="sustained",
        op="gemm_sustained",
        dtype="fp32",
        shape=(16, 16, 16, 4000),
        group_size=1,
        work=2.0 * 16**3,
        work_unit="flop",
    )

    def row(it: Item, samples: list[float], inner: int, share: float) -> dict[str, Any]:
        return {"op": it.op, "samples": samples, "inner": inner}

    rows = _one_rank(item, timer=timer, row=row, monkeypatch=monkeypatch)
    burst, soak = rows
    assert burst["op"] == "gemm_burst" and burst["samples"] == [1e-3]
    assert soak["op"] == "gemm_sustained" and set(soak["samples"]) == {1.25e-3}
    assert "every rank at once" in soak["note"]
    assert clock.now >= bench_sustained.IDLE_S + 4.0  # slept, then soaked the item's 4 s


def test_sustained_item_on_this_machine_runs_and_its_rows_build_a_term(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real thing on a CPU, with a short soak: a burst row and window rows, positive."""
    item = sustained_item("cpu", nproc=1, soak_s=0.3)
    collected: list[dict[str, Any]] = []

    def timer(fn: Any, inner: int) -> float:
        import time

        begin = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - begin) / inner

    def row(it: Item, samples: list[float], inner: int, share: float) -> dict[str, Any]:
        out = _row(it.op, 0, statistics.median(samples))
        out.update(dtype=it.dtype, shape=it.shape_text, group_size=1, work=it.work)
        collected.append(out)
        return out

    rows = _one_rank(item, timer=timer, row=row, monkeypatch=monkeypatch)
    assert [r["op"] for r in rows] == ["gemm_burst", "gemm_sustained"]
    assert all(r["median_s"] > 0 for r in rows)
    terms = sustained_term(frame(collected, run_id=RUN), source="s")
    assert 0 < terms.scalars["sustained_matmul_fraction"] <= 1
