"""Seconds of one model chunk's passes for one micro-batch, by part (pure).

A pipeline stage (model chunk) of ``n`` layers runs ``n`` times the per-layer pass times
(``plansim.analytic.layer_cost.PassTimes``), its first and last layers kept in bf16 at the
bf16 layer's times (``num_layers_at_start/end_in_bf16``), plus the embedding work on the
first stage and the logits and loss on the last (``EdgeTimes``). Full recompute re-runs the
forward of the layers :meth:`ParallelPlan.recomputed_layers` names (the block method: the
chunk's first ones); selective recompute is inside the per-layer times.

A model with experts: the chunk's MoE layers (``moe_layer.stage_moe_layer_counts``) run at
the MoE layer's times instead of the dense layer's, and add their dispatch and combine
all-to-alls (``ep_*``); its MTP modules run on the last stage, each a layer like the model's
last plus a second final norm, logits and loss (``plansim.analytic.moe_layer``).

These are the parts that hold a rank's compute stream: kernels and the blocking TP and EP
collectives. ZeRO-3, context-parallel and pipeline transfers come on top
(``plansim.analytic.cost``).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.edge_cost import EdgeTimes
from plansim.analytic.layer_cost import PassTimes
from plansim.specs.plan import ParallelPlan, Recompute


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSeconds:
    """Seconds of one micro-batch through one model chunk on one GPU, by part.

    Attributes:
        forward_s, tp_forward_s: forward kernels; its TP collectives.
        backward_input_s, backward_weight_s, tp_backward_s: input-gradient and
            weight-gradient kernels; the backward's TP collectives.
        recompute_s, tp_recompute_s: the forward re-run by full recompute, and its TP
            collectives (0 without full recompute).
        recomputed_layers: the chunk's layers whose recompute runs (all of them, or the
            block method's first ones with full recompute; all with selective, whose
            per-layer recompute times hold only the recomputed part).
        ep_forward_s, ep_backward_s, ep_recompute_s: the MoE layers' dispatch and combine
            all-to-alls in forward, backward and full recompute (blocking).
        ep_forward_bytes, ep_backward_bytes: bytes a rank sends in them.
    """

    forward_s: float
    tp_forward_s: float
    backward_input_s: float
    backward_weight_s: float
    tp_backward_s: float
    recompute_s: float
    tp_recompute_s: float
    recomputed_layers: int
    ep_forward_s: float = 0.0
    ep_backward_s: float = 0.0
    ep_recompute_s: float = 0.0
    ep_forward_bytes: float = 0.0
    ep_backward_bytes: float = 0.0

    @property
    def forward_total_s(self) -> float:
        """What a forward action holds the compute stream for: kernels + TP and EP
        collectives."""
        return self.forward_s + self.tp_forward_s + self.ep_forward_s

    @property
    def backward_total_s(self) -> float:
        """What a backward action (input + weight gradients, with recompute) holds the
        compute stream for."""
        return (
            self.recompute_s
            + self.tp_recompute_s
            + self.ep_recompute_s
            + self.backward_input_s
            + self.backward_weight_s
            + self.tp_backward_s
            + self.ep_backward_s
        )


def stage_seconds(
    num_layers: int,
    *,
    first: bool,
    last: bool,
    plan: ParallelPlan,
    layer: PassTimes,
    layer16: PassTimes,
    bf16_ends: tuple[int, int],
    edges: EdgeTimes,
    moe: PassTimes | None = None,
    moe_layers: int = 0,
    mtp_layers: int = 0,
) -> StageSeconds:
    """Seconds of a chunk of ``num_layers`` layers whose first and last ``bf16_ends`` layers
    run at ``layer16``'s times (``plansim.specs.layer_split.stage_bf16_layers``), the rest at
    ``layer``'s; ``first`` / ``last``: it is the model's first / last stage (``edges``).
    ``moe_layers`` of them are MoE layers at ``moe``'s times (taken among the quantized
    ones); ``mtp_layers`` MTP modules run on the last stage (module docstring)."""
    mtp = mtp_layers if moe is not None else 0  # a layer of moe's kind or the dense one
    base = _dense_stage_seconds(
        num_layers + mtp, first=first, last=last, plan=plan, layer=layer, layer16=layer16,
        bf16_ends=bf16_ends, edges=edges,
    )  # fmt: skip
    if moe is None or (moe_layers == 0 and mtp_layers == 0):
        return base
    return _with_moe_layers(
        base, num_layers=num_layers + mtp, last=last, layer=layer, edges=edges, moe=moe,
        moe_layers=moe_layers, mtp_layers=mtp_layers,
    )  # fmt: skip


def _with_moe_layers(
    base: StageSeconds,
    *,
    num_layers: int,
    last: bool,
    layer: PassTimes,
    edges: EdgeTimes,
    moe: PassTimes,
    moe_layers: int,
    mtp_layers: int,
) -> StageSeconds:
    """``base`` (the chunk's ``num_layers`` layers priced as dense ones, MTP modules
    included) with each of its ``moe_layers`` MoE layers at ``moe``'s times instead (the
    caller counts MTP modules among them when the model's last layer has experts), their
    all-to-alls, and on the last stage each MTP module's second final norm, logits and loss."""
    n = num_layers
    k = moe_layers
    r = base.recomputed_layers
    k_r = k * r / n if n else 0.0  # MoE layers among the recomputed ones, pro rata

    def more(attr: str, count: float) -> float:
        return count * (float(getattr(moe, attr)) - float(getattr(layer, attr)))

    extra = float(mtp_layers if last else 0)
    return StageSeconds(
        forward_s=base.forward_s + more("forward_s", k) + extra * edges.last_forward_s,
        tp_forward_s=base.tp_forward_s + more("tp_forward_s", k) + extra * edges.last_tp_s,
        backward_input_s=base.backward_input_s
        + more("backward_input_s", k)
        + extra * edges.last_backward_input_s,
        backward_weight_s=base.backward_weight_s
        + more("backward_weight_s", k)
        + extra * edges.last_backward_weight_s,
        tp_backward_s=base.tp_backward_s + more("tp_backward_s", k) + extra * edges.last_tp_s,
        recompute_s=base.recompute_s + more("recompute_s", k_r),
        tp_recompute_s=base.tp_recompute_s + more("tp_recompute_s", k_r),
        recomputed_layers=r,
        ep_forward_s=k * moe.ep_forward_s,
        ep_backward_s=k * moe.ep_backward_s,
        ep_recompute_s=k_r * moe.ep_recompute_s,
        ep_forward_bytes=k * moe.ep_forward_bytes,
        ep_backward_bytes=k * moe.ep_backward_bytes,
    )


