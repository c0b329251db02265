"""The search's compute-only bounds: below the full bound, refined lazily to the same
simulated plans, and memoised under keys that leave out only fields they ignore."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plansim.analytic import memory, stage_compute, stored_activations
from plansim.analytic.stage_compute import stage_compute_s
from plansim.analytic.stored_activations import microbatch_activation_bytes, stage_activation_bytes
from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.planner import search as search_module
from plansim.planner.bounds import compute_lower_bound_s, step_time_lower_bound_s
from plansim.planner.context import SearchContext
from plansim.planner.enumerate import layouts
from plansim.planner.parallel import Workers
from plansim.planner.search import search
from plansim.planner.space import SearchSpace
from plansim.schedule import build_actions
from plansim.sim import simulate
from plansim.specs.hardware import HardwareProfile, HostSpec
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    DpSync,
    ExecutionSpec,
    OffloadDevice,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)
from tests.unit.synthetic import round_profile
from tests.unit.test_planner_pruning import _uniform_work
from tests.unit.test_work_memo import BASE, H100, MODEL

A100 = load_profile("a100-sxm4-80gb")
#: The looped schedules (V and dual placements: tests/unit/test_dualpipe.py).
LOOPED = [s for s in Schedule if s.placement.value == "loop"]


@pytest.mark.parametrize("schedule", LOOPED)
def test_compute_bound_of_uniform_stages_is_the_last_rank_after_the_fill(
    schedule: Schedule,
) -> None:
    p, m = 4, 8
    v = 2 if schedule is Schedule.INTERLEAVED_1F1B else 1
    split = schedule is Schedule.ZB_H1
    work = _uniform_work(p, m, v, split=split)
    backward = ("backward_input", "backward_weight") if split else ("backward",)
    stages = tuple(
        (
            sum(s.duration_s for s in st.forward),
            sum(s.duration_s for part in backward for s in getattr(st, part)),
        )
        for st in work.stages
    )
    quick = compute_lower_bound_s(stages, num_ranks=p, num_microbatches=m)
    # F = 1 s, B = 2 s (ZB-H1: I + W = 1.5 s) per chunk: the last rank waits 3 forwards,
    # then runs m v (F + B)
    assert quick == pytest.approx(3 * 1.0 + m * v * (2.5 if split else 3.0), rel=1e-5)
    full = step_time_lower_bound_s(work, schedule=schedule)
    simulated = simulate(build_actions(schedule, num_ranks=p, num_microbatches=m, vpp=v), work)
    assert quick < full <= simulated.step_time_s


SPACE = SearchSpace(max_micro_batch_size=2, max_vpp=4)


@pytest.mark.parametrize(("name", "profile", "gpus", "gbs", "k"), [
    ("megatron-1.7b", A100, 8, 16, 10),
    ("megatron-7.5b", round_profile(gpus_per_node=4), 16, 32, 5),
    ("llama3-8b", A100, 16, 32, 3),
])  # fmt: skip
def test_lazy_refinement_simulates_the_plans_eager_bounds_would(
    name: str, profile: object, gpus: int, gbs: int, k: int
) -> None:
    model = resolve_model(name)
    kw = dict(num_gpus=gpus, global_batch_size=gbs, space=SPACE, with_estimate=False)
    runs, costed = [], []
    for refine in (True, False):
        with Workers(model, profile, jobs=1) as workers:  # type: ignore[arg-type]
            _, feasible, _ = search_module._cost_all(
                workers,
                refine=refine,
                progress=None,
                **kw,  # type: ignore[arg-type]
            )
            assert all(c.refined is refine for c in feasible)
            sims, fully_costed = search_module._branch_and_bound(
                workers, feasible, top_k=k, exhaustive=False, progress=None
            )
        runs.append([(c.label, c.bound_s, out.step_time_s) for c, out in sims])  # type: ignore[union-attr]
        costed.append(fully_costed)
    eager, lazy = runs
    assert lazy == eager  # same plans, same order, same full bounds and times
    assert len(feasible) > 4 * len(lazy)  # and the search did prune
    assert costed[0] == len(feasible)  # eager: every plan costed in full
    assert len(lazy) <= costed[1] < len(feasible) / 2  # lazy: most plans never costed
    result = search(model, profile, top_k=k, space=SPACE, num_gpus=gpus, global_batch_size=gbs)  # type: ignore[arg-type]
    assert result.num_fully_costed == costed[1]


ZERO3 = {"zero_stage": 3, "overlap_grad_reduce": False}
INTERLEAVED = {"vpp": 2, "schedule": Schedule.INTERLEAVED_1F1B}
PS = {"zero_stage": 0, "dp_sync": DpSync.PARAMETER_SERVER}

#: field -> (what both plans share beyond BASE, what the second one changes)
PAIRS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "dp": ({}, {"dp": 8}),
    "global_batch_size": ({}, {"global_batch_size": 32}),
    "zero_stage": ({}, {"zero_stage": 2}),
    "schedule": ({}, {"schedule": Schedule.GPIPE}),
    "overlap_p2p_comm": (INTERLEAVED, {"overlap_p2p_comm": True}),
    "overlap_grad_reduce": ({}, {"overlap_grad_reduce": False}),
    "overlap_param_gather": ({}, {"overlap_param_gather": True}),
    "gradient_accumulation_fusion": ({}, {"gradient_accumulation_fusion": False}),
    "fused_elementwise": ({}, {"fused_elementwise": False}),
    "persist_layer_norm": ({}, {"persist_layer_norm": False}),
    "grad_reduce_in_bf16": ({}, {"grad_reduce_in_bf16": True}),
    "scatter_gather_p2p": ({}, {"scatter_gather_p2p": False}),
    "dp_sync": ({"zero_stage": 0}, {"dp_sync": DpSync.PARAMETER_SERVER}),
    "ps_servers": (PS, {"ps_servers": 2}),
    "offload_optimizer": ({}, {"offload_optimizer": OffloadDevice.CPU}),
    "offload_param": (
        {**ZERO3, "offload_optimizer": OffloadDevice.CPU},
        {"offload_param": OffloadDevice.CPU},
    ),
    "zero3_param_fetch": (ZERO3, {"zero3_param_fetch": Zero3ParamFetch.PER_TENSOR_SYNC}),
    "use_torch_fsdp2": (ZERO3, {"use_torch_fsdp2": True}),
    "reshard_after_forward": (ZERO3, {"reshard_after_forward": False}),
    "dp_shard": ({}, {"dp_shard": 2}),
    # dense here; tests/unit/test_moe_planning.py checks a model with experts
    "ep": ({"etp": 1}, {"ep": 2}),
}


def _stage_compute(plan: ParallelPlan) -> object:
    return stage_compute_s(MODEL, plan, H100)


def _activations(plan: ParallelPlan) -> object:
    per_rank = [microbatch_activation_bytes(MODEL, plan, rank=r) for r in range(plan.pp)]
    per_stage = [stage_activation_bytes(MODEL, plan, stage=s) for s in range(plan.num_stages)]
    return per_rank, per_stage


def _working_set(plan: ParallelPlan) -> object:
    return [memory._working_bytes(MODEL, plan, rank=r) for r in range(plan.pp)]


@pytest.mark.parametrize(
    ("excluded", "price"),
    [
        (stage_compute.NOT_IN_COMPUTE, _stage_compute),
        (stored_activations.NOT_IN_ACTIVATIONS, _activations),
        (stored_activations.NOT_IN_ACTIVATIONS, _working_set),
    ],
    ids=["stage compute", "activations per micro-batch", "transient working set"],
)
def test_memo_keys_leave_out_only_fields_the_quantity_ignores(
    excluded: tuple[str, ...], price: object
) -> None:
    assert set(excluded) <= set(PAIRS)  # every left-out field is checked here
    for field in excluded:
        common, change = PAIRS[field]
        first = BASE.with_fields(**common)  # type: ignore[arg-type]
        second = first.with_fields(**change)  # type: ignore[arg-type]
        assert price(first) == price(second), field  # type: ignore[operator]
    # and the check can fail: a field the quantity depends on changes it
    assert price(BASE) != price(BASE.with_fields(micro_batch_size=2, global_batch_size=32))  # type: ignore[operator]
    assert price(BASE) != price(BASE.with_fields(tp=4))  # type: ignore[operator]


#: The H100 profile with a host for offloaded states (a what-if: round figures, not a
#: measured host).
HOST_H100 = replace(
    H100,
    host=HostSpec(
        memory_bytes=2.0**41,
        adam_params_per_s=1e9,
        nvme_read_bytes_per_s=10e9,
        nvme_write_bytes_per_s=5e9,
    ),
)

#: Spaces beyond the default one: context parallelism, offload, parameter servers, hybrid
#: sharding, fp8 with bf16 edge layers, every overlap flag.
RICH_SPACES = (
    SearchSpace(
        cp=None,
        micro_batch_size=(1,),
        recomputes=(Recompute.NONE, Recompute.FULL),
        offloads=(
            (OffloadDevice.NONE, OffloadDevice.NONE),
            (OffloadDevice.CPU, OffloadDevice.NONE),
            (OffloadDevice.CPU, OffloadDevice.CPU),
        ),
        dp_syncs=(DpSync.RING, DpSync.PARAMETER_SERVER),
        overlap_param_gather=(False, True),
        tp_comm_overlap=(False, True),
        grad_reduce_in_bf16=(False, True),
        hsdp_shard_gpus=8,
    ),
    SearchSpace(
        max_micro_batch_size=2,
        precision=Precision.FP8,
        bf16_layers=(1, 1),
        zero3_param_fetch=Zero3ParamFetch.PER_TENSOR_SYNC,
        execution=ExecutionSpec(gradient_accumulation_fusion=False),
    ),
)


def _compute_only_bound_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, ctx: SearchContext
) -> float:
    """The bound from the stages' compute-stream seconds alone (no ZeRO segments)."""
    return compute_lower_bound_s(
        stage_compute_s(model, plan, profile, memo=ctx.memo),
        num_ranks=plan.pp,
        num_microbatches=plan.num_microbatches,
    )


