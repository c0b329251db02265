"""FP8 and FP4 plans pay Transformer Engine's casts of their GEMM operands (quantize_traffic)."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.elementwise import quantize_traffic
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.backtest import predict_row
from plansim.planner.evaluate import Rejected, check_plan
from plansim.specs.model import Activation
from plansim.specs.plan import Precision, Recompute, plan_from_fields
from tests.unit.synthetic import TINY_MODEL, round_profile

FP8, FP4 = Precision.FP8, Precision.FP4


def test_quantize_bytes_hand_counted_gelu_tp2_with_and_without_sp() -> None:
    model = dataclasses.replace(
        TINY_MODEL, activation=Activation.GELU, ffn_hidden_size=4 * TINY_MODEL.hidden_size
    )
    h, f, kv, tokens = model.hidden_size, model.ffn_hidden_size, model.kv_size, model.seq_length
    # no SP: each norm-fed input 2 T h (transpose) - T h (1-byte norm write), x 2 inputs;
    # the projection / second-MLP inputs 4 B over T (h + f) / 2
    plain = quantize_traffic(
        model, precision=FP8, micro_batch_size=1, tp=2, sequence_parallel=False
    )
    assert plain.forward_bytes == tokens * (2 * h + 4 * (h + f) / 2)
    # backward: dY of QKV (h + 2kv)/2, projection h, FC1 f/2, FC2 h, 4 B each
    assert plain.backward_bytes == tokens * 4 * ((h + 2 * kv + f) / 2 + 2 * h)
    sp = quantize_traffic(model, precision=FP8, micro_batch_size=1, tp=2, sequence_parallel=True)
    # with SP the norm writes only its T/2 tokens: the saving halves
    assert sp.forward_bytes == plain.forward_bytes + tokens * h
    assert sp.backward_bytes == plain.backward_bytes and sp.num_kernels == 4


def test_swiglu_counts_gate_and_up_gradients() -> None:
    llama = resolve_model("llama3-8b")
    t = quantize_traffic(llama, precision=FP8, micro_batch_size=2, tp=1, sequence_parallel=False)
    h, f, kv = llama.hidden_size, llama.ffn_hidden_size, llama.kv_size
    assert t.backward_bytes == 2 * llama.seq_length * 4 * (h + 2 * kv + 2 * f + 2 * h)


def test_an_fp8_layer_pays_its_casts_and_a_bf16_layer_does_not() -> None:
    base = round_profile()
    prof = dataclasses.replace(
        base,
        peak_flops_per_s={**base.peak_flops_per_s, "fp8": 2 * base.peak_flops_per_s["bf16"]},
        matmul_efficiency={**base.matmul_efficiency, "fp8": base.matmul_efficiency["bf16"]},
    )
    plan8 = plan_from_fields(
        dp=1, tp=2, pp=1, micro_batch_size=1, global_batch_size=1, precision=Precision.FP8
    )
    plan16 = plan8.with_fields(precision=Precision.BF16)
    groups = layout_groups(plan8, gpus_per_node=prof.gpus_per_node)
    t8 = layer_pass_times(TINY_MODEL, plan8, prof, groups)
    t16 = layer_pass_times(TINY_MODEL, plan16, prof, groups)
    quant = quantize_traffic(
        TINY_MODEL, precision=FP8, micro_batch_size=1, tp=2, sequence_parallel=False
    )
    launches = quant.num_kernels * prof.kernel_launch_s
    fwd_cast = quant.forward_bytes / prof.elementwise_bytes_per_s(backward=False) + launches
    bwd_cast = quant.backward_bytes / prof.elementwise_bytes_per_s(backward=True) + launches
    # The tiny layer's GEMMs are bound by their (16-bit priced) operand traffic, so the two
    # precisions differ by exactly the casts.
    assert fwd_cast > 0 and bwd_cast > fwd_cast
    assert t8.forward_s == pytest.approx(t16.forward_s + fwd_cast)
    assert t8.backward_input_s == pytest.approx(t16.backward_input_s + bwd_cast)
    assert t8.backward_weight_s == pytest.approx(t16.backward_weight_s)


def test_nvfp4_casts_every_operand_both_ways_from_16_bit() -> None:
    model = dataclasses.replace(
        TINY_MODEL, activation=Activation.GELU, ffn_hidden_size=4 * TINY_MODEL.hidden_size
    )
    h, f, kv, tokens = model.hidden_size, model.ffn_hidden_size, model.kv_size, model.seq_length
    per_element = 2 + 2 * (0.5 + 1 / 16)  # read bf16, write two NVFP4 layouts with scales
    for sp in (False, True):  # the column-wise copy comes from 16-bit data: SP changes nothing
        t = quantize_traffic(model, precision=FP4, micro_batch_size=1, tp=2, sequence_parallel=sp)
        assert t.forward_bytes == pytest.approx(tokens * per_element * (2 * h + (h + f) / 2))
        assert t.backward_bytes == pytest.approx(
            tokens * per_element * ((h + 2 * kv + f) / 2 + 2 * h)
        )
    fp8 = quantize_traffic(model, precision=FP8, micro_batch_size=1, tp=2, sequence_parallel=False)
    # 3.125 B against FP8's 4 B per cast element, but the norm-fed inputs cost more than
    # FP8's transpose of its own 1-byte copy
    assert t.backward_bytes < fp8.backward_bytes
    assert t.forward_bytes > fp8.forward_bytes


def test_quantize_traffic_refuses_an_unquantized_precision() -> None:
    with pytest.raises(SpecError, match="precision='bf16' is not quantized; choose one of: fp8"):
        quantize_traffic(
            TINY_MODEL, precision=Precision.BF16, micro_batch_size=1, tp=1, sequence_parallel=False
        )


def test_fp4_on_blackwell_is_faster_than_fp8_and_rejected_on_hopper() -> None:
    model = resolve_model("llama3-70b")
    plan = plan_from_fields(
        dp=1,
        tp=8,
        pp=1,
        micro_batch_size=1,
        global_batch_size=8,
        sequence_parallel=True,
        recompute=Recompute.FULL,
        precision=FP8,
    )
    b200 = load_profile("b200-sxm-180gb")
    times = {}
    for precision in (Precision.BF16, FP8, FP4):
        p = plan.with_fields(precision=precision)
        times[precision] = layer_pass_times(
            model, p, b200, layout_groups(p, gpus_per_node=8)
        ).forward_s
    # 2x the fp8 peak, but the casts and the 16-bit kernels stay: far less than 2x
    assert times[FP4] < times[FP8] < times[Precision.BF16]
    assert times[FP8] / times[FP4] < 1.6
    h100 = load_profile("h100-sxm5-80gb")
    assert "fp4" not in h100.peak_flops_per_s
    outcome = check_plan(model, plan.with_fields(precision=FP4), h100)
    assert isinstance(outcome, Rejected) and outcome.category == "precision not supported"


# --- backtest ----------------------------------------------------------------------------

ROW = {
    "row_id": "Q1",
    "model_name": "llama-like",
    "num_layers": "32",
    "hidden_size": "4096",
    "num_attention_heads": "32",
    "num_kv_heads": "8",
    "ffn_hidden_size": "14336",
    "ffn_activation": "swiglu",
    "seq_len_tokens": "8192",
    "vocab_size": "128256",
    "gpu_type": "gb300-nvl72",
    "num_gpus": "8",
    "tp": "1",
    "pp": "1",
    "micro_batch_size_seqs": "1",
    "global_batch_size_seqs": "64",
    "recompute": "none",
    "zero_stage": "1",
    "precision": "fp4",
    "step_time_s": "10.0",
    "framework": "Megatron-LM (2025)",
}


def test_backtest_predicts_an_fp4_row_on_blackwell_and_skips_one_on_hopper() -> None:
    fp4 = predict_row(RunRow(path="runs.csv", line=2, cells=ROW))
    assert fp4.status == "ok", fp4.note
    fp8 = predict_row(RunRow(path="runs.csv", line=2, cells={**ROW, "precision": "fp8"}))
    assert fp8.predicted_step_time_s is not None and fp4.predicted_step_time_s is not None
    assert fp4.predicted_step_time_s < fp8.predicted_step_time_s
    hopper = predict_row(
        RunRow(path="runs.csv", line=2, cells={**ROW, "gpu_type": "h100-sxm5-80gb"})
    )
    assert hopper.status == "skipped"
    assert "h100-sxm5-80gb has no fp4 matmul data (has: bf16, fp16, fp8)" in hopper.note
