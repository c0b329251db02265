"""Parameters (total and active per token) and forward FLOPs per token of any ModelSpec,
layer kind by layer kind: dense layers, MoE layers, MLA and MTP modules.

Pure functions of :class:`~plansim.specs.model.ModelSpec`; no I/O. For a dense model the
counts equal :func:`plansim.analytic.params.count_parameters` and
:func:`plansim.analytic.flops.model_flops_per_token` exactly (the tests check every dense
preset); this module exists for the models those refuse.

Parameters (a count of scalars, not bytes):

- one routed or shared expert is an MLP of its own width (:func:`~plansim.analytic.params.
  ffn_params`: 3 h x ffn matrices for SwiGLU); a MoE layer has E routed experts, the shared
  ones, and a router h x E (+ E with ``router.bias``; + h for a shared-expert gate). Each
  token runs top_k routed experts and all shared ones (DeepSeekMoE, arXiv:2401.06066 §3;
  Mixtral, arXiv:2401.04088: 47B parameters of which 13B are active per token);
- MLA (DeepSeek-V2 arXiv:2405.04434 §2.1.2-2.1.3, DeepSeek-V3 ``inference/model.py``):
  h*q_lora + q_lora + q_lora*a*(d_nope + d_rope) for queries (h*a*(d_nope + d_rope) without a
  query latent), h*(kv_lora + d_rope) + kv_lora + kv_lora*a*(d_nope + d_v) for keys and
  values, a*d_v*h for the output;
- an MTP module (DeepSeek-V3 report §2.2, Fig. 3; ``README_WEIGHTS.md`` of
  deepseek-ai/DeepSeek-V3): one transformer layer like the model's last, a projection
  h x 2h, two RMSNorms on its inputs and one before the shared output head; it shares the
  embedding and the output head with the model.

Counting conventions differ between publishers, and each count is available:

- ``total``: every parameter of the main model, embeddings and output head included, MTP
  modules excluded: DeepSeek-V3's 671B (report §4.2; ``README_WEIGHTS.md``: "Main Model
  Weights ... Total parameters: 671B", the MTP module's 11.5B counted apart). Meta, Mistral,
  Qwen, Moonshot and xAI give totals of the same kind.
- ``active``: the parameters one token uses, both embedding tables included, as DeepSeek-V3
  counts its 37B (``README_WEIGHTS.md``: 36.7B "including 0.9B for Embedding and 0.9B for
  the output Head"; this count gives 37.55B, 2.3% more) and Mixtral its 12.9B.
- ``active_without_input_embedding``: the same without the input embedding lookup (which
  costs no FLOPs), as the gpt-oss model card counts its 5.1B active (arXiv:2508.10925 Table 1:
  the unembedding counted, the embedding not).
- ``total_with_mtp``: total + the MTP modules' own parameters (11.5B for DeepSeek-V3).

Forward FLOPs per token (a multiply-add is 2 FLOPs; GEMMs only, as :mod:`plansim.analytic.
flops` and Korthikanti et al. 2022 App. A count them): 2 x the weights of every matrix the
token multiplies (the router's h x E for all experts, top_k routed and all shared experts,
MLA's five projections, the logits h x V) plus the attention core, 2*s*a*d_qk for the scores
and 2*s*a*d_v for the weighted values per layer with every query against all s keys
(:class:`AttentionCore` FULL, as :mod:`plansim.analytic.flops` and Korthikanti et al. count
it) or half of that (CAUSAL, the non-zero half of a causal mask). Model FLOPs per trained
token are 3 x forward (backward = 2 x forward). The model TFLOP/s that Megatron-Bridge
reports (``reference/moe_SOURCES.md``, "Consistency checks": DeepSeek-V3 260 GFLOP per token
with MTP and 249 without, Qwen3-235B-A22B 148, Qwen3-30B-A3B 23, Kimi-K2 204, Grok-1 521)
match CAUSAL within 1% (FULL is 4-21% above them); the tests check it.

Modelling limits: no per-head QK norms (Qwen3 ``q_norm``/``k_norm``, 2*d per layer), no
attention sinks (gpt-oss, a per layer), no norms after the attention and MLP (Grok-1 has four
per layer, two counted), each below 0.01% of the totals of the presets in ``plansim.catalog``;
no vision encoder or projector of multimodal checkpoints (Llama 4). Sliding-window and
chunked attention (gpt-oss's 128-token windows on every other layer, Llama 4's 8192-token
chunks) are counted over the whole sequence. With a capacity factor, the dropped tokens'
expert FLOPs are still counted (as model FLOPs count them).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.flops import FWD_BWD_MULTIPLIER
from plansim.analytic.params import (
    NORMS_PER_LAYER,
    attention_params_per_layer,
    ffn_params,
)
from plansim.errors import SpecError
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.model import ModelSpec, PositionEmbedding


class AttentionCore(ChoiceEnum):
    """How the attention core's FLOPs are counted per token.

    FULL: every query against all s keys, 4*s*a*d per layer for MHA/GQA (Korthikanti et al.
    2022 App. A Eq. 7, Narayanan et al. SC21 §5.1; :mod:`plansim.analytic.flops`).
    CAUSAL: half of that, the non-zero half of the causal mask (what Megatron-Bridge's model
    TFLOP/s imply, ``reference/moe_SOURCES.md``).
    """

    FULL = "full"
    CAUSAL = "causal"


#: Norms of one MTP module besides its transformer layer's: the two RMSNorms on the
#: embedding and on the previous depth's hidden state, and the one before the shared output
#: head (DeepSeek-V3 ``README_WEIGHTS.md``: ``enorm``, ``hnorm``, ``shared_head.norm``).
MTP_NORMS = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer of one kind (dense, or with experts).

    Attributes:
        attention: self-attention (MHA/GQA, or MLA with its two latent norms).
        norms: the pre-attention and pre-MLP norms.
        mlp: the dense MLP (0 in a MoE layer).
        router: the gate h x E (+ E bias; + h for a shared-expert gate); 0 in a dense layer.
        expert: one routed expert (0 in a dense layer).
        num_experts: routed experts E (0 in a dense layer).
        top_k: routed experts one token runs (0 in a dense layer).
        shared_experts: all shared experts together.
    """

    attention: int
    norms: int
    mlp: int
    router: int = 0
    expert: int = 0
    num_experts: int = 0
    top_k: int = 0
    shared_experts: int = 0

    @property
    def routed_experts(self) -> int:
        """All routed experts: E x one expert."""
        return self.num_experts * self.expert

    @property
    def total(self) -> int:
        """Every parameter of the layer."""
        return (
            self.attention
            + self.norms
            + self.mlp
            + self.router
            + self.routed_experts
            + self.shared_experts
        )

    @property
    def active(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to."""
        return self.total - (self.num_experts - self.top_k) * self.expert


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEParamCounts:
    """Parameter counts of a model whose layers need not be alike.

    Attributes:
        dense_layer: a layer without experts (its counts even when no layer is dense).
        moe_layer: a layer with experts (equal to dense_layer for a dense model).
        num_dense_layers: layers without experts.
        num_moe_layers: layers with experts.
        embedding: word embedding V x h.
        position_embedding: s x h for learned positions, else 0.
        final_norm: the norm after the last layer.
        output_layer: V x h untied, 0 when tied to the embedding.
        mtp_module: one MTP module's own parameters (its layer, projection and norms; the
            shared embedding and head not counted again).
        mtp_module_active: those one token uses.
        num_mtp_modules: MTP modules (0 without).
    """

    dense_layer: LayerParams
    moe_layer: LayerParams
    num_dense_layers: int
    num_moe_layers: int
    embedding: int
    position_embedding: int
    final_norm: int
    output_layer: int
    mtp_module: int = 0
    mtp_module_active: int = 0
    num_mtp_modules: int = 0

    @property
    def layers(self) -> int:
        """Parameters of all transformer layers."""
        return (
            self.num_dense_layers * self.dense_layer.total
            + self.num_moe_layers * self.moe_layer.total
        )

    @property
    def outside_layers(self) -> int:
        """Embeddings, final norm and output layer."""
        return self.embedding + self.position_embedding + self.final_norm + self.output_layer

    @property
    def total(self) -> int:
        """All parameters of the main model, MTP modules excluded (DeepSeek-V3's 671B)."""
        return self.layers + self.outside_layers

    @property
    def active(self) -> int:
        """Parameters one token uses, embedding and output head included (how DeepSeek-V3
        counts its 37B and Mixtral its 12.9B)."""
        layers = (
            self.num_dense_layers * self.dense_layer.active
            + self.num_moe_layers * self.moe_layer.active
        )
        return layers + self.outside_layers

    @property
    def active_without_input_embedding(self) -> int:
        """:attr:`active` less the input lookup tables (the gpt-oss model card's 5.1B): the
        word embedding when the output layer is untied (tied, the matrix is the output
        head's and stays) and learned positions."""
        lookup = self.embedding if self.output_layer else 0
        return self.active - lookup - self.position_embedding

    @property
    def expert_fraction(self) -> float:
        """Share of the total held by routed experts (0 for a dense model)."""
        return self.num_moe_layers * self.moe_layer.routed_experts / self.total

    @property
    def total_with_mtp(self) -> int:
        """:attr:`total` + the MTP modules' own parameters."""
        return self.total + self.num_mtp_modules * self.mtp_module

    def as_dict(self) -> dict[str, int]:
        """Path-keyed breakdown for tables: ``{"moe_layer/routed_experts": ..., "total": ...}``.

        Rows of a layer kind the model lacks are left out; MTP rows only with MTP modules.
        """
        rows: dict[str, int] = {}
        if self.num_dense_layers:
            rows.update(_layer_rows("dense_layer", self.dense_layer, self.num_dense_layers))
        if self.num_moe_layers:
            rows.update(_layer_rows("moe_layer", self.moe_layer, self.num_moe_layers))
        rows.update(
            {
                "layers": self.layers,
                "embedding/word": self.embedding,
                "embedding/position": self.position_embedding,
                "final_norm": self.final_norm,
                "output_layer": self.output_layer,
                "total": self.total,
                "active": self.active,
                "active_without_input_embedding": self.active_without_input_embedding,
            }
        )
        if self.num_mtp_modules:
            rows.update(
                {
                    "mtp/module": self.mtp_module,
                    "mtp/module_active": self.mtp_module_active,
                    "mtp/modules": self.num_mtp_modules,
                    "total_with_mtp": self.total_with_mtp,
                }
            )
        return rows


def _layer_rows(prefix: str, layer: LayerParams, count: int) -> dict[str, int]:
    rows = {
        f"{prefix}/attention": layer.attention,
        f"{prefix}/norms": layer.norms,
    }
    if layer.num_experts:
        rows.update(
            {
                f"{prefix}/router": layer.router,
                f"{prefix}/expert": layer.expert,
                f"{prefix}/routed_experts": layer.routed_experts,
                f"{prefix}/shared_experts": layer.shared_experts,
            }
        )
    else:
        rows[f"{prefix}/mlp"] = layer.mlp
    rows.update(
        {
            f"{prefix}/total": layer.total,
            f"{prefix}/active": layer.active,
            f"{prefix}/count": count,
        }
    )
    return rows


def mla_params_per_layer(model: ModelSpec) -> int:
    """Parameters of one MLA block (DeepSeek-V3 ``inference/model.py`` class ``MLA``):
    ``wq_a``, ``q_norm``, ``wq_b`` (or ``wq``), ``wkv_a``, ``kv_norm``, ``wkv_b``, ``wo``.

    Raises:
        SpecError: the model has no MLA (``model.mla`` is None).
    """
    mla = model.mla
    if mla is None:
        raise SpecError(f"{model.name} has no MLA (model.mla is None)")
    h, a = model.hidden_size, model.num_attention_heads
    if mla.q_lora_rank is None:
        query = h * a * mla.qk_head_dim
    else:
        query = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * a * mla.qk_head_dim
    kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
    kv += mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
    return query + kv + a * mla.v_head_dim * h


def _attention_params(model: ModelSpec) -> int:
    if model.mla is not None:
        return mla_params_per_layer(model)
    return attention_params_per_layer(model)


def _dense_layer(model: ModelSpec) -> LayerParams:
    norm = model.normalization.params_per_hidden * model.hidden_size
    return LayerParams(
        attention=_attention_params(model),
        norms=NORMS_PER_LAYER * norm,
        mlp=ffn_params(model, ffn_hidden_size=model.ffn_hidden_size),
    )


def _moe_layer(model: ModelSpec) -> LayerParams:
    moe = model.moe
    if moe is None:
        return _dense_layer(model)
    h, experts = model.hidden_size, moe.num_experts
    router = h * experts + (experts if moe.router.bias else 0)
    router += h if moe.shared_expert_gate else 0
    shared = moe.num_shared_experts * ffn_params(model, ffn_hidden_size=moe.shared_ffn_hidden_size)
    return LayerParams(
        attention=_attention_params(model),
        norms=NORMS_PER_LAYER * model.normalization.params_per_hidden * h,
        mlp=0,
        router=router,
        expert=ffn_params(model, ffn_hidden_size=moe.expert_ffn_hidden_size),
        num_experts=experts,
        top_k=moe.top_k,
        shared_experts=shared,
    )


def _last_layer(model: ModelSpec) -> LayerParams:
    """The kind of the model's last layer (an MTP module's layer is built like it)."""
    moe = model.moe
    if moe is not None and moe.is_moe_layer(model.num_layers - 1):
        return _moe_layer(model)
    return _dense_layer(model)


def count_moe_parameters(model: ModelSpec) -> MoEParamCounts:
    """Count the parameters of ``model`` (dense, MoE, MLA, MTP) by layer kind.

    Args:
        model: the transformer.

    Returns:
        MoEParamCounts; for a dense model ``total`` equals
        ``plansim.analytic.params.count_parameters(model).total``.
    """
    h, vocab = model.hidden_size, model.vocab_size
    norm = model.normalization.params_per_hidden * h
    moe_layers = model.moe.num_moe_layers(model.num_layers) if model.moe is not None else 0
    learned = model.position_embedding is PositionEmbedding.LEARNED
    mtp = model.mtp_num_layers or 0
    last = _last_layer(model)
    extra = 2 * h * h + MTP_NORMS * norm  # projection h x 2h and the module's own norms
    return MoEParamCounts(
        dense_layer=_dense_layer(model),
        moe_layer=_moe_layer(model),
        num_dense_layers=model.num_layers - moe_layers,
        num_moe_layers=moe_layers,
        embedding=vocab * h,
        position_embedding=model.seq_length * h if learned else 0,
        final_norm=norm,
        output_layer=0 if model.tied_embeddings else vocab * h,
        mtp_module=last.total + extra if mtp else 0,
        mtp_module_active=last.active + extra if mtp else 0,
        num_mtp_modules=mtp,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardFlopsPerToken:
    """Forward GEMM FLOPs per token, summed over the layers, by component.

    Attributes:
        attention_projections: Q, K, V and output projections (MLA: its five matrices).
        attention_core: scores and weighted values (all s keys, or the causal half).
        dense_mlp: the dense layers' MLPs.
        router: the routers' h x E GEMMs (+ the shared-expert gates' h x 1).
        routed_experts: top_k routed experts per MoE layer.
        shared_experts: the shared experts.
        logits: the output layer h x V.
        mtp: the MTP modules (projection, layer and their logits through the shared head).
    """

    attention_projections: int
    attention_core: int
    dense_mlp: int
    router: int
    routed_experts: int
    shared_experts: int
    logits: int
    mtp: int = 0

    @property
    def total(self) -> int:
        """Forward FLOPs per token of the main model (MTP modules excluded)."""
        return (
            self.attention_projections
            + self.attention_core
            + self.dense_mlp
            + self.router
            + self.routed_experts
            + self.shared_experts
            + self.logits
        )

    @property
    def total_with_mtp(self) -> int:
        """:attr:`total` + the MTP modules' forward."""
        return self.total + self.mtp

    def as_dict(self) -> dict[str, int]:
        """Path-keyed breakdown: ``{"forward/attention_core": ..., "forward/total": ...}``."""
        rows = {
            "forward/attention_projections": self.attention_projections,
            "forward/attention_core": self.attention_core,
            "forward/dense_mlp": self.dense_mlp,
            "forward/router": self.router,
            "forward/routed_experts": self.routed_experts,
            "forward/shared_experts": self.shared_experts,
            "forward/logits": self.logits,
            "forward/total": self.total,
        }
        if self.mtp:
            rows.update({"forward/mtp": self.mtp, "forward/total_with_mtp": self.total_with_mtp})
        return rows


def _attention_flops(model: ModelSpec, core: AttentionCore) -> tuple[int, int]:
    """(projection, core) forward FLOPs per token of one attention block."""
    s, a = model.seq_length, model.num_attention_heads
    mla = model.mla
    if mla is None:
        h, q, kv = model.hidden_size, model.query_size, model.kv_size
        projections, full = 2 * (2 * h * q + 2 * h * kv), 2 * s * q + 2 * s * q
    else:
        norms = mla.kv_lora_rank + (mla.q_lora_rank or 0)  # the latent norms run no GEMM
        projections = 2 * (mla_params_per_layer(model) - norms)
        full = 2 * s * a * mla.qk_head_dim + 2 * s * a * mla.v_head_dim
    return projections, full if core is AttentionCore.FULL else full // 2


def _gemm_flops(model: ModelSpec, ffn_hidden_size: int) -> int:
    """Forward FLOPs per token of one MLP of that width: 2 x its weight matrices."""
    return 2 * model.activation.num_ffn_matrices * model.hidden_size * ffn_hidden_size


def _moe_layer_flops(model: ModelSpec) -> tuple[int, int, int]:
    """(router, routed experts, shared experts) forward FLOPs per token of one MoE layer."""
    moe = model.moe
    if moe is None:
        return 0, 0, 0
    h = model.hidden_size
    router = 2 * h * moe.num_experts + (2 * h if moe.shared_expert_gate else 0)
    routed = moe.top_k * _gemm_flops(model, moe.expert_ffn_hidden_size)
    shared = moe.num_shared_experts * _gemm_flops(model, moe.shared_ffn_hidden_size)
    return router, routed, shared


def forward_flops_per_token(
    model: ModelSpec, *, attention_core: AttentionCore = AttentionCore.FULL
) -> ForwardFlopsPerToken:
    """Forward GEMM FLOPs per token of ``model`` (sequence length ``model.seq_length``).

    For a dense model with FULL, 3 x ``total`` equals
    ``plansim.analytic.flops.model_flops_per_token``. An MTP module runs its projection
    (2 x 2h x h), a layer like the model's last and the shared output head (2 x h x V) per
    token (DeepSeek-V3 report §2.2).

    Args:
        model: the transformer.
        attention_core: count the attention core over all keys (FULL) or the causal half.
    """
    projections, core = _attention_flops(model, attention_core)
    router, routed, shared = _moe_layer_flops(model)
    moe_layers = model.moe.num_moe_layers(model.num_layers) if model.moe is not None else 0
    dense_layers = model.num_layers - moe_layers
    logits = 2 * model.hidden_size * model.vocab_size
    mtp = model.mtp_num_layers or 0
    last_moe = model.moe is not None and model.moe.is_moe_layer(model.num_layers - 1)
    mlp = router + routed + shared if last_moe else _gemm_flops(model, model.ffn_hidden_size)
    module = 2 * 2 * model.hidden_size**2 + projections + core + mlp + logits
    return ForwardFlopsPerToken(
        attention_projections=model.num_layers * projections,
        attention_core=model.num_layers * core,
        dense_mlp=dense_layers * _gemm_flops(model, model.ffn_hidden_size),
        router=moe_layers * router,
        routed_experts=moe_layers * routed,
        shared_experts=moe_layers * shared,
        logits=logits,
        mtp=mtp * module,
    )


def model_flops_per_token(
    model: ModelSpec,
    *,
    with_mtp: bool = False,
    attention_core: AttentionCore = AttentionCore.FULL,
) -> int:
    """Model FLOPs per trained token: 3 x forward (no recompute), for MFU.

    Args:
        with_mtp: add the MTP modules' FLOPs (Megatron-Bridge's model FLOPs count them,
            ``reference/moe_SOURCES.md``).
        attention_core: as :func:`forward_flops_per_token`.
    """
    forward = forward_flops_per_token(model, attention_core=attention_core)
    return FWD_BWD_MULTIPLIER * (forward.total_with_mtp if with_mtp else forward.total)
