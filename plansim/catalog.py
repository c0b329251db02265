"""Named model presets, each a small factory function citing where its shape comes from.

``resolve_model`` turns a preset name or a path to a local Hugging Face ``config.json`` into a
:class:`~plansim.specs.model.ModelSpec`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from plansim.errors import UnknownNameError
from plansim.io.hf_config import read_hf_config
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding

#: Vocabulary of the Megatron GPT runs: GPT-2 BPE (50257) padded, V = 51200 in Narayanan SC21
#: and Korthikanti 2022.
MEGATRON_VOCAB = 51200
#: Llama 3 vocabulary: 128K BPE tokens (Llama 3 paper Table 3) + 256 special tokens = 128256
#: (``vocab_size`` of the Meta-Llama-3 config.json files).
LLAMA3_VOCAB = 128256
#: Llama 1/2 SentencePiece vocabulary (Touvron et al. 2023, Llama 2 §2.1).
LLAMA2_VOCAB = 32000


def _gpt(name: str, *, layers: int, hidden: int, heads: int) -> ModelSpec:
    """A Megatron GPT: MHA, ffn = 4h, GELU, seq 2048, V = 51200, learned positions, tied."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        ffn_hidden_size=4 * hidden,
        activation=Activation.GELU,
        seq_length=2048,
        vocab_size=MEGATRON_VOCAB,
        tied_embeddings=True,
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        add_bias_linear=True,
    )


