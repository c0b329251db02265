"""A GPT/Llama-style decoder built from a ModelSpec (torch), synthetic data, and scaling down.

The model follows the ModelSpec field by field: token embedding (+ learned positions or
RoPE), ``num_layers`` pre-norm blocks (causal self-attention with GQA, MLP with GELU /
SwiGLU / ReLU / squared ReLU, ``plansim.validate.mlp``; where ``moe.is_moe_layer(i)``, a
Mixture-of-Experts layer, ``plansim.validate.moe_layer``), final norm, output layer (tied
to the embedding or not), biases on the linear layers when ``add_bias_linear``. Every
linear layer is a separate ``nn.Linear`` so tensor parallelism can shard it: ``q``, ``k``,
``v``, ``up`` and ``gate`` column-wise, ``o`` and ``down`` row-wise (Megatron-LM's split,
Shoeybi et al. 2019 §3).
Attention reads its local head count from the projected width, so it runs unchanged on a
TP shard. A pipeline stage (:class:`StageModule`) holds a contiguous range of blocks; the
first also the embedding, the last the final norm and output layer.

Initialisation is deterministic from a seed (GPT-2 style: normal(0, 0.02), zero biases,
unit norms), in fp32. Tensor shapes: tokens ``[b, s]`` int64, hidden ``[b, s, h]``,
logits ``[b, s, V]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plansim.specs.layer_split import stage_layer_counts
from plansim.specs.model import ModelSpec, Normalization, PositionEmbedding
from plansim.specs.plan import ParallelPlan
from plansim.validate.mlp import MLP
from plansim.validate.moe_layer import MoELayer
from plansim.validate.result import ValidateError

#: Standard deviation of the weight initialisation (GPT-2, Radford et al. 2019).
INIT_STD = 0.02
#: RoPE base (Su et al. 2021, RoFormer Eq. 15).
ROPE_BASE = 10000.0


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.normalization is Normalization.RMSNORM:
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``[b, heads, s, d]`` (RoFormer, half-split form)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq).to(x.device)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class AttentionCore(nn.Module):
    """softmax(Q K^T / sqrt(d) + causal mask) V (no parameters: the selective-recompute unit).

    Inputs q ``[b, s, a_local * d]``, k and v ``[b, s, g_local * d]``; output
    ``[b, s, a_local * d]``. Query heads share K/V heads in groups (GQA, Ainslie et al. 2023).
    """

    def __init__(self, *, head_dim: int, rope: bool) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rope = rope

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s, _ = q.shape
        d = self.head_dim
        q4 = q.view(b, s, -1, d).transpose(1, 2)
        k4 = k.view(b, s, -1, d).transpose(1, 2)
        v4 = v.view(b, s, -1, d).transpose(1, 2)
        if self.rope:
            q4, k4 = _rope(q4), _rope(k4)
        group = q4.shape[1] // k4.shape[1]
        if group > 1:
            k4 = k4.repeat_interleave(group, dim=1)
            v4 = v4.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, -1)


class Attention(nn.Module):
    """Self-attention with separate q/k/v projections (column-parallel) and o (row-parallel)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, bias = spec.hidden_size, spec.add_bias_linear
        self.q = nn.Linear(h, h, bias=bias)
        self.k = nn.Linear(h, spec.kv_size, bias=bias)
        self.v = nn.Linear(h, spec.kv_size, bias=bias)
        self.core: nn.Module = AttentionCore(
            head_dim=spec.head_dim, rope=spec.position_embedding is PositionEmbedding.ROPE
        )
        self.o = nn.Linear(h, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.o(self.core(self.q(x), self.k(x), self.v(x)))
        return out


def _mlp(spec: ModelSpec, layer: int | None) -> nn.Module:
    """Layer ``layer``'s MLP: dense, or the MoE layer where ``spec.moe.is_moe_layer`` says so
    (``plansim.validate.moe_layer``; None: dense)."""
    if spec.moe is not None and layer is not None and spec.moe.is_moe_layer(layer):
        return MoELayer(spec)
    return MLP(spec)


class Block(nn.Module):
    """Pre-norm transformer layer: ``x + attn(norm1(x))``, then ``+ mlp(norm2(x))``.

    ``layer`` (0 = first) decides, for a MoE spec, whether the MLP has experts.
    """

    def __init__(self, spec: ModelSpec, *, layer: int | None = None) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.mlp_norm = _norm(spec)
        self.mlp = _mlp(spec, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class Embedding(nn.Module):
    """Token embedding ``[V, h]`` plus learned positions ``[s, h]`` when the spec says so."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        learned = spec.position_embedding is PositionEmbedding.LEARNED
        self.positions = nn.Embedding(spec.seq_length, spec.hidden_size) if learned else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.tokens(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        return x


class Head(nn.Module):
    """Final norm and output layer ``[h] -> [V]`` (no bias, as Megatron-LM and Llama)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = _norm(spec)
        self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.output(self.norm(x))
        return out


class StageModule(nn.Module):
    """A contiguous range of the decoder: optional embedding, blocks, optional head.

    Forward: tokens ``[b, s]`` (first stage) or hidden ``[b, s, h]`` in; hidden or logits
    ``[b, s, V]`` (last stage) out. Block names keep their global index (``blocks["3"]``).
    """

    def __init__(
        self, *, embedding: Embedding | None, blocks: dict[str, Block], head: Head | None
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.blocks = nn.ModuleDict(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def _init_weights(module: nn.Module, *, seed: int) -> None:
    """GPT-2 initialisation, deterministic: parameters in named order from one generator;
    biases (the experts' stacked ``[E, f]`` ones too) zero, norm weights one."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("bias") or (param.dim() == 1 and "norm" in name):
                param.fill_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * INIT_STD)


def build_model(spec: ModelSpec, *, seed: int) -> StageModule:
    """The whole decoder as one stage, fp32 on CPU, initialised from ``seed``.

    With ``spec.tied_embeddings`` the output layer's weight is the token embedding's.
    """
    embedding = Embedding(spec)
    blocks = {str(i): Block(spec, layer=i) for i in range(spec.num_layers)}
    head = Head(spec)
    model = StageModule(embedding=embedding, blocks=blocks, head=head)
    _init_weights(model, seed=seed)
    if spec.tied_embeddings:
        head.output.weight = embedding.tokens.weight
    return model


def stage_layers(spec: ModelSpec, plan: ParallelPlan, stage: int) -> range:
    """Block indices of pipeline ``stage``: the stages hold consecutive layers in stage
    order, each as many as ``plansim.specs.layer_split.stage_layer_counts`` gives it (an even split
    over pp * vpp stages, or the plan's uneven one)."""
    counts = stage_layer_counts(spec.num_layers, plan)
    start = sum(counts[:stage])
    return range(start, start + counts[stage])


def split_stage(model: StageModule, spec: ModelSpec, plan: ParallelPlan, stage: int) -> StageModule:
    """The part of ``model`` that pipeline ``stage`` runs (shares its modules).

    With tied embeddings and pp > 1 the last stage gets its own copy of the embedding
    weight (the two copies are kept equal by summing their gradients, Megatron-LM's
    embedding group); stage 0 keeps the original.
    """
    last = plan.num_stages - 1
    head = model.head if stage == last else None
    if head is not None and spec.tied_embeddings and plan.num_stages > 1:
        copy = Head(spec)
        copy.norm.load_state_dict(head.norm.state_dict())
        copy.output.weight = nn.Parameter(head.output.weight.detach().clone())
        head = copy
    return StageModule(
        embedding=model.embedding if stage == 0 else None,
        blocks={str(i): model.blocks[str(i)] for i in stage_layers(spec, plan, stage)},  # type: ignore[misc]
        head=head,
    )


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits ``[b, s, V]`` against targets ``[b, s]``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One global batch: tokens and next-token targets, each ``[global_batch_size, s]`` int64."""

    tokens: torch.Tensor
    targets: torch.Tensor


def synthetic_batches(spec: ModelSpec, *, global_batch_size: int, seed: int) -> Iterator[Batch]:
    """Endless seeded batches: random token ids, the targets are the ids shifted by one."""
    gen = torch.Generator().manual_seed(seed + 1)
    while True:
        ids = torch.randint(
            0, spec.vocab_size, (global_batch_size, spec.seq_length + 1), generator=gen
        )
        yield Batch(tokens=ids[:, :-1].contiguous(), targets=ids[:, 1:].contiguous())


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaledModel:
    """A ModelSpec scaled down to fit, and what changed (``"num_layers 96 -> 4"``)."""

    model: ModelSpec
    changes: tuple[str, ...]


def _round_down(value: int, multiple: int) -> int:
    return max(multiple, value // multiple * multiple)


def scale_model(
    spec: ModelSpec,
    *,
    plan: ParallelPlan,
    max_layers: int | None = None,
    max_hidden_size: int | None = None,
    max_seq_length: int | None = None,
    max_vocab_size: int | None = None,
) -> ScaledModel:
    """Scale ``spec`` down (depth, width, heads, sequence, vocabulary) so it fits.

    Keeps what the plan needs: layers a multiple of pp * vpp, heads and query groups
    multiples of tp, the head width and the heads-per-group ratio where possible, the FFN
    ratio ``ffn_hidden_size / hidden_size``. A limit of None keeps the value.

    Raises:
        ValidateError: a limit is below what the plan needs (e.g. max_layers < pp * vpp).
    """
    changes: dict[str, int] = {}
    stages = plan.num_stages
    if max_layers is not None and spec.num_layers > max_layers:
        if plan.uneven_pipeline:
            raise ValidateError(
                f"max_layers({max_layers}) would change the depth of an uneven pipeline split "
                f"(decoder_first/last_pipeline_num_layers): give the depth to run instead"
            )
        if max_layers < stages:
            raise ValidateError(
                f"max_layers({max_layers}) is below pp({plan.pp}) * vpp({plan.vpp}) = {stages}"
            )
        changes["num_layers"] = _round_down(max_layers, stages)
    if max_hidden_size is not None and spec.hidden_size > max_hidden_size:
        changes |= _scaled_width(spec, plan=plan, max_hidden_size=max_hidden_size)
    if max_seq_length is not None and spec.seq_length > max_seq_length:
        changes["seq_length"] = max_seq_length
    if max_vocab_size is not None and spec.vocab_size > max_vocab_size:
        changes["vocab_size"] = max_vocab_size
    scaled = dataclasses.replace(spec, **changes)  # type: ignore[arg-type]
    if changes:
        scaled = dataclasses.replace(scaled, name=f"{spec.name} (scaled)")
    text = tuple(f"{k} {getattr(spec, k)} -> {v}" for k, v in changes.items())
    return ScaledModel(model=scaled, changes=text)


def _scaled_width(spec: ModelSpec, *, plan: ParallelPlan, max_hidden_size: int) -> dict[str, int]:
    """hidden, heads, query groups and FFN width for a hidden size <= max_hidden_size."""
    ratio = spec.num_attention_heads // spec.num_query_groups
    head_dim = min(spec.head_dim, max_hidden_size // (plan.tp * ratio))
    if head_dim < 1:
        raise ValidateError(
            f"max_hidden_size({max_hidden_size}) is too small for tp({plan.tp}) with "
            f"{ratio} query heads per KV head"
        )
    groups = _round_down(max(1, max_hidden_size // (head_dim * ratio)), plan.tp)
    groups = min(groups, spec.num_query_groups)
    heads = groups * ratio
    hidden = heads * head_dim
    ffn = math.ceil(spec.ffn_hidden_size * hidden / spec.hidden_size / plan.tp) * plan.tp
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": groups,
        "ffn_hidden_size": ffn,
    }
