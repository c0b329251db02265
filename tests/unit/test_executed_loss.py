"""The validate runner's loss memory (plansim.validate.executed_loss): torch's
F.cross_entropy on the whole vocabulary's fp32 logits holds three logits-sized tensors at the
start of the backward, where plansim's Megatron-LM loss holds one of V/tp."""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.io.profiles import load_profile
from plansim.specs.plan import ParallelPlan
from plansim.validate.executed_loss import runner_loss_extra_bytes, with_runner_loss
from tests.unit.synthetic import SMALL_GPT

MODEL = SMALL_GPT  # s 16, V 128


def test_three_copies_of_the_whole_vocabulary_less_plansims_one() -> None:
    copy = 4.0 * 16 * 2 * 128  # fp32, s 16, b 2
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch_size=2, global_batch_size=4)
    assert runner_loss_extra_bytes(MODEL, plan) == pytest.approx(2 * copy)
    tp2 = ParallelPlan(tp=2, pp=1, dp=1, micro_batch_size=2, global_batch_size=4)
    assert runner_loss_extra_bytes(MODEL, tp2) == pytest.approx(3 * copy - copy / 2)


def test_only_the_last_pipeline_rank_holds_it() -> None:
    plan = ParallelPlan(tp=1, pp=2, dp=1, micro_batch_size=2, global_batch_size=8)
    work = build_pipeline_work(MODEL, plan, load_profile("h100-sxm5-80gb"))
    after = with_runner_loss(work, MODEL, plan)
    assert after.ranks[0] == work.ranks[0]
    added = after.ranks[1].static_bytes - work.ranks[1].static_bytes
    assert added == pytest.approx(runner_loss_extra_bytes(MODEL, plan))
