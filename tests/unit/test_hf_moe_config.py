"""Hugging Face config.json import of models with experts (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3,
Kimi K2, gpt-oss, Llama 4), and the refusal of hybrid Mamba / linear-attention models.

The configs are written in each test: the values of the published config.json files (as the
presets in ``plansim.catalog`` cite them), or small ones worked by hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from plansim.analytic.moe_counts import count_moe_parameters
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import InputFileError
from plansim.io.hf_config import (
    described_model_types,
    read_hf_config,
    supported_model_types,
)
from plansim.specs.model import ModelSpec
from plansim.specs.moe import RouterScore

#: deepseek-ai/DeepSeek-V3 config.json (the keys plansim reads, and a few it ignores).
DEEPSEEK_V3: dict[str, Any] = {
    "_name_or_path": "deepseek-ai/DeepSeek-V3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "hidden_act": "silu",
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "vocab_size": 129280,
    "num_nextn_predict_layers": 1,
    "attention_bias": False,
    "attention_dropout": 0.0,
}

#: moonshotai/Kimi-K2 config.json: DeepSeek-V3's architecture, 384 experts, 64 heads.
KIMI_K2: dict[str, Any] = {
    **DEEPSEEK_V3,
    "_name_or_path": "moonshotai/Kimi-K2-Base",
    "model_type": "kimi_k2",
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.827,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
    "num_nextn_predict_layers": 0,
}

#: deepseek-ai/DeepSeek-V2-Lite config.json: no query latent, greedy softmax routing.
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 6,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "vocab_size": 102400,
}

#: mistralai/Mixtral-8x7B-v0.1 config.json.
MIXTRAL_8X7B: dict[str, Any] = {
    "_name_or_path": "mistralai/Mixtral-8x7B-v0.1",
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1e6,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}

#: Qwen/Qwen3-30B-A3B config.json.
QWEN3_30B_A3B: dict[str, Any] = {
    "_name_or_path": "Qwen/Qwen3-30B-A3B",
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "attention_dropout": 0.0,
}

#: Qwen/Qwen2-57B-A14B config.json: one wide shared expert with a sigmoid gate.
QWEN2_57B_A14B: dict[str, Any] = {
    "model_type": "qwen2_moe",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "moe_intermediate_size": 2560,
    "shared_expert_intermediate_size": 20480,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}

#: openai/gpt-oss-120b config.json: biases, head_dim 64, alternating attention windows.
GPT_OSS_120B: dict[str, Any] = {
    "_name_or_path": "openai/gpt-oss-120b",
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_act": "silu",
    "hidden_size": 2880,
    "head_dim": 64,
    "intermediate_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "attention_bias": True,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}

#: meta-llama/Llama-4-Maverick-17B-128E config.json (the text model inside; vision omitted).
LLAMA4_MAVERICK: dict[str, Any] = {
    "_name_or_path": "meta-llama/Llama-4-Maverick-17B-128E",
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama4_text",
        "hidden_act": "silu",
        "hidden_size": 5120,
        "head_dim": 128,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "num_local_experts": 128,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "moe_layers": list(range(1, 48, 2)),
        "max_position_embeddings": 1048576,
        "vocab_size": 202048,
        "attention_dropout": 0.0,
    },
    "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408},
}


def _write(tmp_path: Path, data: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _read(tmp_path: Path, data: dict[str, Any]) -> ModelSpec:
    return read_hf_config(_write(tmp_path, data))


def _as_preset(model: ModelSpec, preset: str) -> ModelSpec:
    """``model`` under the preset's name and sequence length (configs give the maximum)."""
    reference = resolve_model(preset)
    return dataclasses.replace(model, name=reference.name, seq_length=reference.seq_length)


# ----------------------------------------------------------------------------- the presets


@pytest.mark.parametrize(
    ("config", "preset"),
    [
        (DEEPSEEK_V3, "deepseek-v3"),
        (KIMI_K2, "kimi-k2"),
        (MIXTRAL_8X7B, "mixtral-8x7b"),
        (QWEN3_30B_A3B, "qwen3-30b-a3b"),
        (GPT_OSS_120B, "gpt-oss-120b"),
        (LLAMA4_MAVERICK, "llama4-maverick"),
    ],
)
def test_published_configs_read_as_the_presets(
    tmp_path: Path, config: dict[str, Any], preset: str
) -> None:
    model = _read(tmp_path, config)
    assert model.name == config["_name_or_path"]
    assert _as_preset(model, preset) == resolve_model(preset)


