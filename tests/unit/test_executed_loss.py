"""The validate runner's loss memory (plansim.validate.executed_loss): torch's
F.cross_entropy on the whole vocabulary's fp32 logits holds three logits-sized tensors at the
start of the backward, where plansim's Megatron-LM loss holds one of V/tp."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.flops import Gemm
from plansim.analytic.layer_cost import gemm_time_s
from plansim.analytic.sustained import job_compute_profile
from plansim.io.profiles import load_profile
from plansim.specs.plan import plan_from_fields
from plansim.specs.work import Segment
from plansim.validate.executed_loss import (
    replicated_head_extra_s,
    runner_loss_extra_bytes,
    runner_loss_time_s,
    with_replicated_head,
    with_runner_loss,
    with_runner_loss_time,
)
from tests.unit.synthetic import SMALL_GPT

MODEL = SMALL_GPT  # s 16, V 128


def test_three_copies_of_the_whole_vocabulary_less_plansims_one() -> None:
    copy = 4.0 * 16 * 2 * 128  # fp32, s 16, b 2
    plan = plan_from_fields(tp=1, pp=1, dp=1, micro_batch_size=2, global_batch_size=4)
    assert runner_loss_extra_bytes(MODEL, plan) == pytest.approx(2 * copy)
    tp2 = plan_from_fields(tp=2, pp=1, dp=1, micro_batch_size=2, global_batch_size=4)
    assert runner_loss_extra_bytes(MODEL, tp2) == pytest.approx(3 * copy - copy / 2)


def test_only_the_last_pipeline_rank_holds_it() -> None:
    plan = plan_from_fields(tp=1, pp=2, dp=1, micro_batch_size=2, global_batch_size=8)
    work = build_pipeline_work(MODEL, plan, load_profile("h100-sxm5-80gb"))
    after = with_runner_loss(work, MODEL, plan)
    assert after.ranks[0] == work.ranks[0]
    added = after.ranks[1].static_bytes - work.ranks[1].static_bytes
    assert added == pytest.approx(runner_loss_extra_bytes(MODEL, plan))


def test_the_replicated_output_layer_costs_the_whole_vocabulary_on_every_tp_rank() -> None:
    """The runner shards the blocks only: each TP rank runs the logits GEMM of all V columns,
    where plansim's Megatron output layer runs V/tp."""
    profile = load_profile("h100-sxm5-80gb")
    model = dataclasses.replace(SMALL_GPT, vocab_size=32768, hidden_size=1024, seq_length=1024)
    one = plan_from_fields(tp=1, pp=2, dp=1, micro_batch_size=2, global_batch_size=8)
    assert replicated_head_extra_s(model, one, profile) == 0.0
    plan = one.with_fields(tp=4)
    full = Gemm(name="logits", m=2 * 1024, n=32768, k=1024)
    quarter = dataclasses.replace(full, n=32768 // 4)
    job = job_compute_profile(profile, plan.num_gpus)  # the job's sustained GEMM rate
    expected = gemm_time_s(full, job, dtype="bf16") - gemm_time_s(quarter, job, dtype="bf16")
    extra = replicated_head_extra_s(model, plan, profile)
    assert extra == pytest.approx(expected) and extra > 0
    work = build_pipeline_work(model, plan, profile)
    after = with_replicated_head(work, model, plan, profile)
    assert after.stages[0] == work.stages[0]

    def seconds(segments):  # type: ignore[no-untyped-def]
        return sum(s.duration_s for s in segments if s.stream == "compute")

    last, new = work.stages[-1], after.stages[-1]
    assert seconds(new.forward) - seconds(last.forward) == pytest.approx(extra)
    assert seconds(new.backward) - seconds(last.backward) == pytest.approx(2 * extra)


def test_the_runners_loss_moves_its_bytes_split_as_torch_runs_it() -> None:
    """torch's log-softmax moves 16 B a logit forward and, with the NLL's dense gradient, 20
    backward (plus the bf16 cast each way), on all V logits; plansim's Megatron-LM loss 32
    and 8 (plus the cast) on V/tp. The difference lands on the last stage."""
    profile = load_profile("h100-sxm5-80gb")
    model = dataclasses.replace(SMALL_GPT, vocab_size=32768, hidden_size=1024, seq_length=1024)
    plan = plan_from_fields(tp=1, pp=2, dp=1, micro_batch_size=2, global_batch_size=8)
    logits, rate = 2 * 1024 * 32768, profile.streaming_bytes_per_s()
    forward, backward = runner_loss_time_s(model, plan, profile)
    assert forward == pytest.approx((22 - 38) * logits / rate)  # bf16: less forward
    assert backward == pytest.approx((26 - 14) * logits / rate)  # and more backward
    tp4 = plan.with_fields(tp=4)
    forward4, backward4 = runner_loss_time_s(model, tp4, profile)
    assert forward4 == pytest.approx((22 - 38 / 4) * logits / rate)  # all V on every TP rank
    assert backward4 == pytest.approx((26 - 14 / 4) * logits / rate)
    work = build_pipeline_work(model, plan, profile)
    after = with_runner_loss_time(work, model, plan, profile)
    assert after.stages[0] == work.stages[0]
    last, new = work.stages[-1], after.stages[-1]
    assert new.forward[0].duration_s - last.forward[0].duration_s == pytest.approx(forward)
    assert new.backward[0].duration_s - last.backward[0].duration_s == pytest.approx(backward)


def test_the_loss_change_lands_on_the_stages_bulk_not_on_a_pipeline_actions_segment() -> None:
    """Under pipelining each stage pass of the validate simulation starts with a short compute
    segment of torch.distributed.pipelining's own work (``simulated.PIPELINE_ACTION_KIND``);
    the runner's loss, less forward at tp 1, changes the segment of the layers and loss."""
    profile = load_profile("h100-sxm5-80gb")
    model = dataclasses.replace(SMALL_GPT, vocab_size=32768, hidden_size=1024, seq_length=1024)
    plan = plan_from_fields(tp=1, pp=2, dp=1, micro_batch_size=2, global_batch_size=8)
    forward, backward = runner_loss_time_s(model, plan, profile)
    assert forward < -1e-4
    work = build_pipeline_work(model, plan, profile)
    action = Segment(kind="pipeline_action", stream="compute", duration_s=1e-5)
    last = work.stages[-1]
    last = dataclasses.replace(
        last,
        forward=(action, *last.forward),
        backward=(action, *last.backward),
        backward_input=(action, *last.backward_input),
    )
    work = dataclasses.replace(work, stages=(*work.stages[:-1], last))
    after = with_runner_loss_time(work, model, plan, profile).stages[-1]
    assert after.forward[0] == action and after.backward[0] == action
    assert after.forward[1].duration_s == pytest.approx(last.forward[1].duration_s + forward)
    assert after.backward[1].duration_s == pytest.approx(last.backward[1].duration_s + backward)