@pytest.mark.parametrize("space", RICH_SPACES, ids=["cp offload ps hsdp", "fp8 bf16-layers"])
def test_compute_bound_stays_below_the_full_bound_across_the_plan_features(
    space: SearchSpace,
) -> None:
    model, gpus = resolve_model("llama3-8b"), 8
    ctx = SearchContext(model, HOST_H100)
    checked = 0
    for layout in layouts(gpus, space):
        costing = ctx.cost_layout(layout, num_gpus=gpus, global_batch_size=32, space=space)
        for cand in costing.feasible:
            plan = cand.plan
            quick = _compute_only_bound_s(model, plan, HOST_H100, ctx)
            assert 0 < quick <= cand.bound_s, cand.label
            checked += 1
    assert checked > 100


@pytest.mark.parametrize(
    "extra",
    [{}, {"reshard_after_forward": (True, False)}, {"zero3_param_fetch": Zero3ParamFetch.PER_STEP}],
    ids=["default", "kept gathered", "per-step"],
)
def test_the_cheap_bound_of_sharded_plans_counts_their_zero_segments_and_stays_a_bound(
    extra: dict[str, object],
) -> None:
    # ZeRO-2/3 plans: the cheap bound adds the ZeRO segments their actions hold
    # (zero_segments.sharded_action_s), per plan, since ZeRO-2's overlap flag changes them; it must
    # stay at or below each plan's full bound, with FSDP's knobs too.
    model, gpus = resolve_model("llama3-8b"), 8
    space = SearchSpace(
        zero_stages=(2, 3), micro_batch_size=(1,), recomputes=(Recompute.NONE,), **extra
    )  # type: ignore[arg-type]
    ctx = SearchContext(model, A100)
    tighter = checked = 0
    for layout in layouts(gpus, space):
        costing = ctx.cost_layout(
            layout, num_gpus=gpus, global_batch_size=32, space=space, refine=False
        )
        for cand in costing.feasible:
            plan = cand.plan
            compute_only = _compute_only_bound_s(model, plan, A100, ctx)
            (full,) = ctx.refine_bounds((plan,))
            assert compute_only <= cand.bound_s <= full, cand.label
            tighter += cand.bound_s > compute_only * 1.01
            checked += 1
    assert checked > 20 and tighter > checked / 2, (tighter, checked)