def test_deepseek_v3_fields(tmp_path: Path) -> None:
    model = _read(tmp_path, DEEPSEEK_V3)
    assert model.seq_length == 163840 and model.mtp_num_layers == 1
    assert model.moe is not None and model.mla is not None
    assert (model.moe.first_k_dense_layers, model.moe.layer_interval) == (3, 1)
    router = model.moe.router
    assert (router.score, router.top_k, router.bias) == (RouterScore.SIGMOID, 8, True)
    assert (router.num_groups, router.groups_per_token) == (8, 4)
    assert model.mla.q_lora_rank == 1536 and model.mla.qk_head_dim == 192


def test_deepseek_v2_lite_has_no_query_latent_and_greedy_softmax(tmp_path: Path) -> None:
    model = _read(tmp_path, DEEPSEEK_V2_LITE)
    assert model.mla is not None and model.mla.q_lora_rank is None
    assert model.moe is not None and model.mtp_num_layers is None
    router = model.moe.router
    assert (router.score, router.bias, router.num_groups) == (RouterScore.SOFTMAX, False, 1)
    # DeepSeek-V2 paper arXiv:2405.04434 App. B: V2-Lite 15.7B total, 2.4B active
    counts = count_moe_parameters(model)
    assert counts.total / 1e9 == pytest.approx(15.7, rel=0.05 / 15.7 + 0.01)
    assert counts.active_without_input_embedding / 1e9 == pytest.approx(2.4, rel=0.05 / 2.4 + 0.01)
    # DeepSeek-V2 itself: group-limited greedy over 8 groups, 3 per token
    grouped = {"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}
    v2 = _read(tmp_path, {**DEEPSEEK_V2_LITE, **grouped})
    assert v2.moe is not None
    assert (v2.moe.router.num_groups, v2.moe.router.groups_per_token) == (8, 3)


def test_deepseek_moe_layer_freq_is_fitted_or_refused(tmp_path: Path) -> None:
    # layers i >= 1 with i % 1 == 0 -> from layer 1 on; with freq 2 and 1 dense layer, the
    # even layers 2, 4, ... (HF's rule) form the pattern first_k 1, every 2nd
    every_other = _read(tmp_path, {**DEEPSEEK_V2_LITE, "moe_layer_freq": 2})
    assert every_other.moe is not None
    assert every_other.moe.moe_layer_indices(27) == tuple(range(2, 27, 2))
    assert (every_other.moe.first_k_dense_layers, every_other.moe.layer_interval) == (1, 2)
    # freq 3 from layer 1: 3, 6, 9, ... fits first_k 1 and every 3rd (1-based: layers 3, 6...)
    third = _read(tmp_path, {**DEEPSEEK_V2_LITE, "moe_layer_freq": 3})
    assert third.moe is not None and third.moe.moe_layer_indices(27) == tuple(range(3, 27, 3))


def test_qwen2_moe_shared_expert_and_published_totals(tmp_path: Path) -> None:
    model = _read(tmp_path, QWEN2_57B_A14B)
    assert model.moe is not None
    assert model.moe.num_shared_experts == 1 and model.moe.shared_ffn_hidden_size == 20480
    assert model.moe.shared_expert_gate and model.kv_channels is None
    counts = count_moe_parameters(model)
    # Qwen2 technical report arXiv:2407.10671 Table 1: 57B total, 14B activated (its Q/K/V
    # biases, 28 x 4608, are not modelled)
    assert counts.total / 1e9 == pytest.approx(57, rel=0.5 / 57 + 0.01)
    assert counts.active / 1e9 == pytest.approx(14, rel=0.5 / 14 + 0.01)
    assert counts.moe_layer.router == 64 * 3584 + 3584  # the gate and the shared-expert gate


def test_qwen_mlp_only_layers_and_sparse_step(tmp_path: Path) -> None:
    leading = _read(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]})
    assert leading.moe is not None
    assert (leading.moe.first_k_dense_layers, leading.moe.layer_interval) == (2, 1)
    assert count_moe_parameters(leading).num_dense_layers == 2
    step = _read(tmp_path, {**QWEN3_30B_A3B, "decoder_sparse_step": 2})
    assert step.moe is not None and step.moe.moe_layer_indices(48) == tuple(range(1, 48, 2))
    no_head_dim = {k: v for k, v in QWEN3_30B_A3B.items() if k != "head_dim"}
    assert _read(tmp_path, no_head_dim).kv_channels is None  # h / heads = 64
    with pytest.raises(InputFileError, match=r"MoE layers 1, 2, 3, 4, 6, .* do not follow"):
        _read(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": [0, 5]})


def test_llama4_text_config_and_flat_text_model(tmp_path: Path) -> None:
    scout = {**LLAMA4_MAVERICK["text_config"], "num_local_experts": 16}
    scout.update({"interleave_moe_layer_step": 1, "moe_layers": None, "_name_or_path": "scout"})
    model = _read(tmp_path, {**scout, "model_type": "llama4_text"})
    assert _as_preset(model, "llama4-scout") == resolve_model("llama4-scout")
    # the step alone gives Maverick's layers when moe_layers is absent
    text = {k: v for k, v in LLAMA4_MAVERICK["text_config"].items() if k != "moe_layers"}
    maverick = _read(tmp_path, {**LLAMA4_MAVERICK, "text_config": text})
    assert _as_preset(maverick, "llama4-maverick") == resolve_model("llama4-maverick")
    odd = {**LLAMA4_MAVERICK["text_config"], "moe_layers": [0, 1, 5]}
    with pytest.raises(InputFileError, match="MoE layers 0, 1, 5 of 48 do not follow"):
        _read(tmp_path, {**LLAMA4_MAVERICK, "text_config": odd})


def test_llama4_errors_name_the_nested_key(tmp_path: Path) -> None:
    text = {k: v for k, v in LLAMA4_MAVERICK["text_config"].items() if k != "hidden_size"}
    with pytest.raises(InputFileError, match=r"key 'text_config\.hidden_size' is missing"):
        _read(tmp_path, {**LLAMA4_MAVERICK, "text_config": text})
    with pytest.raises(InputFileError, match=r"key 'text_config' must be an object, got None"):
        _read(tmp_path, {**LLAMA4_MAVERICK, "text_config": None})


def test_mixtral_head_dim_null_and_counts(tmp_path: Path) -> None:
    model = _read(tmp_path, {**MIXTRAL_8X7B, "head_dim": None})
    assert model.kv_channels is None and model.moe is not None
    assert model.moe.router.score is RouterScore.SOFTMAX
    counts = count_moe_parameters(model)
    assert (round(counts.total / 1e9, 1), round(counts.active / 1e9, 1)) == (46.7, 12.9)


def test_gpt_oss_biases(tmp_path: Path) -> None:
    model = _read(tmp_path, GPT_OSS_120B)
    assert model.add_bias_linear and model.kv_channels == 64
    assert model.moe is not None and model.moe.router.bias
    no_bias = _read(tmp_path, {**GPT_OSS_120B, "attention_bias": False})
    assert not no_bias.add_bias_linear


def test_family_defaults_of_missing_keys(tmp_path: Path) -> None:
    # a missing head_dim is the family's transformers default (GptOssConfig: 64), a null one
    # hidden / heads (2880 / 64 = 45)
    no_head_dim = {k: v for k, v in GPT_OSS_120B.items() if k != "head_dim"}
    assert _read(tmp_path, no_head_dim).kv_channels == 64
    assert _read(tmp_path, {**GPT_OSS_120B, "head_dim": None}).kv_channels is None
    # num_key_value_heads is required (MixtralConfig's default is 8, not the heads) except
    # for DeepSeek, whose config class defaults it to the heads
    no_kv = {k: v for k, v in MIXTRAL_8X7B.items() if k != "num_key_value_heads"}
    with pytest.raises(InputFileError, match="'num_key_value_heads' is missing"):
        _read(tmp_path, no_kv)
    v3 = {k: v for k, v in DEEPSEEK_V3.items() if k != "num_key_value_heads"}
    assert _read(tmp_path, v3).num_query_groups == 128
    # Qwen2MoeConfig's shared expert width is a model size: required
    no_shared = {k: v for k, v in QWEN2_57B_A14B.items() if k != "shared_expert_intermediate_size"}
    with pytest.raises(InputFileError, match="'shared_expert_intermediate_size' is missing"):
        _read(tmp_path, no_shared)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"scoring_func": "sqrtsoftplus"}, r"'scoring_func' is 'sqrtsoftplus'; supported: softmax"),
        ({"topk_method": "top1"}, r"'topk_method' is 'top1'; supported: greedy"),
        ({"n_routed_experts": "256"}, r"'n_routed_experts' must be an integer"),
        ({"kv_lora_rank": None}, r"'kv_lora_rank' is missing"),
        ({"num_experts_per_tok": 300}, r"top_k\(300\) exceeds moe\.num_experts\(256\)"),
        ({"num_key_value_heads": 8}, r"num_query_groups\(8\) must equal"),
        (
            {"first_k_dense_replace": 61},
            r"no layer of 61 has experts, and model_type 'deepseek_v3'",
        ),
        ({"hidden_act": "gelu"}, r"'hidden_act' is 'gelu'; supported: silu"),
    ],
)
def test_bad_moe_configs_name_the_key(tmp_path: Path, change: dict[str, Any], match: str) -> None:
    path = _write(tmp_path, {**DEEPSEEK_V3, **change})
    with pytest.raises(InputFileError, match=match) as info:
        read_hf_config(path)
    assert str(path) in str(info.value)


