"""Planner: enumeration, rejection reasons, ranking, determinism."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.comm import collective_time_s
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import MemoryBreakdown, rank_memory
from plansim.analytic.ranks import layout_groups
from plansim.analytic.stored_activations import microbatch_activation_bytes
from plansim.analytic.tp_comm import hidden_message_bytes
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace, divisors, enumerate_plans, vpp_values
from plansim.planner.estimate import estimate_step_time_s
from plansim.planner.evaluate import Evaluation, Rejected, check_plan, evaluate
from plansim.planner.search import search
from plansim.schedule import build_actions
from plansim.sim import simulate
from plansim.specs.plan import Recompute, Schedule, plan_from_fields
from plansim.specs.work import P2P, PipelineWork, RankWork, Segment, StageWork
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
        overlap_grad_reduce=(False,),
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
        plan_from_fields(dp=4, tp=1, pp=1, micro_batch_size=2, global_batch_size=10)
    with pytest.raises(SpecError, match="zero_stage=4"):
        plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, zero_stage=4)
    with pytest.raises(SpecError, match="sequence_parallel needs tp > 1"):
        plan_from_fields(
            dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, sequence_parallel=True
        )


def test_rejection_reasons() -> None:
    gpt3 = resolve_model("gpt3-175b")
    bad_pp = plan_from_fields(dp=1, tp=8, pp=64, micro_batch_size=1, global_batch_size=64)
    r = check_plan(gpt3, bad_pp, A100)
    assert isinstance(r, Rejected) and "num_layers(96) is not divisible by pp(64)" in r.reason
    big = plan_from_fields(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8)
    r = check_plan(gpt3, big, A100)
    assert isinstance(r, Rejected) and r.category == "out of memory"
    assert r.reason.startswith("stage 0 needs ") and "80.0 GiB available: activations" in r.reason
    # tp 16 on 8-GPU nodes: two whole nodes per TP group, priced on the inter-node tier
    wide = plan_from_fields(dp=1, tp=16, pp=1, micro_batch_size=1, global_batch_size=1)
    r = check_plan(gpt3, wide, A100)
    assert not (isinstance(r, Rejected) and r.category == "tp straddles nodes")
    # ... but not with Transformer Engine's userbuffers TP overlap, which stays in one node
    wide_overlap = wide.with_fields(sequence_parallel=True, tp_comm_overlap=True)
    r = check_plan(gpt3, wide_overlap, A100)
    assert isinstance(r, Rejected) and r.category == "tp comm overlap across nodes"
    assert r.reason.startswith("tp_comm_overlap needs the TP group inside one node; tp(16)")
    # tp 3 divides the 96 heads, but groups of 3 consecutive ranks straddle 8-GPU nodes
    odd = plan_from_fields(dp=8, tp=3, pp=1, micro_batch_size=1, global_batch_size=8)
    r = check_plan(gpt3, odd, A100)
    assert isinstance(r, Rejected) and r.category == "tp straddles nodes"
    assert r.reason.startswith(
        "tp(3) neither divides nor is a multiple of GPUs per node(8) of a100-sxm4-80gb"
    )
    # tp 12: half of every other group sits on one node, half on the next
    twelve = plan_from_fields(dp=2, tp=12, pp=1, micro_batch_size=1, global_batch_size=2)
    r = check_plan(gpt3, twelve, A100)
    assert isinstance(r, Rejected) and r.category == "tp straddles nodes"
    # on 6 GPUs of one node no group crosses a node boundary
    one_node = plan_from_fields(dp=2, tp=3, pp=1, micro_batch_size=1, global_batch_size=2)
    r = check_plan(gpt3, one_node, A100)
    assert not (isinstance(r, Rejected) and r.category == "tp straddles nodes")


def test_tp_across_nodes_pays_the_inter_node_tier() -> None:
    """A TP group of two 8-GPU nodes prices its all-reduces on the NICs: per-layer TP
    collectives cost more than the same message inside one node, and the simulator tags
    them on the NIC link (so they contend with DP and PP traffic there)."""
    gpt3 = resolve_model("gpt3-175b")
    plans = {
        tp: plan_from_fields(dp=1, tp=tp, pp=64 // tp, micro_batch_size=1, global_batch_size=32)
        for tp in (8, 16)
    }
    groups = {
        tp: layout_groups(plan, gpus_per_node=A100.gpus_per_node) for tp, plan in plans.items()
    }
    assert groups[8].tp.num_nodes == 1 and groups[16].tp.num_nodes == 2
    message = hidden_message_bytes(gpt3, plans[16])
    inside = collective_time_s(
        A100, collective="all_reduce", message_bytes=message, span=groups[8].tp
    )
    across = collective_time_s(
        A100, collective="all_reduce", message_bytes=message, span=groups[16].tp
    )
    assert across > inside
    work = build_pipeline_work(gpt3, plans[16], A100)
    tp_links = {
        seg.link
        for stage in work.stages
        for seg in stage.forward + stage.backward
        if seg.kind == "tp_comm"
    }
    assert tp_links == {"nic"}
    ev = evaluate(gpt3, plans[16], A100)
    assert isinstance(ev, Evaluation) and ev.exposed_comm_s_by_kind["tp_comm"] > 0


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
        plan = plan_from_fields(
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
    plan = plan_from_fields(
        dp=8, tp=8, pp=16, micro_batch_size=1, global_batch_size=1536, recompute=Recompute.FULL
    )
    ev = evaluate(gpt3, plan, A100)
    assert isinstance(ev, Evaluation)
    assert ev.tokens_per_s == pytest.approx(1536 * 2048 / ev.step_time_s)
    assert 0 < ev.mfu < ev.hfu < 1
    assert ev.hfu / ev.mfu == pytest.approx(4 / 3, rel=0.02)  # full recompute: 4 passes vs 3
    assert ev.peak_memory_bytes <= A100.hbm_capacity_bytes


def _one_knob_space(**kw) -> SearchSpace:
    base = dict(
        zero_stages=(0,),
        recomputes=(Recompute.NONE,),
        sequence_parallel=(False,),
        micro_batch_size=(1,),
        tp=(1,),
        overlap_p2p_comm=(False,),
        overlap_grad_reduce=(False,),
        partial_recompute=False,
    )
    base.update(kw)
    return SearchSpace(**base)


def test_vpp_values_divide_layers_per_rank() -> None:
    space = SearchSpace()
    assert vpp_values(2, num_layers=24, space=space) == (1, 2, 3, 4, 6)  # 12 > max_vpp 8
    assert vpp_values(8, num_layers=24, space=space) == (1, 3)
    assert vpp_values(1, num_layers=24, space=space) == (1,)  # interleaving needs pp > 1
    # pp 5 does not split 24 layers: uneven splits (first, last) = (5, 4), (4, 2), (3, 3)
    # with 5, 6, 3 layers on the middle ranks fit vpp 1, 2, 3 (chunks of equal whole layers)
    assert vpp_values(5, num_layers=24, space=space) == (1, 2, 3)
    assert vpp_values(5, num_layers=24, space=SearchSpace(uneven_pipeline=False)) == (1,)
    assert vpp_values(2, num_layers=None, space=space) == (1,)
    assert vpp_values(1, num_layers=24, space=SearchSpace(vpps=(1, 3))) == (1,)
    assert vpp_values(4, num_layers=24, space=SearchSpace(vpps=(3, 1))) == (1, 3)


def test_enumeration_pairs_vpp_with_schedules() -> None:
    # 24 layers on 8 GPUs, tp = 1, mbs = 1, gbs = 8: pp 2 (dp 4, m 2), 4 (dp 2, m 4), 8 (m 8).
    plans = list(
        enumerate_plans(num_gpus=8, global_batch_size=8, space=_one_knob_space(), num_layers=24)
    )
    got = sorted((p.pp, p.vpp, p.schedule.value) for p in plans)
    flat = [(pp, 1, s) for pp in (2, 4, 8) for s in ("1f1b", "gpipe", "zb-h1")] + [(1, 1, "1f1b")]
    interleaved = [(2, v, "interleaved-1f1b") for v in (2, 3, 4, 6)]  # m = 2: a multiple of 2
    interleaved += [(4, v, "interleaved-1f1b") for v in (2, 3, 6)]  # m = 4
    interleaved += [(8, 3, "interleaved-1f1b")]  # m = 8
    assert got == sorted(flat + interleaved)
    # mbs 2: m = 1, 2, 4 for pp = 2, 4, 8, never a multiple of pp: no interleaved plan
    plans = list(
        enumerate_plans(
            num_gpus=8,
            global_batch_size=8,
            space=_one_knob_space(micro_batch_size=(2,)),
            num_layers=24,
        )
    )
    assert {(p.pp, p.vpp) for p in plans} == {(2, 1), (4, 1), (8, 1)}
    no_interleaving = _one_knob_space(schedules=(Schedule.ONE_F_ONE_B,))
    plans = list(
        enumerate_plans(num_gpus=8, global_batch_size=8, space=no_interleaving, num_layers=24)
    )
    assert {p.vpp for p in plans} == {1}


def _uniform_chunks(p: int, v: int, m: int, *, send_s: float) -> PipelineWork:
    def segs(kind: str, seconds: float) -> tuple[Segment, ...]:
        return (Segment(kind=kind, stream="compute", duration_s=seconds),)

    chunk = StageWork(
        forward=segs("forward", 1.0 / v),
        backward=segs("backward", 2.0 / v),
        backward_input=(),
        backward_weight=(),
        send_forward=P2P(duration_s=send_s, num_bytes=1.0),
        send_backward=P2P(duration_s=send_s, num_bytes=1.0),
        activation_bytes=0.0,
    )
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=())
    return PipelineWork(stages=(chunk,) * (p * v), ranks=(rank,) * p, num_microbatches=m)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 16), (4, 4, 16), (8, 3, 32)])
def test_interleaved_estimate_matches_uniform_simulation(p: int, v: int, m: int) -> None:
    # (m + (p-1)/v) x 3 s of compute per micro-batch and rank, plus 2 (p v - 1) exposed sends.
    work = _uniform_chunks(p, v, m, send_s=0.05)
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)
    simulated = simulate(actions, work).step_time_s
    expected = (m + (p - 1) / v) * 3.0 + 2 * (p * v - 1) * 0.05
    assert estimate_step_time_s(work) == pytest.approx(expected, rel=1e-12)
    assert simulated == pytest.approx(expected, rel=1e-9)


def test_interleaved_engine_peak_memory_equals_analytic() -> None:
    # megatron-1.7b (24 layers) on the round-number profile: pp 4, vpp 3, m 8 micro-batches.
    # Rank 0 stores 2(p-1) + (v-1)p + 1 = 15 chunks = 5 micro-batches of its 6 layers
    # = 4 (1 + 3/12) (Korthikanti §4.2.3); the engine, fed per-chunk bytes by cost.py, must
    # reach the analytic total of every rank exactly.
    model = resolve_model("megatron-1.7b")
    prof = round_profile()
    plan = plan_from_fields(
        dp=1,
        tp=1,
        pp=4,
        vpp=3,
        micro_batch_size=1,
        global_batch_size=8,
        recompute=Recompute.FULL,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    ev = evaluate(model, plan, prof)
    assert isinstance(ev, Evaluation)
    per_mb = microbatch_activation_bytes(model, plan, rank=0)
    analytic = rank_memory(model, plan, prof, rank=0)
    assert analytic.activations_bytes == pytest.approx(5 * per_mb, rel=1e-15)
    for rank in range(plan.pp):
        total = rank_memory(model, plan, prof, rank=rank).total_bytes
        assert ev.result.peak_memory_bytes[rank] == pytest.approx(total, rel=1e-12)


def test_search_offers_interleaving_and_it_wins_the_bubble() -> None:
    # On the round-number profile the interleaved layouts of one (tp, pp, dp, mbs) beat 1F1B.
    model = resolve_model("megatron-1.7b")
    space = _one_knob_space(recomputes=(Recompute.FULL,), pp=(4,), dp=(2,))
    result = search(model, round_profile(), num_gpus=8, global_batch_size=16, space=space)
    by_vpp = {ev.plan.vpp: ev for ev in result.ranked if ev.plan.schedule is not Schedule.GPIPE}
    assert sorted(by_vpp) == [1, 2, 3, 6]
    assert by_vpp[2].step_time_s < by_vpp[1].step_time_s
    assert by_vpp[2].bubble_fraction < by_vpp[1].bubble_fraction
    assert result.ranked[0].plan.schedule is Schedule.INTERLEAVED_1F1B


def test_overlapping_p2p_makes_interleaving_cheaper_on_slow_links() -> None:
    model = resolve_model("megatron-7.5b")
    prof = round_profile(gpus_per_node=1)  # every pipeline hop crosses a 10 GB/s NIC
    kw = dict(
        dp=1,
        tp=1,
        pp=4,
        vpp=3,
        micro_batch_size=1,
        global_batch_size=16,
        recompute=Recompute.FULL,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    sync = evaluate(model, plan_from_fields(**kw), prof)
    overlap = evaluate(model, plan_from_fields(**kw, overlap_p2p_comm=True), prof)
    assert isinstance(sync, Evaluation) and isinstance(overlap, Evaluation)
    assert overlap.step_time_s < sync.step_time_s
    with pytest.raises(SpecError, match="overlap_p2p_comm needs schedule interleaved-1f1b"):
        plan_from_fields(
            **{**kw, "vpp": 1, "schedule": Schedule.ONE_F_ONE_B}, overlap_p2p_comm=True
        )


def test_zb_h1_estimate_matches_the_simulated_pipeline_on_uniform_costs() -> None:
    from plansim.specs.work import P2P, PipelineWork, RankWork, Segment, StageWork

    def seg(kind: str, d: float) -> tuple[Segment, ...]:
        return (Segment(kind=kind, stream="compute", duration_s=d),)

    st = StageWork(
        forward=seg("forward", 1.0),
        backward=seg("backward", 2.0),
        backward_input=seg("backward_input", 1.0),
        backward_weight=seg("backward_weight", 1.0),
        send_forward=P2P(duration_s=0.0, num_bytes=0.0),
        send_backward=P2P(duration_s=0.0, num_bytes=0.0),
        activation_bytes=0.0,
    )
    rk = RankWork(static_bytes=0.0, grad_sync=(), optimizer=())
    work = PipelineWork(stages=(st,) * 4, ranks=(rk,) * 4, num_microbatches=8)
    from plansim.schedule.builders import build_actions
    from plansim.sim.engine import simulate

    sim = simulate(build_actions(Schedule.ZB_H1, num_ranks=4, num_microbatches=8), work)
    est = estimate_step_time_s(work, schedule=Schedule.ZB_H1)
    assert est == pytest.approx(sim.pipeline_time_s) == pytest.approx(8 * 3 + 3 * 1)
    assert estimate_step_time_s(work) == pytest.approx((8 + 3) * 3)  # 1F1B


def test_estimate_credits_gradient_buckets_hidden_behind_backward() -> None:
    from plansim.analytic.cost import build_pipeline_work

    model = resolve_model("megatron-1.7b")
    prof = round_profile()
    base = dict(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8)
    plain = build_pipeline_work(model, plan_from_fields(**base), prof)
    over = build_pipeline_work(model, plan_from_fields(**base, overlap_grad_reduce=True), prof)
    est_plain, est_over = estimate_step_time_s(plain), estimate_step_time_s(over)
    assert est_over < est_plain
    ev = evaluate(model, plan_from_fields(**base, overlap_grad_reduce=True), prof)
    assert isinstance(ev, Evaluation)
    assert est_over == pytest.approx(ev.step_time_s, rel=0.05)


def test_layouts_the_batch_does_not_split_over_are_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """gbs 1000 on 992 GPUs: dp must divide both, so most layouts are never enumerated; the
    search says which dp sizes and why, instead of only the rejections it made."""
    from plansim.cli import main

    space = SearchSpace(tp=(8,), zero_stages=(3,), recomputes=(Recompute.FULL,))
    model = resolve_model("gpt3-175b")
    result = search(
        model, round_profile(), num_gpus=992, global_batch_size=1000, space=space, top_k=1
    )
    assert result.batch_indivisible_dps == (31, 62, 124)  # 992 / 8 = 124 = dp * pp
    args = ["plan", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "992"]
    assert main([*args, "--gbs", "1000"]) == 1  # nothing feasible: no plan
    out = capsys.readouterr().out
    assert "not enumerated: layouts with dp in (16, 31, 32, 62, 124, 248, 496, 992)" in out
    assert "global batch 1000 is not divisible by dp" in out


def test_memory_rejection_example_is_the_plan_closest_to_fitting() -> None:
    """With nothing feasible, the out-of-memory example names the smallest need: GPT-3 175B
    on 8 A100s never fits, and the least-memory plan is the one a user should look at."""
    gpt3 = resolve_model("gpt3-175b")
    space = SearchSpace(
        zero_stages=(0, 3),
        recomputes=(Recompute.NONE, Recompute.FULL),
        sequence_parallel=(False,),
        schedules=(Schedule.ONE_F_ONE_B,),
        micro_batch_size=(1,),
        overlap_grad_reduce=(False,),
    )
    result = search(gpt3, A100, num_gpus=8, global_batch_size=8, space=space, simulate_top=4)
    assert not result.ranked
    short = [r for r in result.rejected if r.category == "out of memory"]
    needs = sorted(r.need_bytes for r in short)
    assert len(short) > 2 and needs[0] < needs[-1]
    least = min(short, key=lambda r: r.need_bytes)
    assert result.rejection_examples["out of memory"] == least.reason
    assert least.reason.startswith(f"stage 0 needs {needs[0] / 2**30:.1f} GiB")
    assert least.plan.recompute is Recompute.FULL
    assert all(r.need_bytes == 0 for r in result.rejected if r.category != "out of memory")


def test_a_need_just_above_the_capacity_is_shown_above_it() -> None:
    gib = 2.0**30
    parts = dict(weights_bytes=40 * gib, gradients_bytes=0.0, optimizer_bytes=0.0)
    near = MemoryBreakdown(
        rank=0, **parts, activations_bytes=40.02 * gib, transient_bytes=0.0, reserve_bytes=0.0
    )
    assert near.describe(capacity_bytes=80 * gib).startswith(
        "stage 0 needs 80.02 GiB, 80.0 GiB available: "
    )
    far = dataclasses.replace(near, activations_bytes=53.1 * gib)
    assert far.describe(capacity_bytes=80 * gib).startswith("stage 0 needs 93.1 GiB, 80.0 GiB")
