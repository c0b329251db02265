"""Memory model oracles: ZeRO paper Table 1, Korthikanti et al. 2022 Table 2, stage placement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plansim.analytic.activations import full_layer_bytes, layer_activations
from plansim.analytic.memory import (
    StateBytesPerParam,
    memory_state_bytes,
    model_state_bytes,
    plan_state_bytes,
    rank_parameters,
    state_bytes_per_param,
)
from plansim.analytic.params import count_parameters
from plansim.analytic.stored_activations import microbatches_in_flight, saved_gemm_input_bytes
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.specs.plan import (
    AttentionKernel,
    Framework,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    plan_from_fields,
)

ZERO_PAPER = StateBytesPerParam(param=2.0, grad=2.0, optimizer=12.0)  # K = 12 (M01 §5)


def _gb(states) -> float:  # ZeRO Table 1 reports GB = 1e9 bytes
    return (states.weights_bytes + states.gradients_bytes + states.optimizer_bytes) / 1e9


@pytest.mark.parametrize(
    ("psi", "dp", "stage", "table_gb"),
    [
        (7.5e9, 1, 1, 120),
        (7.5e9, 64, 1, 31.4),
        (7.5e9, 64, 2, 16.6),
        (7.5e9, 64, 3, 1.88),
        (7.5e9, 4, 3, 30),
        (128e9, 16, 1, 608),
        (128e9, 1024, 2, 257),
        (1e12, 1024, 3, 15.6),
        (1e12, 256, 1, 4046),
    ],
)
def test_zero_table1_model_states(psi: float, dp: int, stage: int, table_gb: float) -> None:
    got = _gb(model_state_bytes(psi, dp=dp, zero_stage=stage, per_param=ZERO_PAPER))
    assert got == pytest.approx(table_gb, rel=0.01)


def test_megatron_bytes_per_param_table() -> None:
    # M02 dist_optimizer table: fp16 20 -> 4 + 16/d; bf16 18 -> 6 + 12/d
    bf16 = state_bytes_per_param(Precision.BF16)
    fp16 = state_bytes_per_param(Precision.FP16)
    assert bf16.param + bf16.grad + bf16.optimizer == 18
    assert fp16.param + fp16.grad + fp16.optimizer == 20
    dist = model_state_bytes(1.0, dp=8, zero_stage=1, per_param=bf16)
    assert dist.weights_bytes + dist.gradients_bytes + dist.optimizer_bytes == pytest.approx(
        6 + 12 / 8
    )


GPT3 = resolve_model("gpt3-175b")
S, H, A = 2048, 12288, 96


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_eq2_tp_only(tp: int, b: int) -> None:
    sbh = S * b * H
    expected = sbh * (10 + 24 / tp + 5 * A * S / (H * tp))
    got = full_layer_bytes(GPT3, micro_batch_size=b, tp=tp, sequence_parallel=False, flash=False)
    assert got == pytest.approx(expected, rel=1e-12)


def test_korthikanti_eq4_tp_sp_and_eq6_selective() -> None:
    sbh, t = S * 1 * H, 8
    sp = full_layer_bytes(GPT3, micro_batch_size=1, tp=t, sequence_parallel=True, flash=False)
    assert sp == pytest.approx(sbh / t * (34 + 5 * A * S / H), rel=1e-12)
    sel = layer_activations(
        GPT3,
        micro_batch_size=1,
        tp=t,
        sequence_parallel=True,
        recompute=Recompute.SELECTIVE,
        flash=False,
    )
    assert sel.stored_bytes == pytest.approx(34 * sbh / t, rel=1e-12)
    full = layer_activations(
        GPT3,
        micro_batch_size=1,
        tp=t,
        sequence_parallel=False,
        recompute=Recompute.FULL,
        flash=False,
    )
    assert full.stored_bytes == 2 * sbh
    # Korthikanti: selective recompute saves 70% of GPT-3's activation memory (5as/h = 80)
    assert 1 - sel.stored_bytes / sp == pytest.approx(80 / 114, rel=1e-9)


def test_gqa_swiglu_change_only_their_terms() -> None:
    llama = resolve_model("llama3-8b")
    assert not llama.dropout  # Meta's configs: no dropout, so no masks (10 - 2 = 8)
    s, h = llama.seq_length, llama.hidden_size
    got = full_layer_bytes(llama, micro_batch_size=1, tp=1, sequence_parallel=False, flash=True)
    sharded = 2 + 4 * 1024 / h + 2 + 6 * llama.ffn_hidden_size / h
    lse = 4 * llama.num_attention_heads / h
    assert got == pytest.approx(s * h * (8 + sharded + lse), rel=1e-12)
    with_dropout = replace(llama, dropout=True)
    got = full_layer_bytes(
        with_dropout, micro_batch_size=1, tp=1, sequence_parallel=False, flash=True
    )
    assert got == pytest.approx(s * h * (10 + sharded + lse), rel=1e-12)


def test_dropout_free_unfused_core_keeps_only_the_softmax_output() -> None:
    sbh, t = S * 1 * H, 8
    plain = replace(GPT3, dropout=False)
    got = full_layer_bytes(plain, micro_batch_size=1, tp=t, sequence_parallel=True, flash=False)
    assert got == pytest.approx(sbh / t * (32 + 2 * A * S / H), rel=1e-12)


@pytest.mark.parametrize(("q", "precision"), [(1.0, Precision.FP8), (0.5625, Precision.FP4)])
def test_quantized_gemm_inputs_are_kept_quantized(q: float, precision: Precision) -> None:
    # GPT-3 layer with SP and flash: 16-bit 34 + lse; quantized: attention and MLP inputs q
    # (replicated 4 + 2q + 2), projection input 2 + q, FC2 input 4q (ffn = 4h)
    sbh, t = S * 1 * H, 8
    lse = 4 * A / H
    got = full_layer_bytes(
        GPT3, micro_batch_size=1, tp=t, sequence_parallel=True, flash=True, gemm_input_bytes=q
    )
    expected = (4 + 2 * q + 2) + (2 + 4 + (2 + q) + 8 + 4 * q) + lse
    assert got == pytest.approx(sbh / t * expected, rel=1e-12)
    plan = _plan(precision=precision, sequence_parallel=True, attention=AttentionKernel.FLASH)
    assert saved_gemm_input_bytes(plan) == q
    assert saved_gemm_input_bytes(plan.with_fields(precision=Precision.BF16)) == 2.0


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=8, tp=8, pp=16, micro_batch_size=1, global_batch_size=1536)
    base.update(kw)
    return plan_from_fields(**base)


def test_inflight_microbatches_1f1b_and_gpipe() -> None:
    plan = _plan()
    assert microbatches_in_flight(plan, rank=0) == 16
    assert microbatches_in_flight(plan, rank=15) == 1
    assert microbatches_in_flight(_plan(schedule=Schedule.GPIPE), rank=15) == 192
    short = _plan(global_batch_size=64)  # m = 8 < p
    assert microbatches_in_flight(short, rank=0) == 8


def test_stage_parameters_sum_to_model_with_tied_copy() -> None:
    plan = _plan(tp=1, dp=64)
    counts = count_parameters(GPT3)
    per_rank = [rank_parameters(GPT3, plan, rank=r) for r in range(plan.pp)]
    # the last stage keeps a copy of the tied word embedding for the output layer (Megatron)
    assert sum(per_rank) == pytest.approx(counts.total + counts.embedding, rel=1e-12)
    assert per_rank[0] > per_rank[1] and per_rank[-1] > per_rank[1]


def _interleaved(**kw) -> ParallelPlan:
    base = dict(dp=1, tp=8, pp=8, vpp=3, micro_batch_size=1, global_batch_size=64) | {
        "schedule": Schedule.INTERLEAVED_1F1B
    }
    base.update(kw)
    return plan_from_fields(**base)


def test_inflight_interleaved_matches_korthikanti_on_rank_0() -> None:
    # Korthikanti et al. 2022 §4.2.3 (memory.md): interleaving multiplies the first stage's
    # activations by 1 + (p-1)/(p v). GPT-3 175B, p = 8, v = 3, m = 64 (their Table 3 layout):
    # rank 0 holds 96 * (1 + 7/24) = 124 layers' worth = 124 / 12 = 31/3 micro-batches of its
    # 12 layers, i.e. (v p + p - 1) = 31 stored chunks of 4 layers.
    plan = _interleaved()
    assert microbatches_in_flight(plan, rank=0) == pytest.approx(31 / 3, rel=1e-15)
    layers = microbatches_in_flight(plan, rank=0) * GPT3.num_layers / plan.pp
    assert layers == pytest.approx(GPT3.num_layers * (1 + (8 - 1) / (8 * 3)), rel=1e-15)
    # the last rank warms up (v - 1) p = 16 chunks and stores one more: 17 chunks
    assert microbatches_in_flight(plan, rank=7) == pytest.approx(17 / 3, rel=1e-15)
    # 1F1B on the same layers: p = 8 micro-batches on rank 0
    flat = _interleaved(vpp=1, schedule=Schedule.ONE_F_ONE_B)
    assert microbatches_in_flight(flat, rank=0) == 8


def test_inflight_interleaved_is_capped_by_the_microbatches() -> None:
    # m = p: rank 0's warm-up 2(p-1) + (v-1)p = 30 exceeds its m v = 24 chunks, so it runs
    # every forward first and holds all m = 8 micro-batches (less than 31/3).
    plan = _interleaved(global_batch_size=8)
    assert microbatches_in_flight(plan, rank=0) == 8
    assert microbatches_in_flight(plan, rank=7) == pytest.approx(17 / 3, rel=1e-15)


def test_interleaved_plan_validation_names_values() -> None:
    with pytest.raises(SpecError) as info:
        _interleaved(schedule=Schedule.ONE_F_ONE_B)
    assert str(info.value) == "schedule 1f1b needs vpp == 1 (got vpp=3); use interleaved-1f1b"
    with pytest.raises(SpecError, match=r"schedule gpipe needs vpp == 1 \(got vpp=2\)"):
        _interleaved(vpp=2, schedule=Schedule.GPIPE)
    with pytest.raises(SpecError, match=r"interleaved-1f1b needs vpp > 1 \(got vpp=1\)"):
        _interleaved(vpp=1)
    with pytest.raises(SpecError, match=r"interleaved-1f1b needs pp > 1 \(got pp=1, vpp=3\)"):
        _interleaved(pp=1)
    with pytest.raises(SpecError) as info:
        _interleaved(global_batch_size=12)
    assert "num_microbatches(12)" in str(info.value) and "multiple of pp(8)" in str(info.value)
    assert _interleaved().label() == "tp8 pp8 dp1 vpp3 mbs1 zero0 none interleaved-1f1b"


def test_unfused_gradient_accumulation_adds_one_pass_over_layer_params() -> None:
    from plansim.analytic.layer_cost import layer_pass_times
    from plansim.analytic.ranks import layout_groups
    from tests.unit.synthetic import round_profile

    prof = round_profile()  # 1000 GB/s streaming HBM
    counts = count_parameters(GPT3)
    times = {}
    for fused in (True, False):
        plan = plan_from_fields(
            dp=1,
            tp=8,
            pp=1,
            micro_batch_size=1,
            global_batch_size=1,
            gradient_accumulation_fusion=fused,
        )
        times[fused] = layer_pass_times(
            GPT3, plan, prof, layout_groups(plan, gpus_per_node=8)
        ).backward_weight_s
    local = (counts.attention_per_layer + counts.mlp_per_layer) / 8 + counts.norms_per_layer
    # bf16: read the 2-byte fresh gradient, read and write the 4-byte fp32 main grad
    assert times[False] - times[True] == pytest.approx(local * (2 + 8) / 1000e9, rel=1e-12)


@pytest.mark.parametrize(
    ("preset", "pp", "mbs", "gbs"),
    [
        ("korthikanti-22b", 1, 4, 4),
        ("korthikanti-175b", 8, 1, 64),
        ("korthikanti-530b", 35, 1, 280),
        ("korthikanti-1t", 64, 1, 512),
    ],
)
def test_korthikanti_table3_fits_only_with_sp_and_selective_or_full_recompute(
    preset: str, pp: int, mbs: int, gbs: int
) -> None:
    """Korthikanti et al. 2022 §6 / Figure 7 (reference memory.md §2.3): on 80 GB A100s with
    tp 8, none of the Table 3 configurations fits without sequence parallelism and selective
    recompute together (or full recompute)."""
    from plansim.analytic.memory import worst_rank_memory
    from plansim.io.profiles import load_profile

    a100 = load_profile("a100-sxm4-80gb")
    model = resolve_model(preset)

    def fits(recompute: Recompute, sp: bool) -> bool:
        plan = plan_from_fields(
            dp=1, tp=8, pp=pp, micro_batch_size=mbs, global_batch_size=gbs, recompute=recompute,
            sequence_parallel=sp, attention=AttentionKernel.UNFUSED,
        )  # fmt: skip
        return worst_rank_memory(model, plan, a100).total_bytes <= a100.hbm_capacity_bytes

    assert not fits(Recompute.NONE, False)
    assert not fits(Recompute.NONE, True)
    assert not fits(Recompute.SELECTIVE, False)
    assert fits(Recompute.SELECTIVE, True)
    assert fits(Recompute.FULL, False)


@pytest.mark.parametrize(
    ("framework", "precision", "zero", "grad"),
    [
        (Framework.MEGATRON_DEEPSPEED, Precision.BF16, 1, 6.0),
        (Framework.DEEPSPEED, Precision.BF16, 0, 6.0),
        (Framework.MEGATRON_DEEPSPEED, Precision.FP16, 1, 2.0),
        (Framework.MEGATRON_DEEPSPEED, Precision.BF16, 2, 4.0),
        (Framework.MEGATRON_CORE, Precision.BF16, 1, 4.0),
    ],
)
def test_deepspeed_bf16_optimizer_keeps_the_16_bit_gradients_too(
    framework: Framework, precision: Precision, zero: int, grad: float
) -> None:
    """DeepSpeed's BF16_Optimizer (ZeRO 0/1) keeps autograd's bf16 .grad until the step
    beside its fp32 buffer: 6 bytes of gradient per parameter in memory; the gradient bytes
    the collectives move stay 4, and every other framework or stage is unchanged."""
    plan = plan_from_fields(
        dp=8, tp=4, pp=12, micro_batch_size=2, global_batch_size=2048,
        precision=precision, zero_stage=zero, framework=framework,
    )  # fmt: skip
    assert memory_state_bytes(plan).grad == grad
    assert plan_state_bytes(plan).grad == (2.0 if precision is Precision.FP16 else 4.0)
    assert memory_state_bytes(plan).optimizer == plan_state_bytes(plan).optimizer