def _llama(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    seq: int,
    vocab: int,
) -> ModelSpec:
    """A Llama: SwiGLU, RMSNorm, RoPE, no linear biases, untied output layer, no dropout (the
    Meta Llama config.json files: ``attention_dropout`` 0.0 and no hidden dropout)."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=kv_heads,
        ffn_hidden_size=ffn,
        activation=Activation.SWIGLU,
        seq_length=seq,
        vocab_size=vocab,
        tied_embeddings=False,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        add_bias_linear=False,
        dropout=False,
    )


def gpt3_175b() -> ModelSpec:
    """GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d_model 12288, 96 heads, n_ctx
    2048); V = 51200 as in the Megatron runs (Narayanan SC21 Eq. 2 gives 174.6B)."""
    return _gpt("gpt3-175b", layers=96, hidden=12288, heads=96)


def _megatron(label: str, layers: int, hidden: int, heads: int) -> Callable[[], ModelSpec]:
    def factory() -> ModelSpec:
        return _gpt(f"megatron-{label}", layers=layers, hidden=hidden, heads=heads)

    factory.__name__ = f"megatron_{label.replace('.', '_')}"
    factory.__doc__ = (
        f"Megatron GPT {label.upper()}: Narayanan et al. SC21 Table 1 weak-scaling row "
        f"({layers} layers, h {hidden}, {heads} heads; reference/published_runs.csv T0001-T0010)."
    )
    return factory


def _korthikanti(label: str, layers: int, hidden: int, heads: int) -> Callable[[], ModelSpec]:
    def factory() -> ModelSpec:
        return _gpt(f"korthikanti-{label}", layers=layers, hidden=hidden, heads=heads)

    factory.__name__ = f"korthikanti_{label}"
    factory.__doc__ = (
        f"GPT {label.upper()} of Korthikanti et al. 2022 Table 3 ({layers} layers, h {hidden}, "
        f"{heads} heads; reference/published_runs.csv T0024-T0031)."
    )
    return factory


def bloom_176b() -> ModelSpec:
    """BLOOM 176B: BigScience 2022 (arXiv:2211.05100) Table 3 and bigscience/bloom
    config.json (n_layer 70, hidden_size 14336, n_head 112, vocab_size 250880, seq 2048).

    ALiBi positions carry no parameters; ModelSpec has no ALIBI member, so ROPE stands in as
    "no position parameters". BLOOM's embedding LayerNorm (2h) is not modelled: the count is
    28,672 below the published 176,247,271,424.
    """
    return ModelSpec(
        name="bloom-176b",
        num_layers=70,
        hidden_size=14336,
        num_attention_heads=112,
        num_query_groups=112,
        ffn_hidden_size=4 * 14336,
        activation=Activation.GELU,
        seq_length=2048,
        vocab_size=250880,
        tied_embeddings=True,
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.ROPE,
        add_bias_linear=True,
    )


def llama2_7b() -> ModelSpec:
    """Llama 2 7B: Touvron et al. 2023 (arXiv:2307.09288) Table 1 (4k context) and
    meta-llama/Llama-2-7b-hf config.json (32 layers, h 4096, 32 heads, ffn 11008)."""
    return _llama(
        "llama2-7b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn=11008,
        seq=4096,
        vocab=LLAMA2_VOCAB,
    )


def llama2_13b() -> ModelSpec:
    """Llama 2 13B: Touvron et al. 2023 Table 1 and meta-llama/Llama-2-13b-hf config.json
    (40 layers, h 5120, 40 heads, ffn 13824)."""
    return _llama(
        "llama2-13b",
        layers=40,
        hidden=5120,
        heads=40,
        kv_heads=40,
        ffn=13824,
        seq=4096,
        vocab=LLAMA2_VOCAB,
    )


def llama2_70b() -> ModelSpec:
    """Llama 2 70B: Touvron et al. 2023 Table 1 (GQA) and meta-llama/Llama-2-70b-hf
    config.json (80 layers, h 8192, 64 heads, 8 KV heads, ffn 28672)."""
    return _llama(
        "llama2-70b",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=28672,
        seq=4096,
        vocab=LLAMA2_VOCAB,
    )


def llama3_8b() -> ModelSpec:
    """Llama 3 8B: Llama 3 paper (arXiv:2407.21783) Table 3 and the Meta-Llama-3-8B model
    card / config.json (32 layers, h 4096, 32 heads, 8 KV heads, ffn 14336, 8k context)."""
    return _llama(
        "llama3-8b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        seq=8192,
        vocab=LLAMA3_VOCAB,
    )


def llama3_70b() -> ModelSpec:
    """Llama 3 70B: Llama 3 paper Table 3 and the Meta-Llama-3-70B model card / config.json
    (80 layers, h 8192, 64 heads, 8 KV heads, ffn 28672, 8k context)."""
    return _llama(
        "llama3-70b",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=28672,
        seq=8192,
        vocab=LLAMA3_VOCAB,
    )


def llama3_405b() -> ModelSpec:
    """Llama 3 405B: Llama 3 paper Table 3 and the Llama-3.1-405B model card / config.json
    (126 layers, h 16384, 128 heads, 8 KV heads, ffn 53248); seq 8192, the pre-training
    length before long-context training (paper §3.4)."""
    return _llama(
        "llama3-405b",
        layers=126,
        hidden=16384,
        heads=128,
        kv_heads=8,
        ffn=53248,
        seq=8192,
        vocab=LLAMA3_VOCAB,
    )


#: Megatron SC21 weak-scaling family: (label, layers, hidden, heads), published_runs.csv.
_MEGATRON_FAMILY = (
    ("1.7b", 24, 2304, 24),
    ("3.6b", 30, 3072, 32),
    ("7.5b", 36, 4096, 32),
    ("18.4b", 40, 6144, 48),
    ("39.1b", 48, 8192, 64),
    ("76.1b", 60, 10240, 80),
    ("145.6b", 80, 12288, 96),
    ("310.1b", 96, 16384, 128),
    ("529.6b", 105, 20480, 128),
    ("1t", 128, 25600, 160),
)

#: Korthikanti et al. 2022 Table 3: (label, layers, hidden, heads).
_KORTHIKANTI_FAMILY = (
    ("22b", 48, 6144, 64),
    ("175b", 96, 12288, 96),
    ("530b", 105, 20480, 128),
    ("1t", 128, 25600, 160),
)

#: Preset name -> factory.
PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "gpt3-175b": gpt3_175b,
    **{f"megatron-{row[0]}": _megatron(*row) for row in _MEGATRON_FAMILY},
    **{f"korthikanti-{row[0]}": _korthikanti(*row) for row in _KORTHIKANTI_FAMILY},
    "bloom-176b": bloom_176b,
    "llama2-7b": llama2_7b,
    "llama2-13b": llama2_13b,
    "llama2-70b": llama2_70b,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "llama3-405b": llama3_405b,
}


def preset_names() -> tuple[str, ...]:
    """Names of the presets, in catalog order."""
    return tuple(PRESETS)


def _looks_like_path(name: str) -> bool:
    return name.endswith(".json") or "/" in name or "\\" in name or Path(name).exists()


def resolve_model(name_or_path: str, *, seq_length: int | None = None) -> ModelSpec:
    """A preset by name, or the model of a local Hugging Face ``config.json``.

    Args:
        name_or_path: a key of PRESETS, or a path to a config.json (or its directory).
        seq_length: training sequence length replacing the preset's (or the config's
            max_position_embeddings); None keeps it. With learned positions this also sizes
            the position-embedding table (ModelSpec has no separate maximum length).

    Returns:
        The model.

    Raises:
        UnknownNameError: neither a preset nor a path; the message lists the presets.
        InputFileError: the config file is missing or malformed.
        SpecError: seq_length is not a positive integer.
    """
    if name_or_path in PRESETS:
        model = PRESETS[name_or_path]()
    elif _looks_like_path(name_or_path):
        model = read_hf_config(name_or_path)
    else:
        raise UnknownNameError("model", name_or_path, preset_names())
    if seq_length is not None:
        model = dataclasses.replace(model, seq_length=seq_length)
    return model
