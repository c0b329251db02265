"""Compute slowed by communication beside it (profile ``overlap_compute_slowdown_fraction``).

Oracles by hand with s = 0.25 (compute 25% slower while overlapped, so 1 / 1.25 = 0.8 of its
speed): g = 10 ms of gather beside c = 12 ms of layer compute.
"""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.zero3 import exposed_backward_s, exposed_gather_s, overlapped_excess_s
from plansim.catalog import resolve_model
from plansim.errors import InputFileError, SpecError
from plansim.io.profile_parse import profile_from_dict
from plansim.io.profiles import load_profile, profile_to_dict
from plansim.planner.evaluate import evaluate
from plansim.specs.plan import plan_from_fields
from tests.unit.synthetic import profile_dict_provenance_keys, round_profile


def test_excess_of_one_overlapped_layer() -> None:
    # 10 ms of gather: compute does 8 ms of its 12 during it, then 4 ms alone: 14 ms, +2 ms
    assert overlapped_excess_s(10e-3, 12e-3, 0.25) == pytest.approx(2e-3)
    # compute 7 ms (8.75 ms slowed) fits in the gather: the layer takes the 10 ms of gather
    assert overlapped_excess_s(10e-3, 7e-3, 0.25) == pytest.approx(3e-3)
    # without slowdown: max(0, g - c)
    assert overlapped_excess_s(10e-3, 12e-3, 0.0) == 0.0
    assert overlapped_excess_s(10e-3, 7e-3, 0.0) == pytest.approx(3e-3)
    assert overlapped_excess_s(0.0, 7e-3, 0.25) == 0.0


def test_prefetched_layers_pay_the_slowdown_on_every_overlapped_layer() -> None:
    # 4 layers: first gather exposed (10 ms), then 3 overlapped layers at +2 ms each
    got = exposed_gather_s(4, gather_s=10e-3, compute_s=12e-3, slowdown=0.25)
    assert got == pytest.approx(10e-3 + 3 * 2e-3)
    assert exposed_gather_s(4, gather_s=10e-3, compute_s=12e-3) == pytest.approx(10e-3)
    # backward: g + r = 10 + 4 ms beside 20 ms of compute: excess 14 * 0.2 = 2.8 ms
    got = exposed_backward_s(3, gather_s=10e-3, scatter_s=4e-3, compute_s=20e-3, slowdown=0.25)
    assert got == pytest.approx(10e-3 + 2 * 2.8e-3 + 4e-3)


def _dict_with(value: object) -> dict:  # type: ignore[type-arg]
    data = profile_to_dict(round_profile())
    data["overlap_compute_slowdown_fraction"] = value
    data["provenance"] = {
        **{k: "synthetic" for k in profile_dict_provenance_keys(data)},
        "overlap_compute_slowdown_fraction": "measured: test",
    }
    return data


def test_profile_key_round_trips_and_is_checked() -> None:
    profile = profile_from_dict(_dict_with(0.189), source="t.yaml")
    assert profile.overlap_compute_slowdown_fraction == 0.189
    assert profile_to_dict(profile)["overlap_compute_slowdown_fraction"] == 0.189
    with pytest.raises(InputFileError, match=r"t\.yaml.*overlap_compute_slowdown_fraction"):
        profile_from_dict(_dict_with(1.5), source="t.yaml")
    with pytest.raises(SpecError, match="overlap_compute_slowdown_fraction"):
        dataclasses.replace(round_profile(), overlap_compute_slowdown_fraction=-0.1)
    # absent: 0, and not written back
    assert "overlap_compute_slowdown_fraction" not in profile_to_dict(round_profile())
    measured = load_profile("cpu-2core-gloo")  # plansim calibrate measured it there
    assert 0 < measured.overlap_compute_slowdown_fraction < 1
    assert measured.provenance["overlap_compute_slowdown_fraction"].startswith("measured: ")
    assert load_profile("a100-sxm4-80gb").overlap_compute_slowdown_fraction == 0.189


def test_zero3_prefetch_plan_slows_only_with_the_slowdown() -> None:
    model = resolve_model("megatron-1.7b")
    plan = plan_from_fields(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8, zero_stage=3)
    base = round_profile()  # dp 8 inside a node: the gathers hide behind compute
    slowed = dataclasses.replace(base, overlap_compute_slowdown_fraction=0.189)
    t0 = evaluate(model, plan, base).result.step_time_s  # type: ignore[union-attr]
    t1 = evaluate(model, plan, slowed).result.step_time_s  # type: ignore[union-attr]
    assert t1 > t0
    no_zero3 = plan.with_fields(zero_stage=1)
    a = evaluate(model, no_zero3, base).result.step_time_s  # type: ignore[union-attr]
    b = evaluate(model, no_zero3, slowed).result.step_time_s  # type: ignore[union-attr]
    assert a == b  # no ZeRO-3, nothing asynchronous beside compute: unchanged
