"""ZeRO-3 ``per-step``: FSDP2 under torch.distributed.pipelining (plansim.analytic.zero3).

A pipeline stage keeps FSDP2 from syncing and resharding until its last backward, and
torchtitan shards without resharding after forward when pp > 1: one gather and one
reduce-scatter per step, parameters and accumulated (reduce-dtype) gradients unsharded all
step. Worked on the round-number profile.
"""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import plan_state_bytes, rank_memory, rank_parameters
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.runs import RunRow
from plansim.planner.run_framework import zero3_fetch
from plansim.specs.plan import OffloadDevice, ParallelPlan, Zero3ParamFetch
from tests.unit.synthetic import round_profile
from tests.unit.test_zero2 import MODEL, _evaluate
from tests.unit.test_zero2 import _plan as zero2_plan

PER_STEP = Zero3ParamFetch.PER_STEP


def _plan(**kw: object) -> ParallelPlan:
    """test_zero2's plan (dp 2, pp 2, 8 micro-batches), ZeRO-3 per-step unless overridden."""
    return zero2_plan(**{"zero_stage": 3, "zero3_param_fetch": PER_STEP, **kw})


def test_one_reduce_scatter_and_one_gather_per_rank_and_step() -> None:
    plan = _plan()
    work = build_pipeline_work(MODEL, plan, round_profile())
    for stage in work.stages:  # nothing per micro-batch
        actions = (*stage.forward, *stage.backward, *stage.backward_input, *stage.backward_weight)
        assert "dp_comm" not in [seg.kind for seg in actions]
    per_param = plan_state_bytes(plan)
    for r, rank in enumerate(work.ranks):
        params = rank_parameters(MODEL, plan, rank=r)
        scatter, gather = rank.grad_sync[0], rank.optimizer[-1]
        assert (scatter.kind, gather.kind) == ("dp_comm", "dp_comm")
        # the accumulated gradients in their (fp32) dtype, the 16-bit parameters
        assert scatter.num_bytes == pytest.approx(params * per_param.grad, rel=1e-12)
        assert gather.num_bytes == pytest.approx(params * per_param.param, rel=1e-12)
        assert scatter.duration_s > 0 and gather.duration_s > 0


def test_the_step_moves_the_same_bytes_for_any_number_of_micro_batches() -> None:
    def dp_bytes(gbs: int, fetch: Zero3ParamFetch) -> float:
        rows = _evaluate(_plan(global_batch_size=gbs, zero3_param_fetch=fetch)).result.timeline
        return float(rows.loc[rows["kind"] == "dp_comm", "bytes"].sum())

    assert dp_bytes(16, PER_STEP) == pytest.approx(dp_bytes(4, PER_STEP), rel=1e-12)
    # the per-micro-batch FSDP it replaces moves m times as much
    per_layer = Zero3ParamFetch.LAYER_PREFETCH
    assert dp_bytes(16, per_layer) > 3 * dp_bytes(4, per_layer)
    per_step = _evaluate(_plan())
    per_microbatch = _evaluate(_plan(zero3_param_fetch=per_layer))
    assert (
        per_step.exposed_comm_s_by_kind["dp_comm"]
        < per_microbatch.exposed_comm_s_by_kind["dp_comm"]
    )


def test_the_rank_holds_its_parameters_and_accumulated_gradients_unsharded() -> None:
    prof = round_profile()
    per_step = rank_memory(MODEL, _plan(), prof, rank=0)
    zero1 = rank_memory(
        MODEL, _plan(zero_stage=1, zero3_param_fetch=Zero3ParamFetch.LAYER_PREFETCH), prof, rank=0
    )
    per_param = plan_state_bytes(_plan())
    held = rank_parameters(MODEL, _plan(), rank=0) * (per_param.param + per_param.grad)
    assert per_step.transient_bytes - zero1.transient_bytes == pytest.approx(held, rel=1e-12)
    per_layer = rank_memory(
        MODEL, _plan(zero3_param_fetch=Zero3ParamFetch.LAYER_PREFETCH), prof, rank=0
    )
    assert per_step.transient_bytes > 3 * per_layer.transient_bytes


def test_deepspeed_offload_is_refused_with_it() -> None:
    with pytest.raises(SpecError, match=r"zero3_param_fetch=per-step .* offload_optimizer none"):
        _plan(offload_optimizer=OffloadDevice.CPU)


@pytest.mark.parametrize(
    ("framework", "pp", "fetch"),
    [
        ("torchtitan (2024)", "8", PER_STEP),
        ("torchtitan (2024)", "1", Zero3ParamFetch.LAYER_PREFETCH),
        ("torchtitan (2024)", "", PER_STEP),  # pp searched: the search keeps pp 1 per layer
        ("PyTorch FSDP (2023)", "8", Zero3ParamFetch.LAYER_PREFETCH),
    ],
)
def test_the_back_test_gives_it_to_torchtitan_rows_with_a_pipeline(
    framework: str, pp: str, fetch: Zero3ParamFetch
) -> None:
    row = RunRow(path="runs.csv", line=2, cells={"row_id": "Z1", "framework": framework, "pp": pp})
    notes: list[str] = []
    assert zero3_fetch(row, 2024, notes) is fetch
    assert bool(notes) == (fetch is PER_STEP)


def test_a_search_with_it_leaves_out_deepspeed_offload_for_zero3() -> None:
    from plansim.planner.enumerate import enumerate_plans
    from plansim.planner.space import SearchSpace

    space = SearchSpace(
        zero_stages=(1, 3),
        zero3_param_fetch=PER_STEP,
        offloads=(
            (OffloadDevice.NONE, OffloadDevice.NONE),
            (OffloadDevice.CPU, OffloadDevice.NONE),
        ),
    )
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=16, space=space, num_layers=24))
    assert plans  # no SpecError from a per-step plan with offload
    zero3 = [p for p in plans if p.zero_stage == 3]
    assert zero3 and all(p.offload_optimizer is OffloadDevice.NONE for p in zero3)
    assert any(p.offload_optimizer is OffloadDevice.CPU for p in plans if p.zero_stage == 1)


def test_simulate_refuses_a_fetch_mode_without_zero3(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "16"]
    args += ["--tp", "1", "--pp", "2", "--mbs", "1", "--gbs", "16"]
    assert main([*args, "--zero", "2", "--zero3-param-fetch", "per-step"]) == 2
    assert "--zero3-param-fetch per-step needs --zero 3 (got --zero 2)" in capsys.readouterr().err
    assert main([*args, "--zero", "3", "--zero3-param-fetch", "per-step"]) == 0
    assert "zero3-per-step" in capsys.readouterr().out


def test_a_per_step_search_gathers_per_layer_without_a_pipeline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from plansim.planner.enumerate import enumerate_plans
    from plansim.planner.space import SearchSpace

    space = SearchSpace(zero_stages=(3,), zero3_param_fetch=PER_STEP)
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=16, space=space, num_layers=24))
    fetch = {p.pp > 1: p.zero3_param_fetch for p in plans}
    assert fetch == {False: Zero3ParamFetch.LAYER_PREFETCH, True: PER_STEP}
    args = ["plan", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    args += ["--gbs", "16", "--zero", "3", "--pp", "1,2", "--top", "40"]
    assert main([*args, "--zero3-param-fetch", "per-step"]) == 0
    out = capsys.readouterr().out
    assert "zero3_fetch" in out and "per-step" in out and "layer-prefetch" in out
