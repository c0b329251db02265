"""Activations a pipeline rank stores between a micro-batch's forward and its backward
(pure): per layer from ``plansim.analytic.activations``, per model chunk and per micro-batch
(block-method recompute, layers kept in bf16 under fp8 / fp4), and at the rank's peak over
its schedule (micro-batches in flight). ``plansim.analytic.memory`` adds them to the rank's
model states, transients and reserve.
"""

from __future__ import annotations

from plansim.analytic.activations import layer_activations
from plansim.analytic.elementwise import QUANTIZED_ELEMENT_BYTES
from plansim.analytic.memo import Memo, fields_getter, memoised
from plansim.analytic.moe_layer import dense_proxy, expert_traffic
from plansim.analytic.recompute_modules import saved_bytes
from plansim.schedule.actions import ActionKind, parts
from plansim.schedule.builders import build_actions, interleaved_chunk, interleaved_warmup
from plansim.specs.layer_split import stage_bf16_layers, stage_layer_counts
from plansim.specs.model import ModelSpec, is_dense
from plansim.specs.plan import PLAN_FIELDS, ParallelPlan, Recompute, Schedule
from plansim.specs.stage_placement import StagePlacement


def microbatches_in_flight(plan: ParallelPlan, *, rank: int) -> float:
    """Micro-batches' worth of the rank's activations (its L/pp layers) held at its peak.

    GPipe: all m (Huang et al. 2019); 1F1B: min(p - rank, m) (Narayanan et al. SC21 §2.2).
    Interleaved 1F1B: the peak number of stored micro-batch *chunks* (each 1/v of the rank's
    layers) divided by v. Rank r stores its w warm-up forwards plus the first steady-state
    forward: ``min(w + 1, m v)`` chunks with ``w = min(2(p - r - 1) + (v - 1)p, m v)``
    (Megatron-LM warm-up, see ``plansim.schedule.builders.interleaved_warmup``). For rank 0
    with enough micro-batches that is (v p + p - 1)/v = p(1 + (p - 1)/(p v)) micro-batches, so
    it holds L(1 + (p - 1)/(p v)) layers' worth (Korthikanti et al. 2022 §4.2.3; memory.md
    "Interleaved schedule ... multiply by (1 + (p - 1)/(p m))" with m the chunks per rank).
    ZB-H1 (Qi et al. ICLR 2024, arXiv:2401.10241, §2.1): min(p, m) on every rank. A
    micro-batch's activations live from its F to its W, and rank r runs W r slots after the
    matching I (``plansim.schedule.builders._zb_h1``), so each rank reaches p in flight:
    rank 0 exactly 1F1B's min(p, m) (the paper: H1's peak, on the first worker, equals
    1F1B's), later ranks more than 1F1B's min(p - r, m). The paper counts a micro-batch
    between I and W at the smaller W footprint (Table 1: M_W = 32sbh against
    M_B = 34sbh + 5as^2b per layer); here, as in the engine, it keeps all its stored bytes
    until W: an upper bound for ranks r > 0, close when the s^2 term is gone (FlashAttention).

    ZB-V, DualPipeV and DualPipe: the peak of live chunk activations replaying the rank's
    action list (:func:`replayed_chunk_peak`, chunks counted equal) over its two chunks. ZB-V
    holds p micro-batches' worth on every rank (Qi et al. §6: 1F1B's peak, balanced);
    DualPipe p + 1 chunks of one copy's stage on rank 0, i.e. (p + 1)/2 of the rank's two
    chunks (DeepSeek-V3 report Table 2: activations PP + 1).
    """
    m, p, v = plan.num_microbatches, plan.pp, plan.vpp
    if plan.schedule.placement is not StagePlacement.LOOP:
        return replayed_chunk_peak(plan, (1.0, 1.0), rank=rank) / 2
    if plan.schedule is Schedule.GPIPE:
        return m
    if plan.schedule is Schedule.ZB_H1:
        return min(p, m)
    if plan.schedule is Schedule.INTERLEAVED_1F1B:
        warmup = interleaved_warmup(rank, num_ranks=p, num_microbatches=m, vpp=v)
        return min(warmup + 1, m * v) / v
    return min(p - rank, m)


def saved_gemm_input_bytes(plan: ParallelPlan) -> float:
    """Bytes per element of the GEMM inputs kept for the backward: the quantized size with fp8
    / fp4 (Transformer Engine saves the copy the GEMM read, ``plansim.analytic.activations``),
    else 2 (16-bit; fp32 training scales every activation by 2 afterwards)."""
    return QUANTIZED_ELEMENT_BYTES.get(plan.precision, 2.0)


