"""The loss is priced kernel by kernel as Megatron-LM's _VocabParallelCrossEntropy runs it."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.edge_cost import edge_times
from plansim.analytic.elementwise import cross_entropy_bytes
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.specs.plan import Precision, plan_from_fields

A100 = load_profile("a100-sxm4-80gb")


def test_bytes_per_logit_follow_the_op_sequence() -> None:
    # forward: cast 2+4, max 4, sub_ 8, exp 8, sum 4, div_ 8; backward: mul_ 8, cast 4+2
    assert cross_entropy_bytes(2.0) == (38.0, 14.0)
    assert cross_entropy_bytes(4.0) == (32.0, 8.0)  # fp32 training: the casts are no-ops
    with pytest.raises(SpecError, match="activation_bytes must be 2 or 4"):
        cross_entropy_bytes(1.0)


def test_a_larger_vocabulary_costs_its_logits_traffic_at_the_streaming_rate() -> None:
    model = resolve_model("gpt3-175b")
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)
    wide = dataclasses.replace(model, vocab_size=model.vocab_size + 32768)
    groups = layout_groups(plan, gpus_per_node=A100.gpus_per_node)
    base, more = edge_times(model, plan, A100, groups), edge_times(wide, plan, A100, groups)
    logits = 32768 * model.seq_length
    hbm = A100.streaming_bytes_per_s()
    forward_extra = more.last_forward_s - base.last_forward_s
    backward_extra = more.last_backward_input_s - base.last_backward_input_s
    gemm_extra = more.last_backward_weight_s - base.last_backward_weight_s  # one logits GEMM
    assert forward_extra - gemm_extra == pytest.approx(38.0 * logits / hbm, rel=0.02)
    assert backward_extra - gemm_extra == pytest.approx(14.0 * logits / hbm, rel=0.02)


@pytest.mark.parametrize("precision", [Precision.FP8, Precision.FP4])
def test_the_logits_gemms_stay_16_bit_under_fp8_and_fp4(precision: Precision) -> None:
    # Megatron-core's output layer is a plain ColumnParallelLinear outside Transformer
    # Engine: its GEMMs run at the bf16 rate whatever the layers' precision.
    gb200 = load_profile("gb200-nvl72")
    model = resolve_model("llama3-8b")
    bf16 = plan_from_fields(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8)
    quantized = bf16.with_fields(precision=precision)
    groups = layout_groups(bf16, gpus_per_node=gb200.gpus_per_node)
    head = edge_times(model, bf16, gb200, groups).last_backward_weight_s  # one logits GEMM
    assert edge_times(model, quantized, gb200, groups).last_backward_weight_s == head
    assert gb200.matmul_flops_per_s(precision.value, 1e12) > gb200.matmul_flops_per_s(
        "bf16", 1e12
    )  # so a quantized head would have been faster
