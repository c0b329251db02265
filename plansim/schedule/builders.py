"""Per-rank action lists for each pipeline schedule (table-driven: Schedule -> builder).

A builder returns, for every pipeline rank, the compute actions it executes in order.
Placement (``plansim.specs.stage_placement``) follows Megatron for the looped schedules: stage
``s`` lives on rank ``s % num_ranks`` (with vpp = 1, stage s is rank s; with vpp = v, rank r
holds stages r, p + r, ..., (v - 1)p + r, its model chunks 0..v-1); ZB-V and DualPipeV put
stages r and 2p - 1 - r on rank r (a V); DualPipe holds depth r of one model copy and depth
p - 1 - r of the other. Orders match ``torch.distributed.pipelining``'s ``ScheduleGPipe``,
``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` with one
stage per rank (ZB-H1), ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` (their planned
orders without the idle steps and communication actions), and DualPipe the step loop of the
deepseek-ai/DualPipe repository.

To add a schedule: write a builder with the :data:`Builder` signature and register it in
``_BUILDERS``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from plansim.errors import SpecError, require_positive_int
from plansim.schedule.actions import Action, ActionKind, OverlapFB, PerRankActions, ScheduleItem
from plansim.specs.plan import Schedule

#: (num_ranks, num_microbatches, vpp) -> per-rank actions. Inputs are validated already.
Builder = Callable[[int, int, int], PerRankActions]

_F = ActionKind.FORWARD
_B = ActionKind.FULL_BACKWARD
_I = ActionKind.BACKWARD_INPUT
_W = ActionKind.BACKWARD_WEIGHT


def _require_vpp_1(schedule: Schedule, vpp: int) -> None:
    if vpp != 1:
        raise SpecError(
            f"schedule {schedule.value} needs vpp == 1 (got vpp={vpp}); "
            f"use {Schedule.INTERLEAVED_1F1B.value}"
        )


def _gpipe(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """GPipe (Huang et al. 2019, fill-drain): all forwards of a stage, then all backwards.

    Backwards run in micro-batch order 0..m-1, as torch's ``ScheduleGPipe`` does.
    Stage 0 holds all m micro-batches' activations at the end of the forward phase.
    """
    _require_vpp_1(Schedule.GPIPE, vpp)
    per_rank = []
    for rank in range(num_ranks):
        forwards = [Action(stage=rank, kind=_F, microbatch=j) for j in range(num_microbatches)]
        backwards = [Action(stage=rank, kind=_B, microbatch=j) for j in range(num_microbatches)]
        per_rank.append(tuple(forwards + backwards))
    return tuple(per_rank)


def _one_f_one_b_rank(rank: int, num_ranks: int, num_microbatches: int) -> tuple[Action, ...]:
    """1F1B order of one rank: warm-up forwards, steady F/B pairs, cool-down backwards."""
    warmup = min(num_ranks - rank - 1, num_microbatches)
    actions = [Action(stage=rank, kind=_F, microbatch=j) for j in range(warmup)]
    for j in range(num_microbatches - warmup):
        actions.append(Action(stage=rank, kind=_F, microbatch=warmup + j))
        actions.append(Action(stage=rank, kind=_B, microbatch=j))
    for j in range(num_microbatches - warmup, num_microbatches):
        actions.append(Action(stage=rank, kind=_B, microbatch=j))
    return tuple(actions)


def _one_f_one_b(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """1F1B / PipeDream-Flush (Narayanan et al. SC21 §2.2.1, Fig. 4 top; torch ``Schedule1F1B``).

    Rank r runs ``w = min(p - r - 1, m)`` warm-up forwards, then ``m - w`` pairs
    (forward of micro-batch w + i, backward of micro-batch i), then the ``w`` remaining
    backwards. At most ``min(p - r, m)`` micro-batches are in flight on rank r, so stage 0
    holds ``min(p, m)`` activations instead of GPipe's m. With ``m < p`` it degenerates to
    GPipe on the first ranks (torch's ``Schedule1F1B`` refuses m < p; we allow it).
    """
    _require_vpp_1(Schedule.ONE_F_ONE_B, vpp)
    return tuple(_one_f_one_b_rank(r, num_ranks, num_microbatches) for r in range(num_ranks))


def _interleaved_action(k: int, *, rank: int, num_ranks: int, vpp: int, kind: ActionKind) -> Action:
    """The ``k``-th forward (or backward) of ``rank`` in the interleaved order.

    Micro-batches go through the rank's chunks in groups of p: forwards k = 0..p-1 run chunk 0
    on micro-batches 0..p-1, k = p..2p-1 chunk 1 on the same micro-batches, and so on; after
    v groups the next p micro-batches start. Backwards visit the chunks in reverse order
    (Megatron-LM ``get_model_chunk_id``; torch ``forward_stage_index`` /
    ``backward_stage_index``). Stage = chunk * p + rank.
    """
    group, within = divmod(k, num_ranks)
    chunk = interleaved_chunk(k, num_ranks=num_ranks, vpp=vpp, backward=kind is _B)
    microbatch = (group // vpp) * num_ranks + within
    return Action(stage=chunk * num_ranks + rank, kind=kind, microbatch=microbatch)


def interleaved_chunk(k: int, *, num_ranks: int, vpp: int, backward: bool = False) -> int:
    """Model chunk (0..vpp-1) of a rank's ``k``-th forward (or backward) in interleaved 1F1B:
    groups of p micro-batches per chunk, backwards in reverse chunk order
    (:func:`_interleaved_action`)."""
    chunk = (k // num_ranks) % vpp
    return vpp - 1 - chunk if backward else chunk


def interleaved_warmup(rank: int, *, num_ranks: int, num_microbatches: int, vpp: int) -> int:
    """Warm-up forwards of ``rank`` in interleaved 1F1B: ``min(2(p - r - 1) + (v - 1)p, m v)``.

    Megatron-LM ``forward_backward_pipelining_with_interleaving`` (``num_warmup_microbatches``)
    and torch ``_get_warmup_ops`` (multiply_factor 2, microbatches_per_round p).
    """
    warmup = 2 * (num_ranks - rank - 1) + (vpp - 1) * num_ranks
    return min(warmup, num_microbatches * vpp)


def _interleaved_rank(
    rank: int, num_ranks: int, num_microbatches: int, vpp: int
) -> tuple[Action, ...]:
    """Interleaved 1F1B order of one rank: warm-up, steady F/B pairs, cool-down."""
    total = num_microbatches * vpp
    warmup = interleaved_warmup(
        rank, num_ranks=num_ranks, num_microbatches=num_microbatches, vpp=vpp
    )
    kw = {"rank": rank, "num_ranks": num_ranks, "vpp": vpp}
    actions = [_interleaved_action(k, kind=_F, **kw) for k in range(warmup)]
    for k in range(total - warmup):
        actions.append(_interleaved_action(warmup + k, kind=_F, **kw))
        actions.append(_interleaved_action(k, kind=_B, **kw))
    actions += [_interleaved_action(k, kind=_B, **kw) for k in range(total - warmup, total)]
    return tuple(actions)


def _interleaved(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """Interleaved 1F1B (Narayanan et al. SC21 §2.2.2, Fig. 4 bottom; Megatron-LM virtual
    pipeline; torch ``ScheduleInterleaved1F1B``).

    Each rank holds v model chunks (stages r, p + r, ..., (v - 1)p + r). Rank r runs
    ``w = min(2(p - r - 1) + (v - 1)p, m v)`` warm-up forwards, then ``m v - w`` pairs
    (forward w + i, backward i), then the w remaining backwards, where forward/backward k is
    mapped to a (chunk, micro-batch) by :func:`_interleaved_action`. With uniform costs the
    bubble is (p - 1)(t_f + t_b)/v, 1/v of 1F1B's; rank 0 stores up to ``min(w + 1, m v)``
    chunk activations, i.e. ``p + (p - 1)/v`` micro-batches' worth of its layers when
    m >= p + (p - 1)/v (Korthikanti et al. 2022 §4.2.3: L(1 + (p - 1)/(p v)) layers).

    Raises:
        SpecError: vpp < 2, or m not a multiple of p (Megatron-LM's requirement; torch
            relaxes it, we do not model that variant).
    """
    name = Schedule.INTERLEAVED_1F1B.value
    if vpp < 2:
        raise SpecError(f"schedule {name} needs vpp > 1 (got vpp={vpp}); use 1f1b")
    if num_microbatches % num_ranks:
        raise SpecError(
            f"schedule {name} needs num_microbatches({num_microbatches}) to be a multiple "
            f"of the pipeline ranks pp({num_ranks})"
        )
    return tuple(_interleaved_rank(r, num_ranks, num_microbatches, vpp) for r in range(num_ranks))


def _zb_h1_rank(rank: int, num_ranks: int, num_microbatches: int) -> tuple[Action, ...]:
    """ZB-H1 order of one rank: slots x = 0 .. m + p - 2, each ``F_x, I_(x-(p-1-r)), W_(x-(p-1))``
    with the indices outside 0..m-1 left out (see :func:`_zb_h1`)."""
    input_lag = num_ranks - 1 - rank  # I trails F by the rank's 1F1B warm-up, p - r - 1
    weight_lag = num_ranks - 1  # W trails F by p - 1 slots on every rank
    actions = []
    for slot in range(num_microbatches + num_ranks - 1):
        for kind, microbatch in (
            (_F, slot),
            (_I, slot - input_lag),
            (_W, slot - weight_lag),
        ):
            if 0 <= microbatch < num_microbatches:
                actions.append(Action(stage=rank, kind=kind, microbatch=microbatch))
    return tuple(actions)


def _zb_h1(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """ZB-H1, the memory-efficient zero-bubble schedule (Qi et al., "Zero Bubble Pipeline
    Parallelism", ICLR 2024, arXiv:2401.10241, §2.1 and Fig. 3 top; torch
    ``ScheduleInterleavedZeroBubble`` with one stage per rank, ``_get_1f1b_rank_ops`` with
    ``enable_zero_bubble``).

    Each backward is split into I (input gradient, sent upstream at once) and W (weight
    gradient, needed by nobody downstream). In the paper's steady state rank r runs the
    triple (F_x, I_(x-(p-1-r)), W_(x-(p-1))) per slot x: forwards and input gradients as in
    1F1B (w = p - r - 1 warm-up forwards), weight gradients p - 1 slots behind the forwards on
    every rank, i.e. r slots behind rank r's I. Slots run x = 0 .. m + p - 2 and drop indices
    outside 0..m-1, which yields (for m >= p) the phases: p - r - 1 lone forwards, r (F, I)
    pairs, (F, I, W) triples, p - r - 1 (I, W) pairs, r lone W that fill the tail bubble.
    Rank 0 runs W right after each I, the last rank defers its first W by p - 1 slots.

    Memory: activations of a micro-batch live from F to its W, so every rank holds up to
    ``min(p, m)`` micro-batches; rank 0 holds as many as in 1F1B (the paper's claim that H1
    does not exceed 1F1B's peak, which sits on the first worker), later ranks more (the paper
    counts them at the smaller W footprint M_W < M_B, Table 1; the engine frees at W).

    Bubble with uniform costs and free P2P: (p - 1)(t_F + t_I - t_W) per rank (paper §2.1,
    t_B of the paper = our t_I) against 1F1B's (p - 1)(t_F + t_I + t_W): a third of it when
    t_F = t_I = t_W. Holds for m >= p and t_W <= min(t_F, t_I) (read from the engine); with
    m < p fewer W exist to fill the tail and the bubble is larger.

    No condition on m: torch's ``ScheduleInterleavedZeroBubble`` only asks that m be a multiple
    of max(1, m // p) rounds, which does not change this order with one stage per rank.

    Raises:
        SpecError: vpp != 1 or a single rank (nothing to fill: use 1F1B).
    """
    _require_vpp_1(Schedule.ZB_H1, vpp)
    if num_ranks < 2:
        raise SpecError(
            f"schedule {Schedule.ZB_H1.value} needs pp > 1 (got num_ranks={num_ranks}); "
            f"use {Schedule.ONE_F_ONE_B.value}"
        )
    return tuple(_zb_h1_rank(r, num_ranks, num_microbatches) for r in range(num_ranks))


def _require_v_shape(schedule: Schedule, num_ranks: int, vpp: int) -> None:
    if vpp != 2:
        raise SpecError(
            f"schedule {schedule.value} needs vpp == 2 (got vpp={vpp}): two model chunks per "
            "rank, placed as a V (torch requires exactly 2 stages per rank)"
        )
    if num_ranks < 2:
        raise SpecError(f"schedule {schedule.value} needs pp > 1 (got pp={num_ranks})")


def _zb_v_rank(rank: int, num_ranks: int, num_microbatches: int) -> tuple[Action, ...]:
    """ZB-V order of one rank (see :func:`_zb_v`), the micro-batches >= m left out."""
    p, r = num_ranks, rank
    n = max(2 * p - 1, num_microbatches)  # enough virtual micro-batches to fill the V
    down, up = r, 2 * p - 1 - r  # the rank's chunk on the way down and on the way up
    out: list[Action] = []
    count: Counter[tuple[int, ActionKind]] = Counter()

    def add(stage: int, *kinds: ActionKind) -> None:
        for kind in kinds:
            out.append(Action(stage=stage, kind=kind, microbatch=count[(stage, kind)]))
            count[(stage, kind)] += 1

    for _ in range(2 * (p - r) - 1):
        add(down, _F)
    for _ in range(r):
        add(up, _F)
        add(down, _F)
    for _ in range(p - r):
        add(up, _F, _I, _W)
    while count[(up, _F)] < count[(down, _F)] or count[(down, _F)] < n:
        if count[(down, _F)] < n:
            add(down, _F)
        add(down, _I, _W)
        add(up, _F, _I, _W)
    for _ in range(r):
        add(down, _I)
        add(up, _I)
    for _ in range(p - r):
        add(down, _I, _W)
    add(up, *[_W] * (count[(up, _I)] - count[(up, _W)]))
    add(down, *[_W] * (count[(down, _I)] - count[(down, _W)]))
    return tuple(a for a in out if a.microbatch < num_microbatches)


def _zb_v(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv:2401.10241, §6;
    torch ``ScheduleZBVZeroBubble``): two chunks per rank on a V, backward split into I and W.

    Rank r holds chunk ``r`` (on the way down) and ``2p - 1 - r`` (on the way up). Its order:
    ``2(p - r) - 1`` forwards of the down chunk; r pairs (up F, down F); ``p - r`` up-chunk
    triples (F, I, W); then the steady state, one down triple and one up triple per round
    (down F only while micro-batches remain), until every forward has run; then r pairs
    (down I, up I), ``p - r`` pairs (down I, down W), and the deferred W of the up, then the
    down chunk. Built for ``max(2p - 1, m)`` micro-batches and cut to m, as torch does.

    With F = I = W the bubble vanishes once m >= 2p - 1 (paper §6: "zero bubble" under equal
    times); the peak activation memory is p micro-batches' worth of the rank's layers on
    every rank (2p chunk activations of half the layers), 1F1B's rank-0 peak (paper Table 5).

    Raises:
        SpecError: vpp != 2 or pp < 2.
    """
    _require_v_shape(Schedule.ZB_V, num_ranks, vpp)
    return tuple(_zb_v_rank(r, num_ranks, num_microbatches) for r in range(num_ranks))


class _DualPipeRank:
    """One rank's DualPipe step loop over its two phases (chunks), with per-stage counters.

    ``stages[phase]`` is the work stage of the phase and ``bases[phase]`` the first
    micro-batch of that stage's copy. Full backwards (B) and input gradients (I) share one
    counter; an I queues its W, which a later "W if pending" pops in FIFO order (the
    DualPipe repository's ``WeightGradStore``; torch's ``weight_queue``).
    """

    def __init__(self, stages: tuple[int, int], bases: tuple[int, int]) -> None:
        self.stages = stages
        self.bases = bases
        self.items: list[ScheduleItem] = []
        self.forwards = [0, 0]
        self.backwards = [0, 0]
        self.pending_w: list[Action] = []

    def _forward(self, phase: int) -> Action:
        j = self.bases[phase] + self.forwards[phase]
        self.forwards[phase] += 1
        return Action(stage=self.stages[phase], kind=_F, microbatch=j)

    def _backward(self, phase: int, *, split: bool) -> Action:
        j = self.bases[phase] + self.backwards[phase]
        self.backwards[phase] += 1
        stage = self.stages[phase]
        if split:
            self.pending_w.append(Action(stage=stage, kind=_W, microbatch=j))
            return Action(stage=stage, kind=_I, microbatch=j)
        return Action(stage=stage, kind=_B, microbatch=j)

    def forward(self, phase: int) -> None:
        self.items.append(self._forward(phase))

    def backward(self, phase: int, *, split: bool = False) -> None:
        self.items.append(self._backward(phase, split=split))

    def overlapped(self, forward_phase: int) -> None:
        """Forward of ``forward_phase`` and full backward of the other phase, overlapped."""
        fwd = self._forward(forward_phase)
        self.items.append(
            OverlapFB(forward=fwd, backward=self._backward(1 - forward_phase, split=False))
        )

    def weight_if_pending(self) -> None:
        if self.pending_w:
            self.items.append(self.pending_w.pop(0))


def _dualpipe_steps(run: _DualPipeRank, *, ranks: int, rank: int, chunks: int) -> None:
    """The eight steps of DualPipe's loop for half-rank ``rank`` of ``ranks`` and ``chunks``
    micro-batches per phase pair (deepseek-ai/DualPipe ``DualPipe.step``; the same steps with
    the V's rank, ranks and micro-batches are torch's ``ScheduleDualPipeV``)."""
    k, n = rank, ranks
    for _ in range(2 * (n - k - 1)):  # 1: forwards of phase 0
        run.forward(0)
    for _ in range(k + 1):  # 2: forwards of both phases
        run.forward(0)
        run.forward(1)
    for _ in range(n - k - 1):  # 3: zero-bubble I and W of phase 1, then its next forward
        run.backward(1, split=True)
        run.weight_if_pending()
        run.forward(1)
    for i in range(chunks - 2 * n + k + 1):  # 4: the main step, overlapped F&B pairs
        if i == 0 and k == n - 1:  # the turning rank does not overlap its first pair
            run.forward(0)
            run.backward(1)
        else:
            run.overlapped(0)
        run.overlapped(1)
    for _ in range(n - k - 1):  # 5: backward of phase 1, then an overlapped pair
        run.backward(1)
        run.overlapped(1)
    split = False
    for i in range(k + 1):  # 6: backwards of both phases; the second half split (zero bubble)
        if i == (k + 1) // 2 and k % 2 == 1:
            split = True
        run.backward(1, split=split)
        if i == (k + 1) // 2 and k % 2 == 0:
            split = True
        run.backward(0, split=split)
    for _ in range(n - k - 1):  # 7: a deferred W, then the next backward of phase 0
        run.weight_if_pending()
        run.backward(0, split=split)
    for _ in range(k + 1):  # 8: the remaining deferred W
        run.weight_if_pending()


def _dualpipe_v(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """DualPipeV (torch ``ScheduleDualPipeV``; DualPipe "cut in half", deepseek-ai/DualPipe):
    the V placement of ZB-V with DualPipe's overlapped forward-and-backward chunks.

    Rank r runs :func:`_dualpipe_steps` with phase 0 its down chunk (stage r) and phase 1 its
    up chunk (stage 2p - 1 - r), p ranks and m micro-batches: warm-up forwards, zero-bubble
    I/W of the up chunk, then ``m - 2p + r + 1`` rounds of two overlapped pairs (F down with B
    up, F up with B down: :class:`~plansim.schedule.actions.OverlapFB`), then the drain with
    half of the backwards split so that deferred W fill the tail.

    Raises:
        SpecError: vpp != 2, pp < 2, or m < 2p (torch's rule: at least as many micro-batches
            as stages).
    """
    _require_v_shape(Schedule.DUALPIPE_V, num_ranks, vpp)
    if num_microbatches < 2 * num_ranks:
        raise SpecError(
            f"schedule {Schedule.DUALPIPE_V.value} needs num_microbatches({num_microbatches}) "
            f">= the stages 2 * pp({num_ranks}) = {2 * num_ranks} (torch ScheduleDualPipeV)"
        )
    per_rank = []
    for r in range(num_ranks):
        run = _DualPipeRank(stages=(r, 2 * num_ranks - 1 - r), bases=(0, 0))
        _dualpipe_steps(run, ranks=num_ranks, rank=r, chunks=num_microbatches)
        per_rank.append(tuple(run.items))
    return tuple(per_rank)


def _dualpipe(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """DualPipe (DeepSeek-V3 report, arXiv:2412.19437 §3.2.1, Fig. 5; deepseek-ai/DualPipe):
    two copies of the model, micro-batches fed from both ends of the pipeline.

    Work stage ``c p + d`` is depth d of copy c (copy 0 on rank d, copy 1 on rank p - 1 - d;
    ``plansim.specs.stage_placement``); micro-batches 0 .. m/2 - 1 run copy 0, the rest
    copy 1. Ranks r and p - 1 - r run the same step loop (:func:`_dualpipe_steps` for half
    rank ``h = min(r, p - 1 - r)`` of p/2, with m/2 micro-batches per direction), phase 0
    being the direction that reaches them first (copy 0 on the first half of the ranks, copy
    1 on the second).

    Bubble with uniform costs (paper Table 2): (p/2 - 1)(F&B + B - 3W), against 1F1B's
    (p - 1)(F + B); activations: p + 1 micro-batches in flight; parameters: 2x.

    Raises:
        SpecError: vpp != 1, pp odd or < 2, m odd or m < 2p (the repository's asserts).
    """
    name = Schedule.DUALPIPE.value
    _require_vpp_1(Schedule.DUALPIPE, vpp)
    p, m = num_ranks, num_microbatches
    if p < 2 or p % 2:
        raise SpecError(f"schedule {name} needs an even pp >= 2 (got pp={p})")
    if m % 2 or m < 2 * p:
        raise SpecError(
            f"schedule {name} needs an even num_microbatches >= 2 * pp({p}) = {2 * p} "
            f"(got {m}): half of them enter at each end of the pipeline"
        )
    per_rank = []
    for r in range(p):
        first_half = r < p // 2
        forward_copy = (r, 0)  # (work stage, first micro-batch) of copy 0 at depth r
        reverse_copy = (2 * p - 1 - r, m // 2)  # copy 1 at depth p - 1 - r
        phases = (forward_copy, reverse_copy) if first_half else (reverse_copy, forward_copy)
        run = _DualPipeRank(stages=(phases[0][0], phases[1][0]), bases=(phases[0][1], phases[1][1]))
        _dualpipe_steps(run, ranks=p // 2, rank=min(r, p - 1 - r), chunks=m // 2)
        per_rank.append(tuple(run.items))
    return tuple(per_rank)


_BUILDERS: dict[Schedule, Builder] = {
    Schedule.GPIPE: _gpipe,
    Schedule.ONE_F_ONE_B: _one_f_one_b,
    Schedule.INTERLEAVED_1F1B: _interleaved,
    Schedule.ZB_H1: _zb_h1,
    Schedule.ZB_V: _zb_v,
    Schedule.DUALPIPE_V: _dualpipe_v,
    Schedule.DUALPIPE: _dualpipe,
}


def build_actions(
    schedule: Schedule, *, num_ranks: int, num_microbatches: int, vpp: int = 1
) -> PerRankActions:
    """Per-rank compute actions of ``schedule`` for one pipeline replica and one step.

    Args:
        schedule: the pipeline schedule.
        num_ranks: pipeline-parallel ranks (pp).
        num_microbatches: micro-batches per step (m).
        vpp: model chunks per rank; stages = num_ranks * vpp, stage s on rank s % num_ranks.

    Returns:
        ``actions[rank]``: that rank's actions in execution order.

    Raises:
        SpecError: a count is not a positive integer, or the schedule has no builder for
            this vpp (or at all).
    """
    require_positive_int("num_ranks", num_ranks)
    require_positive_int("num_microbatches", num_microbatches)
    require_positive_int("vpp", vpp)
    builder = _BUILDERS.get(schedule)
    if builder is None:
        known = ", ".join(s.value for s in _BUILDERS)
        raise SpecError(f"schedule {schedule!r} has no action builder yet; built: {known}")
    return builder(num_ranks, num_microbatches, vpp)
