"""Matmul FLOPs of a dense decoder-only transformer: per GEMM, per layer and per step.

Pure functions of :class:`~plansim.specs.model.ModelSpec`; no I/O. Only GEMMs are counted
(norms, softmax, activations, dropout and residual adds are ignored), as in Narayanan et al.
SC21 §5.1 and Korthikanti et al. 2022 App. A. A multiply-add is 2 FLOPs.

Backward convention (both papers): the backward pass of every GEMM costs 2x its forward, one
GEMM for the input gradient and one for the weight gradient, each as many FLOPs as the
forward. For the two batched attention GEMMs (scores Q K^T and attention over V) there is no
weight: both backward GEMMs are activation gradients (dQ and dK; dP and dV).

Per-step formulas for a GPT-style model (MHA, ffn = 4h, B sequences of length s, L layers,
vocabulary V) that the functions below reproduce exactly:

- model FLOPs (Korthikanti et al. 2022 App. A Eq. 7): 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL));
- hardware FLOPs, full recompute (Narayanan et al. SC21 Eq. 3):
  96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h));
- hardware FLOPs, selective recompute (Korthikanti et al. 2022 App. A Eq. 8):
  72*B*L*s*h^2*(1 + s/(3h) + V/(12hL)).

GQA changes only the K and V projections (n = h + 2*kv_size instead of 3h); the attention
core still runs per query head. SwiGLU adds a gate GEMM the shape of the up projection.

Dense models only: the step FLOPs refuse models with routed experts, MLA or MTP modules
(``plansim.specs.model.require_dense``); :mod:`plansim.analytic.moe_counts` gives their
forward FLOPs per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError, require_positive_int
from plansim.specs.model import Activation, ModelSpec, require_dense
from plansim.specs.plan import Recompute

#: Forward + backward = 3 forward passes (backward = 2x forward), Korthikanti 2022 App. A.
FWD_BWD_MULTIPLIER = 3

#: Korthikanti et al. 2022 App. A Eq. 8 counts selective recompute as this many extra
#: attention-core forwards (s/(3h) instead of s/(6h): +72*B*L*s*h^2 * s/(6h) = 3 x the
#: 4*B*s^2*h forward FLOPs of Q K^T and attention over V). The work actually recomputed is
#: one forward (see :func:`layer_recompute_gemms`); this constant exists only to reproduce the
#: paper's HFU convention.
SELECTIVE_RECOMPUTE_ATTENTION_FORWARDS = 3

#: Names of the batched attention-core GEMMs (recomputed by selective recompute).
ATTENTION_CORE_GEMMS = ("attn_scores", "attn_over_v")


@dataclass(frozen=True, slots=True, kw_only=True)
class Gemm:
    """``count`` independent GEMMs C[m, n] = A[m, k] @ B[k, n] on one GPU.

    Attributes:
        name: operation, e.g. ``qkv``, ``attn_scores``, ``attn_over_v``, ``attn_out``,
            ``mlp_up``, ``mlp_gate``, ``mlp_down``, ``logits``.
        m, n, k: GEMM shape (output m x n, reduction k).
        count: how many such GEMMs (batched GEMMs: sequences x local heads).
        has_weight: B is a weight, so the backward pass has a weight-gradient GEMM; False for
            the attention batched GEMMs, whose two backward GEMMs are activation gradients.

    Raises:
        SpecError: a dimension or the count is not a positive integer.
    """

    name: str
    m: int
    n: int
    k: int
    count: int = 1
    has_weight: bool = True

    def __post_init__(self) -> None:
        for field in ("m", "n", "k", "count"):
            require_positive_int(f"gemm[{self.name}].{field}", getattr(self, field))

    @property
    def flops(self) -> int:
        """Forward FLOPs: 2 * m * n * k * count."""
        return 2 * self.m * self.n * self.k * self.count

    @property
    def backward_flops(self) -> int:
        """Backward FLOPs: 2x forward (input-grad + weight-grad, or two activation grads)."""
        return 2 * self.flops


def _local_query_groups(model: ModelSpec, tp: int) -> int:
    """KV heads held by one TP rank; KV heads are replicated when tp > num_query_groups."""
    groups = model.num_query_groups
    if groups % tp == 0:
        return groups // tp
    if tp % groups == 0:
        return 1
    raise SpecError(f"num_query_groups({groups}) and tp({tp}) do not divide one another")


def _check_tp(model: ModelSpec, tp: int) -> None:
    require_positive_int("tp", tp)
    if model.num_attention_heads % tp:
        raise SpecError(
            f"num_attention_heads({model.num_attention_heads}) is not divisible by tp({tp})"
        )
    if model.ffn_hidden_size % tp:
        raise SpecError(f"ffn_hidden_size({model.ffn_hidden_size}) is not divisible by tp({tp})")


def layer_forward_gemms(model: ModelSpec, *, micro_batch_size: int, tp: int) -> tuple[Gemm, ...]:
    """Per-GPU forward GEMMs of one transformer layer under Megatron tensor parallelism.

    Column-parallel QKV and MLP up/gate (output columns split over tp), row-parallel attention
    output and MLP down (reduction split over tp); heads split over tp (Shoeybi et al. 2019,
    Megatron-LM §3). With b = micro_batch_size, a = heads, d = head_dim:

    - ``qkv``: m = b*s, k = h, n = (h + 2*kv_size)/tp (KV heads replicated when tp exceeds
      the query groups: n = h/tp + 2*d);
    - ``attn_scores`` (Q K^T): count = b*a/tp, m = s, n = s, k = d;
    - ``attn_over_v``: count = b*a/tp, m = s, n = d, k = s;
    - ``attn_out``: m = b*s, k = h/tp, n = h;
    - ``mlp_up`` (and ``mlp_gate`` for SwiGLU): m = b*s, k = h, n = ffn/tp;
    - ``mlp_down``: m = b*s, k = ffn/tp, n = h.

    For a GPT-style model at tp = 1 the sum is 24*b*s*h^2 + 4*b*s^2*h (Narayanan SC21 §5.1).

    Args:
        model: the transformer.
        micro_batch_size: sequences b per micro-batch.
        tp: tensor-parallel degree.

    Returns:
        The GEMMs in execution order.

    Raises:
        SpecError: b or tp is not a positive integer, or tp does not split heads, query groups
            or ffn.
    """
    require_positive_int("micro_batch_size", micro_batch_size)
    _check_tp(model, tp)
    h, s, d = model.hidden_size, model.seq_length, model.head_dim
    tokens = micro_batch_size * s
    local_heads = model.num_attention_heads // tp
    qkv_n = local_heads * d + 2 * _local_query_groups(model, tp) * d
    ffn_local = model.ffn_hidden_size // tp
    batched = micro_batch_size * local_heads
    gemms = [
        Gemm(name="qkv", m=tokens, n=qkv_n, k=h),
        Gemm(name="attn_scores", m=s, n=s, k=d, count=batched, has_weight=False),
        Gemm(name="attn_over_v", m=s, n=d, k=s, count=batched, has_weight=False),
        Gemm(name="attn_out", m=tokens, n=h, k=local_heads * d),
        Gemm(name="mlp_up", m=tokens, n=ffn_local, k=h),
    ]
    if model.activation is Activation.SWIGLU:
        gemms.append(Gemm(name="mlp_gate", m=tokens, n=ffn_local, k=h))
    gemms.append(Gemm(name="mlp_down", m=tokens, n=h, k=ffn_local))
    return tuple(gemms)


def logits_forward_gemm(model: ModelSpec, *, micro_batch_size: int, tp: int) -> Gemm:
    """Per-GPU forward GEMM of the output layer (vocabulary-parallel logits).

    m = b*s, k = h, n = ceil(V/tp): Megatron pads V to a multiple of 128*tp; here it is padded
    only to a multiple of tp (n = V exactly at tp = 1). Forward FLOPs 2*b*s*h*V
    (Narayanan SC21 §5.1).

    Raises:
        SpecError: b or tp is not a positive integer.
    """
    require_positive_int("micro_batch_size", micro_batch_size)
    require_positive_int("tp", tp)
    return Gemm(
        name="logits",
        m=micro_batch_size * model.seq_length,
        n=-(-model.vocab_size // tp),
        k=model.hidden_size,
    )


def layer_recompute_gemms(
    model: ModelSpec, *, micro_batch_size: int, tp: int, recompute: Recompute
) -> tuple[Gemm, ...]:
    """GEMMs re-run in the backward pass of one layer: the work actually recomputed.

    NONE: none; FULL: the whole layer forward (Narayanan SC21 §3.5); SELECTIVE: one forward of
    the attention core, Q K^T and attention over V (Korthikanti et al. 2022 §5);
    SELECTIVE_OP: torchtitan's every second weight matmul
    (:func:`op_selective_recompute_gemms`). Note that :func:`hardware_flops_per_step` counts
    SELECTIVE by the paper's Eq. 8 convention instead.
    """
    if recompute is Recompute.NONE:
        return ()
    if recompute is Recompute.SELECTIVE_OP:
        return op_selective_recompute_gemms(model, micro_batch_size=micro_batch_size, tp=tp)
    gemms = layer_forward_gemms(model, micro_batch_size=micro_batch_size, tp=tp)
    if recompute is Recompute.FULL:
        return gemms
    return tuple(g for g in gemms if g.name in ATTENTION_CORE_GEMMS)


def op_selective_recompute_gemms(
    model: ModelSpec, *, micro_batch_size: int, tp: int
) -> tuple[Gemm, ...]:
    """Weight GEMMs of one layer that torchtitan's per-op selective activation checkpointing
    runs again in the backward.

    torchtitan's policy (``_apply_op_sac`` in ``torchtitan/distributed/activation_checkpoint.py``,
    "Saves output of all compute ops, except every second mm"; torch's
    ``create_selective_checkpoint_contexts``) counts the ``aten.mm`` calls of a transformer
    block in execution order and saves every odd one's output; the even ones are recomputed.
    torchtitan's blocks call ``wq, wk, wv, wo`` and then ``w1`` (gate), ``w3`` (up), ``w2``
    (down) for SwiGLU, so the K projection, the attention output projection and the up
    projection run again: for Llama 3 8B (1024 + 4096 + 14336) * 4096 of the 218.1M weights'
    FLOPs per token, 36.5%. A non-gated MLP's down projection is the even sixth matmul, but
    it is the block's last: its output feeds only the residual add, whose backward needs
    nothing, and non-reentrant checkpointing stops recomputing once every tensor the backward
    needs exists (torch's early stop, on by default), so only K and the output projection run
    again (counted on the validator's model, ``tests/unit/test_op_selective_recompute.py``).
    The attention kernel's output is saved (not recomputed).

    Shapes as :func:`layer_forward_gemms` (m = b*s, Megatron's TP split); the K projection is
    its own GEMM (n = local query groups x head_dim), as torchtitan does not fuse Q, K, V.
    """
    require_positive_int("micro_batch_size", micro_batch_size)
    _check_tp(model, tp)
    h, d = model.hidden_size, model.head_dim
    tokens = micro_batch_size * model.seq_length
    gemms = [
        Gemm(name="k_proj", m=tokens, n=_local_query_groups(model, tp) * d, k=h),
        Gemm(name="attn_out", m=tokens, n=h, k=model.num_attention_heads // tp * d),
    ]
    if model.activation is Activation.SWIGLU:
        gemms.append(Gemm(name="mlp_up", m=tokens, n=model.ffn_hidden_size // tp, k=h))
    return tuple(gemms)


def layer_forward_flops(model: ModelSpec, *, micro_batch_size: int, tp: int = 1) -> int:
    """Per-GPU forward GEMM FLOPs of one layer (sum of :func:`layer_forward_gemms`)."""
    gemms = layer_forward_gemms(model, micro_batch_size=micro_batch_size, tp=tp)
    return sum(g.flops for g in gemms)


def attention_core_forward_flops(model: ModelSpec, *, micro_batch_size: int, tp: int = 1) -> int:
    """Per-GPU forward FLOPs of Q K^T and attention over V in one layer (4*b*s^2*h / tp)."""
    gemms = layer_forward_gemms(model, micro_batch_size=micro_batch_size, tp=tp)
    return sum(g.flops for g in gemms if g.name in ATTENTION_CORE_GEMMS)


def _model_flops_exact(model: ModelSpec, global_batch_size: int) -> int:
    require_dense(model)  # experts, MLA, MTP: plansim.analytic.moe_counts
    layers = model.num_layers * layer_forward_flops(model, micro_batch_size=global_batch_size)
    logits = logits_forward_gemm(model, micro_batch_size=global_batch_size, tp=1).flops
    return FWD_BWD_MULTIPLIER * (layers + logits)


def model_flops_per_step(model: ModelSpec, *, global_batch_size: int) -> float:
    """Model FLOPs of one training step (forward + backward, no recompute), for MFU.

    3 x (forward GEMM FLOPs of all L layers + logits): Korthikanti et al. 2022 App. A Eq. 7,
    generalised to GQA and SwiGLU by summing the actual GEMMs. For a GPT-style model this is
    exactly 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL)).

    Args:
        model: the transformer.
        global_batch_size: sequences B per optimizer step.

    Returns:
        FLOPs (a count) summed over all GPUs.
    """
    return float(_model_flops_exact(model, global_batch_size))


def hardware_flops_per_step(
    model: ModelSpec,
    *,
    global_batch_size: int,
    recompute: Recompute,
    recomputed_layers: int | None = None,
) -> float:
    """Hardware FLOPs of one training step (model FLOPs + recomputation), for HFU.

    - NONE: model FLOPs (Korthikanti 2022 App. A Eq. 7).
    - FULL: + one more forward of every transformer layer (not the logits), or of
      ``recomputed_layers`` of them (Megatron's block method: ``plan.recomputed_layers``);
      with every layer, for GPT-style models exactly Narayanan et al. SC21 Eq. 3,
      96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)).
    - SELECTIVE: + SELECTIVE_RECOMPUTE_ATTENTION_FORWARDS (3) x the attention-core forward
      FLOPs of every layer, the convention of Korthikanti 2022 App. A Eq. 8,
      72*B*L*s*h^2*(1 + s/(3h) + V/(12hL)). The physically recomputed GEMM work is one
      attention-core forward (:func:`layer_recompute_gemms`), so this overstates it by
      2 x 4*B*L*s^2*h; kept to match the paper's published HFU.
    - SELECTIVE_OP: + the FLOPs of :func:`op_selective_recompute_gemms` in every layer.

    Args:
        model: the transformer.
        global_batch_size: sequences B per optimizer step.
        recompute: activation recomputation mode.

    Returns:
        FLOPs (a count) summed over all GPUs.
    """
    total = _model_flops_exact(model, global_batch_size)
    layers = model.num_layers
    if recompute is Recompute.FULL:
        if recomputed_layers is not None:  # Megatron's block method: some layers only
            layers = recomputed_layers
        total += layers * layer_forward_flops(model, micro_batch_size=global_batch_size)
    elif recompute is Recompute.SELECTIVE:
        core = attention_core_forward_flops(model, micro_batch_size=global_batch_size)
        total += SELECTIVE_RECOMPUTE_ATTENTION_FORWARDS * layers * core
    elif recompute is Recompute.SELECTIVE_OP:
        again = op_selective_recompute_gemms(model, micro_batch_size=global_batch_size, tp=1)
        total += layers * sum(g.flops for g in again)
    return float(total)


def model_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs per trained token: :func:`model_flops_per_step` for one sequence / s.

    Equals 6 x (weight-matrix parameters, including the output layer but not the embedding
    lookup) + 12*L*s*h (the attention core, 4*s*h FLOPs per token and layer forward); compare
    the 6N rule of Kaplan et al. 2020 §2.1.
    """
    return _model_flops_exact(model, 1) / model.seq_length
