"""A Mixture-of-Experts MLP built from a ModelSpec's MoESpec, with expert parallelism (torch).

The layer replaces a block's dense MLP where ``moe.is_moe_layer(i)`` says so
(``plansim.validate.model.Block``). For tokens ``x`` ``[T, h]`` (T = b * s):

- **router**: one linear ``h -> E`` (``router``; a bias when ``moe.router.bias``, trained as
  gpt-oss's: DeepSeek-V3's selection-only correction bias, updated outside the gradient, is
  not modelled), then the top-k of the scores per token (Megatron-Core
  ``topk_routing_with_score_function``): softmax gating takes the top-k logits and a softmax
  over them (Mixtral, arXiv:2401.04088 Eq. 2; Megatron's default, ``moe_router_pre_softmax``
  off); sigmoid gating takes the top-k of ``sigmoid(logits)`` and normalises them over the k
  chosen (DeepSeek-V3 report arXiv:2412.19437 Eq. 13-15; Megatron normalises for k > 1 only).
  With ``router.num_groups`` > 1 a token's experts come from its best
  ``router.groups_per_token`` groups, a group scored by the sum of its top k / groups_per_token
  scores (Megatron-Core ``group_limited_topk``; DeepSeek-V3 "node-limited routing").
- **dropless routing** (``ExpertCapacity.DROPLESS``): every (token, choice) pair is computed.
  The T * k pairs are sorted by expert (stable), so each expert sees one contiguous slice.
- **routed experts** (:class:`RoutedExperts`): per expert an MLP of width
  ``expert_ffn_hidden_size`` with the model's activation (SwiGLU, GELU, ReLU, squared ReLU),
  weights stacked as ``[E, h, f]`` and ``[E, f, h]``.
- **combine**: each pair's output goes back to its token, weighted by its gate, summed over
  the k choices; the **shared experts** (``num_shared_experts`` MLPs every token runs, fused
  into one MLP of num_shared x width as Megatron-Core's ``SharedExpertMLP``; sigmoid-gated
  when ``moe.shared_expert_gate``, Qwen2-MoE) are added.

**Expert parallelism** (:class:`ExpertParallel`, set by ``plansim.validate.expert_parallel``):
each of the ``ep`` ranks of an EP group holds E/ep consecutive experts (rank r: experts
r*E/ep .. (r+1)*E/ep - 1, Megatron-Core's local expert indices). The per-expert pair counts
are exchanged first (an all-to-all of E int64), then the sorted pairs are **dispatched** with
``torch.distributed.all_to_all_single`` (the part for rank r is the slice of r's experts),
regrouped by local expert, computed, put back in arrival order and **combined** back with
the inverse all-to-all (Megatron-Core ``MoEAlltoAllTokenDispatcher``; GShard, Lepikhin et al.
2020 §2.2). The all-to-all is an autograd Function (:class:`_AllToAll`): its backward is the
inverse all-to-all of the gradient. ``torch.distributed.nn.functional.all_to_all_single`` runs
on gloo too (checked with torch 2.13), but is deprecated and its backward cannot be timed.

Every token all-to-all (dispatch and combine, forward and backward) is timed on the
recorder, as an ``ep_comm`` row on the ``tp`` stream (the stream of collectives that block
compute) with the stage and micro-batch of the action it ran in; the dispatch row starts at
the count exchange. ``bytes``: what this rank sends to the other ranks (its send buffer less
the rows it keeps; ``plansim.analytic.moe_layer`` prices the same off-rank bytes).

Gradients: an expert's weights see the tokens of every rank of the EP group, while the dense
weights see one rank's; so that averaging expert gradients over the expert-data-parallel
group (edp) gives the gradient of the global mean loss, the expert weights' gradients are
scaled by edp / dp = 1 / ep in the backward (:attr:`RoutedExperts.grad_scale`; Megatron-Core
``DistributedDataParallel``'s ``expert_gradient_scaling_factor`` edp / dp; torchtitan sets
the experts' FSDP2 gradient divide factor to dp instead, which needs NCCL's PREMUL_SUM).

Shapes: layer input/output ``[b, s, h]``; gates ``[T, k]``; expert weights ``[E_local, h, f]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from plansim.specs.model import Activation, ModelSpec
from plansim.specs.moe import RouterScore, RouterSpec
from plansim.validate.mlp import MLP, activate

#: Epsilon of the sigmoid gates' normalisation (Megatron-Core topk_routing_with_score_function).
GATE_NORM_EPS = 1e-20


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """The router's choice for T tokens: ``indices`` ``[T, k]`` int64 (expert ids) and
    ``gates`` ``[T, k]`` (the weight of each choice in the combine)."""

    indices: torch.Tensor
    gates: torch.Tensor


def _top_k(scores: torch.Tensor, router: RouterSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) ``[T, k]`` of the top-k scores, group-limited when the router has
    groups (Megatron-Core ``group_limited_topk``)."""
    k, groups = router.top_k, router.num_groups
    if groups == 1:
        return torch.topk(scores, k, dim=-1)
    num_tokens, num_experts = scores.shape
    per_group = scores.view(num_tokens, groups, num_experts // groups)
    group_scores = per_group.topk(k // router.groups_per_token, dim=-1).values.sum(dim=-1)
    best = group_scores.topk(router.groups_per_token, dim=-1).indices  # [T, M]
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    allowed = mask.unsqueeze(-1).expand_as(per_group).reshape(num_tokens, num_experts)
    masked = scores.masked_fill(~allowed, float("-inf"))
    return torch.topk(masked, k, dim=-1)


def route(logits: torch.Tensor, router: RouterSpec) -> Routing:
    """Top-k choice and gates from router logits ``[T, E]`` (module docstring)."""
    if router.score is RouterScore.SOFTMAX:
        values, indices = _top_k(logits, router)
        gates = torch.softmax(values, dim=-1, dtype=torch.float32).to(logits.dtype)
        return Routing(indices=indices, gates=gates)
    scores = torch.sigmoid(logits)
    values, indices = _top_k(scores, router)
    if router.top_k > 1:
        values = values / (values.sum(dim=-1, keepdim=True) + GATE_NORM_EPS)
    return Routing(indices=indices, gates=values)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` in backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class RoutedExperts(nn.Module):
    """``num_experts`` expert MLPs with stacked weights (the experts one rank holds).

    Parameters: ``up_weight`` and (SwiGLU) ``gate_weight`` ``[E, h, f]``, ``down_weight``
    ``[E, f, h]``; with biases ``up_bias`` / ``gate_bias`` ``[E, f]`` and ``down_bias``
    ``[E, h]``. :attr:`grad_scale` multiplies the weights' gradients (module docstring).
    """

    def __init__(
        self, *, num_experts: int, hidden_size: int, ffn_hidden_size: int, spec: ModelSpec
    ) -> None:
        super().__init__()
        e, h, f = num_experts, hidden_size, ffn_hidden_size
        self.activation = spec.activation
        self.grad_scale = 1.0
        self.up_weight = nn.Parameter(torch.empty(e, h, f))
        gated = spec.activation is Activation.SWIGLU
        self.gate_weight = nn.Parameter(torch.empty(e, h, f)) if gated else None
        self.down_weight = nn.Parameter(torch.empty(e, f, h))
        bias = spec.add_bias_linear
        self.up_bias = nn.Parameter(torch.zeros(e, f)) if bias else None
        self.gate_bias = nn.Parameter(torch.zeros(e, f)) if bias and gated else None
        self.down_bias = nn.Parameter(torch.zeros(e, h)) if bias else None

    @property
    def num_experts(self) -> int:
        """Experts held here (E_local)."""
        return int(self.up_weight.shape[0])

    def _param(self, name: str) -> torch.Tensor | None:
        param: torch.Tensor | None = getattr(self, name)
        if param is None or self.grad_scale == 1.0:
            return param
        scaled: torch.Tensor = _ScaleGrad.apply(param, self.grad_scale)  # type: ignore[no-untyped-call]
        return scaled

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows ``x`` ``[N, h]`` sorted by expert, ``counts[e]`` rows for expert e; ``[N, h]``."""
        up_w, gate_w, down_w = (self._param(n) for n in ("up_weight", "gate_weight", "down_weight"))
        up_b, gate_b, down_b = (self._param(n) for n in ("up_bias", "gate_bias", "down_bias"))
        assert up_w is not None and down_w is not None
        outs = []
        for e, rows in enumerate(x.split(counts)):  # type: ignore[no-untyped-call]
            up = rows @ up_w[e] + (up_b[e] if up_b is not None else 0.0)
            gate = None
            if gate_w is not None:
                gate = rows @ gate_w[e] + (gate_b[e] if gate_b is not None else 0.0)
            out = activate(self.activation, up, gate) @ down_w[e]
            outs.append(out + down_b[e] if down_b is not None else out)
        return torch.cat(outs)


@dataclass(slots=True, kw_only=True)
class ExpertParallel:
    """The EP group of a MoE layer and how its all-to-alls are timed.

    Attributes:
        group: the process group of the ``size`` ranks that share the experts.
        rank: this rank's index in it (it holds experts rank*E/size .. (rank+1)*E/size - 1).
        size: ep.
        mark: a time point (``Recorder.mark``).
        record: records one all-to-all, ``record(start, end, num_bytes)``.
    """

    group: Any
    rank: int
    size: int
    mark: Callable[[], Any]
    record: Callable[[Any, Any, float], None]


def _exchange(
    x: torch.Tensor, *, send: list[int], recv: list[int], ep: ExpertParallel, start: Any
) -> torch.Tensor:
    """One timed all_to_all_single of rows ``x``: ``send[r]`` rows to rank r, ``recv[r]``
    from it; the interval starts at ``start`` (None: now)."""
    x = x.contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    begin = ep.mark() if start is None else start
    dist.all_to_all_single(out, x, recv, send, group=ep.group)
    row_bytes = x[0].numel() * x.element_size() if x.shape[0] else 0
    ep.record(begin, ep.mark(), float((sum(send) - send[ep.rank]) * row_bytes))
    return out


class _AllToAll(torch.autograd.Function):
    """Autograd-aware all_to_all_single: backward sends the gradient back (splits swapped)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        send: list[int],
        recv: list[int],
        ep: ExpertParallel,
        start: Any,
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.ep = send, recv, ep
        return _exchange(x, send=send, recv=recv, ep=ep, start=start)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        back = _exchange(grad, send=ctx.recv, recv=ctx.send, ep=ctx.ep, start=None)
        return back, None, None, None, None


def _inverse(order: torch.Tensor) -> torch.Tensor:
    """The inverse of permutation ``order`` (``out[order[i]] = i``)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


class MoELayer(nn.Module):
    """Router, routed experts and shared experts of one MoE layer (module docstring).

    ``ep`` is None in one process (all experts here); ``plansim.validate.expert_parallel``
    keeps this rank's experts and sets it.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.router_spec = moe.router
        self.num_experts = moe.num_experts
        h = spec.hidden_size
        self.router = nn.Linear(h, moe.num_experts, bias=moe.router.bias)
        self.experts = RoutedExperts(
            num_experts=moe.num_experts,
            hidden_size=h,
            ffn_hidden_size=moe.expert_ffn_hidden_size,
            spec=spec,
        )
        self.shared: nn.Module | None = None
        self.shared_gate: nn.Linear | None = None
        if moe.num_shared_experts:
            width = moe.num_shared_experts * moe.shared_ffn_hidden_size
            self.shared = MLP(dataclasses.replace(spec, ffn_hidden_size=width))
            if moe.shared_expert_gate:
                self.shared_gate = nn.Linear(h, 1, bias=False)
        self.ep: ExpertParallel | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, h]
        routing = route(self.router(tokens), self.router_spec)
        k = routing.indices.shape[1]
        expert_of = routing.indices.reshape(-1)  # [T * k], pair i is token i // k
        order = torch.argsort(expert_of, stable=True)
        counts = torch.bincount(expert_of, minlength=self.num_experts)
        routed = self._run_experts(tokens[order // k], counts)  # [T * k, h], sorted
        pairs = routed[_inverse(order)].view(tokens.shape[0], k, -1)
        out = (pairs * routing.gates.unsqueeze(-1)).sum(dim=1)
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(tokens)) * shared
            out = out + shared
        return out.view(shape)

    def _run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Expert outputs of ``rows`` ``[N, h]`` sorted by expert (``counts`` ``[E]``), here or
        over the EP group (dispatch, compute, combine)."""
        ep = self.ep
        if ep is None:
            out: torch.Tensor = self.experts(rows, counts.tolist())
            return out
        start = ep.mark()
        send_counts = counts.view(ep.size, -1)  # [destination rank, its local expert]
        recv_counts = torch.empty_like(send_counts)  # [source rank, local expert]
        dist.all_to_all_single(recv_counts, send_counts.contiguous(), group=ep.group)
        send, recv = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
        # arrived rows: by source rank, then by local expert
        arrived = _AllToAll.apply(rows, send, recv, ep, start)  # type: ignore[no-untyped-call]
        local = torch.arange(recv_counts.shape[1], device=rows.device).repeat(ep.size)
        regroup = torch.argsort(local.repeat_interleave(recv_counts.reshape(-1)), stable=True)
        computed = self.experts(arrived[regroup], recv_counts.sum(0).tolist())
        back = computed[_inverse(regroup)]
        combined: torch.Tensor = _AllToAll.apply(back, recv, send, ep, None)  # type: ignore[no-untyped-call]
        return combined
