"""Uneven pipeline splits (Megatron-LM ``--decoder-first/last-pipeline-num-layers``).

The first and/or last pipeline rank holds its own number of layers and the other ranks share
the rest evenly; Llama 3 405B trains 126 layers on pp 16 as 7, 8 x 14, 7 (Dubey et al. 2024
§3.3.2). Stage costs, parameters, memory and the search follow the per-rank counts.
Timings use the round-number profile (tests/unit/synthetic.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import rank_memory, rank_parameters, worst_rank_memory
from plansim.analytic.params import count_parameters
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.report.tables import pipeline_split_label, ranked_table
from plansim.specs.layer_split import (
    check_plan_divides_model,
    pipeline_layer_counts,
    stage_layer_counts,
    stage_num_layers,
    uneven_pipeline_split,
)
from plansim.specs.plan import ParallelPlan, Schedule, plan_from_fields
from tests.unit.synthetic import TINY_MODEL, round_profile

#: 12 layers: an even split over pp 4 is 3 each; the uneven 2, 4, 4, 2 keeps the same total.
TWELVE = dataclasses.replace(TINY_MODEL, num_layers=12, tied_embeddings=False)
#: The same split on layers wide enough for compute, not latency, to set the step.
WIDE = dataclasses.replace(resolve_model("megatron-1.7b"), num_layers=12)


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"dp": 1, "tp": 1, "pp": 4, "micro_batch_size": 1}
    base.update(kw)
    base.setdefault("global_batch_size", 16)
    return plan_from_fields(**base)  # type: ignore[arg-type]


def _compute_s(segments: tuple[object, ...]) -> float:
    return sum(s.duration_s for s in segments if s.stream == "compute")  # type: ignore[attr-defined]


def test_llama3_405b_split_is_metas() -> None:
    assert uneven_pipeline_split(126, pp=16, vpp=1) == (7, 7)
    plan = _plan(
        tp=8,
        pp=16,
        global_batch_size=64,
        decoder_first_pipeline_num_layers=7,
        decoder_last_pipeline_num_layers=7,
    )
    assert pipeline_layer_counts(126, plan) == (7, *[8] * 14, 7)
    assert plan.label().endswith("first-stage-7 last-stage-7")
    llama = resolve_model("llama3-405b")
    reason = check_plan_divides_model(
        plan, num_layers=126, num_attention_heads=128, num_query_groups=llama.num_query_groups
    )
    assert reason is None


def test_even_plans_are_unchanged_and_one_edge_may_be_set_alone() -> None:
    assert pipeline_layer_counts(12, _plan()) == (3, 3, 3, 3)
    assert pipeline_layer_counts(12, _plan(vpp=3, schedule=Schedule.INTERLEAVED_1F1B)) == (3,) * 4
    only_last = _plan(decoder_last_pipeline_num_layers=3)
    assert pipeline_layer_counts(15, only_last) == (4, 4, 4, 3)
    assert [stage_num_layers(15, only_last, s) for s in range(4)] == [4, 4, 4, 3]


@pytest.mark.parametrize(
    ("num_layers", "pp", "vpp", "split"),
    [
        (126, 16, 2, (8, 6)),  # chunks of 4, 4 x 14 ranks, chunks of 3 on the last rank
        (70, 12, 1, (5, 5)),  # BLOOM-176B's 70 layers on pp 12
        (24, 5, 1, (5, 4)),  # the larger half of the missing layers comes off the last rank
        (24, 5, 3, (3, 3)),
        (24, 4, 1, None),  # even
        (25, 4, 2, None),  # 25 layers cannot form chunks of equal pairs
        (3, 4, 1, None),  # fewer layers than ranks
    ],
)
def test_uneven_split_cases(
    num_layers: int, pp: int, vpp: int, split: tuple[int, int] | None
) -> None:
    assert uneven_pipeline_split(num_layers, pp=pp, vpp=vpp) == split


def test_every_offered_split_is_valid_and_as_balanced_as_the_chunks_allow() -> None:
    for num_layers, pp, vpp in itertools.product(range(2, 80), range(2, 17), range(1, 5)):
        split = uneven_pipeline_split(num_layers, pp=pp, vpp=vpp)
        if split is None:
            continue
        schedule = Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B
        plan = _plan(
            pp=pp,
            vpp=vpp,
            schedule=schedule,
            global_batch_size=pp,
            decoder_first_pipeline_num_layers=split[0],
            decoder_last_pipeline_num_layers=split[1],
        )
        counts = pipeline_layer_counts(num_layers, plan)
        assert sum(counts) == num_layers
        assert all(c % vpp == 0 and c >= vpp for c in counts)
        # the busiest rank holds the fewest layers any split into vpp-layer multiples can
        assert max(counts) == vpp * -(-num_layers // (pp * vpp))
        assert counts[0] >= counts[-1]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"pp": 1, "decoder_first_pipeline_num_layers": 2},
            r"plan.decoder_first_pipeline_num_layers\(2\) needs pp > 1",
        ),
        (
            {"decoder_last_pipeline_num_layers": 0},
            "plan.decoder_last_pipeline_num_layers must be a positive integer",
        ),
    ],
)
def test_bad_split_fields_are_named(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _plan(**kw)


@pytest.mark.parametrize(
    ("num_layers", "kw", "message"),
    [
        (
            126,
            {"pp": 16},
            r"num_layers\(126\) is not divisible by pp\(16\) \* vpp\(1\) = 16; an uneven split "
            r"fits: account_for_embedding_in_pipeline_split=True, "
            r"account_for_loss_in_pipeline_split=True",
        ),
        (
            12,
            {"decoder_first_pipeline_num_layers": 1},
            "the other 3 ranks cannot share 11 layers evenly",
        ),
        (
            12,
            {"decoder_first_pipeline_num_layers": 6, "decoder_last_pipeline_num_layers": 6},
            "0 layers left for 2 other ranks",
        ),
        (
            12,
            {
                "vpp": 2,
                "schedule": Schedule.INTERLEAVED_1F1B,
                "decoder_first_pipeline_num_layers": 3,
                "decoder_last_pipeline_num_layers": 3,
            },
            r"rank layer counts 3 are not multiples of vpp\(2\)",
        ),
    ],
)
def test_splits_that_do_not_fit_are_explained(
    num_layers: int, kw: dict[str, object], message: str
) -> None:
    reason = check_plan_divides_model(
        _plan(**kw), num_layers=num_layers, num_attention_heads=4, num_query_groups=4
    )
    assert reason is not None
    assert re.search(message, reason), reason


def test_stage_work_and_parameters_follow_the_layer_counts() -> None:
    prof = round_profile()
    even = _plan()
    uneven = _plan(decoder_first_pipeline_num_layers=2, decoder_last_pipeline_num_layers=2)
    work_even = build_pipeline_work(TWELVE, even, prof)
    work_uneven = build_pipeline_work(TWELVE, uneven, prof)
    # middle stages: 4 layers against 3, nothing else on them
    for s in (1, 2):
        ratio = _compute_s(work_uneven.stages[s].forward) / _compute_s(work_even.stages[s].forward)
        assert ratio == pytest.approx(4 / 3, rel=1e-12)
    # the edge stages lose one layer each (their embedding / logits work stays)
    layer_fwd = _compute_s(work_even.stages[1].forward) / 3
    for s in (0, 3):
        lost = _compute_s(work_even.stages[s].forward) - _compute_s(work_uneven.stages[s].forward)
        assert lost == pytest.approx(layer_fwd, rel=1e-12)
    # every parameter sits on exactly one rank (tp = 1, untied embeddings)
    total = count_parameters(TWELVE).total
    assert sum(rank_parameters(TWELVE, uneven, rank=r) for r in range(4)) == pytest.approx(total)
    assert rank_parameters(TWELVE, uneven, rank=1) > rank_parameters(TWELVE, even, rank=1)


@pytest.mark.parametrize("split", [(None, None), (2, 2), (4, 2), (2, 4)])
def test_the_busiest_stage_sets_the_1f1b_step(split: tuple[int | None, int | None]) -> None:
    """1F1B with m = 64 micro-batches on p = 4 ranks takes about (m + p - 1) x the busiest
    stage's forward + backward. Here the last stage's logits (V = 51200) outweigh a layer,
    so moving one layer off each edge rank (2, 4, 4, 2) beats the even split."""
    first, last = split
    plan = _plan(
        global_batch_size=64,
        decoder_first_pipeline_num_layers=first,
        decoder_last_pipeline_num_layers=last,
    )
    prof = round_profile()
    work = build_pipeline_work(WIDE, plan, prof)
    busiest = max(_compute_s(s.forward) + _compute_s(s.backward) for s in work.stages)
    ev = evaluate(WIDE, plan, prof)
    assert isinstance(ev, Evaluation)
    assert ev.step_time_s == pytest.approx((64 + 4 - 1) * busiest, rel=0.03)
    even = evaluate(WIDE, _plan(global_batch_size=64), prof)
    assert isinstance(even, Evaluation)
    if split == (2, 2):
        assert ev.step_time_s < 0.9 * even.step_time_s


def test_the_analytic_worst_rank_sees_the_middle_ranks() -> None:
    prof = round_profile()
    even = _plan(global_batch_size=64)
    plan = _plan(
        global_batch_size=64,
        decoder_first_pipeline_num_layers=2,
        decoder_last_pipeline_num_layers=2,
    )
    # rank 1 holds 4 layers' weights and activations against 3 with the even split
    middle = rank_memory(WIDE, plan, prof, rank=1)
    assert middle.activations_bytes == pytest.approx(
        4 / 3 * rank_memory(WIDE, even, prof, rank=1).activations_bytes
    )
    worst = worst_rank_memory(WIDE, plan, prof)
    assert worst.total_bytes >= middle.total_bytes
    assert worst.total_bytes == max(
        rank_memory(WIDE, plan, prof, rank=r).total_bytes for r in range(4)
    )
    ev = evaluate(WIDE, plan, prof)
    assert isinstance(ev, Evaluation)
    assert ev.memory.total_bytes == pytest.approx(worst.total_bytes)


def test_search_offers_the_split_only_when_allowed() -> None:
    space = SearchSpace(tp=(1,), pp=(4,), micro_batch_size=(1,), zero_stages=(0,))
    plans = list(enumerate_plans(num_gpus=4, global_batch_size=8, space=space, num_layers=10))
    # 10 layers on pp 4: 2, 3, 3, 2 for vpp 1 and vpp 3: with the embedding and the loss
    # counted as layers, 12 slots fill 4 ranks x 3 chunks of one (the first chunk holds only
    # the embedding, the last only the loss)
    assert plans
    assert {pipeline_layer_counts(10, p) for p in plans} == {(2, 3, 3, 2)}
    assert {p.vpp for p in plans} == {1, 3}
    assert all(p.account_for_embedding_in_pipeline_split for p in plans)
    ten = dataclasses.replace(TWELVE, num_layers=10)
    assert isinstance(evaluate(ten, plans[0], round_profile()), Evaluation)
    strict = dataclasses.replace(space, uneven_pipeline=False)
    assert all(
        not p.uneven_pipeline
        for p in enumerate_plans(num_gpus=4, global_batch_size=8, space=strict, num_layers=10)
    )


def test_cli_simulates_an_uneven_split_and_suggests_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["simulate", "--model", "llama3-405b", "--gpu", "h100-sxm5-80gb", "--gpus", "2048"]
    base += [
        "--tp",
        "8",
        "--pp",
        "16",
        "--mbs",
        "1",
        "--gbs",
        "512",
        "--recompute",
        "full",
        "--zero",
        "1",
    ]
    assert main(base) == 2
    assert "account_for_embedding_in_pipeline_split=True" in capsys.readouterr().err
    split = ["--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers", "7"]
    assert main([*base, *split, "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"decoder_first_pipeline_num_layers": 7' in out
    in_split = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    assert main([*base, *in_split, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["account_for_loss_in_pipeline_split"] is True
    # at vpp 1 both splits put 7, 8 x 14, 7 layers on the ranks: the same step
    assert doc["step_time_s"] == pytest.approx(json.loads(out)["step_time_s"], rel=1e-9)


def _in_split(**kw: object) -> ParallelPlan:
    return _plan(
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
        **kw,
    )


def test_embedding_and_loss_in_the_split_give_llama3_its_chunks() -> None:
    plan = _in_split(pp=16, vpp=8, global_batch_size=16, schedule=Schedule.INTERLEAVED_1F1B)
    stages = stage_layer_counts(126, plan)
    # 126 layers + embedding + loss = 128 slots = 16 ranks x 8 chunks of one
    assert stages == (0, *[1] * 126, 0)
    assert pipeline_layer_counts(126, plan) == (7, *[8] * 14, 7)
    assert plan.label().endswith("embedding-in-split loss-in-split")
    only_loss = _plan(account_for_loss_in_pipeline_split=True)
    assert stage_layer_counts(15, only_loss) == (4, 4, 4, 3)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"pp": 1, "account_for_loss_in_pipeline_split": True},
            r"plan.account_for_loss_in_pipeline_split needs pp > 1",
        ),
        (
            {
                "account_for_embedding_in_pipeline_split": True,
                "decoder_last_pipeline_num_layers": 2,
            },
            "does not combine with decoder_first/last_pipeline_num_layers",
        ),
        (
            {"account_for_embedding_in_pipeline_split": 1},
            "plan.account_for_embedding_in_pipeline_split",
        ),
    ],
)
def test_bad_in_split_flags_are_named(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _plan(**kw)


def test_in_split_that_does_not_divide_is_explained() -> None:
    reason = check_plan_divides_model(
        _in_split(), num_layers=12, num_attention_heads=4, num_query_groups=4
    )
    assert reason is not None
    assert "num_layers(12) + embedding + loss = 14 slots are not divisible by pp(4)" in reason
    # and the error for a plain plan proposes the split that fits
    plain = check_plan_divides_model(
        _plan(pp=16, vpp=8, global_batch_size=16, schedule=Schedule.INTERLEAVED_1F1B),
        num_layers=126,
        num_attention_heads=128,
        num_query_groups=8,
    )
    assert plain is not None and "account_for_embedding_in_pipeline_split=True" in plain


@pytest.mark.parametrize("gbs", [4, 8, 12])
def test_unequal_chunks_keep_the_analytic_peak_equal_to_the_engine(gbs: int) -> None:
    """10 layers + embedding + loss over pp 4 x vpp 3: stage 0 holds only the embedding and
    the last stage only the loss, so rank 0's and rank 3's chunks differ; the analytic
    activations replay the rank's actions and must equal the event engine's peak."""
    plan = _in_split(vpp=3, global_batch_size=gbs, schedule=Schedule.INTERLEAVED_1F1B)
    model = dataclasses.replace(WIDE, num_layers=10)
    assert stage_layer_counts(10, plan) == (0, *[1] * 10, 0)
    prof = round_profile()
    ev = evaluate(model, plan, prof)
    assert isinstance(ev, Evaluation)
    engine = ev.result.peak_memory_bytes
    for rank in range(plan.pp):
        analytic = rank_memory(model, plan, prof, rank=rank).total_bytes
        assert engine[rank] == pytest.approx(analytic, rel=1e-9), rank


def test_ranked_table_names_the_split() -> None:
    prof = round_profile()
    even = evaluate(WIDE, _plan(global_batch_size=64), prof)
    split = evaluate(
        WIDE,
        _plan(
            global_batch_size=64,
            decoder_first_pipeline_num_layers=2,
            decoder_last_pipeline_num_layers=2,
        ),
        prof,
    )
    assert isinstance(even, Evaluation) and isinstance(split, Evaluation)
    assert "pipeline_split" not in ranked_table([even])
    table = ranked_table([split, even])
    assert list(table["pipeline_split"]) == ["first2 last2", "even"]
    assert pipeline_split_label(_in_split()) == "embedding+loss"
