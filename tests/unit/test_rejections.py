"""A search's rejections travel as rows and read back as the Rejected the checks gave."""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import replace

import pytest

from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.planner.context import SearchContext
from plansim.planner.enumerate import SearchSpace, enumerate_plans, layouts
from plansim.planner.evaluate import OUT_OF_MEMORY, Rejected, check_plan
from plansim.planner.rejections import RejectedRows, Rejections, plan_from_values, plan_values
from plansim.planner.search import search

A100 = load_profile("a100-sxm4-80gb")
MODEL = resolve_model("megatron-7.5b")
SPACE = SearchSpace(max_micro_batch_size=4, max_vpp=2)
KW = dict(num_gpus=16, global_batch_size=64, space=SPACE)


def _checked_one_by_one() -> list[Rejected]:
    """Every enumerated plan checked alone, in enumeration order: the rejections a search
    must report."""
    out = []
    for plan in enumerate_plans(**KW, num_layers=MODEL.num_layers):  # type: ignore[arg-type]
        why = check_plan(MODEL, plan, A100)
        if why is not None:
            out.append(why)
    return out


def test_search_reports_every_rejection_the_checks_give_in_order() -> None:
    result = search(MODEL, A100, top_k=3, **KW)  # type: ignore[arg-type]
    expected = _checked_one_by_one()
    assert isinstance(result.rejected, Rejections)
    assert len(result.rejected) == len(expected) > 100
    assert result.rejected == expected  # each Rejected built back, plan validated again
    assert tuple(result.rejected) == tuple(expected)
    assert result.rejection_counts == dict(
        sorted(Counter(r.category for r in expected).items(), key=lambda kv: (-kv[1], kv[0]))
    )
    short = [r for r in expected if r.category == OUT_OF_MEMORY]
    assert short and result.closest_miss == min(short, key=lambda r: r.need_bytes)
    assert result.rejection_examples[OUT_OF_MEMORY] == result.closest_miss.reason


def test_rejections_behave_as_a_sequence() -> None:
    expected = _checked_one_by_one()[:7]
    rows = RejectedRows()
    for why in expected[:5]:
        rows.add(why, [why.plan])
    seq = Rejections([RejectedRows(), rows], expected[5:])  # empty rows are skipped
    assert len(seq) == 7
    assert seq[0] == expected[0] and seq[-1] == expected[-1] and seq[5] == expected[5]
    assert seq[2:6] == tuple(expected[2:6])
    assert list(seq) == expected and seq == tuple(expected)
    assert seq != expected[:6]
    with pytest.raises(IndexError, match="out of range"):
        seq[7]
    assert seq.counts() == Counter(r.category for r in expected)
    first: dict[str, str] = {}
    for r in expected:
        first.setdefault(r.category, r.reason)
    assert seq.examples() == first
    # the closest miss may be a rejection of a simulated plan (the extra part)
    short = [r for r in expected if r.category == OUT_OF_MEMORY]
    assert short
    tighter = replace(short[0], need_bytes=min(r.need_bytes for r in short) / 2)
    assert Rejections([rows], [tighter]).closest_miss() == tighter
    assert Rejections([rows]).closest_miss() == min(
        (r for r in expected[:5] if r.category == OUT_OF_MEMORY),
        key=lambda r: r.need_bytes,
        default=None,
    )


def test_costing_results_carry_plain_values_not_plan_objects() -> None:
    ctx = SearchContext(MODEL, A100)
    costings = [
        ctx.cost_layout(layout, refine=False, **KW)  # type: ignore[arg-type]
        for layout in layouts(16, SPACE)
    ]
    assert any(len(c.rejected) for c in costings) and any(c.feasible for c in costings)
    for costing in costings:
        # a plan object pickles with its class name; the rows and candidates carry none
        assert b"ParallelPlan" not in pickle.dumps(costing)
        for cand in costing.feasible:
            assert plan_values(cand.plan) == cand.plan_values
            assert cand.plan.label() == cand.label
            assert plan_from_values(cand.plan_values) == cand.plan
