"""Parameter and FLOP counts against hand-worked formulas and published numbers."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from plansim.analytic.flops import (
    Gemm,
    attention_core_forward_flops,
    hardware_flops_per_step,
    layer_forward_flops,
    layer_forward_gemms,
    layer_recompute_gemms,
    logits_forward_gemm,
    model_flops_per_step,
    model_flops_per_token,
)
from plansim.analytic.params import count_parameters
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.plan import Recompute

GPT_STYLE = ("gpt3-175b", "megatron-1.7b", "korthikanti-22b", "megatron-529.6b", "megatron-1t")


def gpt3() -> ModelSpec:
    return resolve_model("gpt3-175b")


def tiny(**overrides: object) -> ModelSpec:
    """A small model whose counts are easy to work out by hand (h 8, 2 heads, ffn 16)."""
    fields: dict[str, object] = {
        "name": "tiny",
        "num_layers": 2,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_query_groups": 2,
        "ffn_hidden_size": 16,
        "activation": Activation.GELU,
        "seq_length": 4,
        "vocab_size": 10,
        "tied_embeddings": True,
    }
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- parameters


def test_gpt3_175b_matches_narayanan_eq2_exactly() -> None:
    # Narayanan et al. SC21 Eq. 2: P = 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h)); it leaves out
    # the final LayerNorm (2h), which count_parameters includes.
    m = gpt3()
    L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.seq_length
    eq2 = 12 * L * h**2 * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * L * h))
    counts = count_parameters(m)
    assert counts.final_norm == 2 * h
    assert counts.total - counts.final_norm == eq2
    assert counts.total == pytest.approx(174.6e9, rel=1e-3)


def test_gpt3_breakdown_by_component() -> None:
    h = 12288
    counts = count_parameters(gpt3())
    assert counts.attention_per_layer == 4 * h * h + 4 * h
    assert counts.mlp_per_layer == 8 * h * h + 5 * h
    assert counts.norms_per_layer == 4 * h
    assert counts.per_layer == 12 * h * h + 13 * h
    assert counts.embedding == 51200 * h
    assert counts.position_embedding == 2048 * h
    assert counts.output_layer == 0
    assert counts.as_dict()["total"] == counts.total
    assert counts.as_dict()["layer/attention"] == counts.attention_per_layer


@pytest.mark.parametrize(
    ("preset", "published", "rel"),
    [
        # Meta model cards / Llama 3 paper Table 3 shapes; sizes as on the model cards.
        ("llama3-8b", 8.03e9, 5e-3),
        ("llama3-70b", 70.55e9, 5e-3),
        ("llama3-405b", 405.85e9, 5e-3),
        # Touvron et al. 2023 (Llama 2) shapes; sizes as in the HF checkpoints.
        ("llama2-7b", 6.74e9, 1e-3),
        ("llama2-13b", 13.0e9, 2e-3),
        ("llama2-70b", 68.98e9, 1e-3),
    ],
)
def test_llama_parameter_counts(preset: str, published: float, rel: float) -> None:
    assert count_parameters(resolve_model(preset)).total == pytest.approx(published, rel=rel)


def test_llama3_8b_hand_worked() -> None:
    # h 4096, kv_size 8 * 128 = 1024, ffn 14336, V 128256, RMSNorm, untied, no biases.
    counts = count_parameters(resolve_model("llama3-8b"))
    assert counts.attention_per_layer == 2 * 4096**2 + 2 * 4096 * 1024
    assert counts.mlp_per_layer == 3 * 4096 * 14336
    assert counts.norms_per_layer == 2 * 4096
    assert counts.position_embedding == 0
    assert counts.output_layer == counts.embedding == 128256 * 4096
    assert counts.final_norm == 4096
    assert counts.total == 8_030_261_248


def test_biases_with_gqa_and_swiglu() -> None:
    # h 8, 4 heads of 2, 2 query groups -> kv_size 4; SwiGLU: up and gate biases have ffn each.
    m = tiny(
        num_attention_heads=4,
        num_query_groups=2,
        activation=Activation.SWIGLU,
        add_bias_linear=True,
    )
    counts = count_parameters(m)
    assert counts.attention_per_layer == (8 * 8 + 2 * 8 * 4 + 8 * 8) + (8 + 2 * 4) + 8
    assert counts.mlp_per_layer == 3 * 8 * 16 + 2 * 16 + 8


def test_no_bias_rmsnorm_rope_untied() -> None:
    m = tiny(
        add_bias_linear=False,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        tied_embeddings=False,
    )
    counts = count_parameters(m)
    assert counts.attention_per_layer == 4 * 8 * 8
    assert counts.mlp_per_layer == 2 * 8 * 16
    assert counts.norms_per_layer == 2 * 8
    assert counts.final_norm == 8
    assert counts.position_embedding == 0
    assert counts.output_layer == 10 * 8
    assert counts.total == 2 * (256 + 256 + 16) + 80 + 8 + 80


def test_learned_positions_scale_with_seq_length() -> None:
    assert count_parameters(tiny(seq_length=4)).position_embedding == 4 * 8
    assert count_parameters(tiny(seq_length=6)).position_embedding == 6 * 8


# ----------------------------------------------------------------------------- GEMMs


def test_gemm_flops_and_backward() -> None:
    g = Gemm(name="x", m=3, n=5, k=7, count=2)
    assert g.flops == 2 * 3 * 5 * 7 * 2
    assert g.backward_flops == 2 * g.flops
    assert g.has_weight


@pytest.mark.parametrize("field", ["m", "n", "k", "count"])
def test_gemm_rejects_non_positive_dimensions(field: str) -> None:
    kwargs: dict[str, object] = {"name": "x", "m": 1, "n": 1, "k": 1, "count": 1, field: 0}
    with pytest.raises(SpecError, match=f"gemm\\[x\\].{field}"):
        Gemm(**kwargs)  # type: ignore[arg-type]


def test_gpt3_layer_gemms_tp8() -> None:
    b, s, h, d, tp = 2, 2048, 12288, 128, 8
    gemms = {g.name: g for g in layer_forward_gemms(gpt3(), micro_batch_size=b, tp=tp)}
    assert list(gemms) == ["qkv", "attn_scores", "attn_over_v", "attn_out", "mlp_up", "mlp_down"]
    shapes = {name: (g.m, g.n, g.k, g.count) for name, g in gemms.items()}
    assert shapes == {
        "qkv": (b * s, 3 * h // tp, h, 1),
        "attn_scores": (s, s, d, b * 96 // tp),
        "attn_over_v": (s, d, s, b * 96 // tp),
        "attn_out": (b * s, h, h // tp, 1),
        "mlp_up": (b * s, 4 * h // tp, h, 1),
        "mlp_down": (b * s, h, 4 * h // tp, 1),
    }
    assert not gemms["attn_scores"].has_weight
    assert not gemms["attn_over_v"].has_weight
    assert gemms["qkv"].has_weight


@pytest.mark.parametrize("preset", GPT_STYLE)
def test_gpt_layer_forward_is_24bsh2_plus_4bs2h_and_splits_over_tp(preset: str) -> None:
    m = resolve_model(preset)
    b, s, h = 3, m.seq_length, m.hidden_size
    expected = 24 * b * s * h**2 + 4 * b * s**2 * h
    assert layer_forward_flops(m, micro_batch_size=b, tp=1) == expected
    assert layer_forward_flops(m, micro_batch_size=b, tp=8) * 8 == expected
    assert attention_core_forward_flops(m, micro_batch_size=b) == 4 * b * s**2 * h


def test_llama3_70b_gqa_swiglu_gemms_tp8() -> None:
    m = resolve_model("llama3-70b")
    gemms = {g.name: g for g in layer_forward_gemms(m, micro_batch_size=1, tp=8)}
    assert gemms["qkv"].n == (8192 + 2 * 1024) // 8
    assert gemms["mlp_gate"] == dataclasses.replace(gemms["mlp_up"], name="mlp_gate")
    assert gemms["mlp_up"].n == 28672 // 8
    assert gemms["mlp_down"].k == 28672 // 8
    assert gemms["attn_scores"].count == 64 // 8


def test_kv_heads_replicated_when_tp_exceeds_query_groups() -> None:
    m = resolve_model("llama3-8b")  # 32 heads, 8 KV heads, head_dim 128
    qkv = layer_forward_gemms(m, micro_batch_size=1, tp=16)[0]
    assert qkv.n == 2 * 128 + 2 * 128


@pytest.mark.parametrize(
    ("overrides", "tp", "match"),
    [
        ({}, 3, "num_attention_heads"),
        ({"num_attention_heads": 4, "num_query_groups": 4, "ffn_hidden_size": 18}, 4, "ffn"),
        ({"ffn_hidden_size": 18, "num_attention_heads": 8, "num_query_groups": 4}, 0, "tp"),
    ],
)
def test_tp_must_split_the_layer(overrides: dict[str, object], tp: int, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        layer_forward_gemms(tiny(**overrides), micro_batch_size=1, tp=tp)


def test_groups_not_dividing_tp_rejected() -> None:
    m = tiny(hidden_size=48, num_attention_heads=12, num_query_groups=4, ffn_hidden_size=48)
    with pytest.raises(SpecError, match="num_query_groups"):
        layer_forward_gemms(m, micro_batch_size=1, tp=6)


def test_logits_gemm_pads_vocab_to_tp() -> None:
    m = tiny(vocab_size=50257, hidden_size=768, num_attention_heads=12, num_query_groups=12)
    g = logits_forward_gemm(m, micro_batch_size=2, tp=8)
    assert (g.m, g.n, g.k) == (2 * 4, 6283, 768)
    assert logits_forward_gemm(m, micro_batch_size=1, tp=1).n == 50257


def test_recompute_gemms() -> None:
    m = gpt3()
    assert layer_recompute_gemms(m, micro_batch_size=1, tp=8, recompute=Recompute.NONE) == ()
    full = layer_recompute_gemms(m, micro_batch_size=1, tp=8, recompute=Recompute.FULL)
    assert full == layer_forward_gemms(m, micro_batch_size=1, tp=8)
    sel = layer_recompute_gemms(m, micro_batch_size=1, tp=8, recompute=Recompute.SELECTIVE)
    assert [g.name for g in sel] == ["attn_scores", "attn_over_v"]


# ----------------------------------------------------------------------------- per step


def _gpt_terms(m: ModelSpec, batch: int) -> tuple[int, int, int, int, int]:
    return batch, m.num_layers, m.seq_length, m.hidden_size, m.vocab_size


@pytest.mark.parametrize("preset", GPT_STYLE)
def test_model_flops_equal_korthikanti_eq7(preset: str) -> None:
    m = resolve_model(preset)
    B, L, s, h, V = _gpt_terms(m, 1536)
    eq7 = 72 * B * L * s * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * h * L))
    assert model_flops_per_step(m, global_batch_size=B) == float(eq7)
    assert hardware_flops_per_step(m, global_batch_size=B, recompute=Recompute.NONE) == float(eq7)


@pytest.mark.parametrize("preset", GPT_STYLE)
def test_full_recompute_equals_narayanan_eq3(preset: str) -> None:
    m = resolve_model(preset)
    B, L, s, h, V = _gpt_terms(m, 512)
    eq3 = 96 * B * s * L * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * L * h))
    assert hardware_flops_per_step(m, global_batch_size=B, recompute=Recompute.FULL) == float(eq3)


@pytest.mark.parametrize("preset", GPT_STYLE)
def test_selective_recompute_equals_korthikanti_eq8(preset: str) -> None:
    m = resolve_model(preset)
    B, L, s, h, V = _gpt_terms(m, 64)
    eq8 = 72 * B * L * s * h**2 * (1 + Fraction(s, 3 * h) + Fraction(V, 12 * h * L))
    got = hardware_flops_per_step(m, global_batch_size=B, recompute=Recompute.SELECTIVE)
    assert got == float(eq8)


def test_gqa_swiglu_per_token_is_6_matmul_params_plus_attention() -> None:
    # Llama has no biases: the forward does 2 FLOPs per weight-matrix parameter per token
    # (logits use the untied output layer), plus 4*s*h per layer for Q K^T and A V.
    m = resolve_model("llama3-8b")
    counts = count_parameters(m)
    L, s, h = m.num_layers, m.seq_length, m.hidden_size
    matmul_params = L * (counts.attention_per_layer + counts.mlp_per_layer) + counts.output_layer
    assert model_flops_per_token(m) == 6 * matmul_params + 12 * L * s * h


def test_selective_recompute_adds_three_attention_core_forwards_for_gqa() -> None:
    m = resolve_model("llama3-70b")
    B, L, s, h = 16, m.num_layers, m.seq_length, m.hidden_size
    model = model_flops_per_step(m, global_batch_size=B)
    sel = hardware_flops_per_step(m, global_batch_size=B, recompute=Recompute.SELECTIVE)
    full = hardware_flops_per_step(m, global_batch_size=B, recompute=Recompute.FULL)
    assert sel - model == 3 * L * 4 * B * s**2 * h
    assert full - model == L * layer_forward_flops(m, micro_batch_size=B)


@pytest.mark.parametrize(
    ("preset", "step_time_s", "num_gpus", "batch", "mfu_pct", "hfu_pct"),
    [
        # Korthikanti et al. 2022 Table 5 (SP + selective), published_runs.csv T0025-T0031;
        # A100 peak 312 TFLOP/s as used by the paper.
        ("korthikanti-22b", 1.10, 8, 4, 41.5, 43.7),
        ("korthikanti-175b", 13.75, 64, 64, 51.4, 52.8),
        ("korthikanti-530b", 37.83, 280, 280, 56.0, 57.0),
        ("korthikanti-1t", 71.49, 512, 512, 56.3, 57.0),
    ],
)
def test_reproduces_korthikanti_table5_mfu_hfu(
    preset: str, step_time_s: float, num_gpus: int, batch: int, mfu_pct: float, hfu_pct: float
) -> None:
    m = resolve_model(preset)
    peak = step_time_s * num_gpus * 312e12
    mfu = 100 * model_flops_per_step(m, global_batch_size=batch) / peak
    hfu = 100 * hardware_flops_per_step(m, global_batch_size=batch, recompute=Recompute.SELECTIVE)
    assert mfu == pytest.approx(mfu_pct, abs=0.2)
    assert hfu / peak == pytest.approx(hfu_pct, abs=0.2)