def test_qwen_mlp_only_layers_must_be_integers(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"'mlp_only_layers' must be a list of integers"):
        _read(tmp_path, {**QWEN3_30B_A3B, "mlp_only_layers": "0,1"})


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            {"model_type": "nemotron_h", "hybrid_override_pattern": "M-M-M*-M-M-"},
            r"key 'model_type' is 'nemotron_h': hybrid Mamba-2 / attention layers "
            r"\(hybrid_override_pattern\), which plansim does not model",
        ),
        (
            {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]},
            r"'model_type' is 'qwen3_next': hybrid Gated DeltaNet \(linear attention\)",
        ),
        ({"model_type": "jamba"}, r"'jamba': hybrid Mamba / attention layers with experts"),
        ({"model_type": "mamba2"}, r"'mamba2': Mamba-2 state-space layers \(no attention\)"),
        (
            {**QWEN3_30B_A3B, "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
            r"key 'layer_types' has linear_attention layers, which plansim does not model",
        ),
        (
            {**MIXTRAL_8X7B, "hybrid_override_pattern": "M*M*"},
            r"key 'hybrid_override_pattern' describes a hybrid Mamba / attention stack",
        ),
        (
            {**LLAMA4_MAVERICK, "text_config": {"layer_types": ["mamba"]}},
            r"key 'text_config\.layer_types' has mamba layers",
        ),
    ],
)
def test_hybrid_models_are_refused_with_the_reason(
    tmp_path: Path, config: dict[str, Any], match: str
) -> None:
    with pytest.raises(InputFileError, match=match):
        _read(tmp_path, config)


