"""Planner: enumeration, rejection reasons, ranking, determinism."""

from __future__ import annotations

import pytest

from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace, divisors, enumerate_plans
from plansim.planner.evaluate import Evaluation, Rejected, check_plan, evaluate
from plansim.planner.search import search
from plansim.specs.plan import ParallelPlan, Recompute, Schedule
from tests.unit.synthetic import round_profile

A100 = load_profile("a100-sxm4-80gb")


def test_divisors() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


def test_enumeration_covers_every_factorisation() -> None:
    space = SearchSpace(
        zero_stages=(0,),
        recomputes=(Recompute.NONE,),
        sequence_parallel=(False,),
        schedules=(Schedule.ONE_F_ONE_B,),
        micro_batch_size=(1,),
    )
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=space))
    layouts = sorted((p.tp, p.pp, p.dp) for p in plans)
    assert layouts == sorted(
        (t, p, 8 // (t * p)) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if t * p <= 8
    )
    assert all(p.num_gpus == 8 for p in plans)


def test_plan_validation_names_values() -> None:
    with pytest.raises(
        SpecError,
        match=r"global_batch_size\(10\) is not divisible by "
        r"micro_batch_size\(2\) \* dp\(4\) = 8",
    ):
        ParallelPlan(dp=4, tp=1, pp=1, micro_batch_size=2, global_batch_size=10)
    with pytest.raises(SpecError, match="zero_stage=4"):
        ParallelPlan(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, zero_stage=4)
    with pytest.raises(SpecError, match="sequence_parallel needs tp > 1"):
        ParallelPlan(
            dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, sequence_parallel=True
        )


def test_rejection_reasons() -> None:
    gpt3 = resolve_model("gpt3-175b")
    bad_pp = ParallelPlan(dp=1, tp=8, pp=64, micro_batch_size=1, global_batch_size=64)
    r = check_plan(gpt3, bad_pp, A100)
    assert isinstance(r, Rejected) and "num_layers(96) is not divisible by pp(64)" in r.reason
    big = ParallelPlan(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8)
    r = check_plan(gpt3, big, A100)
    assert isinstance(r, Rejected) and r.category == "out of memory"
    assert r.reason.startswith("stage 0 needs ") and "80.0 GiB available: activations" in r.reason
    wide = ParallelPlan(dp=1, tp=16, pp=1, micro_batch_size=1, global_batch_size=1)
    r = check_plan(gpt3, wide, A100)
    assert isinstance(r, Rejected) and r.category == "tp spans nodes"


def test_search_ranks_by_simulated_step_time_and_is_deterministic() -> None:
    model = resolve_model("megatron-1.7b")
    prof = round_profile()
    kw = dict(
        num_gpus=8, global_batch_size=16, space=SearchSpace(max_micro_batch_size=4), simulate_top=20
    )
    first = search(model, prof, **kw)
    second = search(model, prof, **kw)
    times = [e.step_time_s for e in first.ranked]
    assert times == sorted(times) and len(times) == 20
    assert [e.plan for e in first.ranked] == [e.plan for e in second.ranked]
    assert times == [e.step_time_s for e in second.ranked]
    assert first.num_candidates == first.num_feasible + sum(first.rejection_counts.values())


def test_more_microbatches_shrink_the_bubble() -> None:
    model = resolve_model("megatron-7.5b")
    prof = round_profile()
    bubbles = []
    for gbs in (4, 16, 64):
        plan = ParallelPlan(
            dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=gbs, recompute=Recompute.FULL
        )
        ev = evaluate(model, plan, prof)
        assert isinstance(ev, Evaluation)
        bubbles.append(ev.bubble_fraction)
    assert bubbles[0] > bubbles[1] > bubbles[2]
    # the embedding and logits make the first and last stages heavier: the bubble can only
    # exceed the uniform-cost oracle (p-1)/(m+p-1)
    for gbs, bubble in zip((4, 16, 64), bubbles, strict=True):
        assert bubble >= 3 / (gbs + 3) - 1e-9


def test_gpt3_published_layout_metrics_are_consistent() -> None:
    gpt3 = resolve_model("gpt3-175b")
    plan = ParallelPlan(
        dp=8, tp=8, pp=16, micro_batch_size=1, global_batch_size=1536, recompute=Recompute.FULL
    )
    ev = evaluate(gpt3, plan, A100)
    assert isinstance(ev, Evaluation)
    assert ev.tokens_per_s == pytest.approx(1536 * 2048 / ev.step_time_s)
    assert 0 < ev.mfu < ev.hfu < 1
    assert ev.hfu / ev.mfu == pytest.approx(4 / 3, rel=0.02)  # full recompute: 4 passes vs 3
    assert ev.peak_memory_bytes <= A100.hbm_capacity_bytes
