"""ModelSpec: the shape of a decoder-only transformer, dense or with Mixture-of-Experts layers.

Field names follow Megatron-LM's arguments where one exists (``num_layers``, ``hidden_size``,
``num_attention_heads``, ``num_query_groups``, ``ffn_hidden_size``, ``seq_length``,
``kv_channels``, ``mtp_num_layers``). A dense model leaves the optional fields at None: routed
experts (``moe``, :mod:`plansim.specs.moe`), Multi-head Latent Attention (``mla``,
:mod:`plansim.specs.mla`), multi-token prediction modules (``mtp_num_layers``) and a head width
other than hidden / heads (``kv_channels``). Such models are counted by
:mod:`plansim.analytic.moe_counts` and planned and simulated by :mod:`plansim.analytic.moe_layer`;
the dense-only counts refuse them (:func:`require_dense`).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.mla import MlaSpec
from plansim.specs.moe import MoESpec


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
    """A decoder-only transformer (dense unless ``moe`` is set).

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
        kv_channels: per-head width of queries, keys and values (Megatron ``--kv-channels``,
            Hugging Face ``head_dim``) where it is not hidden_size / num_attention_heads:
            Qwen3-235B-A22B 128 with h = 4096 and 64 heads (queries 8192 wide); None: h / a.
        moe: the routed experts; None for a dense model.
        mla: Multi-head Latent Attention instead of MHA/GQA (DeepSeek-V2/V3, Kimi K2); None
            for MHA/GQA.
        mtp_num_layers: multi-token prediction modules trained beside the model (DeepSeek-V3
            report §2.2: 1; Megatron ``--mtp-num-layers``, Hugging Face
            ``num_nextn_predict_layers``); None: none.

    Raises:
        SpecError: a field is not positive, heads do not divide the width, or query groups do
            not divide the heads; with ``moe``, no layer is left for the experts; with ``mla``,
            query groups differ from the heads, ``kv_channels`` is set or the linears carry
            biases.
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
    kv_channels: int | None = None
    moe: MoESpec | None = None
    mla: MlaSpec | None = None
    mtp_num_layers: int | None = None

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
        own_width = self.kv_channels is not None or self.mla is not None
        if not own_width and self.hidden_size % self.num_attention_heads:
            raise SpecError(
                f"model.hidden_size({self.hidden_size}) is not divisible by "
                f"model.num_attention_heads({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_query_groups:
            raise SpecError(
                f"model.num_attention_heads({self.num_attention_heads}) is not divisible by "
                f"model.num_query_groups({self.num_query_groups})"
            )
        for field in ("kv_channels", "mtp_num_layers"):
            if getattr(self, field) is not None:
                require_positive_int(f"model.{field}", getattr(self, field))
        self._check_moe()
        self._check_mla()

    def _check_moe(self) -> None:
        moe = self.moe
        if moe is None:
            return
        if not isinstance(moe, MoESpec):
            raise SpecError(f"model.moe must be a MoESpec or None, got {moe!r}")
        if moe.num_moe_layers(self.num_layers) == 0:
            raise SpecError(
                f"moe.first_k_dense_layers({moe.first_k_dense_layers}) and "
                f"moe.layer_interval({moe.layer_interval}) leave no expert layer among "
                f"model.num_layers({self.num_layers})"
            )

    def _check_mla(self) -> None:
        mla = self.mla
        if mla is None:
            return
        if not isinstance(mla, MlaSpec):
            raise SpecError(f"model.mla must be a MlaSpec or None, got {mla!r}")
        if self.num_query_groups != self.num_attention_heads:
            raise SpecError(
                f"model.mla expands keys and values per head: model.num_query_groups"
                f"({self.num_query_groups}) must equal model.num_attention_heads"
                f"({self.num_attention_heads})"
            )
        if self.kv_channels is not None:
            raise SpecError(
                f"model.kv_channels({self.kv_channels}) is set with model.mla, which gives its "
                f"own head widths (qk_nope_head_dim, qk_rope_head_dim, v_head_dim)"
            )
        if self.add_bias_linear:
            raise SpecError(
                "model.add_bias_linear is True with model.mla: MLA's projections have no "
                "biases (DeepSeek-V2/V3); set it False"
            )

    @property
    def head_dim(self) -> int:
        """Per-head width: ``kv_channels`` when set, else h / a (Megatron ``kv_channels``)."""
        if self.kv_channels is not None:
            return self.kv_channels
        return self.hidden_size // self.num_attention_heads

    @property
    def query_size(self) -> int:
        """Width of the Q projection (and the input of the output projection): heads x
        head_dim; h for every model without ``kv_channels``."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the K (and of the V) projection: query groups x head_dim."""
        return self.num_query_groups * self.head_dim


def is_dense(model: ModelSpec) -> bool:
    """Whether ``model`` is dense: no experts, MLA or MTP modules, and attention as wide as
    the hidden size (:func:`unsimulated_features` empty; cheap, for the costing's hot paths)."""
    if model.moe is not None or model.mla is not None or model.mtp_num_layers is not None:
        return False
    return model.kv_channels is None or model.query_size == model.hidden_size


def unsimulated_features(model: ModelSpec) -> tuple[tuple[str, str], ...]:
    """What ``model`` has that the dense-only counts do not cover, as pairs (what the model
    has, what they miss); empty for a dense model.

    Routed experts, MLA, MTP modules, and attention whose width heads x kv_channels differs
    from the hidden size (the dense activation and communication formulas take them equal).
    """
    found: list[tuple[str, str]] = []
    if model.moe is not None:
        found.append((f"{model.moe.num_experts} routed experts", "expert layers"))
    if model.mla is not None:
        found.append(("Multi-head Latent Attention", "MLA"))
    if model.mtp_num_layers is not None:
        n = model.mtp_num_layers
        found.append((f"{n} MTP module{'s' if n > 1 else ''}", "MTP modules"))
    if model.mla is None and model.query_size != model.hidden_size:
        found.append(
            (
                f"attention num_attention_heads({model.num_attention_heads}) x kv_channels"
                f"({model.head_dim}) = {model.query_size} wide against hidden_size"
                f"({model.hidden_size})",
                "attention of another width than the hidden size",
            )
        )
    return tuple(found)


def dense_only_reason(model: ModelSpec) -> str | None:
    """Why the dense-only counts (``plansim.analytic.params.count_parameters``, the step
    FLOPs of ``plansim.analytic.flops``) refuse ``model``, or None for a dense model: it has
    experts, MLA, MTP modules or attention wider than the hidden size (count those with
    ``plansim.analytic.moe_counts``)."""
    if is_dense(model):
        return None
    found = unsimulated_features(model)
    has = _join([have for have, _ in found], "and")
    missing = _join([what for _, what in found], "or")
    return (
        f"{model.name} has {has}: the dense counts do not cover {missing} "
        f"(plansim.analytic.moe_counts counts them)"
    )


def require_dense(model: ModelSpec) -> None:
    """Raise SpecError unless ``model`` is dense (:func:`dense_only_reason`)."""
    reason = dense_only_reason(model)
    if reason is not None:
        raise SpecError(reason)


def _join(items: list[str], word: str) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"
