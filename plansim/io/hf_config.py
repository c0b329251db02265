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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plansim.errors import InputFileError, SpecError
from plansim.specs.model import (
    Activation,
    ModelSpec,
    Normalization,
    PositionEmbedding,
)

_GELU_NAMES = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python")
_ACTIVATIONS = {**{name: Activation.GELU for name in _GELU_NAMES}, "relu": Activation.RELU}


class _Keys:
    """Typed access to the keys of one config, with errors naming the file and the key."""

    def __init__(self, path: Path, data: Mapping[str, Any]) -> None:
        self.path = path
        self.data = data

    def error(self, key: str, message: str) -> InputFileError:
        return InputFileError(f"{self.path}: key {key!r} {message}")

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


def supported_model_types() -> tuple[str, ...]:
    """The ``model_type`` values :func:`read_hf_config` understands, sorted."""
    return tuple(sorted(READERS))


def _load_json(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read Hugging Face config: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
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
            ``model_type`` (the message lists the supported ones), lacks a key or has one of
            the wrong type (the message names the file and the key), or describes an invalid
            model (heads not dividing the width, ...).
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    keys = _Keys(file, _load_json(file))
    model_type = keys.data.get("model_type")
    if not isinstance(model_type, str) or model_type not in READERS:
        found = "is missing" if model_type is None else f"is {model_type!r}"
        raise keys.error("model_type", f"{found}; supported: {', '.join(supported_model_types())}")
    try:
        return READERS[model_type](keys)
    except SpecError as exc:
        raise InputFileError(f"{file}: {exc}") from exc
