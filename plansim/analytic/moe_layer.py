"""Expert layers and Multi-head Latent Attention under Megatron-Core's parallel folding (pure).

What a transformer with routed experts (``ModelSpec.moe``), MLA (``ModelSpec.mla``) or MTP
modules costs beyond a dense one, per rank, per layer and per micro-batch: its GEMMs, the
token dispatch and combine traffic, the extra activations and the parameters a rank holds.

Layout (Megatron-Core MoE parallel folding, Liu et al. 2025, arXiv:2504.14960 §3): the
attention of a pipeline stage runs over tp x cp x dp ranks, its experts over etp x ep x edp
of the same ranks. A rank holds E/ep routed experts, each split over etp (its FFN columns);
the router and the shared experts run like a dense MLP (shared experts split over tp).
Megatron-Core needs sequence parallelism with tp > 1 and experts, so a rank routes its
b*s/(cp*tp) sequence-parallel tokens.

Per MoE layer and micro-batch, with T = b*s/(cp*tp) tokens on a rank, k = top_k, E experts:

- dispatch (Megatron ``alltoall`` dispatcher; Lepikhin et al. 2020, GShard §2.2): each rank
  sends its T*k token copies, h 16-bit values each, to the ranks holding their experts: one
  all-to-all of S = 2*T*k*h bytes over the EP group, of which 1/ep stays local; combine sends
  them back (another S); the backward runs both again on the gradients (Megatron-Core
  ``MoEAlltoAllTokenDispatcher``). With etp > 1 the received tokens are all-gathered over the
  etp ranks of an expert and the outputs reduce-scattered back (its ``gather_from_sequence_
  parallel_region`` / ``reduce_scatter_to_sequence_parallel_region`` over the expert TP
  group).
- expert compute: balanced routing gives every local expert T_e = T*k*etp*ep/E token rows
  (the EP group's T*k*ep*etp copies split over its E experts... per etp shard, each of them
  sees all the etp group's rows): the grouped GEMM of an expert is m = T_e, k = h,
  n = ffn_e/etp (up, gate) and m = T_e, k = ffn_e/etp, n = h (down), E/ep of them, each
  priced at the profile's GEMM efficiency for its own size, so small per-expert batches run
  below the dense rate (MegaBlocks, Gale et al. 2023 §5, Fig. 5). The busiest rank sets the
  step: ``plan.expert_load_imbalance`` (max over EP ranks of routed rows / mean; 1.0 for the
  forced-balance routing the Megatron-Bridge benchmarks use, "force-balance the token
  distribution among experts", ``reference/moe_SOURCES.md`` E01) scales T_e and the
  dispatch and combine messages.
- router: a GEMM m = T, k = h, n = E (replicated weights) and its softmax/sigmoid and top-k;
  permute and unpermute copy the T*k rows (read and write, forward and backward), and the
  gates scale the combined rows.
- activations (saved for backward): the T*k*etp received rows (the experts' first GEMM
  input), the router's fp32 probabilities and the routing map, besides what the dense proxy
  below counts for the expert intermediates.

Parameters a rank holds: the routed experts of its MoE layers, E/ep x one expert / etp;
everything else as a dense model (linear weights / tp, norms and router replicated). Their
gradients are reduced and their optimizer states sharded over edp (experts) and dp x cp (the
rest) (``plansim.analytic.memory``).

Dense proxy (:func:`dense_proxy`): the elementwise traffic, stored activations and TP
messages of the dense models in ``plansim.analytic.elementwise``, ``activations`` and
``tp_comm`` price a MoE layer as a dense layer whose FFN is as wide as the intermediate a
token runs through: top_k x expert width + shared experts' width (DeepSeek-V3: 8 x 2048 +
2048 = 18432 = its dense layers' FFN). MLA enters them as MHA with the heads' query/key
width (qk_nope + qk_rope). Modelling limits: the latent projections' own small activations
and norms, MTP activations, and dropped tokens under a capacity factor are not counted; the
MLA down-projections are taken as split over tp (Megatron keeps them whole on each rank).

MTP modules (DeepSeek-V3 report §2.2): on the last pipeline stage, each one a layer like the
model's last plus the projection and a second logits and loss pass (Megatron-Core puts them
there).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from plansim.analytic import flops as fl
from plansim.analytic.moe_counts import count_moe_parameters
from plansim.analytic.params import edge_parameters
from plansim.errors import SpecError
from plansim.specs.layer_split import stage_layer_counts
from plansim.specs.model import Activation, ModelSpec, is_dense
from plansim.specs.moe import MoESpec
from plansim.specs.plan import DpSync, OffloadDevice, ParallelPlan

#: Bytes of one dispatched or combined token element: 16-bit (Megatron-Core dispatches bf16
#: activations).
TOKEN_ELEMENT_BYTES = 2.0
#: Bytes of one fp8-dispatched element with its scale: 1 byte plus one fp32 scale per 128
#: elements (DeepSeek-V3 §3.3.2: activations before the up-projections quantized in 1 x 128
#: tiles and dispatched in fp8; the combine stays bf16).
FP8_DISPATCH_ELEMENT_BYTES = 1.0 + 4.0 / 128
#: Bytes per router probability (fp32, Megatron ``--moe-router-dtype fp32``) and per
#: routing-map entry (bool).
ROUTER_PROB_BYTES = 4.0
ROUTING_MAP_BYTES = 1.0
#: Memory-bound kernels of one MoE layer's routing per pass (router softmax/sigmoid, top-k,
#: permute, unpermute, gate scaling, aux/bias update), each a launch.
ROUTING_KERNELS = 6


def routed_ffn_width(model: ModelSpec) -> int:
    """Intermediate width one token runs through in a MoE layer: top_k x expert FFN +
    shared experts x their FFN (the dense model's FFN without experts)."""
    moe = model.moe
    if moe is None:
        return model.ffn_hidden_size
    return moe.top_k * moe.expert_ffn_hidden_size + (
        moe.num_shared_experts * moe.shared_ffn_hidden_size
    )


@functools.lru_cache(maxsize=64)  # pure; a search prices the same model's proxy per plan
def dense_proxy(model: ModelSpec, *, moe_layer: bool) -> ModelSpec:
    """The dense ModelSpec the elementwise, activation and TP-message models price in place
    of a layer of ``model`` (module docstring): MLA as MHA of head width qk_nope + qk_rope,
    a MoE layer's FFN as :func:`routed_ffn_width`; ``model`` itself when it is dense."""
    if is_dense(model):
        return model
    changes: dict[str, object] = {"moe": None, "mla": None, "mtp_num_layers": None}
    if model.mla is not None:
        changes["num_query_groups"] = model.num_attention_heads
        changes["kv_channels"] = model.mla.qk_head_dim
    if moe_layer and model.moe is not None:
        changes["ffn_hidden_size"] = routed_ffn_width(model)
    return dataclasses.replace(model, **changes)  # type: ignore[arg-type]


def moe_split_reason(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why ``plan``'s expert layout cannot hold ``model``'s layers, or None.

    The routed experts must split over ep (E % ep) and their FFN over etp, the shared
    experts' FFN over tp; expert parallelism needs a model with experts; tp > 1 with experts
    needs sequence parallelism (Megatron-Core refuses otherwise); MLA heads split over tp.
    """
    moe = model.moe
    etp = plan.dims.expert_tensor_parallel_size
    if moe is None:
        if plan.ep > 1 or plan.etp is not None:
            return f"ep({plan.ep}) / etp({plan.etp}) set for {model.name}, which has no experts"
        return None
    if moe.num_experts % plan.ep:
        return f"moe.num_experts({moe.num_experts}) is not divisible by ep({plan.ep})"
    if moe.expert_ffn_hidden_size % etp:
        width = moe.expert_ffn_hidden_size
        return f"moe.expert_ffn_hidden_size({width}) is not divisible by etp({etp})"
    shared = moe.num_shared_experts * moe.shared_ffn_hidden_size
    if shared % plan.tp:
        return f"shared experts' FFN width({shared}) is not divisible by tp({plan.tp})"
    if plan.tp > 1 and not plan.sequence_parallel:
        return f"tp({plan.tp}) > 1 with experts needs sequence_parallel (Megatron-Core)"
    return None


def moe_option_reason(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why ``plan`` uses an option plansim does not model for a model with experts, MLA or
    MTP modules, or None: ZeRO-2/3 and PyTorch FSDP (sharded expert gradients and
    parameters), offload, a parameter server, or layers kept in bf16 at the pipeline ends."""
    if is_dense(model):
        return None
    if plan.zero_stage >= 2 or plan.use_torch_fsdp2:
        return (
            f"zero_stage({plan.zero_stage}) / use_torch_fsdp2({plan.use_torch_fsdp2}): "
            f"{model.name} is modelled with ZeRO-0/1 (Megatron-Core's distributed optimizer)"
        )
    none = OffloadDevice.NONE
    offloaded = plan.offload_optimizer is not none or plan.offload_param is not none
    if offloaded or plan.dp_sync is not DpSync.RING:
        return f"offload or dp_sync({plan.dp_sync.value}) is not modelled for {model.name}"
    if plan.num_layers_at_start_in_bf16 or plan.num_layers_at_end_in_bf16:
        return f"num_layers_at_start/end_in_bf16 is not modelled for {model.name}"
    return None


def rank_tokens(model: ModelSpec, plan: ParallelPlan) -> float:
    """Tokens T one rank routes per MoE layer and micro-batch: b*s/(cp*tp) (sequence
    parallel: the tp ranks split the sequence before the router)."""
    return plan.micro_batch_size * model.seq_length / (plan.cp * plan.tp)


def tokens_per_local_expert(model: ModelSpec, plan: ParallelPlan) -> int:
    """Rows of one local expert's grouped GEMM on the busiest rank:
    ceil(imbalance x T*k*etp*ep/E) (module docstring)."""
    moe = _moe(model)
    etp = plan.dims.expert_tensor_parallel_size
    rows = rank_tokens(model, plan) * moe.top_k * etp * plan.ep / moe.num_experts
    return max(1, math.ceil(plan.expert_load_imbalance * rows - 1e-9))


def dispatch_message_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Send buffer of one rank's dispatch (and of its combine) all-to-all, bytes:
    imbalance x 2*T*k*h (module docstring)."""
    moe = _moe(model)
    rows = rank_tokens(model, plan) * moe.top_k * plan.expert_load_imbalance
    return TOKEN_ELEMENT_BYTES * rows * model.hidden_size


def mla_attention_gemms(model: ModelSpec, *, micro_batch_size: int, tp: int) -> tuple[fl.Gemm, ...]:
    """Per-GPU forward GEMMs of one MLA block on one TP rank (DeepSeek-V2 arXiv:2405.04434
    §2.1.2-2.1.3; Megatron-Core ``MLASelfAttention``), b = micro_batch_size, a_l = a/tp:
    ``q_down`` h -> q_lora and ``q_up`` q_lora -> a_l*(d_nope + d_rope) (or ``q`` h ->
    a_l*d_qk without a query latent), ``kv_down`` h -> kv_lora + d_rope, ``kv_up`` kv_lora ->
    a_l*(d_nope + d_v), the core ``attn_scores`` (k = d_qk) and ``attn_over_v`` (n = d_v) per
    local head, ``attn_out`` a_l*d_v -> h; m = b*s for the projections.

    Raises:
        SpecError: the model has no MLA, or tp does not split its heads.
    """
    mla = model.mla
    if mla is None:
        raise SpecError(f"{model.name} has no MLA (model.mla is None)")
    if model.num_attention_heads % tp:
        raise SpecError(
            f"num_attention_heads({model.num_attention_heads}) is not divisible by tp({tp})"
        )
    h, s = model.hidden_size, model.seq_length
    tokens, heads = micro_batch_size * s, model.num_attention_heads // tp
    batched = micro_batch_size * heads
    gemms: list[fl.Gemm] = []
    if mla.q_lora_rank is None:
        gemms.append(fl.Gemm(name="q", m=tokens, n=heads * mla.qk_head_dim, k=h))
    else:
        gemms.append(fl.Gemm(name="q_down", m=tokens, n=mla.q_lora_rank, k=h))
        gemms.append(fl.Gemm(name="q_up", m=tokens, n=heads * mla.qk_head_dim, k=mla.q_lora_rank))
    kv_up_n = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return (
        *gemms,
        fl.Gemm(name="kv_down", m=tokens, n=mla.kv_lora_rank + mla.qk_rope_head_dim, k=h),
        fl.Gemm(name="kv_up", m=tokens, n=kv_up_n, k=mla.kv_lora_rank),
        fl.Gemm(name="attn_scores", m=s, n=s, k=mla.qk_head_dim, count=batched, has_weight=False),
        fl.Gemm(name="attn_over_v", m=s, n=mla.v_head_dim, k=s, count=batched, has_weight=False),
        fl.Gemm(name="attn_out", m=tokens, n=h, k=heads * mla.v_head_dim),
    )


def moe_mlp_gemms(model: ModelSpec, plan: ParallelPlan, *, local: ModelSpec) -> tuple[fl.Gemm, ...]:
    """Per-GPU forward GEMMs of one MoE layer's MLP part on the busiest rank (module
    docstring): ``router``; the shared experts as a dense MLP split over tp (``mlp_up``,
    ``mlp_gate``, ``mlp_down``, m = b*s/cp); the E/ep local routed experts' grouped GEMMs
    (``expert_up``, ``expert_gate``, ``expert_down``, m = :func:`tokens_per_local_expert`).
    ``local``: the model as one cp rank sees it (s/cp tokens a sequence)."""
    moe = _moe(model)
    h, tp = model.hidden_size, plan.tp
    etp = plan.dims.expert_tensor_parallel_size
    tokens = plan.micro_batch_size * local.seq_length
    gated = model.activation is Activation.SWIGLU
    gemms = [fl.Gemm(name="router", m=max(1, -(-tokens // tp)), n=moe.num_experts, k=h)]
    shared = moe.num_shared_experts * moe.shared_ffn_hidden_size // tp
    if shared:
        gemms.append(fl.Gemm(name="mlp_up", m=tokens, n=shared, k=h))
        if gated:
            gemms.append(fl.Gemm(name="mlp_gate", m=tokens, n=shared, k=h))
        gemms.append(fl.Gemm(name="mlp_down", m=tokens, n=h, k=shared))
    rows, ffn = tokens_per_local_expert(model, plan), moe.expert_ffn_hidden_size // etp
    experts = moe.num_experts // plan.ep
    gemms.append(fl.Gemm(name="expert_up", m=rows, n=ffn, k=h, count=experts))
    if gated:
        gemms.append(fl.Gemm(name="expert_gate", m=rows, n=ffn, k=h, count=experts))
    gemms.append(fl.Gemm(name="expert_down", m=rows, n=h, k=ffn, count=experts))
    return tuple(gemms)


def layer_kind_gemms(
    model: ModelSpec, plan: ParallelPlan, *, local: ModelSpec, moe_layer: bool
) -> tuple[fl.Gemm, ...]:
    """Per-GPU forward GEMMs of one layer of a model with experts or MLA, before context
    parallelism's key-length change (``layer_cost.layer_gemms`` applies it): the attention
    (MLA, or MHA/GQA as ``flops.layer_forward_gemms``), then the dense MLP or, in a MoE
    layer, :func:`moe_mlp_gemms`."""
    b = plan.micro_batch_size
    dense = dataclasses.replace(model, moe=None, mla=None, mtp_num_layers=None)
    local_dense = dataclasses.replace(dense, seq_length=local.seq_length)
    if moe_layer and model.moe is not None:
        shared = model.moe.num_shared_experts * model.moe.shared_ffn_hidden_size
        local_dense = dataclasses.replace(local_dense, ffn_hidden_size=max(shared, plan.tp))
    base = fl.layer_forward_gemms(local_dense, micro_batch_size=b, tp=plan.tp)
    attention: tuple[fl.Gemm, ...] = tuple(g for g in base if not g.name.startswith("mlp_"))
    if model.mla is not None:
        mla_local = dataclasses.replace(model, seq_length=local.seq_length)
        attention = mla_attention_gemms(mla_local, micro_batch_size=b, tp=plan.tp)
    if moe_layer and model.moe is not None:
        return (*attention, *moe_mlp_gemms(model, plan, local=local))
    return (*attention, *(g for g in base if g.name.startswith("mlp_")))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertTraffic:
    """One MoE layer's expert-parallel traffic and routing work on one rank, per micro-batch.

    Attributes:
        dispatch_bytes: send buffer of the dispatch all-to-all (the combine's is the same).
        etp_gather_bytes: gathered output of the expert-TP all-gather of the received rows
            (the reduce-scatter after the experts is the same); 0 with etp == 1.
        routing_bytes: HBM bytes of the router's softmax/top-k, permute and unpermute and the
            gate scaling in one pass (forward; the backward moves as many).
        stored_rows_bytes: the received rows the experts' first GEMM saves for its weight
            gradient, at 16 bits (quantized precisions keep the copy the GEMM read:
            ``plansim.analytic.stored_activations`` scales it).
        router_state_bytes: the router's saved fp32 probabilities and routing map.
    """

    dispatch_bytes: float
    etp_gather_bytes: float
    routing_bytes: float
    stored_rows_bytes: float
    router_state_bytes: float


def expert_traffic(model: ModelSpec, plan: ParallelPlan) -> ExpertTraffic:
    """:class:`ExpertTraffic` of one MoE layer (module docstring)."""
    moe = _moe(model)
    etp = plan.dims.expert_tensor_parallel_size
    tokens = rank_tokens(model, plan)
    message = dispatch_message_bytes(model, plan)
    received = message * etp  # the rows a rank's local experts run, after the etp gather
    router = tokens * moe.num_experts * (2 * ROUTER_PROB_BYTES + ROUTING_MAP_BYTES)
    routing = router + 2.0 * (message + received) + 2.0 * received  # permute/unpermute, gates
    return ExpertTraffic(
        dispatch_bytes=message,
        etp_gather_bytes=received if etp > 1 else 0.0,
        routing_bytes=routing,
        stored_rows_bytes=received,
        router_state_bytes=tokens * moe.num_experts * (ROUTER_PROB_BYTES + ROUTING_MAP_BYTES),
    )


def stage_moe_layer_counts(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """MoE layers in each pipeline stage (model chunk), stage 0 first; the chunks hold
    consecutive layers in stage order (``layer_split.stage_layer_counts``). All zero for a
    dense model."""
    counts = stage_layer_counts(model.num_layers, plan)
    moe = model.moe
    if moe is None:
        return tuple(0 for _ in counts)

    def before(i: int) -> int:  # MoE layers among layers 0 .. i - 1
        return max(0, i - moe.first_k_dense_layers) // moe.layer_interval

    out, start = [], 0
    for n in counts:
        out.append(before(start + n) - before(start))
        start += n
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankParameters:
    """Parameters one GPU of a pipeline rank holds, by how they are sharded.

    Attributes:
        dense: every parameter but the routed experts (linear weights / tp, norms and
            routers whole); gradients reduced, ZeRO states sharded over dp x cp.
        expert: the routed experts of the rank's MoE layers, E/ep of them / etp each;
            gradients reduced, ZeRO states sharded over edp.
    """

    dense: float
    expert: float

    @property
    def total(self) -> float:
        """All parameters on the GPU."""
        return self.dense + self.expert


def rank_parameter_split(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> RankParameters:
    """Parameters of pipeline rank ``rank`` on one GPU (module docstring), MTP modules on
    the last rank. Linear weights, the word embedding and the output layer are split over
    tp; norms, routers (and their biases) and learned positions replicated; each MoE
    layer's routed experts over ep x etp."""
    counts = count_moe_parameters(model)
    stages = stage_layer_counts(model.num_layers, plan)
    moe_stages = stage_moe_layer_counts(model, plan)
    mine = plan.stages_of_rank(rank)
    layers = sum(stages[s] for s in mine)
    moe_layers = sum(moe_stages[s] for s in mine)
    dense_layers = layers - moe_layers
    d, m = counts.dense_layer, counts.moe_layer
    sharded = dense_layers * (d.attention + d.mlp) + moe_layers * (m.attention + m.shared_experts)
    replicated = dense_layers * d.norms + moe_layers * (m.norms + m.router)
    etp = plan.dims.expert_tensor_parallel_size
    expert = moe_layers * (m.num_experts // plan.ep) * m.expert / etp
    last_stage = plan.rank_holds_stage(rank, plan.num_stages - 1)
    edges = edge_parameters(counts, plan, first=plan.rank_holds_stage(rank, 0), last=last_stage)
    if last_stage:
        mtp_experts = 0 if m.num_experts == 0 or not _last_is_moe(model) else m.routed_experts
        sharded += counts.num_mtp_modules * (counts.mtp_module - mtp_experts)
        if mtp_experts:
            expert += counts.num_mtp_modules * (m.num_experts // plan.ep) * m.expert / etp
    dense = (sharded + edges.sharded) / plan.tp + (replicated + edges.replicated)
    return RankParameters(dense=dense, expert=expert)


def _last_is_moe(model: ModelSpec) -> bool:
    """Whether the model's last layer (and so each MTP module's layer) has experts."""
    return model.moe is not None and model.moe.is_moe_layer(model.num_layers - 1)


def _moe(model: ModelSpec) -> MoESpec:
    if model.moe is None:
        raise SpecError(f"{model.name} has no routed experts (model.moe is None)")
    return model.moe


def expected_nodes_per_token(model: ModelSpec, *, num_nodes: int) -> float:
    """Expected number of the EP group's ``num_nodes`` nodes (experts spread evenly, E /
    num_nodes each) a token's top_k experts sit on, for uniform routing:

    * group-limited routing whose groups lie inside nodes (``router.num_groups`` a multiple of
      ``num_nodes``, c groups per node; DeepSeek-V3: 8 groups on 8 nodes, 4 per token): the
      token picks G of g groups, so a node is missed with probability C(g - c, G) / C(g, G);
    * otherwise k distinct experts of E: a node is missed with probability
      C(E - E/num_nodes, k) / C(E, k).

    Expected nodes = num_nodes x (1 - P(missed)) (DeepSeek-V3 §3.2.2: at most 4 nodes a
    token, 3.2 experts a node on average). A model without experts: 0."""
    moe = model.moe
    if moe is None or num_nodes < 1:
        return 0.0
    experts, k = moe.num_experts, moe.top_k
    groups, per_token = moe.router.num_groups, moe.router.groups_per_token
    if groups > 1 and groups % num_nodes == 0:
        groups_per_node = groups // num_nodes
        missed = math.comb(groups - groups_per_node, per_token) / math.comb(groups, per_token)
    else:
        experts_per_node = round(experts / num_nodes)
        missed = math.comb(experts - experts_per_node, k) / math.comb(experts, k)
    return num_nodes * (1.0 - missed)


@dataclass(frozen=True, slots=True, kw_only=True)
class DedupTraffic:
    """Bytes one rank moves in one node-deduplicated dispatch (or combine).

    Attributes:
        network_bytes: sent to other nodes, once per (token, destination node).
        nvlink_bytes: moved inside nodes to the experts' GPUs.
    """

    network_bytes: float
    nvlink_bytes: float


def dedup_traffic(
    model: ModelSpec,
    plan: ParallelPlan,
    *,
    num_nodes: int,
    members_per_node: int,
    element_bytes: float,
) -> DedupTraffic:
    """:class:`DedupTraffic` of one MoE layer's dispatch or combine for one micro-batch: T
    tokens (x the load imbalance) each sent to the expected remote nodes,
    :func:`expected_nodes_per_token` x (num_nodes - 1) / num_nodes (a token's own node is as
    likely as any), h elements of ``element_bytes`` each; inside nodes every (token, expert)
    row whose expert sits on another GPU of the node, k x (m - 1) / m of the rows, m the
    EP ranks per node."""
    moe = _moe(model)
    tokens = rank_tokens(model, plan) * plan.expert_load_imbalance
    row_bytes = element_bytes * model.hidden_size
    remote_nodes = (
        expected_nodes_per_token(model, num_nodes=num_nodes) * (num_nodes - 1) / num_nodes
    )
    inside = moe.top_k * (members_per_node - 1) / members_per_node
    return DedupTraffic(
        network_bytes=tokens * remote_nodes * row_bytes, nvlink_bytes=tokens * inside * row_bytes
    )
