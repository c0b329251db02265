"""ZB-V, DualPipeV and DualPipe: action lists (torch cross-check, invariants, CSV), the bubble
against DeepSeek-V3 Table 2 read from events, the overlapped F&B hiding communication,
memory per schedule, plan rules, planner bounds and the steady-state extrapolation.

Notation as DeepSeek-V3 (arXiv:2412.19437) Table 2: F forward, B full backward, W weight
gradient, F&B an overlapped forward-and-backward pair; p pipeline ranks, m micro-batches.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from plansim.analytic.params import rank_parameters
from plansim.analytic.stored_activations import microbatches_in_flight
from plansim.catalog import MOE_PRESETS, resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.bounds import step_time_lower_bound_s
from plansim.planner.enumerate import SearchSpace, _schedules
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.schedule import ScheduleError, build_actions, check_actions
from plansim.schedule.actions import (
    Action,
    OverlapFB,
    PerRankActions,
    format_actions_csv,
    parse_actions_csv,
    parse_item,
    parts,
)
from plansim.sim import SimResult, simulate
from plansim.sim import timeline as tl
from plansim.specs.plan import Precision, Recompute, Schedule, plan_from_fields
from plansim.specs.stage_placement import StageGraph, StagePlacement
from plansim.specs.work import P2P, PipelineWork, RankWork, Segment, StageWork

V_SCHEDULES = (Schedule.ZB_V, Schedule.DUALPIPE_V)


def strs(actions: PerRankActions) -> list[list[str]]:
    return [[str(item) for item in row] for row in actions]


def _segs(kind: str, seconds: float, stream: str = "compute") -> tuple[Segment, ...]:
    return (Segment(kind=kind, stream=stream, duration_s=seconds),) if seconds else ()


def uniform_work(
    schedule: Schedule,
    p: int,
    m: int,
    *,
    f: float = 1.0,
    i: float = 1.0,
    w: float = 1.0,
    comm_s: float = 0.0,
    num_layers: int = 1,
) -> PipelineWork:
    """Equal stages of F = f, I = i, W = w (B = i + w), each pass followed by ``comm_s`` of
    blocking communication (an all-to-all on the ``tp`` stream), free P2P."""
    comm = _segs("ep_comm", comm_s, "tp")
    stage = StageWork(
        forward=_segs("forward", f) + comm,
        backward=_segs("backward", i + w) + comm,
        backward_input=_segs("backward_input", i) + comm,
        backward_weight=_segs("backward_weight", w),
        send_forward=P2P(duration_s=0.0, num_bytes=0.0),
        send_backward=P2P(duration_s=0.0, num_bytes=0.0),
        activation_bytes=1.0,
        num_layers=num_layers,
    )
    placement = schedule.placement
    num_stages = p if placement is StagePlacement.LOOP else 2 * p
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=())
    return PipelineWork(
        stages=(stage,) * num_stages,
        ranks=(rank,) * p,
        num_microbatches=m,
        placement=placement,
    )


def run(schedule: Schedule, p: int, m: int, **costs: float) -> SimResult:
    vpp = 2 if schedule.placement is StagePlacement.V else 1
    actions = build_actions(schedule, num_ranks=p, num_microbatches=m, vpp=vpp)
    return simulate(actions, uniform_work(schedule, p, m, **costs))  # type: ignore[arg-type]


def idle_s(result: SimResult) -> list[float]:
    """Each rank's compute-idle seconds within the pipeline time, read from the events."""
    return [result.pipeline_time_s * b for b in result.per_rank_bubble_fraction]


# --- action lists ------------------------------------------------------------------------


def _torch_rank_order(cls: type, p: int, m: int, rank: int) -> list[str]:
    """torch's planned compute order of one rank, its planner run on a stand-in object (it
    reads only the group size, the micro-batches and the stage count)."""
    fake = SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p, _num_stages=2 * p)
    return [str(a) for a in cls._calculate_single_rank_operations(fake, rank) if a is not None]


