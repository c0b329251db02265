"""A runs-CSV row's model shape as a ModelSpec (pure).

Row -> ModelSpec (schema in ../shared/reference/README.md): blank ``num_kv_heads`` means as
many as the heads, blank ``ffn_hidden_size`` 4 x hidden, blank ``ffn_activation`` gelu (the
schema's own definitions). The schema has no columns for norms, biases, embeddings,
positions or dropout, so the activation names the family, as its published configs define it:
GELU/ReLU rows are taken as GPT-style (LayerNorm, biases, learned positions, tied embeddings,
dropout: Megatron-LM's GPT examples train with 0.1), SwiGLU rows as Llama-style (RMSNorm, no
biases, RoPE, untied, no dropout: the Meta Llama configs), squared-ReLU rows as Nemotron-style
(LayerNorm, no biases, RoPE, untied, no dropout: NVIDIA/NeMo ``NemotronConfig``,
``nemo/collections/llm/gpt/model/nemotron.py``); the note says which. A GELU row whose model
is named MPT is GPT-style without dropout: MosaicML's ``MosaicGPTConfig`` (mosaicml/examples,
later llm-foundry ``MPTConfig``) defaults ``attn_pdrop``, ``resid_pdrop`` and ``emb_pdrop`` to
0 (biases, learned positions and tied embeddings as GPT: its parameter counts include them).
A blank vocabulary is taken from the preset with the same (layers, hidden, heads), noted, or
the row is skipped.
"""

from __future__ import annotations

import re

from plansim.catalog import PRESETS
from plansim.errors import PlansimError
from plansim.io.runs import RunRow
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding

#: A model name of MosaicML's MPT family ("MPT-7B", "mpt 30b").
_MPT_NAME = re.compile(r"\s*mpt\b", re.IGNORECASE)


class Skip(PlansimError):
    """A row that cannot be modelled; the message is the reason."""


def row_model(row: RunRow, notes: list[str]) -> ModelSpec:
    """The row's model (module docstring); what was assumed is appended to ``notes``.

    Raises:
        Skip: the shape is incomplete, the activation is not modelled, or a blank
            vocabulary matches no preset.
        SpecError: the shape is inconsistent (e.g. heads that do not divide the hidden size).
        InputFileError: a cell that is not a number where one is expected.
    """
    layers, hidden = row.integer("num_layers"), row.integer("hidden_size")
    heads, seq = row.integer("num_attention_heads"), row.integer("seq_len_tokens")
    if not (layers and hidden and heads and seq):
        raise Skip("model shape incomplete (layers, hidden, heads, seq_len)")
    act_text = row.choice("ffn_activation") or "gelu"
    try:
        activation = Activation(act_text)
    except ValueError:
        raise Skip(f"ffn_activation {act_text!r} not modelled") from None
    vocab = row.integer("vocab_size")
    if vocab is None:
        vocab = _preset_vocab(layers, hidden, heads, notes)
    llama = activation is Activation.SWIGLU
    nemotron = activation is Activation.SQUARED_RELU
    mpt = not (llama or nemotron) and _MPT_NAME.match(row.text("model_name") or "") is not None
    if llama:
        notes.append("llama-style model (rmsnorm, rope, untied, no dropout)")
    elif nemotron:
        notes.append("nemotron-style model (layernorm, rope, untied, no biases, no dropout)")
    elif mpt:
        notes.append("gpt-style model without dropout (MPT)")
    else:
        notes.append("gpt-style model")
    return ModelSpec(
        name=row.text("model_name") or row.row_id,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=row.integer("num_kv_heads") or heads,
        ffn_hidden_size=_ffn(row, hidden),
        activation=activation,
        seq_length=seq,
        vocab_size=vocab,
        tied_embeddings=not (llama or nemotron),
        normalization=Normalization.RMSNORM if llama else Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.ROPE
        if llama or nemotron
        else PositionEmbedding.LEARNED,
        add_bias_linear=not (llama or nemotron),
        dropout=not (llama or nemotron or mpt),
    )


def _preset_vocab(layers: int, hidden: int, heads: int, notes: list[str]) -> int:
    for name in sorted(PRESETS):
        spec = PRESETS[name]()
        if (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (layers, hidden, heads):
            notes.append(f"vocab blank: {spec.vocab_size} from preset {name}")
            return spec.vocab_size
    raise Skip("vocab_size blank and no preset has this shape")


def _ffn(row: RunRow, hidden: int) -> int:
    """The stated FFN width, 4 x hidden when blank (a stated 0 is refused by
    ``RunRow.integer``, not defaulted)."""
    ffn = row.integer("ffn_hidden_size")
    return 4 * hidden if ffn is None else ffn
