"""Megatron-LM --overlap-param-gather: the ZeRO-1/2 parameter all-gather hidden behind the
next step's forward, bucket by bucket (plansim.analytic.rank_work)."""

from __future__ import annotations

import json

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.rank_work import (
    ParamGatherCover,
    gather_cover,
    param_gather_exposed_s,
    rank_work,
)
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.specs.plan import ParallelPlan, Recompute, plan_from_fields
from plansim.specs.work import P2P, GradBucket, Segment, StageWork

A100 = load_profile("a100-sxm4-80gb")
MODEL = resolve_model("megatron-1.7b")


def test_exposed_part_hand_computed() -> None:
    cover = ParamGatherCover(num_buckets=4, forward_s=8.0)
    # each 1 s bucket gather hides behind the previous bucket's 2 s forward: only the first
    assert param_gather_exposed_s(4.0, cover=cover, slowdown=0.0) == 1.0
    # 3 s per bucket beside 2 s of forward: 3 + 3 x (3 - 2)
    assert param_gather_exposed_s(12.0, cover=cover, slowdown=0.0) == 6.0
    # hidden, but compute slows 25% beside it: 1 + 3 x 1 x 0.25 / 1.25
    assert param_gather_exposed_s(4.0, cover=cover, slowdown=0.25) == pytest.approx(1.6)
    one = ParamGatherCover(num_buckets=1, forward_s=100.0)
    assert param_gather_exposed_s(4.0, cover=one, slowdown=0.0) == 4.0  # one bucket: all waits


def _stage(forward_s: float, buckets: int) -> StageWork:
    seg = Segment(kind="forward", stream="compute", duration_s=forward_s, num_bytes=0.0)
    tp = Segment(kind="tp_comm", stream="tp", duration_s=1.0, num_bytes=0.0)
    bucket = GradBucket(
        segment=Segment(kind="dp_comm", stream="dp", duration_s=1.0, num_bytes=8.0),
        ready_fraction=0.5,
    )
    none = P2P(duration_s=0.0, num_bytes=0.0)
    return StageWork(
        forward=(seg, tp),
        backward=(seg,),
        backward_input=(seg,),
        backward_weight=(),
        send_forward=none,
        send_backward=none,
        activation_bytes=0.0,
        grad_buckets=(bucket,) * buckets,
    )


def test_cover_sums_the_ranks_chunks_forward_and_buckets() -> None:
    cover = gather_cover([_stage(3.0, 2), _stage(5.0, 1)])
    assert cover == ParamGatherCover(num_buckets=3, forward_s=10.0)
    assert gather_cover([_stage(3.0, 0)]).num_buckets == 1


def _plan(**kw: object) -> ParallelPlan:
    base = dict(
        dp=8, tp=1, pp=2, micro_batch_size=1, global_batch_size=16, zero_stage=1,
        overlap_grad_reduce=True, recompute=Recompute.FULL,
    )  # fmt: skip
    return plan_from_fields(**{**base, **kw})  # type: ignore[arg-type]


def test_rank_gather_shrinks_and_the_step_gets_faster() -> None:
    plain, over = _plan(), _plan(overlap_param_gather=True)
    groups = layout_groups(plain, gpus_per_node=A100.gpus_per_node)
    whole = rank_work(0, model=MODEL, plan=plain, profile=A100, groups=groups)
    with pytest.raises(SpecError, match="gather_cover"):
        rank_work(0, model=MODEL, plan=over, profile=A100, groups=groups)
    work = build_pipeline_work(MODEL, over, A100, links=False)
    base = build_pipeline_work(MODEL, plain, A100, links=False)
    gathers = [s for s in whole.optimizer if s.kind == "dp_comm"]
    assert len(gathers) == 1
    t = gathers[0].duration_s
    cover = gather_cover(work.stages[0::2])
    expected = param_gather_exposed_s(
        t, cover=cover, slowdown=A100.overlap_compute_slowdown_fraction
    )
    got = [s.duration_s for s in work.ranks[0].optimizer if s.kind == "dp_comm"]
    assert got == [pytest.approx(expected)] and 0 < expected < t
    assert base.stages == work.stages  # nothing else moves
    assert [s.kind for s in base.ranks[0].optimizer] == [s.kind for s in work.ranks[0].optimizer]


def test_plan_rules_label_and_planner() -> None:
    with pytest.raises(SpecError, match="overlap_param_gather needs zero_stage 1 or 2"):
        _plan(zero_stage=0, overlap_param_gather=True)
    with pytest.raises(SpecError, match="overlap_grad_reduce"):
        _plan(overlap_grad_reduce=False, overlap_param_gather=True)
    assert "overlap-param" in _plan(overlap_param_gather=True).label()
    narrow = dict(zero_stages=(0, 1, 3), recomputes=(Recompute.FULL,), micro_batch_size=(1,))
    off = list(enumerate_plans(num_gpus=8, global_batch_size=16, space=SearchSpace(**narrow)))  # type: ignore[arg-type]
    on = list(
        enumerate_plans(
            num_gpus=8,
            global_batch_size=16,
            space=SearchSpace(**narrow, overlap_param_gather=(False, True)),  # type: ignore[arg-type]
        )
    )
    assert not any(p.overlap_param_gather for p in off)
    added = [p for p in on if p.overlap_param_gather]
    assert added and all(p.zero_stage == 1 and p.overlap_grad_reduce for p in added)
    assert len(on) == len(off) + len(added)
    assert {p.with_fields(overlap_param_gather=False) for p in added} <= set(off)


def test_simulate_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "16"]
    args += ["--gbs", "32", "--tp", "1", "--pp", "2", "--mbs", "1", "--zero", "1"]
    args += ["--overlap-grad-reduce", "--recompute", "full"]
    out = []
    for extra in ([], ["--overlap-param-gather"]):
        assert main([*args, *extra, "--format", "json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert "overlap_param_gather" not in out[0]["plan"]
    assert out[1]["plan"]["overlap_param_gather"] is True
    assert out[1]["step_time_s"] < out[0]["step_time_s"]
    assert main([*args, "--overlap-param-gather"]) == 0
    assert "overlap-param" in capsys.readouterr().out