@pytest.mark.parametrize("schedule", V_SCHEDULES)
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (3, 5), (4, 8), (4, 13), (5, 10), (6, 24)])
def test_v_orders_equal_torchs_classes(schedule: Schedule, p: int, m: int) -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if schedule is Schedule.DUALPIPE_V and m < 2 * p:
        with pytest.raises(SpecError, match=r"needs num_microbatches\(\d+\) >= the stages"):
            build_actions(schedule, num_ranks=p, num_microbatches=m, vpp=2)
        return
    cls = {
        Schedule.ZB_V: schedules.ScheduleZBVZeroBubble,
        Schedule.DUALPIPE_V: schedules.ScheduleDualPipeV,
    }[schedule]
    ours = strs(build_actions(schedule, num_ranks=p, num_microbatches=m, vpp=2))
    assert ours == [_torch_rank_order(cls, p, m, r) for r in range(p)]


def test_zb_v_order_p2_m4_by_hand() -> None:
    # rank 0: chunks 0 (down) and 3 (up); rank 1: chunks 1 and 2 (the turn of the V)
    rank0 = (
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 "
        "0I2 0W2 0I3 0W3"
    )
    # one down F; (up F, down F); the up triple; steady triples; (down I, up I); W last
    rank1 = (
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 "
        "1I3 1W2 2W3 1W3"
    )
    ours = build_actions(Schedule.ZB_V, num_ranks=2, num_microbatches=4, vpp=2)
    assert [" ".join(row) for row in strs(ours)] == [rank0, rank1]


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 12), (6, 12), (8, 16), (8, 30)])
def test_dualpipe_lists_pass_every_invariant(p: int, m: int) -> None:
    actions = build_actions(Schedule.DUALPIPE, num_ranks=p, num_microbatches=m)
    check_actions(actions, num_microbatches=m, placement=StagePlacement.DUAL)
    graph = StageGraph(
        placement=StagePlacement.DUAL, num_ranks=p, num_stages=2 * p, num_microbatches=m
    )
    for rank, row in enumerate(actions):
        done = [a for item in row for a in parts(item)]
        assert {graph.rank_of_stage(a.stage) for a in done} == {rank}
        # each rank runs one chunk of each copy, m/2 micro-batches through each
        assert sorted({a.stage for a in done}) == [rank, 2 * p - 1 - rank]
        assert sum(a.kind.value == "F" for a in done) == m
    # ranks r and p - 1 - r run mirrored lists (the same step loop, copies swapped)
    for rank in range(p // 2):
        mirror = p - 1 - rank
        assert [type(i) for i in actions[rank]] == [type(i) for i in actions[mirror]]
    assert any(isinstance(item, OverlapFB) for item in actions[0])


def test_dualpipe_refuses_what_the_repository_asserts() -> None:
    with pytest.raises(SpecError, match="even pp"):
        build_actions(Schedule.DUALPIPE, num_ranks=3, num_microbatches=12)
    with pytest.raises(SpecError, match="even num_microbatches >= 2 \\* pp"):
        build_actions(Schedule.DUALPIPE, num_ranks=4, num_microbatches=7)
    with pytest.raises(SpecError, match="vpp == 2"):
        build_actions(Schedule.ZB_V, num_ranks=4, num_microbatches=8, vpp=1)


def test_overlap_items_round_trip_torchs_csv_form() -> None:
    item = parse_item("(0F3;1B2)OVERLAP_F_B")
    assert isinstance(item, OverlapFB) and str(item) == "(0F3;1B2)OVERLAP_F_B"
    actions = build_actions(Schedule.DUALPIPE_V, num_ranks=3, num_microbatches=8, vpp=2)
    assert parse_actions_csv(format_actions_csv(actions)) == actions
    torch_actions = pytest.importorskip("torch.distributed.pipelining.schedules")._Action
    assert str(torch_actions.from_str(str(item))) == str(item)
    for bad in ("(0F3;1F2)OVERLAP_F_B", "(0F3)OVERLAP_F_B", "(0F3;1B2)OVERLAP"):
        with pytest.raises(SpecError):
            parse_item(bad)


def test_checks_catch_a_micro_batch_on_the_wrong_copy_and_a_deadlock() -> None:
    good = build_actions(Schedule.DUALPIPE, num_ranks=2, num_microbatches=4)
    wrong = (tuple(Action.parse("0F3") if str(a) == "0F0" else a for a in good[0]), *good[1:])
    with pytest.raises(ScheduleError, match="other model copy"):
        check_actions(wrong, num_microbatches=4, placement=StagePlacement.DUAL)
    # rank 1 asks for stage 2's gradient (same rank, later in its list) before producing it
    v = build_actions(Schedule.ZB_V, num_ranks=2, num_microbatches=2, vpp=2)
    swapped = list(v[1])
    i, j = swapped.index(Action.parse("1I0")), swapped.index(Action.parse("2I0"))
    swapped[i], swapped[j] = swapped[j], swapped[i]
    with pytest.raises(ScheduleError):
        check_actions((v[0], tuple(swapped)), num_microbatches=2, placement=StagePlacement.V)


# --- bubble from events against DeepSeek-V3 Table 2 --------------------------------------


def _overlapped_pair_s(result: SimResult) -> float:
    """F&B read from the timeline: the span from the start of an overlapped pair's forward
    to the end of its backward (rank 0's first pair of the main step)."""
    p = int(result.timeline[tl.RANK].max()) + 1
    m = result.simulated_microbatches
    pair = next(
        item
        for item in build_actions(Schedule.DUALPIPE, num_ranks=p, num_microbatches=m)[0]
        if isinstance(item, OverlapFB)
    )
    rows = result.timeline[
        (result.timeline[tl.RANK] == 0) & (result.timeline[tl.STREAM] == tl.COMPUTE)
    ]

    def span(action: Action) -> tuple[float, float]:
        mine = rows[(rows[tl.STAGE] == action.stage) & (rows[tl.MICROBATCH] == action.microbatch)]
        mine = (
            mine[mine[tl.KIND] != "forward"]
            if action.kind.value != "F"
            else mine[mine[tl.KIND] == "forward"]
        )
        return float(mine[tl.START_S].min()), float(mine[tl.END_S].max())

    return span(pair.backward)[1] - span(pair.forward)[0]


@pytest.mark.parametrize(("f", "i", "w"), [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 2.5, 1.0)])
@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_bubbles_equal_deepseek_v3_table_2(f: float, i: float, w: float, p: int, m: int) -> None:
    b = i + w  # Table 2's B is the whole backward
    for rank_idle in idle_s(run(Schedule.ONE_F_ONE_B, p, m, f=f, i=i, w=w)):
        assert rank_idle == pytest.approx((p - 1) * (f + b))
    for rank_idle in idle_s(run(Schedule.ZB_H1, p, m, f=f, i=i, w=w)):  # W <= min(F, I)
        assert rank_idle == pytest.approx((p - 1) * (f + b - 2 * w))
    # DualPipe's formula is stated for uniform costs, F = B(input) = W = t
    t = f
    dual = run(Schedule.DUALPIPE, p, m, f=t, i=t, w=t)
    f_and_b = _overlapped_pair_s(dual)  # read from the events: the halves take turns
    assert f_and_b == pytest.approx(3 * t)
    for rank_idle in idle_s(dual):
        assert rank_idle == pytest.approx((p // 2 - 1) * (f_and_b + 2 * t - 3 * t))


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_dualpipe_v_is_dualpipe_cut_in_half(p: int, m: int) -> None:
    # each V chunk holds half a stage: F, I, W of half the seconds; Table 2's formula with
    # 2p ranks' worth of stages folded onto p: (p - 1)(F&B + B - 3W) in chunk times
    f, i, w = 0.5, 0.5, 0.5
    result = run(Schedule.DUALPIPE_V, p, m, f=f, i=i, w=w)
    for rank_idle in idle_s(result):
        assert rank_idle == pytest.approx((p - 1) * ((f + i + w) + (i + w) - 3 * w))
    # ZB-V: only the ramp of the parallelogram, (p - 1) chunk forwards (zero bubble once
    # iterations tile, Qi et al. §6)
    for rank_idle in idle_s(run(Schedule.ZB_V, p, m, f=f, i=i, w=w)):
        assert rank_idle == pytest.approx((p - 1) * f)


def test_overlapped_pair_hides_one_halfs_all_to_all_behind_the_others_compute() -> None:
    p, m = 4, 16
    kw = {"f": 1.0, "i": 1.0, "w": 1.0, "comm_s": 0.5, "num_layers": 4}
    plain = run(Schedule.ZB_H1, p, m, **kw)
    dual = run(Schedule.DUALPIPE, p, m, **kw)
    exposed = {s: r.exposed_s_by_kind["ep_comm"] for s, r in (("zb", plain), ("dual", dual))}
    assert exposed["zb"] == pytest.approx(p * 2 * m * 0.5)  # blocking: every pass pays it
    assert exposed["dual"] < 0.5 * exposed["zb"]
    assert dual.step_time_s < plain.step_time_s
    # compute never runs twice at once on a GPU: the two halves take turns
    rows = dual.timeline
    for rank in range(p):
        mine = rows[(rows[tl.RANK] == rank) & (rows[tl.STREAM] == tl.COMPUTE)]
        starts, ends = mine[tl.START_S].to_numpy(), mine[tl.END_S].to_numpy()
        assert (starts[1:] >= ends[:-1] - 1e-12).all()


def test_overlap_slowdown_stretches_compute_beside_the_other_halfs_communication() -> None:
    p, m = 4, 16
    kw = {"f": 1.0, "i": 1.0, "w": 1.0, "comm_s": 0.5, "num_layers": 4}
    base = uniform_work(Schedule.DUALPIPE, p, m, **kw)
    actions = build_actions(Schedule.DUALPIPE, num_ranks=p, num_microbatches=m)
    fast = simulate(actions, base)
    slow = simulate(actions, dataclasses.replace(base, overlap_slowdown=0.2))
    assert slow.step_time_s > fast.step_time_s
    assert sum(slow.compute_busy_s) > sum(fast.compute_busy_s)


# --- memory ------------------------------------------------------------------------------


def _plan(schedule: Schedule, p: int, m: int, *, vpp: int = 1, **extra: object):  # type: ignore[no-untyped-def]
    return plan_from_fields(
        dp=1, tp=1, pp=p, vpp=vpp, micro_batch_size=1, global_batch_size=m, schedule=schedule,
        **extra,
    )  # fmt: skip


@pytest.mark.parametrize("p", [4, 8, 16])
def test_activations_in_flight_per_schedule(p: int) -> None:
    m = 4 * p
    one_f_one_b = [
        microbatches_in_flight(_plan(Schedule.ONE_F_ONE_B, p, m), rank=r) for r in range(p)
    ]
    zb_v = [microbatches_in_flight(_plan(Schedule.ZB_V, p, m, vpp=2), rank=r) for r in range(p)]
    dual = [microbatches_in_flight(_plan(Schedule.DUALPIPE, p, m), rank=r) for r in range(p)]
    assert one_f_one_b[0] == p
    assert zb_v == [p] * p  # ZB-V: 1F1B's first-rank peak, on every rank (Qi et al. §6)
    # DualPipe: PP + 1 stage activations (Table 2), each rank's two chunks each one stage
    assert [2 * x for x in dual] == [p + 1] * p


def test_dualpipe_keeps_two_copies_of_the_parameters() -> None:
    model = resolve_model("llama3-8b")
    loop = _plan(Schedule.ONE_F_ONE_B, 4, 16)
    dual = _plan(Schedule.DUALPIPE, 4, 16)
    v = _plan(Schedule.ZB_V, 4, 16, vpp=2)
    middle = rank_parameters(model, loop, rank=1)
    assert rank_parameters(model, dual, rank=1) == pytest.approx(2 * middle)
    # the V puts both ends on rank 0: embedding and output layer, the last rank neither
    assert rank_parameters(model, v, rank=0) > rank_parameters(model, loop, rank=0)
    assert rank_parameters(model, v, rank=3) == pytest.approx(middle)


# --- plans and the planner ---------------------------------------------------------------


def test_plan_rules_name_the_schedule_and_the_values() -> None:
    with pytest.raises(SpecError, match="zb-v needs vpp == 2"):
        _plan(Schedule.ZB_V, 4, 8)
    with pytest.raises(SpecError, match=r"dualpipev needs num_microbatches\(6\).*>= the stages"):
        _plan(Schedule.DUALPIPE_V, 4, 6, vpp=2)
    with pytest.raises(SpecError, match="dualpipe needs an even pp"):
        _plan(Schedule.DUALPIPE, 3, 12)
    with pytest.raises(SpecError, match="dualpipe needs vpp == 1"):
        _plan(Schedule.DUALPIPE, 4, 16, vpp=2)
    with pytest.raises(SpecError, match="splits the layers evenly"):
        _plan(Schedule.DUALPIPE, 4, 16, decoder_first_pipeline_num_layers=3)


def test_planner_offers_each_schedule_where_its_rules_allow() -> None:
    space = SearchSpace(schedules=tuple(Schedule))
    assert Schedule.DUALPIPE in _schedules(4, 1, 8, space)
    assert Schedule.DUALPIPE not in _schedules(4, 1, 6, space)  # m < 2 pp
    assert Schedule.DUALPIPE not in _schedules(3, 1, 12, space)  # odd pp
    assert {Schedule.ZB_V, Schedule.DUALPIPE_V} <= set(_schedules(4, 2, 8, space))
    assert Schedule.DUALPIPE_V not in _schedules(4, 2, 6, space)
    assert not {Schedule.ZB_V, Schedule.DUALPIPE_V} & set(_schedules(4, 3, 12, space))
    default = SearchSpace()  # opt-in: the default search keeps the looped schedules
    assert not {Schedule.ZB_V, Schedule.DUALPIPE_V, Schedule.DUALPIPE} & set(default.schedules)


@pytest.mark.parametrize("schedule", [Schedule.ZB_V, Schedule.DUALPIPE_V, Schedule.DUALPIPE])
@pytest.mark.parametrize(("tp", "pp", "m"), [(1, 2, 8), (2, 4, 16), (1, 4, 12)])
def test_lower_bound_stays_below_the_simulated_step(
    schedule: Schedule, tp: int, pp: int, m: int
) -> None:
    model, profile = resolve_model("llama3-8b"), load_profile("h100-sxm5-80gb")
    vpp = 2 if schedule.placement is StagePlacement.V else 1
    plan = plan_from_fields(
        dp=1, tp=tp, pp=pp, vpp=vpp, micro_batch_size=1, global_batch_size=m,
        schedule=schedule, overlap_grad_reduce=True,
    )  # fmt: skip
    outcome = evaluate(model, plan, dataclasses.replace(profile, hbm_capacity_bytes=1e15))
    assert isinstance(outcome, Evaluation)
    from plansim.analytic.cost import build_pipeline_work

    work = build_pipeline_work(model, plan, profile)
    bound = step_time_lower_bound_s(work, schedule=schedule)
    assert 0.5 * outcome.step_time_s < bound <= outcome.step_time_s


@pytest.mark.parametrize("schedule", [Schedule.ZB_V, Schedule.DUALPIPE_V, Schedule.DUALPIPE])
def test_long_steps_extrapolate_from_two_shorter_simulations(schedule: Schedule) -> None:
    model, profile = resolve_model("llama3-8b"), load_profile("h100-sxm5-80gb")
    vpp = 2 if schedule.placement is StagePlacement.V else 1
    plan = plan_from_fields(
        dp=1, tp=2, pp=4, vpp=vpp, micro_batch_size=1, global_batch_size=400,
        schedule=schedule, overlap_grad_reduce=True,
    )  # fmt: skip
    quick, whole = evaluate(model, plan, profile), evaluate(model, plan, profile, whole=True)
    assert isinstance(quick, Evaluation) and isinstance(whole, Evaluation)
    assert quick.result.simulated_microbatches < 400 == whole.result.simulated_microbatches
    assert quick.step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)


def test_deepseek_v3_dualpipe_hides_part_of_its_all_to_all() -> None:
    model, profile = MOE_PRESETS["deepseek-v3"](), load_profile("h800-sxm5-80gb")
    roomy = dataclasses.replace(profile, hbm_capacity_bytes=2 * profile.hbm_capacity_bytes)
    runs = {}
    for schedule in (Schedule.ONE_F_ONE_B, Schedule.DUALPIPE):
        plan = plan_from_fields(
            dp=128, tp=1, pp=16, ep=64, etp=1, micro_batch_size=1, global_batch_size=15360,
            zero_stage=1, precision=Precision.FP8, recompute=Recompute.SELECTIVE,
            recompute_modules="mla_up_proj,layernorm",
            pipeline_model_parallel_layout="Ettt|(tttt|)*14ttL", schedule=schedule,
        )  # fmt: skip
        outcome = evaluate(model, plan, roomy)
        assert isinstance(outcome, Evaluation)
        runs[schedule] = outcome
    one, dual = runs[Schedule.ONE_F_ONE_B], runs[Schedule.DUALPIPE]
    exposed = {s: r.result.exposed_s_by_kind["ep_comm"] for s, r in runs.items()}
    assert exposed[Schedule.DUALPIPE] < 0.8 * exposed[Schedule.ONE_F_ONE_B]
    assert dual.step_time_s < one.step_time_s
    # the hidden part sits in the overlapped pairs: ep_comm rows there run beside compute
    rows = dual.result.timeline
    ep = rows[(rows[tl.KIND] == "ep_comm") & (rows[tl.RANK] == 1)]
    assert len(ep) > 0


def test_without_an_overlap_function_the_halves_run_in_turn() -> None:
    # torch's runtime performs an OVERLAP_F_B's sub-actions one after the other (the
    # validator's simulation): nothing of the all-to-all hides, every pass pays it
    p, m = 4, 16
    kw = {"f": 1.0, "i": 1.0, "w": 1.0, "comm_s": 0.5, "num_layers": 4}
    work = dataclasses.replace(uniform_work(Schedule.DUALPIPE, p, m, **kw), overlap_fb=False)
    actions = build_actions(Schedule.DUALPIPE, num_ranks=p, num_microbatches=m)
    in_turn = simulate(actions, work)
    overlapped = simulate(actions, dataclasses.replace(work, overlap_fb=True))
    assert in_turn.exposed_s_by_kind["ep_comm"] == pytest.approx(p * 2 * m * 0.5)
    assert overlapped.step_time_s < in_turn.step_time_s


def test_a_search_memo_keeps_each_schedules_own_activation_peak() -> None:
    from plansim.analytic.stored_activations import stored_activation_bytes

    model, memo = resolve_model("llama3-8b"), {}
    for schedule in (Schedule.ZB_V, Schedule.DUALPIPE_V):  # same fields but the schedule
        plan = _plan(schedule, 4, 16, vpp=2)
        alone = stored_activation_bytes(model, plan, rank=0)
        assert stored_activation_bytes(model, plan, rank=0, memo=memo) == alone
