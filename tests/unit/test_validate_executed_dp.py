"""ZeRO-0/1 traffic as the validate run executes it (validate/executed_dp)."""

from __future__ import annotations

import pytest

from plansim.analytic.comm import collective_time_s, p2p_time_s
from plansim.analytic.elementwise import adam_step_bytes
from plansim.analytic.memory import rank_parameters, state_bytes_per_param
from plansim.analytic.ranks import layout_groups
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Precision, Schedule, plan_from_fields
from plansim.validate.executed_dp import (
    FLAT_COPY_ACCESSES,
    broadcasts_s,
    executes_flat_all_reduce,
    layer_tensors,
    rank_tensors,
    stage_tensors,
)
from plansim.validate.simulated import run_plan, simulate_plan
from tests.unit.synthetic import SMALL_GPT, SMALL_LLAMA, round_profile

GPT, LLAMA = SMALL_GPT, SMALL_LLAMA


def _plan(**fields: object) -> ParallelPlan:
    base: dict[str, object] = {"tp": 1, "pp": 1, "dp": 2, "micro_batch_size": 1}
    base.update(fields)
    base.setdefault("global_batch_size", 4 * int(base["dp"]))  # type: ignore[call-overload]
    return plan_from_fields(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", [GPT, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize(("pp", "first"), [(1, None), (2, None), (2, 1)])
def test_the_tensor_list_is_the_validate_models(
    model: ModelSpec, pp: int, first: int | None
) -> None:
    torch = pytest.importorskip("torch")
    from plansim.validate.model import build_model, split_stage

    plan = _plan(pp=pp, decoder_first_pipeline_num_layers=first)  # first: an uneven split
    full = build_model(model, seed=0)
    for stage in range(plan.num_stages):
        module = split_stage(full, model, plan, stage)
        assert isinstance(module, torch.nn.Module)
        got = tuple(p.numel() for p in module.parameters())
        assert stage_tensors(model, plan, stage) == got


def test_tensor_parallel_shards() -> None:
    h, f = GPT.hidden_size, GPT.ffn_hidden_size
    one = layer_tensors(GPT, _plan(tp=1))
    two = layer_tensors(GPT, _plan(tp=2))
    assert len(one) == len(two) == 16
    # column-parallel q/k/v/up weights and biases halve; row-parallel o/down biases and norms
    # stay whole
    assert sum(one) - sum(two) == (4 * h * h + 2 * h * f) / 2 + (3 * h + f) / 2
    interleaved = _plan(pp=2, vpp=2, schedule=Schedule.INTERLEAVED_1F1B)
    assert rank_tensors(GPT, interleaved, pp_rank=1) == (
        stage_tensors(GPT, interleaved, 1) + stage_tensors(GPT, interleaved, 3)
    )
    assert stage_tensors(GPT, interleaved, 1) == one  # one layer, no embedding or head


def _dp_segments(ev: Evaluation) -> list[float]:
    tl = ev.result.timeline
    rows = tl[(tl["rank"] == 0) & (tl["kind"] == "dp_comm")].sort_values("start_s")
    return list(rows["end_s"] - rows["start_s"])


def test_zero1_is_a_flat_all_reduce_and_per_tensor_broadcasts() -> None:
    profile = round_profile()
    plan = _plan(zero_stage=1)
    executed = run_plan(plan, profile, dtype="bf16")
    span = layout_groups(executed, gpus_per_node=profile.gpus_per_node).dp_cp
    tensors = rank_tensors(GPT, executed, pp_rank=0)
    per_param = state_bytes_per_param(Precision.BF16)
    grad_bytes = per_param.grad * sum(tensors)
    reduce_s = collective_time_s(
        profile, collective="all_reduce", message_bytes=grad_bytes, span=span
    )
    copies_s = FLAT_COPY_ACCESSES * grad_bytes / profile.streaming_bytes_per_s()
    bcast = sum(
        p2p_time_s(profile, message_bytes=per_param.param * n, inter_node=False) for n in tensors
    )
    assert broadcasts_s(GPT, executed, profile, pp_rank=0)[0] == pytest.approx(bcast)
    assert bcast > len(tensors) * profile.intra_node["sendrecv"].latency_s
    ev = simulate_plan(GPT, plan, profile, dtype="bf16")
    assert _dp_segments(ev) == pytest.approx([reduce_s + copies_s, bcast])
    # Megatron's reduce-scatter + all-gather, as the planner prices ZeRO-1, is shorter
    megatron = evaluate(GPT, executed, profile)
    assert isinstance(megatron, Evaluation)
    assert sum(_dp_segments(megatron)) < sum(_dp_segments(ev))
    assert ev.step_time_s - megatron.step_time_s == pytest.approx(
        sum(_dp_segments(ev)) - sum(_dp_segments(megatron)), rel=1e-2
    )


def test_zero0_pays_the_copies_and_zero2_is_left_alone() -> None:
    profile = round_profile()
    zero0 = simulate_plan(GPT, _plan(zero_stage=0), profile, dtype="bf16")
    grad_bytes = state_bytes_per_param(Precision.BF16).grad * sum(
        rank_tensors(GPT, _plan(), pp_rank=0)
    )
    span = layout_groups(_plan(), gpus_per_node=profile.gpus_per_node).dp_cp
    reduce_s = collective_time_s(
        profile, collective="all_reduce", message_bytes=grad_bytes, span=span
    )
    copies_s = FLAT_COPY_ACCESSES * grad_bytes / profile.streaming_bytes_per_s()
    assert _dp_segments(zero0) == pytest.approx([reduce_s + copies_s])
    assert not executes_flat_all_reduce(_plan(zero_stage=2))
    assert not executes_flat_all_reduce(_plan(dp=1, zero_stage=1))
    # the runner reduces after the last backward, whatever the plan asked for
    overlapped = run_plan(_plan(zero_stage=1, overlap_grad_reduce=True), profile, dtype="bf16")
    assert not overlapped.overlap_grad_reduce


def test_the_run_s_averaging_all_reduce_leaves_no_scaling_pass() -> None:
    """The runner all-reduces with ReduceOp.AVG, so its twin's optimizer carries Adam alone,
    not Megatron-core's 1/dp pass over the gradient buffer that the plan itself prices."""
    profile = round_profile()
    plan = _plan(zero_stage=0)
    twin = simulate_plan(GPT, plan, profile, dtype="bf16")
    tl = twin.result.timeline
    (opt_s,) = list(tl[(tl["rank"] == 0) & (tl["kind"] == "optimizer")].eval("end_s - start_s"))
    adam_s = adam_step_bytes(rank_parameters(GPT, plan, rank=0)) / profile.streaming_bytes_per_s()
    assert opt_s == pytest.approx(adam_s)
    planned = evaluate(GPT, plan, profile)
    assert isinstance(planned, Evaluation)
    ptl = planned.result.timeline
    (plan_opt_s,) = list(
        ptl[(ptl["rank"] == 0) & (ptl["kind"] == "optimizer")].eval("end_s - start_s")
    )
    assert plan_opt_s > opt_s
