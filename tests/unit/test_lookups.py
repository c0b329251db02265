"""Profile curves read outside their measured points (``plansim.planner.lookups``,
``plansim simulate``'s report of them)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plansim.analytic.flops import logits_forward_gemm
from plansim.analytic.layer_cost import layer_gemms
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.planner.lookups import out_of_range, out_of_range_lookups, recording_profile
from plansim.specs.curves import Curve
from plansim.specs.plan import ParallelPlan, Recompute, plan_from_fields
from tests.unit.synthetic import TINY_MODEL, round_profile

PLAN = plan_from_fields(tp=1, pp=1, dp=1, micro_batch_size=2, global_batch_size=4)


def _with_matmul_points(low: float, high: float):  # type: ignore[no-untyped-def]
    """The round-number profile with its bf16 GEMM curve flat between ``low`` and ``high``
    FLOPs and its collectives' curves over every size (only GEMMs can be outside)."""
    profile = round_profile()
    wide = Curve(x=(1.0, 1e30), y=(100e9, 100e9))
    return dataclasses.replace(
        profile,
        matmul_efficiency={"bf16": Curve(x=(low, high), y=(1.0, 1.0))},
        intra_node={
            n: dataclasses.replace(c, busbw_bytes_per_s=wide) for n, c in profile.intra_node.items()
        },
    )


def _largest_gemm_flops(plan: ParallelPlan) -> float:
    gemms = [
        *layer_gemms(TINY_MODEL, plan),
        logits_forward_gemm(TINY_MODEL, micro_batch_size=2, tp=1),
    ]
    return max(2.0 * g.m * g.n * g.k for g in gemms)


def test_recording_changes_no_price() -> None:
    profile = load_profile("h100-sxm5-80gb")
    model = resolve_model("llama3-70b")
    plan = plan_from_fields(
        tp=4, pp=4, dp=4, micro_batch_size=1, global_batch_size=64, zero_stage=1,
        sequence_parallel=True, recompute=Recompute.FULL, overlap_grad_reduce=True,
    )  # fmt: skip
    copy, log = recording_profile(profile)
    plain, recorded = evaluate(model, plan, profile), evaluate(model, plan, copy)
    assert isinstance(plain, Evaluation) and isinstance(recorded, Evaluation)
    assert recorded.step_time_s == plain.step_time_s
    assert recorded.peak_memory_bytes == plain.peak_memory_bytes
    keys = {key for key, _ in log}
    assert {"matmul_efficiency.bf16", "intra_node.all_gather", "intra_node.all_reduce"} <= keys


def test_a_gemm_above_the_measured_points_is_reported_with_its_flops() -> None:
    largest = _largest_gemm_flops(PLAN)
    profile = _with_matmul_points(1.0, largest / 2)
    (only,) = out_of_range_lookups(TINY_MODEL, PLAN, profile)
    assert only.key == "matmul_efficiency.bf16" and only.unit == "FLOPs"
    assert only.queried_high == largest
    assert only.measured_high == largest / 2
    assert "read up to" in only.text() and "down to" not in only.text()
    assert out_of_range_lookups(TINY_MODEL, PLAN, _with_matmul_points(1.0, largest)) == ()


def test_a_gemm_below_the_measured_points_is_reported() -> None:
    largest = _largest_gemm_flops(PLAN)
    (only,) = out_of_range_lookups(TINY_MODEL, PLAN, _with_matmul_points(largest, 1e30))
    assert only.queried_low < largest == only.measured_low
    assert "read down to" in only.text()


def test_out_of_range_ignores_lookups_inside() -> None:
    profile = _with_matmul_points(10.0, 100.0)
    _, log = recording_profile(profile)
    log += [("matmul_efficiency.bf16", 50.0), ("matmul_efficiency.bf16", 5.0)]
    (only,) = out_of_range(profile, log)
    assert (only.queried_low, only.queried_high, only.num_lookups) == (5.0, 5.0, 1)


SIMULATE = [
    "simulate", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
    "--gbs", "512", "--tp", "4", "--pp", "4", "--mbs", "1", "--zero", "2",
    "--sequence-parallel", "--schedule", "zb-h1", "--overlap-grad-reduce",
]  # fmt: skip


def test_simulate_reports_a_ring_over_fewer_nodes_than_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """dp 4 over 2 nodes: the h100 profile's ring fall-off starts at 4 nodes (N16)."""
    assert main(SIMULATE) == 0
    out = capsys.readouterr().out
    assert "h100-sxm5-80gb's curves read outside their measured points:" in out
    assert "inter_node_ring_scaling: read down to 2 nodes, outside the profile's 4-128" in out
    assert main([*SIMULATE, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ring = next(o for o in doc["out_of_range_lookups"] if o["key"] == "inter_node_ring_scaling")
    assert (ring["queried_low"], ring["measured_low"], ring["unit"]) == (2.0, 4.0, "nodes")


def test_plan_reports_what_rank_1_reads_outside(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "plan", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
        "--gbs", "512", "--tp", "4", "--pp", "4", "--zero", "2", "--mbs", "1", "--jobs", "1",
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "curves read outside their measured points by rank 1's pricing:" in out
    assert "inter_node_ring_scaling: read down to 2 nodes" in out
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    keys = [o["key"] for o in doc["out_of_range_lookups_of_best"]]
    assert "inter_node_ring_scaling" in keys
