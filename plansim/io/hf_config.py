"""Read a local Hugging Face ``config.json`` into a :class:`~plansim.specs.model.ModelSpec`.

Only the local file is read (no download). Supported ``model_type`` families and the keys used
(names as in the ``transformers`` configuration classes):

- ``llama``, ``mistral``, ``qwen2``: hidden_size, num_hidden_layers, num_attention_heads,
  num_key_value_heads (llama: defaults to num_attention_heads, as ``LlamaConfig`` does),
  intermediate_size, vocab_size, max_position_embeddings (default sequence length),
  tie_word_embeddings (default false), hidden_act (must be silu: SwiGLU MLP); RMSNorm, RoPE,
  no linear biases. Modelling limit: Qwen2 has biases on Q, K and V (h + 2*kv_size per
  layer, about 0.13M of Qwen2-7B's 7.6B), which ModelSpec cannot express; they are left out.
- ``gpt2``: n_embd, n_layer, n_head, n_positions, vocab_size, n_inner (null: 4h),
  activation_function (a GELU variant or relu); learned positions, tied, LayerNorm, biases.
- ``gpt_neox``: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
  vocab_size, max_position_embeddings, hidden_act, tie_word_embeddings (default false);
  rotary positions (partial rotary_pct has no parameters), LayerNorm, biases.

Dropout (``ModelSpec.dropout``, which decides whether dropout masks are stored): on when any
of the family's dropout probabilities is above 0, with the ``transformers`` defaults for a
missing key: llama/mistral/qwen2 ``attention_dropout`` (0.0), gpt2 ``resid_pdrop``,
``embd_pdrop``, ``attn_pdrop`` (0.1 each), gpt_neox ``hidden_dropout``,
``attention_dropout`` and the older ``hidden_dropout_prob``, ``attention_probs_dropout_prob``
(0.0 each).

Mixture-of-Experts families (planned and simulated by ``plansim.analytic.moe_layer``), all
SwiGLU (``hidden_act`` silu),
RMSNorm, RoPE, ``attention_dropout`` 0.0 by default; the MoE layers' positions (the
``MoESpec`` pattern: dense leading layers, then every n-th) are fitted to the config's list of
MoE layers, and a list no such pattern gives is refused by name:

- every family: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``num_key_value_heads`` (required, except DeepSeek's: the heads when missing),
  ``intermediate_size``, ``vocab_size``, ``max_position_embeddings`` (default sequence
  length), ``tie_word_embeddings`` (default false), ``head_dim`` where the family has one
  (null: h / heads; missing: the family's ``transformers`` default).
- ``mixtral`` (``MixtralForCausalLM``): ``num_local_experts``, ``num_experts_per_tok``,
  ``intermediate_size`` (each expert's width); softmax router.
- ``qwen2_moe``, ``qwen3_moe``: ``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``intermediate_size`` (the dense layers'), ``decoder_sparse_step``
  (1) and ``mlp_only_layers`` ([]) for which layers have experts (layer i when it is not in
  mlp_only_layers and (i + 1) % decoder_sparse_step == 0, as the ``transformers`` models
  build them); qwen2_moe's ``shared_expert_intermediate_size`` (required; 0: none) is one
  shared expert with a sigmoid ``shared_expert_gate``; its Q/K/V biases are left out as for
  ``qwen2``.
- ``deepseek_v2``, ``deepseek_v3``, ``kimi_k2`` (Kimi K2 ships DeepSeek-V3's architecture):
  MLA (``q_lora_rank``, null or 0: no query latent; ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``), ``n_routed_experts``, ``n_shared_experts``,
  ``num_experts_per_tok``, ``moe_intermediate_size``, ``first_k_dense_replace`` and
  ``moe_layer_freq`` (layer i has experts when i >= first_k_dense_replace and
  i % moe_layer_freq == 0), ``scoring_func`` (softmax for deepseek_v2, sigmoid otherwise,
  when missing), ``topk_method`` (``noaux_tc``: a per-expert score bias; ``noaux_tc`` and
  ``group_limited_greedy`` limit the groups to ``topk_group`` of ``n_group``),
  ``num_nextn_predict_layers`` (MTP modules, 0 when missing).
- ``gpt_oss``: ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size`` (each
  expert's width), ``head_dim`` (64), ``attention_bias`` (true: biases on the attention and, as
  ``transformers`` always builds them, on the experts; the router has a bias); softmax router.
  ``layer_types`` may hold sliding- and full-attention layers (the window is not modelled).
- ``llama4`` (its ``text_config``; the vision tower is not read) and ``llama4_text``:
  ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size`` (experts and the
  one shared expert), ``intermediate_size_mlp`` (dense layers), ``moe_layers`` or
  ``interleave_moe_layer_step`` (layers step-1, 2*step-1, ...), ``head_dim`` (128); sigmoid
  router.

Refused with the reason (never read as another architecture): hybrid models whose layers are
not all attention layers, by ``model_type`` (:data:`HYBRID_MODEL_TYPES`: Nemotron-H,
Qwen3-Next, Jamba, Falcon-H1, Granite-4.0 hybrid, Bamba, Zamba, MiniMax-01, Kimi Linear, LFM2,
RecurrentGemma, plain Mamba and RWKV, each with its reason) or by a
``layer_types`` entry other than full, sliding or chunked attention, or a
``hybrid_override_pattern``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plansim.errors import InputFileError, SpecError
from plansim.specs.mla import MlaSpec
from plansim.specs.model import (
    Activation,
    ModelSpec,
    Normalization,
    PositionEmbedding,
)
from plansim.specs.moe import MoESpec, RouterScore, RouterSpec

_GELU_NAMES = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python")
_ACTIVATIONS = {**{name: Activation.GELU for name in _GELU_NAMES}, "relu": Activation.RELU}


class _Keys:
    """Typed access to the keys of one config, with errors naming the file and the key."""

    def __init__(self, path: Path, data: Mapping[str, Any], *, prefix: str = "") -> None:
        self.path = path
        self.data = data
        self.prefix = prefix  # "text_config." for a nested config

    def error(self, key: str, message: str) -> InputFileError:
        return InputFileError(f"{self.path}: key {self.prefix + key!r} {message}")

    def get_optional_int(self, key: str) -> int | None:
        """An integer, or None when missing, null or 0 (``q_lora_rank``, ``n_group``)."""
        value = self.data.get(key)
        if value is None or value == 0:
            return None
        return self.get_int(key)

    def get_int_list(self, key: str) -> list[int] | None:
        """A list of integers, or None when missing or null."""
        value = self.data.get(key)
        if value is None:
            return None
        bad = not isinstance(value, list) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value
        )
        if bad:
            raise self.error(key, f"must be a list of integers, got {value!r}")
        return list(value)

    def get_choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        """A string among ``choices`` (``default`` when missing)."""
        value = self.data.get(key, default)
        if not isinstance(value, str) or value not in choices:
            raise self.error(key, f"is {value!r}; supported: {', '.join(choices)}")
        return value

    def get_int(
        self, key: str, default: int | None = None, *, null_means_default: bool = False
    ) -> int:
        value = self.data.get(key, default)
        if value is None and null_means_default:  # a JSON null the format defines (n_inner)
            value = default
        if value is None:
            raise self.error(key, "is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def get_dropout(self, defaults: Mapping[str, float]) -> bool:
        """Whether any dropout probability named in ``defaults`` (key -> the family's default
        when the key is missing) is above 0."""
        on = False
        for key, default in defaults.items():
            value = self.data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise self.error(key, f"must be a probability in [0, 1), got {value!r}")
            on = on or value > 0
        return on

    def get_activation(
        self, key: str, choices: Mapping[str, Activation], default: str
    ) -> Activation:
        value = self.data.get(key, default)
        if not isinstance(value, str) or value not in choices:
            raise self.error(key, f"is {value!r}; supported: {', '.join(sorted(choices))}")
        return choices[value]


def _name(keys: _Keys) -> str:
    name = keys.data.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    path = keys.path
    return path.parent.name if path.stem == "config" and path.parent.name else path.stem


def _llama_like(keys: _Keys) -> ModelSpec:
    heads = keys.get_int("num_attention_heads")
    kv_default = heads if keys.data.get("model_type") == "llama" else None
    return ModelSpec(
        name=_name(keys),
        num_layers=keys.get_int("num_hidden_layers"),
        hidden_size=keys.get_int("hidden_size"),
        num_attention_heads=heads,
        num_query_groups=keys.get_int("num_key_value_heads", kv_default),
        ffn_hidden_size=keys.get_int("intermediate_size"),
        activation=keys.get_activation("hidden_act", {"silu": Activation.SWIGLU}, "silu"),
        seq_length=keys.get_int("max_position_embeddings"),
        vocab_size=keys.get_int("vocab_size"),
        tied_embeddings=keys.get_bool("tie_word_embeddings", False),
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        add_bias_linear=False,
        dropout=keys.get_dropout({"attention_dropout": 0.0}),
    )


def _gpt2(keys: _Keys) -> ModelSpec:
    hidden = keys.get_int("n_embd")
    heads = keys.get_int("n_head")
    return ModelSpec(
        name=_name(keys),
        num_layers=keys.get_int("n_layer"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        ffn_hidden_size=keys.get_int("n_inner", 4 * hidden, null_means_default=True),
        activation=keys.get_activation("activation_function", _ACTIVATIONS, "gelu_new"),
        seq_length=keys.get_int("n_positions"),
        vocab_size=keys.get_int("vocab_size"),
        tied_embeddings=keys.get_bool("tie_word_embeddings", True),
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        add_bias_linear=True,
        dropout=keys.get_dropout({"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}),
    )


def _gpt_neox(keys: _Keys) -> ModelSpec:
    heads = keys.get_int("num_attention_heads")
    return ModelSpec(
        name=_name(keys),
        num_layers=keys.get_int("num_hidden_layers"),
        hidden_size=keys.get_int("hidden_size"),
        num_attention_heads=heads,
        num_query_groups=heads,
        ffn_hidden_size=keys.get_int("intermediate_size"),
        activation=keys.get_activation("hidden_act", _ACTIVATIONS, "gelu"),
        seq_length=keys.get_int("max_position_embeddings"),
        vocab_size=keys.get_int("vocab_size"),
        tied_embeddings=keys.get_bool("tie_word_embeddings", False),
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.ROPE,
        add_bias_linear=True,
        dropout=keys.get_dropout(
            {
                "hidden_dropout": 0.0,
                "attention_dropout": 0.0,
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
            }
        ),
    )


#: model_type -> reader of that family.
READERS: dict[str, Callable[[_Keys], ModelSpec]] = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
}


def _moe_layers_pattern(keys: _Keys, moe_layers: list[int], num_layers: int) -> tuple[int, int]:
    """(first_k_dense_layers, layer_interval) of the ``MoESpec`` whose MoE layers are
    ``moe_layers`` (0-based indices), or InputFileError naming the layers no pattern gives.

    The interval is the gap between the first two MoE layers (a single MoE layer at m: the
    smallest that puts no other layer after it, L - m); the dense layers before the first
    interval are the leading ones.
    """
    wanted = tuple(sorted(set(moe_layers)))
    if not wanted:
        raise InputFileError(
            f"{keys.path}: no layer of {num_layers} has experts, and model_type "
            f"{keys.data.get('model_type')!r} describes a model with experts"
        )
    interval = wanted[1] - wanted[0] if len(wanted) > 1 else max(1, num_layers - wanted[0])
    first = wanted[0] - interval + 1
    made = range(first + interval - 1, num_layers, interval)
    if first >= 0 and tuple(made) == wanted:
        return first, interval
    raise InputFileError(
        f"{keys.path}: MoE layers {', '.join(map(str, wanted))} of {num_layers} do not follow "
        f"the pattern plansim describes (leading dense layers, then every n-th layer has "
        f"experts)"
    )


def _base_fields(keys: _Keys, *, name: str, kv_heads_default: bool = False) -> dict[str, Any]:
    """The ModelSpec fields the MoE families share (SwiGLU, RMSNorm, RoPE, untied default).

    ``num_key_value_heads`` is required (the ``transformers`` defaults of these families are
    model sizes, not "as many as the heads"), except with ``kv_heads_default`` (DeepSeek:
    missing means the heads, as ``DeepseekV3Config`` does)."""
    hidden = keys.get_int("hidden_size")
    heads = keys.get_int("num_attention_heads")
    return {
        "name": name,
        "num_layers": keys.get_int("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": keys.get_int(
            "num_key_value_heads", heads if kv_heads_default else None
        ),
        "ffn_hidden_size": keys.get_int("intermediate_size"),
        "activation": keys.get_activation("hidden_act", {"silu": Activation.SWIGLU}, "silu"),
        "seq_length": keys.get_int("max_position_embeddings"),
        "vocab_size": keys.get_int("vocab_size"),
        "tied_embeddings": keys.get_bool("tie_word_embeddings", False),
        "normalization": Normalization.RMSNORM,
        "position_embedding": PositionEmbedding.ROPE,
        "add_bias_linear": False,
        "dropout": keys.get_dropout({"attention_dropout": 0.0}),
    }


def _head_dim(keys: _Keys, fields: Mapping[str, Any], *, missing: int | None = None) -> int | None:
    """``kv_channels``: the config's ``head_dim`` when it is not hidden / heads, else None.

    A null ``head_dim`` means hidden / heads; a missing one the family's ``transformers``
    default ``missing`` (gpt_oss 64, llama4_text 128), or hidden / heads without one."""
    hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
    ratio = hidden // heads
    if "head_dim" not in keys.data and missing is not None:
        head_dim = missing
    else:
        head_dim = keys.get_int("head_dim", ratio, null_means_default=True)
    return None if head_dim == ratio and hidden % heads == 0 else head_dim


def _moe_spec(
    keys: _Keys, fields: Mapping[str, Any], moe_layers: list[int], **spec: Any
) -> MoESpec:
    first, interval = _moe_layers_pattern(keys, moe_layers, fields["num_layers"])
    return MoESpec(first_k_dense_layers=first, layer_interval=interval, **spec)


def _mixtral(keys: _Keys) -> ModelSpec:
    fields = _base_fields(keys, name=_name(keys))
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=keys.get_int("num_experts_per_tok"))
    moe = MoESpec(
        num_experts=keys.get_int("num_local_experts"),
        expert_ffn_hidden_size=fields["ffn_hidden_size"],
        router=router,
    )
    return ModelSpec(**fields, moe=moe, kv_channels=_head_dim(keys, fields))


def _qwen_moe(keys: _Keys) -> ModelSpec:
    fields = _base_fields(keys, name=_name(keys))
    layers = fields["num_layers"]
    step = keys.get_int("decoder_sparse_step", 1)
    dense = set(keys.get_int_list("mlp_only_layers") or [])
    sparse = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    qwen2 = keys.data.get("model_type") == "qwen2_moe"  # qwen3_moe has no shared experts
    shared = keys.get_int("shared_expert_intermediate_size") if qwen2 else 0
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=keys.get_int("num_experts_per_tok"))
    moe = _moe_spec(
        keys,
        fields,
        sparse,
        num_experts=keys.get_int("num_experts"),
        expert_ffn_hidden_size=keys.get_int("moe_intermediate_size"),
        router=router,
        num_shared_experts=1 if shared else 0,
        shared_expert_ffn_hidden_size=shared or None,
        shared_expert_gate=bool(shared),
    )
    return ModelSpec(**fields, moe=moe, kv_channels=_head_dim(keys, fields))


def _deepseek_router(keys: _Keys) -> RouterSpec:
    model_type = keys.data.get("model_type")
    score = keys.get_choice(
        "scoring_func",
        ("softmax", "sigmoid"),
        "softmax" if model_type == "deepseek_v2" else "sigmoid",
    )
    methods = ("greedy", "group_limited_greedy", "noaux_tc")
    method = keys.get_choice("topk_method", methods, "greedy" if score == "softmax" else "noaux_tc")
    grouped = method != "greedy"
    return RouterSpec(
        score=RouterScore(score),
        top_k=keys.get_int("num_experts_per_tok"),
        bias=method == "noaux_tc",
        num_groups=(keys.get_optional_int("n_group") or 1) if grouped else 1,
        groups_per_token=(keys.get_optional_int("topk_group") or 1) if grouped else 1,
    )


def _deepseek(keys: _Keys) -> ModelSpec:
    fields = _base_fields(keys, name=_name(keys), kv_heads_default=True)
    layers = fields["num_layers"]
    first = keys.get_int("first_k_dense_replace", 0)
    freq = keys.get_int("moe_layer_freq", 1)
    sparse = [i for i in range(layers) if i >= first and i % freq == 0]
    mla = MlaSpec(
        q_lora_rank=keys.get_optional_int("q_lora_rank"),
        kv_lora_rank=keys.get_int("kv_lora_rank"),
        qk_nope_head_dim=keys.get_int("qk_nope_head_dim"),
        qk_rope_head_dim=keys.get_int("qk_rope_head_dim"),
        v_head_dim=keys.get_int("v_head_dim"),
    )
    moe = _moe_spec(
        keys,
        fields,
        sparse,
        num_experts=keys.get_int("n_routed_experts"),
        expert_ffn_hidden_size=keys.get_int("moe_intermediate_size"),
        router=_deepseek_router(keys),
        num_shared_experts=keys.get_optional_int("n_shared_experts") or 0,
    )
    mtp = keys.get_optional_int("num_nextn_predict_layers")
    return ModelSpec(**fields, moe=moe, mla=mla, mtp_num_layers=mtp)


def _gpt_oss(keys: _Keys) -> ModelSpec:
    fields = _base_fields(keys, name=_name(keys))
    fields["add_bias_linear"] = keys.get_bool("attention_bias", True)
    router = RouterSpec(
        score=RouterScore.SOFTMAX, top_k=keys.get_int("num_experts_per_tok"), bias=True
    )
    moe = MoESpec(
        num_experts=keys.get_int("num_local_experts"),
        expert_ffn_hidden_size=fields["ffn_hidden_size"],
        router=router,
    )
    return ModelSpec(**fields, moe=moe, kv_channels=_head_dim(keys, fields, missing=64))


def _llama4(keys: _Keys) -> ModelSpec:
    name = _name(keys)
    if keys.data.get("model_type") == "llama4":
        text = keys.data.get("text_config")
        if not isinstance(text, dict):
            raise keys.error("text_config", f"must be an object, got {text!r}")
        outer_tied = keys.get_bool("tie_word_embeddings", False)
        keys = _Keys(keys.path, {"tie_word_embeddings": outer_tied, **text}, prefix="text_config.")
        _refuse_hybrid_layers(keys)
    fields = _base_fields(keys, name=name)
    expert_ffn = fields["ffn_hidden_size"]
    fields["ffn_hidden_size"] = keys.get_int("intermediate_size_mlp", expert_ffn)
    layers = fields["num_layers"]
    step = keys.get_int("interleave_moe_layer_step", 1)
    sparse = keys.get_int_list("moe_layers")
    if sparse is None:
        sparse = list(range(step - 1, layers, step))
    router = RouterSpec(score=RouterScore.SIGMOID, top_k=keys.get_int("num_experts_per_tok"))
    moe = _moe_spec(
        keys,
        fields,
        sparse,
        num_experts=keys.get_int("num_local_experts"),
        expert_ffn_hidden_size=expert_ffn,
        router=router,
        num_shared_experts=1,
    )
    return ModelSpec(**fields, moe=moe, kv_channels=_head_dim(keys, fields, missing=128))


#: model_type -> reader, for models with routed experts.
MOE_READERS: dict[str, Callable[[_Keys], ModelSpec]] = {
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
    "kimi_k2": _deepseek,
    "llama4": _llama4,
    "llama4_text": _llama4,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
}

#: model_type -> why plansim refuses it: layers that are not (all) attention layers.
HYBRID_MODEL_TYPES: dict[str, str] = {
    "bamba": "hybrid Mamba-2 / attention layers",
    "falcon_h1": "hybrid layers running attention and Mamba-2 heads side by side",
    "falcon_mamba": "Mamba state-space layers (no attention)",
    "granitemoehybrid": "hybrid Mamba-2 / attention layers with experts",
    "jamba": "hybrid Mamba / attention layers with experts",
    "kimi_linear": "hybrid Kimi Delta Attention (linear attention) / MLA layers",
    "lfm2": "hybrid short-convolution / attention layers",
    "mamba": "Mamba state-space layers (no attention)",
    "mamba2": "Mamba-2 state-space layers (no attention)",
    "minimax": "hybrid lightning (linear) attention / softmax attention layers",
    "nemotron_h": "hybrid Mamba-2 / attention layers (hybrid_override_pattern)",
    "qwen3_next": "hybrid Gated DeltaNet (linear attention) / gated attention layers",
    "recurrent_gemma": "hybrid RG-LRU recurrent / local attention layers",
    "rwkv": "RWKV recurrent layers (no attention)",
    "zamba": "hybrid Mamba / shared attention layers",
    "zamba2": "hybrid Mamba-2 / shared attention layers",
}

#: ``layer_types`` entries that are attention layers (sliding windows and chunks are counted
#: as full attention: their FLOPs are overstated, their parameters the same).
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def supported_model_types() -> tuple[str, ...]:
    """The dense ``model_type`` values :func:`read_hf_config` understands (plansim plans and
    simulates those models), sorted."""
    return tuple(sorted(READERS))


def described_model_types() -> tuple[str, ...]:
    """The ``model_type`` values of models with experts that :func:`read_hf_config` reads
    (parameters and FLOPs; not yet planned or simulated), sorted."""
    return tuple(sorted(MOE_READERS))


def _refuse_hybrid_layers(keys: _Keys) -> None:
    """InputFileError for a config whose layers are not all attention layers."""
    model_type = keys.data.get("model_type")
    if isinstance(model_type, str) and model_type in HYBRID_MODEL_TYPES:
        raise keys.error(
            "model_type",
            f"is {model_type!r}: {HYBRID_MODEL_TYPES[model_type]}, which plansim does not "
            f"model (it describes transformers whose every layer is attention + MLP)",
        )
    if "hybrid_override_pattern" in keys.data:
        raise keys.error(
            "hybrid_override_pattern",
            "describes a hybrid Mamba / attention stack, which plansim does not model",
        )
    layer_types = keys.data.get("layer_types")
    if isinstance(layer_types, list):
        other = sorted({str(t) for t in layer_types} - set(ATTENTION_LAYER_TYPES))
        if other:
            raise keys.error(
                "layer_types",
                f"has {', '.join(other)} layers, which plansim does not model (it reads "
                f"{', '.join(ATTENTION_LAYER_TYPES)} layers only)",
            )


class _DuplicateKeyError(ValueError):
    """A JSON object repeats a key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json`` object hook: the object's dict, refusing a repeated key."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _load_json(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read Hugging Face config: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except _DuplicateKeyError as exc:
        raise InputFileError(
            f"{path}: duplicate key {exc.key!r} in a JSON object (a key may appear once; "
            "json would keep the last silently)"
        ) from None
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_hf_config(path: str | Path) -> ModelSpec:
    """Build a ModelSpec from a local Hugging Face ``config.json``.

    Args:
        path: the config file, or a directory holding ``config.json``.

    Returns:
        The model; its ``seq_length`` is the config's maximum positions (override it with
        ``dataclasses.replace`` or ``plansim.catalog.resolve_model(..., seq_length=...)``).
        ``name`` is ``_name_or_path`` when present, else the directory (or file) name.

    Raises:
        InputFileError: the file cannot be read, is not a JSON object, has an unsupported
            ``model_type`` (the message lists the supported ones and those described only),
            describes a hybrid (Mamba, linear-attention) model (the message says why it is
            refused), lacks a key or has one of the wrong type (the message names the file
            and the key), or describes an invalid model (heads not dividing the width, ...).
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    keys = _Keys(file, _load_json(file))
    _refuse_hybrid_layers(keys)
    model_type = keys.data.get("model_type")
    readers = {**READERS, **MOE_READERS}
    if not isinstance(model_type, str) or model_type not in readers:
        found = "is missing" if model_type is None else f"is {model_type!r}"
        raise keys.error(
            "model_type",
            f"{found}; supported: {', '.join(supported_model_types())}; with experts: "
            f"{', '.join(described_model_types())}",
        )
    try:
        return readers[model_type](keys)
    except SpecError as exc:
        raise InputFileError(f"{file}: {exc}") from exc