def _layer_stored_bytes(model: ModelSpec, plan: ParallelPlan, recompute: Recompute) -> float:
    """16-bit bytes one layer stores for one micro-batch under ``recompute``. A model with
    experts or MLA: its MoE layer's (every layer priced as one, an upper bound for the
    narrower dense layers), the dense proxy's bytes (``moe_layer.dense_proxy``) plus, unless
    the layer is fully recomputed, the received token rows and router state
    (``moe_layer.expert_traffic``); with selective recompute, less what the plan's recompute
    modules do not keep (``recompute_modules.saved_bytes``)."""
    extra = 0.0
    priced = model
    if not is_dense(model):
        if model.moe is not None and recompute is not Recompute.FULL:
            traffic = expert_traffic(model, plan)
            rows = traffic.stored_rows_bytes * saved_gemm_input_bytes(plan) / 2.0
            extra = rows + traffic.router_state_bytes
        priced = dense_proxy(model, moe_layer=model.moe is not None)
    if recompute is Recompute.SELECTIVE and plan.recompute_modules is not None:
        q = saved_gemm_input_bytes(plan)
        extra -= saved_bytes(model, plan, gemm_input_bytes=q, kv_size=priced.kv_size)
    model = priced
    return (
        extra
        + layer_activations(
            model,
            micro_batch_size=plan.micro_batch_size,
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
            recompute=recompute,
            flash=plan.attention.fused,
            gemm_input_bytes=saved_gemm_input_bytes(plan),
            cp=plan.cp,
        ).stored_bytes
    )


def _chunk_layer_bytes(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> list[float]:
    """16-bit bytes the layers of each of the rank's chunks store for one micro-batch: with
    Megatron's block method (``plan.recompute_num_layers``) the chunk's first N layers store
    their input only and the others everything (no recompute); layers kept in bf16 under
    fp8 / fp4 (``stage_bf16_layers``) keep 16-bit GEMM inputs."""
    mine = plan.stages_of_rank(rank)
    all_counts = stage_layer_counts(model.num_layers, plan)
    counts = [all_counts[s] for s in mine]
    block = plan.recompute_num_layers is not None
    rec_mode = Recompute.FULL if block else plan.recompute
    all_ends = stage_bf16_layers(model.num_layers, plan)
    ends = [all_ends[s] for s in mine]
    rec8 = _layer_stored_bytes(model, plan, rec_mode)
    plain8 = _layer_stored_bytes(model, plan, Recompute.NONE)
    rec16, plain16 = rec8, plain8  # unused (weight 0) unless the rank keeps bf16 layers
    if any(head or tail for head, tail in ends):
        plan16 = plan.bf16_layer_plan()
        rec16 = _layer_stored_bytes(model, plan16, rec_mode)
        plain16 = _layer_stored_bytes(model, plan16, Recompute.NONE)
    chunks = []
    for c, (head, tail) in zip(counts, ends, strict=True):
        r = plan.recomputed_layers(c) if block else c  # layers stored as rec_mode says
        r16 = min(r, head) + max(0, r - (c - tail))
        n16 = head + tail - r16  # bf16 layers stored in full
        chunks.append((r - r16) * rec8 + r16 * rec16 + (c - r - n16) * plain8 + n16 * plain16)
    return chunks


def microbatch_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> float:
    """Bytes one micro-batch's forward leaves stored on ``rank`` until its backward (its
    s/cp tokens with context parallelism)."""
    return _rank_activations(model, plan, rank=rank)[0]


#: Plan fields the bytes one micro-batch stores per layer and chunk do not depend on (the
#: micro-batches in flight do: :func:`microbatches_in_flight`); every other field is in the
#: memo key of :func:`_rank_activations` (and of ``memory.transient_bytes``' part before
#: ZeRO-3), so a field added later counts until listed here.
NOT_IN_ACTIVATIONS = (
    "dp", "global_batch_size", "zero_stage", "schedule", "overlap_p2p_comm",
    "overlap_grad_reduce", "overlap_param_gather", "gradient_accumulation_fusion",
    "grad_reduce_in_bf16", "scatter_gather_p2p", "dp_sync", "ps_servers",
    "offload_optimizer", "offload_param", "zero3_param_fetch", "use_torch_fsdp2", "dp_shard",
    "reshard_after_forward", "fused_elementwise", "persist_layer_norm", "ep",
)  # fmt: skip
#: The memo key fields of a rank's activation pricing (every plan field outside
#: NOT_IN_ACTIVATIONS), for this module and ``memory.transient_bytes``.
activation_key = fields_getter(tuple(f for f in PLAN_FIELDS if f not in NOT_IN_ACTIVATIONS))


def _rank_activations(
    model: ModelSpec, plan: ParallelPlan, *, rank: int, memo: Memo | None = None
) -> tuple[float, tuple[float, ...]]:
    """(:func:`microbatch_activation_bytes`, :func:`stage_activation_bytes` of the rank's vpp
    chunks, chunk 0 first), from one pricing of the rank's layers; ``memo``: a search's
    cache (one model), keyed by the rank and the fields outside NOT_IN_ACTIVATIONS."""
    key = ("rank_activations", rank, plan.schedule.placement, *activation_key(plan))
    return memoised(memo, key, lambda: _price_rank_activations(model, plan, rank=rank))


def _price_rank_activations(
    model: ModelSpec, plan: ParallelPlan, *, rank: int
) -> tuple[float, tuple[float, ...]]:
    layers = _chunk_layer_bytes(model, plan, rank=rank)
    per_mb: float = sum(layers)
    if plan.rank_holds_stage(rank, 0) and model.dropout:  # embedding output, Korthikanti §4.3
        sbh = model.seq_length / plan.cp * plan.micro_batch_size * model.hidden_size
        per_mb += sbh / (plan.tp if plan.sequence_parallel else 1)
    # Korthikanti's bytes are for 16-bit activations; fp32 training stores 4-byte ones.
    per_mb = per_mb * plan.precision.activation_bytes / 2
    if len(set(layers)) == 1:
        return per_mb, (per_mb / len(layers),) * len(layers)
    return per_mb, tuple(per_mb * b / sum(layers) for b in layers)


def stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, *, stage: int) -> float:
    """Bytes one micro-batch's forward through ``stage`` (a model chunk) leaves stored until
    its backward: the rank's :func:`microbatch_activation_bytes` over its vpp chunks, or,
    when the rank's chunks store different bytes (different layer counts with
    ``account_for_*_in_pipeline_split``, layers kept in bf16), in proportion to them. ZB-V,
    DualPipeV: stage s on rank s or 2 pp - 1 - s; DualPipe: the copy fed at rank 0's
    (``ParallelPlan.stages_of_rank``)."""
    rank = plan.rank_of_stage(stage)
    return _rank_activations(model, plan, rank=rank)[1][plan.stages_of_rank(rank).index(stage)]


