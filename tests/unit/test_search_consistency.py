"""A search's shortcuts (grouped memory checks, the shared costing memo, bounds) change
nothing: every plan it ranks simulates alone to the same step time and peak memory, and
every plan it rejects for memory is rejected alone."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace
from plansim.planner.evaluate import OUT_OF_MEMORY, Evaluation, check_plan, evaluate
from plansim.planner.search import search
from plansim.specs.plan import Precision, Recompute


@pytest.mark.parametrize("hbm_gib", [24.0, 40.0])
def test_exhaustive_search_agrees_with_each_plan_alone(hbm_gib: float) -> None:
    model = resolve_model("llama2-7b")
    h100 = load_profile("h100-sxm5-80gb")
    # small enough that memory rejects some plans of every kind, not all
    profile = dataclasses.replace(h100, hbm_capacity_bytes=hbm_gib * 2**30)
    space = SearchSpace(
        tp=(2,),
        pp=(2,),
        micro_batch_size=(1,),
        vpps=(1, 2),
        zero_stages=(0, 1, 3),
        recomputes=(Recompute.NONE, Recompute.FULL),
        grad_reduce_in_bf16=(False, True),
        overlap_param_gather=(False, True),
        precision=Precision.BF16,
    )
    result = search(
        model, profile, num_gpus=8, global_batch_size=16, space=space, top_k=1000,
        exhaustive=True,
    )  # fmt: skip
    assert result.ranked and result.rejected
    assert any(r.category == OUT_OF_MEMORY for r in result.rejected)
    for ranked in result.ranked:
        alone = evaluate(model, ranked.plan, profile)
        assert isinstance(alone, Evaluation), ranked.plan.label()
        assert alone.step_time_s == ranked.step_time_s, ranked.plan.label()
        assert alone.peak_memory_bytes == ranked.peak_memory_bytes, ranked.plan.label()
    for rejected in result.rejected:
        if rejected.category == OUT_OF_MEMORY:
            again = check_plan(model, rejected.plan, profile)
            assert again is not None and again.reason == rejected.reason, rejected.plan.label()