def test_unsupported_model_type_lists_dense_and_described(tmp_path: Path) -> None:
    with pytest.raises(InputFileError) as info:
        _read(tmp_path, {"model_type": "dbrx"})
    message = str(info.value)
    assert "'model_type' is 'dbrx'; supported: gpt2, gpt_neox, llama, mistral, qwen2; " in message
    assert message.endswith(
        "with experts: deepseek_v2, "
        "deepseek_v3, gpt_oss, kimi_k2, llama4, llama4_text, mixtral, qwen2_moe, qwen3_moe"
    )
    assert supported_model_types() == ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")
    assert described_model_types()[0] == "deepseek_v2"


def test_cli_models_reads_a_moe_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, MIXTRAL_8X7B)
    assert main(["models", str(path)]) == 0
    out = capsys.readouterr().out
    row = out.splitlines()[1].split()
    assert row[:5] == ["mistralai/Mixtral-8x7B-v0.1", "46.70", "12.88", "32", "32"]
    assert "moe_layer/routed_experts" in out
    plan = ["plan", "--model", str(path), "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    assert main([*plan, "--gbs", "8", "--jobs", "1", "--pp", "1", "--top", "2"]) == 1
    assert "optimizer" in capsys.readouterr().out  # 8 GPUs hold no layout: named why
