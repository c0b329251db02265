"""A shape's first call pays one-time costs (kernel module loading, cuBLAS heuristics): it
must not cut the rest of its family from the calibration (seen on an H100: every fp32 and
fp16 GEMM above 0.8 GFLOP was skipped after one slow first call)."""

from __future__ import annotations

import dataclasses
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from plansim.calibrate.bench import _Bench  # noqa: E402
from plansim.calibrate.plan import Item, Plan  # noqa: E402
from plansim.calibrate.timing import QUICK  # noqa: E402


@pytest.fixture
def one_rank_group():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _gemm(m: int) -> Item:
    return Item(
        kind="gemm", op="qkv", dtype="fp32", shape=(m, m, m), work=2.0 * m**3, work_unit="flop"
    )


def _bench(timing, monkeypatch, first_call_s: float, later_call_s: float) -> _Bench:
    small, large = _gemm(64), _gemm(128)
    plan = Plan(items=(small, large), timing=timing, group_sizes=(), quick=True)
    bench = _Bench(rank=0, world=1, device=torch.device("cpu"), plan=plan)
    bench.cold.flush_bytes = 1 << 16  # the flush is not what is under test

    def build(item: Item):
        calls = {"n": 0}

        def call() -> None:
            calls["n"] += 1
            time.sleep(first_call_s if calls["n"] == 1 else later_call_s)

        return call

    monkeypatch.setattr(bench, "_build", build)
    return bench


def test_a_slow_first_call_does_not_skip_the_larger_shapes(one_rank_group, monkeypatch):
    timing = dataclasses.replace(QUICK, max_call_s=0.05, target_s=0.003)
    bench = _bench(timing, monkeypatch, first_call_s=0.2, later_call_s=0.001)
    rows = bench.measure(_gemm(64)) + bench.measure(_gemm(128))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert bench.too_slow == {}
    assert all(r["median_s"] < 0.05 for r in rows)


def test_a_call_slow_every_time_still_skips_the_larger_shapes(one_rank_group, monkeypatch):
    timing = dataclasses.replace(QUICK, max_call_s=0.01, target_s=0.02)
    bench = _bench(timing, monkeypatch, first_call_s=0.02, later_call_s=0.02)
    first = bench.measure(_gemm(64))
    assert first[0]["status"] == "ok"
    skipped = bench.measure(_gemm(128))
    assert skipped[0]["status"] == "skipped"
    assert "took over 0.01 s" in skipped[0]["note"]
