"""ZeRO-2 reduce-scatters every micro-batch's gradients (plansim.analytic.zero3 docstring).

A ZeRO-2 rank keeps only its 1/dp shard of the gradients, so it cannot accumulate a step's
micro-batches whole and reduce once, as ZeRO-1 does: DeepSpeed's stage 2 reduces during every
micro-step ("ZeRO stage >= 2 communicates during non gradient accumulation boundaries as
well", ``DeepSpeedEngine.allreduce_gradients``). Worked on the round-number profile.
"""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.grad_buckets import stage_parameters
from plansim.catalog import resolve_model
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.plan import ParallelPlan, Zero3ParamFetch, plan_from_fields
from tests.unit.synthetic import round_profile

MODEL = resolve_model("megatron-1.7b")  # 24 layers, h 2304, tied embeddings


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {
        "dp": 2,
        "tp": 1,
        "pp": 2,
        "micro_batch_size": 1,
        "global_batch_size": 16,  # 8 micro-batches per pipeline
        "zero_stage": 2,
    }
    return plan_from_fields(**{**base, **kw})  # type: ignore[arg-type]


def _evaluate(plan: ParallelPlan) -> Evaluation:
    result = evaluate(MODEL, plan, round_profile())
    assert isinstance(result, Evaluation)
    return result


def test_each_backward_reduce_scatters_its_stage_and_the_step_tail_does_not() -> None:
    work = build_pipeline_work(MODEL, _plan(), round_profile())
    for s, stage in enumerate(work.stages):
        params = stage_parameters(MODEL, _plan(), stage=s)
        total = params.head + params.tail + params.num_layers * params.per_layer
        scatters = [seg for seg in stage.backward if seg.kind == "dp_comm"]
        assert len(scatters) == 1
        # the 16-bit gradients of the whole stage, layers and edges, every micro-batch
        assert scatters[0].num_bytes == pytest.approx(2.0 * total, rel=1e-12)
        assert scatters[0].duration_s > 0
        assert not [seg for seg in stage.forward if seg.kind == "dp_comm"]  # nothing gathered
        assert not stage.grad_buckets
    for rank in work.ranks:
        assert "dp_comm" not in [seg.kind for seg in rank.grad_sync]
        # the updated 16-bit parameters are still all-gathered once, after the optimizer
        assert [seg.kind for seg in rank.optimizer].count("dp_comm") == 1


@pytest.mark.parametrize("overlap", [False, True])
def test_the_reduced_bytes_grow_with_the_micro_batches_as_zero1_s_do_not(overlap: bool) -> None:
    def dp_bytes(zero: int, gbs: int) -> float:
        ev = _evaluate(_plan(zero_stage=zero, global_batch_size=gbs, overlap_grad_reduce=overlap))
        rows = ev.result.timeline
        return float(rows.loc[rows["kind"] == "dp_comm", "bytes"].sum())

    gather = dp_bytes(2, 4)  # 2 micro-batches
    per_microbatch = dp_bytes(2, 8) - gather  # 4 - 2 micro-batches
    assert per_microbatch > 0
    assert dp_bytes(2, 16) - dp_bytes(2, 8) == pytest.approx(2 * per_microbatch, rel=1e-9)
    assert dp_bytes(1, 16) == pytest.approx(dp_bytes(1, 4), rel=1e-12)


def test_serial_reduce_scatters_are_exposed_every_micro_batch() -> None:
    def exposed(gbs: int) -> float:
        return _evaluate(_plan(global_batch_size=gbs)).exposed_comm_s_by_kind["dp_comm"]

    # each more micro-batch adds, on every pipeline rank, its stage's reduce-scatter
    work = build_pipeline_work(MODEL, _plan(), round_profile())
    per_microbatch = sum(  # summed over the pipeline ranks, as the exposure is reported
        seg.duration_s for stage in work.stages for seg in stage.backward if seg.kind == "dp_comm"
    )
    assert per_microbatch > 0.01
    assert exposed(8) - exposed(4) == pytest.approx(2 * per_microbatch, rel=1e-6)
    assert exposed(16) - exposed(8) == pytest.approx(4 * per_microbatch, rel=1e-6)


def test_zero2_is_no_longer_free_next_to_zero1_with_gradient_accumulation() -> None:
    # Same 16-bit gradient bytes per collective (ZeRO-1 reducing in bf16): ZeRO-1 reduces
    # once per step, ZeRO-2 once per micro-batch, so with 8 micro-batches it takes longer.
    zero1 = _evaluate(_plan(zero_stage=1, grad_reduce_in_bf16=True))
    zero2 = _evaluate(_plan(zero_stage=2))
    assert zero2.exposed_comm_s_by_kind["dp_comm"] > 4 * zero1.exposed_comm_s_by_kind["dp_comm"]
    assert zero2.step_time_s > zero1.step_time_s
    # ... and keeps a 1/dp shard of the fp32 main gradients, which is what it is for
    fp32 = _evaluate(_plan(zero_stage=1))
    assert zero2.memory.gradients_bytes == pytest.approx(fp32.memory.gradients_bytes / 2)


def test_zero2_reduces_whole_layers_whatever_the_zero3_fetch_says() -> None:
    # DeepSpeed's stage 2 reduces buckets, never single tensors: the ZeRO-3 fetch mode
    # (which the back-test sets for DeepSpeed rows of 2021) does not change ZeRO-2.
    prof = round_profile()
    flat = build_pipeline_work(MODEL, _plan(), prof)
    sync = build_pipeline_work(
        MODEL, _plan(zero3_param_fetch=Zero3ParamFetch.PER_TENSOR_SYNC), prof
    )
    assert flat.stages == sync.stages


def test_the_layers_being_reduced_are_held_unsharded() -> None:
    # transient: two layers' 16-bit gradients (one in its reduce-scatter, one being produced)
    from plansim.analytic.memory import rank_memory
    from plansim.analytic.params import count_parameters

    prof = round_profile()
    counts = count_parameters(MODEL)
    layer = counts.attention_per_layer + counts.mlp_per_layer
    zero1 = rank_memory(MODEL, _plan(zero_stage=1), prof, rank=0)
    zero2 = rank_memory(MODEL, _plan(), prof, rank=0)
    assert zero2.transient_bytes - zero1.transient_bytes == pytest.approx(2 * layer * 2.0)
    alone = rank_memory(MODEL, _plan(dp=1, global_batch_size=8), prof, rank=0)
    assert alone.transient_bytes == zero1.transient_bytes  # dp 1: nothing to reduce-scatter
