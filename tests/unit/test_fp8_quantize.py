"""FP8 plans pay Transformer Engine's casts of their GEMM operands (fp8_quantize_traffic)."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.elementwise import fp8_quantize_traffic
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.specs.model import Activation
from plansim.specs.plan import ParallelPlan, Precision
from tests.unit.synthetic import TINY_MODEL, round_profile


def test_quantize_bytes_hand_counted_gelu_tp2_with_and_without_sp() -> None:
    model = dataclasses.replace(
        TINY_MODEL, activation=Activation.GELU, ffn_hidden_size=4 * TINY_MODEL.hidden_size
    )
    h, f, kv, tokens = model.hidden_size, model.ffn_hidden_size, model.kv_size, model.seq_length
    # no SP: each norm-fed input 2 T h (transpose) - T h (1-byte norm write), x 2 inputs;
    # the projection / second-MLP inputs 4 B over T (h + f) / 2
    plain = fp8_quantize_traffic(model, micro_batch_size=1, tp=2, sequence_parallel=False)
    assert plain.forward_bytes == tokens * (2 * h + 4 * (h + f) / 2)
    # backward: dY of QKV (h + 2kv)/2, projection h, FC1 f/2, FC2 h, 4 B each
    assert plain.backward_bytes == tokens * 4 * ((h + 2 * kv + f) / 2 + 2 * h)
    sp = fp8_quantize_traffic(model, micro_batch_size=1, tp=2, sequence_parallel=True)
    # with SP the norm writes only its T/2 tokens: the saving halves
    assert sp.forward_bytes == plain.forward_bytes + tokens * h
    assert sp.backward_bytes == plain.backward_bytes and sp.num_kernels == 4


def test_swiglu_counts_gate_and_up_gradients() -> None:
    llama = resolve_model("llama3-8b")
    t = fp8_quantize_traffic(llama, micro_batch_size=2, tp=1, sequence_parallel=False)
    h, f, kv = llama.hidden_size, llama.ffn_hidden_size, llama.kv_size
    assert t.backward_bytes == 2 * llama.seq_length * 4 * (h + 2 * kv + 2 * f + 2 * h)


def test_an_fp8_layer_pays_its_casts_and_a_bf16_layer_does_not() -> None:
    base = round_profile()
    prof = dataclasses.replace(
        base,
        peak_flops_per_s={**base.peak_flops_per_s, "fp8": 2 * base.peak_flops_per_s["bf16"]},
        matmul_efficiency={**base.matmul_efficiency, "fp8": base.matmul_efficiency["bf16"]},
    )
    plan8 = ParallelPlan(
        dp=1, tp=2, pp=1, micro_batch_size=1, global_batch_size=1, precision=Precision.FP8
    )
    plan16 = dataclasses.replace(plan8, precision=Precision.BF16)
    groups = layout_groups(plan8, gpus_per_node=prof.gpus_per_node)
    t8 = layer_pass_times(TINY_MODEL, plan8, prof, groups)
    t16 = layer_pass_times(TINY_MODEL, plan16, prof, groups)
    quant = fp8_quantize_traffic(TINY_MODEL, micro_batch_size=1, tp=2, sequence_parallel=False)
    launches = quant.num_kernels * prof.kernel_launch_s
    fwd_cast = quant.forward_bytes / prof.elementwise_bytes_per_s(backward=False) + launches
    bwd_cast = quant.backward_bytes / prof.elementwise_bytes_per_s(backward=True) + launches
    # The tiny layer's GEMMs are bound by their (16-bit priced) operand traffic, so the two
    # precisions differ by exactly the casts.
    assert fwd_cast > 0 and bwd_cast > fwd_cast
    assert t8.forward_s == pytest.approx(t16.forward_s + fwd_cast)
    assert t8.backward_input_s == pytest.approx(t16.backward_input_s + bwd_cast)
    assert t8.backward_weight_s == pytest.approx(t16.backward_weight_s)
