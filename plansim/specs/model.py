"""ModelSpec: the shape of a dense decoder-only transformer.

Field names follow Megatron-LM's arguments where one exists (``num_layers``, ``hidden_size``,
``num_attention_heads``, ``num_query_groups``, ``ffn_hidden_size``, ``seq_length``).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum


class Activation(ChoiceEnum):
    """MLP activation. Gated ones (SwiGLU) have three FFN weight matrices instead of two."""

    GELU = "gelu"
    SWIGLU = "swiglu"
    RELU = "relu"
    SQUARED_RELU = "squared_relu"

    @property
    def num_ffn_matrices(self) -> int:
        """Weight matrices of shape h x ffn in the MLP: 3 for gated (up, gate, down), else 2."""
        return 3 if self is Activation.SWIGLU else 2


class Normalization(ChoiceEnum):
    """Normalisation layer: LayerNorm has weight and bias, RMSNorm only a weight."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"

    @property
    def params_per_hidden(self) -> int:
        """Parameters per hidden unit of one norm layer."""
        return 2 if self is Normalization.LAYERNORM else 1


class PositionEmbedding(ChoiceEnum):
    """Learned absolute position embeddings (GPT-2/3) carry s x h parameters; RoPE carries none."""

    LEARNED = "learned"
    ROPE = "rope"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A dense decoder-only transformer.

    Attributes:
        name: label shown in reports.
        num_layers: transformer layers L.
        hidden_size: model width h.
        num_attention_heads: query heads a.
        num_query_groups: key/value heads (GQA groups); equal to ``num_attention_heads`` for MHA.
        ffn_hidden_size: MLP inner width (4h for GPT; 8h/3 rounded for Llama).
        activation: MLP activation (SwiGLU has three FFN matrices).
        seq_length: training sequence length s in tokens.
        vocab_size: vocabulary V (Megatron pads it to a multiple of 128 x tp; not modelled).
        tied_embeddings: input embedding and output projection share weights.
        normalization: LayerNorm (GPT) or RMSNorm (Llama).
        position_embedding: learned absolute (s x h parameters) or RoPE.
        add_bias_linear: linear layers carry biases (GPT-3: yes; Llama: no).
        dropout: hidden and attention dropout are on in training (Megatron-LM's default
            ``--hidden-dropout`` / ``--attention-dropout`` 0.1, GPT-3 style); False for models
            trained without (Llama and Nemotron configs set both to 0): no dropout masks are
            stored (``plansim.analytic.activations``).

    Raises:
        SpecError: a field is not positive, heads do not divide the width, or query groups do
            not divide the heads.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    activation: Activation
    seq_length: int
    vocab_size: int
    tied_embeddings: bool
    normalization: Normalization = Normalization.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    add_bias_linear: bool = True
    dropout: bool = True

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "ffn_hidden_size",
            "seq_length",
            "vocab_size",
        ):
            require_positive_int(f"model.{field}", getattr(self, field))
        if not isinstance(self.activation, Activation):
            raise SpecError(f"model.activation must be an Activation, got {self.activation!r}")
        if self.hidden_size % self.num_attention_heads:
            raise SpecError(
                f"model.hidden_size({self.hidden_size}) is not divisible by "
                f"model.num_attention_heads({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_query_groups:
            raise SpecError(
                f"model.num_attention_heads({self.num_attention_heads}) is not divisible by "
                f"model.num_query_groups({self.num_query_groups})"
            )

    @property
    def head_dim(self) -> int:
        """Per-head width h / a (Megatron ``kv_channels``)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the K (and of the V) projection: query groups x head_dim."""
        return self.num_query_groups * self.head_dim
