"""Exact branch-and-bound search: lower bounds, pruned == exhaustive, jobs, progress."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from plansim.analytic.stage_compute import stage_compute_s
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.bounds import compute_lower_bound_s, step_time_lower_bound_s
from plansim.planner.context import SearchContext
from plansim.planner.enumerate import SearchSpace, layouts
from plansim.planner.evaluate import Evaluation
from plansim.planner.search import SearchResult, search
from plansim.schedule import build_actions
from plansim.sim import simulate
from plansim.specs.plan import Recompute, Schedule
from plansim.specs.work import P2P, GradBucket, PipelineWork, RankWork, Segment, StageWork
from tests.unit.synthetic import round_profile

A100 = load_profile("a100-sxm4-80gb")

#: (model, profile, GPUs, global batch): small clusters; few GPUs per node so transfers
#: cross the NIC and share links (where the engine can exceed the bound).
CASES = (
    ("megatron-1.7b", A100, 8, 16),
    ("megatron-7.5b", round_profile(gpus_per_node=4), 16, 32),
    ("megatron-1.7b", round_profile(gpus_per_node=2), 16, 64),
    ("llama3-8b", A100, 16, 32),
)


def _sample_candidates(seed: int, per_case: int) -> list[tuple[SearchContext, object]]:
    rng = random.Random(seed)
    picked = []
    for name, profile, gpus, gbs in CASES:
        ctx = SearchContext(resolve_model(name), profile)
        space = SearchSpace(max_micro_batch_size=4, schedules=tuple(Schedule))
        feasible = []
        for layout in layouts(gpus, space):
            feasible += ctx.cost_layout(
                layout, num_gpus=gpus, global_batch_size=gbs, space=space
            ).feasible
        picked += [(ctx, cand) for cand in rng.sample(feasible, per_case)]
    return picked


def test_lower_bound_never_exceeds_the_simulated_step_time() -> None:
    ratios = []
    quick_ratios: list[float] = []
    schedules = set()
    for ctx, cand in _sample_candidates(seed=5, per_case=30):
        ev = ctx.simulate(cand.plan, keep_below_s=float("inf"))  # type: ignore[attr-defined]
        if not isinstance(ev, Evaluation):
            continue
        assert cand.bound_s <= ev.step_time_s, cand.label  # type: ignore[attr-defined]
        plan = cand.plan  # type: ignore[attr-defined]
        if not plan.schedule.overlaps_forward_backward:  # DualPipe's: 0, its TP/EP may hide
            quick = compute_lower_bound_s(
                stage_compute_s(ctx.model, plan, ctx.profile),  # type: ignore[attr-defined]
                num_ranks=plan.pp,
                num_microbatches=plan.num_microbatches,
                placement=plan.schedule.placement,
            )  # the search's cheap bound, refined to this one: never above it
            assert 0 < quick <= cand.bound_s, cand.label  # type: ignore[attr-defined]
            quick_ratios.append(quick / cand.bound_s)  # type: ignore[attr-defined]
        ratios.append(cand.bound_s / ev.step_time_s)  # type: ignore[attr-defined]
        schedules.add(cand.plan.schedule)  # type: ignore[attr-defined]
    assert len(ratios) >= 100
    assert schedules == set(Schedule)
    # a useful bound: tight on most plans, never trivially small
    assert min(ratios) > 0.5
    assert sorted(ratios)[len(ratios) // 2] > 0.95
    assert sorted(quick_ratios)[len(quick_ratios) // 2] > 0.8  # most plans mostly compute


def _uniform_work(p: int, m: int, v: int, *, split: bool) -> PipelineWork:
    def seg(kind: str, seconds: float) -> tuple[Segment, ...]:
        return (Segment(kind=kind, stream="compute", duration_s=seconds),)

    stage = StageWork(
        forward=seg("forward", 1.0),
        backward=seg("backward", 2.0),
        backward_input=seg("backward_input", 1.0) if split else (),
        backward_weight=seg("backward_weight", 0.5) if split else (),
        send_forward=P2P(duration_s=0.0, num_bytes=0.0),
        send_backward=P2P(duration_s=0.0, num_bytes=0.0),
        activation_bytes=1.0,
    )
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=seg("optimizer", 0.25))
    return PipelineWork(stages=(stage,) * (p * v), ranks=(rank,) * p, num_microbatches=m)


@pytest.mark.parametrize(
    ("schedule", "p", "m", "v", "oracle_s"),
    [
        (Schedule.ONE_F_ONE_B, 4, 8, 1, (8 + 3) * 3.0),  # (m + p - 1)(F + B)
        (Schedule.GPIPE, 4, 8, 1, (8 + 3) * 3.0),
        (Schedule.INTERLEAVED_1F1B, 4, 8, 2, (8 + 3 / 2) * 2 * 3.0),  # (m + (p-1)/v) v (F+B)
        (Schedule.ZB_H1, 4, 8, 1, 8 * 2.5 + 3 * (1.0 + 1.0 - 0.5)),  # m(F+I+W) + (p-1)(F+I-W)
    ],
)
def test_bound_reaches_the_textbook_pipeline_time_with_uniform_costs(
    schedule: Schedule, p: int, m: int, v: int, oracle_s: float
) -> None:
    work = _uniform_work(p, m, v, split=schedule is Schedule.ZB_H1)
    bound = step_time_lower_bound_s(work, schedule=schedule)
    simulated = simulate(build_actions(schedule, num_ranks=p, num_microbatches=m, vpp=v), work)
    assert bound == pytest.approx(oracle_s + 0.25, rel=1e-9)
    assert bound <= simulated.step_time_s == pytest.approx(oracle_s + 0.25, rel=1e-12)


def test_bound_counts_gradient_buckets_left_after_the_last_backward() -> None:
    work = _uniform_work(2, 4, 1, split=False)
    dp = Segment(kind="dp_comm", stream="dp", duration_s=3.0)
    buckets = (GradBucket(segment=dp, ready_fraction=0.5), GradBucket(segment=dp))
    stages = tuple(replace(st, grad_buckets=buckets) for st in work.stages)
    work = replace(work, stages=stages, overlap_grad_reduce=True)
    bound = step_time_lower_bound_s(work, schedule=Schedule.ONE_F_ONE_B)
    simulated = simulate(build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=4), work)
    # pipeline (m + p - 1)(F + B) = 15 s; rank 0's last B runs 13-15 s: bucket 1 is ready at
    # 14 s (half of it), runs 14-17 s, bucket 2 (ready at 15 s) 17-20 s, optimizer 0.25 s
    assert bound == pytest.approx(20.25, rel=1e-9)
    assert bound <= simulated.step_time_s == pytest.approx(20.25)


def _top(result: SearchResult, k: int) -> list[tuple[str, float, float]]:
    return [(e.plan.label(), e.step_time_s, e.peak_memory_bytes) for e in result.ranked[:k]]


SMALL_SPACE = SearchSpace(
    max_micro_batch_size=1,
    zero_stages=(0, 1, 3),
    recomputes=(Recompute.NONE, Recompute.FULL),
    max_vpp=3,
)


@pytest.mark.parametrize(("name", "profile", "gpus", "gbs", "k"), [
    ("megatron-1.7b", A100, 8, 16, 10),
    ("megatron-7.5b", round_profile(gpus_per_node=4), 16, 32, 5),
    ("megatron-1.7b", round_profile(gpus_per_node=2), 8, 32, 3),
])  # fmt: skip
def test_pruned_search_returns_the_exhaustive_top_k(
    name: str, profile: object, gpus: int, gbs: int, k: int
) -> None:
    kw = dict(num_gpus=gpus, global_batch_size=gbs, space=SMALL_SPACE, top_k=k)
    model = resolve_model(name)
    pruned = search(model, profile, **kw)  # type: ignore[arg-type]
    full = search(model, profile, exhaustive=True, **kw)  # type: ignore[arg-type]
    assert full.num_simulated == full.num_feasible > 3 * pruned.num_simulated
    assert pruned.num_simulated + pruned.num_not_simulated == pruned.num_feasible
    assert _top(pruned, k) == _top(full, k)
    assert len(pruned.ranked) >= k


def test_results_are_identical_for_any_number_of_jobs() -> None:
    model = resolve_model("megatron-1.7b")
    kw = dict(num_gpus=8, global_batch_size=16, space=SMALL_SPACE, top_k=4)
    one = search(model, A100, jobs=1, **kw)  # type: ignore[arg-type]
    two = search(model, A100, jobs=2, **kw)  # type: ignore[arg-type]
    assert _top(one, len(one.ranked)) == _top(two, len(two.ranked))
    assert one.rejected == two.rejected
    assert (one.num_candidates, one.num_feasible, one.num_simulated) == (
        two.num_candidates,
        two.num_feasible,
        two.num_simulated,
    )


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def start(self, phase: str, total: int) -> None:
        self.events.append(("start", (phase, total)))

    def update(
        self, done: int, *, feasible: int | None = None, best_s: float | None = None
    ) -> None:
        self.events.append(("update", (done, feasible, best_s)))

    def close(self) -> None:
        self.events.append(("close", None))


def test_progress_reports_phases_counts_and_best_so_far() -> None:
    rec = _Recorder()
    model = resolve_model("megatron-1.7b")
    result = search(model, A100, num_gpus=8, global_batch_size=16, space=SMALL_SPACE, progress=rec)
    starts = [e for kind, e in rec.events if kind == "start"]
    # 8 GPUs: (tp, pp) with tp * pp dividing 8 -> 4 + 3 + 2 + 1 layouts
    assert starts == [("cost layouts", 10), ("simulate", result.num_feasible)]
    updates = [e for kind, e in rec.events if kind == "update"]
    assert sum(u[0] for u in updates) == 10 + result.num_feasible  # type: ignore[index]
    assert updates[-1][2] == result.ranked[0].step_time_s  # type: ignore[index]
    assert rec.events[-1] == ("close", None)


def test_search_argument_errors() -> None:
    model = resolve_model("megatron-1.7b")
    kw = dict(num_gpus=8, global_batch_size=16, space=SMALL_SPACE)
    with pytest.raises(SpecError, match="exclude each other"):
        search(model, A100, simulate_top=4, exhaustive=True, **kw)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="jobs must be a positive integer"):
        search(model, A100, jobs=0, **kw)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="top_k must be a positive integer"):
        search(model, A100, top_k=0, **kw)  # type: ignore[arg-type]


def test_plan_cli_search_modes(capsys: pytest.CaptureFixture[str]) -> None:
    from plansim.cli import main

    base = ["plan", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    args = [*base, "--gbs", "16", "--top", "2", "--jobs", "1", "--format", "json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["plans"]) == 2
    assert doc["num_simulated"] + doc["num_not_simulated"] == doc["num_feasible"]
    assert 2 <= doc["num_simulated"] < doc["num_feasible"] // 10
    assert main([*args[:-2], "--simulate-top", "2", "--exhaustive"]) == 2
    assert "--simulate-top and --exhaustive exclude each other" in capsys.readouterr().err
    assert main([*base, "--gbs", "16", "--jobs", "0"]) == 2
    assert "--jobs must be a positive integer, got 0" in capsys.readouterr().err


def test_pruned_search_stays_exact_with_the_megatron_overlap_flags() -> None:
    """TP communication overlap and the overlapped parameter all-gather shorten the work the
    bound is taken from, so the exact search must still equal the exhaustive one."""
    space = replace(SMALL_SPACE, tp_comm_overlap=(False, True), overlap_param_gather=(False, True))
    kw = dict(num_gpus=8, global_batch_size=16, space=space, top_k=6)
    model = resolve_model("megatron-1.7b")
    pruned = search(model, A100, **kw)  # type: ignore[arg-type]
    full = search(model, A100, exhaustive=True, **kw)  # type: ignore[arg-type]
    assert _top(pruned, 6) == _top(full, 6)
    flags = [(e.plan.tp_comm_overlap, e.plan.overlap_param_gather) for e in full.ranked]
    assert (True, False) in flags or (True, True) in flags
    assert any(param for _, param in flags)


def test_the_first_round_simulates_top_k_plans_and_stays_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The top_k lowest full bounds are all under the final K-th step time, so the exact
    search simulates them in one first round (fewer rounds, no plan it would not simulate
    anyway); later rounds keep PRUNED_BATCH. The top 7 still equals the exhaustive one."""
    import plansim.planner.search as search_module

    rounds: list[int] = []
    real = search_module._simulate

    def recording(workers, chosen, *, keep_below_s, cache=None):  # type: ignore[no-untyped-def]
        rounds.append(len(chosen))
        return real(workers, chosen, keep_below_s=keep_below_s, cache=cache)

    monkeypatch.setattr(search_module, "_simulate", recording)
    model, space = resolve_model("megatron-1.7b"), SearchSpace(max_micro_batch_size=4)
    pruned = search(model, A100, num_gpus=8, global_batch_size=16, space=space, top_k=7)
    assert search_module.PRUNED_BATCH < 7 < pruned.num_feasible
    assert rounds[0] == 7 and all(r <= search_module.PRUNED_BATCH for r in rounds[1:])
    assert sum(rounds) == pruned.num_simulated
    rounds.clear()
    full = search(
        model, A100, num_gpus=8, global_batch_size=16, space=space, top_k=7, exhaustive=True
    )
    top = [(ev.plan.label(), ev.step_time_s) for ev in pruned.ranked[:7]]
    assert top == [(ev.plan.label(), ev.step_time_s) for ev in full.ranked[:7]]
