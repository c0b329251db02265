"""The validate simulation counts DTensor's TP all-reduces over separate projections."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.comm import collective_time_s
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.model import Activation
from plansim.specs.plan import plan_from_fields
from plansim.validate.executed_loss import replicated_head_extra_s, runner_loss_time_s
from plansim.validate.simulated import (
    dtensor_backward_all_reduces,
    executed_model,
    simulate_plan,
)
from tests.unit.synthetic import round_profile

GPT = resolve_model("megatron-1.7b")  # GELU: one up projection
PLAN = plan_from_fields(dp=1, tp=2, pp=1, micro_batch_size=1, global_batch_size=2)


def test_backward_all_reduces_per_layer() -> None:
    assert dtensor_backward_all_reduces(GPT, PLAN) == 3 + 1  # q, k, v, up
    swiglu = dataclasses.replace(GPT, activation=Activation.SWIGLU)
    assert dtensor_backward_all_reduces(swiglu, PLAN) == 3 + 2  # q, k, v, gate, up
    assert dtensor_backward_all_reduces(GPT, PLAN.with_fields(tp=1)) == 0
    sp = PLAN.with_fields(sequence_parallel=True)
    assert dtensor_backward_all_reduces(GPT, sp) == 2  # left at Megatron's


def test_simulated_tp_plan_pays_the_extra_all_reduces() -> None:
    profile = round_profile()
    # as the run executes it (simulated.run_plan): autograd accumulates gradients unfused,
    # torch's norm backward on a GPU is two passes
    executed = PLAN.with_fields(gradient_accumulation_fusion=False, persist_layer_norm=False)
    plain = evaluate(executed_model(GPT), executed, profile)
    assert isinstance(plain, Evaluation)
    got = simulate_plan(GPT, PLAN, profile, dtype="bf16")
    # and the runner's output layer, replicated over TP: forward once, backward twice
    head_s = 3 * replicated_head_extra_s(GPT, PLAN, profile) * PLAN.num_microbatches
    # and its torch cross-entropy on all V logits, not Megatron-LM's on V/tp
    head_s += sum(runner_loss_time_s(GPT, PLAN, profile)) * PLAN.num_microbatches
    # 2 more all-reduces per layer (4 vs Megatron's 2) of b*s*h bf16 activation gradients,
    # for every layer of the 2 micro-batches' backward, all on the critical path (pp = 1)
    groups = layout_groups(PLAN, gpus_per_node=profile.gpus_per_node)
    one = collective_time_s(
        profile,
        collective="all_reduce",
        message_bytes=2.0 * GPT.seq_length * GPT.hidden_size,
        span=groups.tp,
    )
    extra_s = 2 * one * GPT.num_layers * PLAN.num_microbatches
    assert got.step_time_s - plain.step_time_s == pytest.approx(extra_s + head_s, rel=1e-9)
    tp = got.result.busy_s_by_kind["tp_comm"] - plain.result.busy_s_by_kind["tp_comm"]
    assert tp == pytest.approx(extra_s, rel=1e-9)