def stored_activation_bytes(
    model: ModelSpec, plan: ParallelPlan, *, rank: int, memo: Memo | None = None
) -> float:
    """Activations stored at the rank's peak: per micro-batch bytes x micro-batches in flight
    (:func:`microbatches_in_flight`). When the rank's chunks store different bytes (only
    with interleaving: ``account_for_*_in_pipeline_split``, bf16 layers) the chunks held at the peak
    matter, so the rank's interleaved 1F1B order is replayed instead (warm-up forwards, then
    forward/backward pairs, ``plansim.schedule.builders``): each forward stores its chunk's
    bytes (:func:`stage_activation_bytes`), each backward frees them, as the event engine
    does. ``memo``: a search's cache (one model); same result without."""
    per_mb, stored = _rank_activations(model, plan, rank=rank, memo=memo)
    if plan.schedule.placement is not StagePlacement.LOOP:
        replay = ("stored_replay", plan.schedule, rank, plan.num_microbatches, plan.pp, stored)
        return memoised(
            memo, replay, lambda: replayed_chunk_peak(plan, stored, rank=rank, memo=memo)
        )
    if len(set(stored)) == 1:
        return per_mb * microbatches_in_flight(plan, rank=rank)
    key = ("stored_peak", rank, plan.num_microbatches, *activation_key(plan))
    return memoised(memo, key, lambda: _replayed_peak(plan, stored, rank=rank))


def replayed_chunk_peak(
    plan: ParallelPlan, stored: tuple[float, ...], *, rank: int, memo: Memo | None = None
) -> float:
    """Peak stored bytes of ``rank`` replaying its ZB-V / DualPipeV / DualPipe action list
    (``plansim.schedule.builders``): each forward stores its chunk's bytes (``stored``, the
    rank's two chunks in ``ParallelPlan.stages_of_rank`` order), each B or W frees them, an
    overlapped pair's forward before its backward, as the event engine does. ``memo``: a
    search's cache, holding the lists once for all ranks."""
    m, vpp = plan.num_microbatches, plan.vpp
    actions = memoised(
        memo,
        ("actions", plan.schedule, plan.pp, m, vpp),
        lambda: build_actions(plan.schedule, num_ranks=plan.pp, num_microbatches=m, vpp=vpp),
    )
    p, dual = plan.pp, plan.schedule.placement is StagePlacement.DUAL
    mine = plan.stages_of_rank(rank)  # work stage c p + d of DualPipe is plan stage d
    live = peak = 0.0
    for item in actions[rank]:
        for action in parts(item):
            index = mine.index(action.stage % p if dual else action.stage)
            if action.kind is ActionKind.FORWARD:
                live += stored[index]
                peak = max(peak, live)
            elif action.kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT):
                live -= stored[index]
    return peak


def _replayed_peak(plan: ParallelPlan, stored: tuple[float, ...], *, rank: int) -> float:
    """Peak stored bytes of ``rank`` replaying its interleaved 1F1B order, ``stored`` the
    bytes of each of its chunks (:func:`stored_activation_bytes`)."""
    p, v, m = plan.pp, plan.vpp, plan.num_microbatches
    warmup = interleaved_warmup(rank, num_ranks=p, num_microbatches=m, vpp=v)
    live = sum(stored[interleaved_chunk(k, num_ranks=p, vpp=v)] for k in range(warmup))
    peak = live
    # steady state: forward warmup + k, then backward k. Both chunks repeat with period p v
    # in k, and over one period the forwards store what the backwards free, so the live
    # bytes (and their peak) repeat too: one period holds the peak.
    for k in range(min(m * v - warmup, p * v)):
        live += stored[interleaved_chunk(warmup + k, num_ranks=p, vpp=v)]
        peak = max(peak, live)
        live -= stored[interleaved_chunk(k, num_ranks=p, vpp=v, backward=True)]
    return peak