def _dense_stage_seconds(
    num_layers: int,
    *,
    first: bool,
    last: bool,
    plan: ParallelPlan,
    layer: PassTimes,
    layer16: PassTimes,
    bf16_ends: tuple[int, int],
    edges: EdgeTimes,
) -> StageSeconds:
    """:func:`stage_seconds` of a chunk of dense layers."""
    n = num_layers
    head, tail = bf16_ends

    def total(attr: str, count: int, bf16: int) -> float:
        quantized: float = getattr(layer, attr)
        return (count - bf16) * quantized + bf16 * float(getattr(layer16, attr))

    fwd = total("forward_s", n, head + tail) + (edges.first_forward_s if first else 0.0)
    fwd += edges.last_forward_s if last else 0.0
    tp_fwd = total("tp_forward_s", n, head + tail) + (edges.first_tp_s if first else 0.0)
    tp_fwd += edges.last_tp_s if last else 0.0
    bwd_in = total("backward_input_s", n, head + tail)
    bwd_in += (edges.first_backward_s if first else 0.0) + (
        edges.last_backward_input_s if last else 0.0
    )
    bwd_w = total("backward_weight_s", n, head + tail)
    bwd_w += edges.last_backward_weight_s if last else 0.0
    tp_bwd = total("tp_backward_s", n, head + tail) + (edges.first_tp_s if first else 0.0)
    tp_bwd += edges.last_tp_s if last else 0.0
    # layers whose recompute runs: all of them, or the block method's first N (full)
    r = plan.recomputed_layers(n) if plan.recompute is Recompute.FULL else n
    r16 = min(r, head) + max(0, r - (n - tail))  # the block method recomputes the first r
    return StageSeconds(
        forward_s=fwd,
        tp_forward_s=tp_fwd,
        backward_input_s=bwd_in,
        backward_weight_s=bwd_w,
        tp_backward_s=tp_bwd,
        recompute_s=total("recompute_s", r, r16),
        tp_recompute_s=total("tp_recompute_s", r, r16),
        recomputed_layers=r,
    )
