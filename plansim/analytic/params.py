"""Parameter counts of a dense decoder-only transformer, split by component.

Pure functions of :class:`~plansim.specs.model.ModelSpec`; no I/O.

For a GPT-style model (MHA, ffn = 4h, GELU, LayerNorm, biases, learned positions, tied
embeddings) the total equals Narayanan et al. SC21 Eq. 2,

    P = 12*L*h^2 * (1 + 13/(12h) + (V + s)/(12*L*h)) = 12*L*h^2 + 13*L*h + (V + s)*h,

plus the final LayerNorm (2h), which Eq. 2 leaves out. GQA shrinks the K and V projections to
``kv_size = num_query_groups * head_dim`` columns each; SwiGLU adds a third h x ffn matrix.

Modelling limits: dense models only (:func:`count_parameters` refuses models with routed
experts, MLA or MTP modules; :mod:`plansim.analytic.moe_counts` counts those), no QKV-only
biases (Qwen2 has biases on Q, K and V but not on the output or MLP), no embedding LayerNorm
(BLOOM has one, 2h parameters), no vocabulary padding (Megatron pads V to a multiple of
128 x tp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from plansim.specs.layer_split import pipeline_layer_counts
from plansim.specs.model import ModelSpec, PositionEmbedding, require_dense
from plansim.specs.plan import ParallelPlan

#: Norm layers per transformer layer (pre-attention and pre-MLP; Narayanan SC21 Eq. 2's 13h
#: counts 2 LayerNorms x 2h).
NORMS_PER_LAYER = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    """Parameter counts (a count of scalars, not bytes) of one model.

    Attributes:
        attention_per_layer: Q (h x h), K and V (h x kv_size each), output (h x h), plus
            biases h + 2*kv_size (QKV) and h (output) when the linears carry biases.
        mlp_per_layer: num_ffn_matrices * h * ffn, plus biases ffn * (num_ffn_matrices - 1)
            (up, and gate for SwiGLU) and h (down) when the linears carry biases.
        norms_per_layer: 2 norms x params_per_hidden (2 for LayerNorm, 1 for RMSNorm) x h.
        embedding: word embedding V x h.
        position_embedding: s x h for learned absolute positions, 0 for RoPE.
        final_norm: the norm after the last layer, params_per_hidden x h.
        output_layer: V x h for an untied output projection, 0 when tied to the embedding.
        num_layers: transformer layers L.
    """

    attention_per_layer: int
    mlp_per_layer: int
    norms_per_layer: int
    embedding: int
    position_embedding: int
    final_norm: int
    output_layer: int
    num_layers: int

    @property
    def per_layer(self) -> int:
        """Parameters of one transformer layer: attention + MLP + norms."""
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    @property
    def transformer(self) -> int:
        """Parameters of all L transformer layers."""
        return self.num_layers * self.per_layer

    @property
    def total(self) -> int:
        """All parameters: layers, embeddings, final norm and (untied) output layer."""
        return (
            self.transformer
            + self.embedding
            + self.position_embedding
            + self.final_norm
            + self.output_layer
        )

    def as_dict(self) -> dict[str, int]:
        """Path-keyed breakdown for tables, e.g. ``{"layer/attention": ..., "total": ...}``."""
        return {
            "layer/attention": self.attention_per_layer,
            "layer/mlp": self.mlp_per_layer,
            "layer/norms": self.norms_per_layer,
            "layer/total": self.per_layer,
            "layers": self.transformer,
            "embedding/word": self.embedding,
            "embedding/position": self.position_embedding,
            "final_norm": self.final_norm,
            "output_layer": self.output_layer,
            "total": self.total,
        }


def attention_params_per_layer(model: ModelSpec) -> int:
    """Self-attention (MHA/GQA) parameters of one layer.

    Q is h x q and the output projection q x h, with q = ``model.query_size`` = heads x
    head_dim (= h unless ``kv_channels`` says otherwise, as for Qwen3-MoE); K and V are
    h x kv_size each (GQA: kv_size = num_query_groups * head_dim; MHA: kv_size = h, giving
    Narayanan SC21's 4h^2 + 4h). Biases: q + 2*kv_size (QKV) and h (output).
    """
    h, q, kv = model.hidden_size, model.query_size, model.kv_size
    weights = 2 * h * q + 2 * h * kv
    biases = (q + 2 * kv) + h if model.add_bias_linear else 0
    return weights + biases


def ffn_params(model: ModelSpec, *, ffn_hidden_size: int) -> int:
    """Parameters of one MLP of width ``ffn_hidden_size`` (a dense layer's, or one expert's).

    num_ffn_matrices matrices of h x ffn (2 for GELU/ReLU: up, down; 3 for SwiGLU: up, gate,
    down). Biases: ffn outputs for each of the up/gate projections and h for the down one
    (GPT ffn = 4h: 8h^2 + 5h, Narayanan SC21 Eq. 2).
    """
    h, ffn, n = model.hidden_size, ffn_hidden_size, model.activation.num_ffn_matrices
    weights = n * h * ffn
    biases = ffn * (n - 1) + h if model.add_bias_linear else 0
    return weights + biases


def mlp_params_per_layer(model: ModelSpec) -> int:
    """MLP parameters of one layer: :func:`ffn_params` of ``model.ffn_hidden_size``."""
    return ffn_params(model, ffn_hidden_size=model.ffn_hidden_size)


def count_parameters(model: ModelSpec) -> ParamCounts:
    """Count the parameters of ``model`` by component.

    Args:
        model: the transformer.

    Returns:
        ParamCounts; ``total`` equals Narayanan et al. SC21 Eq. 2 plus the final LayerNorm (2h)
        for a GPT-style model.

    Raises:
        SpecError: the model has routed experts, MLA, MTP modules or attention of another
            width than h (``plansim.specs.model.require_dense``; count those with
            ``plansim.analytic.moe_counts.count_moe_parameters``).
    """
    require_dense(model)
    h, vocab = model.hidden_size, model.vocab_size
    norm = model.normalization.params_per_hidden * h
    learned = model.position_embedding is PositionEmbedding.LEARNED
    return ParamCounts(
        attention_per_layer=attention_params_per_layer(model),
        mlp_per_layer=mlp_params_per_layer(model),
        norms_per_layer=NORMS_PER_LAYER * norm,
        embedding=vocab * h,
        position_embedding=model.seq_length * h if learned else 0,
        final_norm=norm,
        output_layer=0 if model.tied_embeddings else vocab * h,
        num_layers=model.num_layers,
    )


def rank_parameters(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> float:
    """Parameters held by pipeline rank ``rank`` on one TP rank.

    Linear weights, word embedding and output layer are split over tp (Megatron
    column/row/vocab parallel); norms and learned position embeddings are replicated.
    Rank 0 holds the embeddings; the last rank the final norm and the output layer (a copy of
    the word embedding when tied and pp > 1, as Megatron keeps one for the tied gradient);
    with ZB-V / DualPipeV rank 0 holds both ends, with DualPipe ranks 0 and pp - 1 both do
    and every rank holds two copies' chunks (``ParallelPlan.stages_of_rank``).
    """
    counts = count_parameters(model)
    layers = pipeline_layer_counts(model.num_layers, plan)[rank]
    sharded = layers * (counts.attention_per_layer + counts.mlp_per_layer)
    replicated = layers * counts.norms_per_layer
    first, last = plan.rank_holds_stage(rank, 0), plan.rank_holds_stage(rank, plan.num_stages - 1)
    edges = edge_parameters(counts, plan, first=first, last=last)
    return (sharded + edges.sharded) / plan.tp + (replicated + edges.replicated)


class EdgeCounts(Protocol):
    """The counts :func:`edge_parameters` reads (``ParamCounts``, ``MoEParamCounts``)."""

    @property
    def embedding(self) -> int: ...
    @property
    def position_embedding(self) -> int: ...
    @property
    def final_norm(self) -> int: ...
    @property
    def output_layer(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeParameters:
    """Parameters of the pipeline's ends on one stage: ``sharded`` over tp (word embedding,
    output layer), ``replicated`` (learned positions, final norm)."""

    sharded: float
    replicated: float


def edge_parameters(
    counts: EdgeCounts, plan: ParallelPlan, *, first: bool, last: bool
) -> EdgeParameters:
    """The embedding (``first``) and final norm + output layer (``last``) a stage or rank
    holds: the word embedding and learned positions on the first, the final norm and the
    output layer on the last (a copy of the word embedding when tied and pp > 1, as Megatron
    keeps one for the tied gradient)."""
    sharded = replicated = 0.0
    if first:
        sharded += counts.embedding
        replicated += counts.position_embedding
    if last:
        replicated += counts.final_norm
        if counts.output_layer:
            sharded += counts.output_layer
        elif plan.pp > 1:
            sharded += counts.embedding
    return EdgeParameters(sharded=sharded, replicated=replicated)
