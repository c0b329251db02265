"""Enumerate parallel layouts for a model, GPU count and global batch (pure).

Divisor generators in the style of calculon's execution search: every (tp, cp, pp, dp) with
tp * cp * pp * dp = num_gpus (cp = 1 unless the search space asks for context parallelism),
every micro-batch size that divides the per-replica batch, every ZeRO
stage, recompute mode, sequence-parallel setting and schedule, and every virtual pipeline
size (vpp): vpp = 1 with the non-interleaved schedules (GPipe, 1F1B and, with pp > 1, ZB-H1:
Qi et al. ICLR 2024 §2.1), vpp > 1 with interleaved 1F1B (Narayanan et al. SC21 §2.2.2).
Combinations that cannot be built (a model that does not split, memory) are rejected later by
``plansim.planner.evaluate.check_plan`` with a reason, so the planner can count them;
interleaved plans whose micro-batch count is not a multiple of pp (Megatron-LM's rule, see
``ParallelPlan``) and cp > 1 with unfused attention (``ParallelPlan`` refuses it) are not
generated at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import product
from typing import TypeVar

from plansim.planner.hsdp import dp_shard_options
from plansim.planner.space import SearchSpace as SearchSpace  # re-exported
from plansim.specs.layer_split import uneven_split_fields
from plansim.specs.plan import (
    AttentionKernel,
    BatchOptions,
    DpSync,
    MixedPrecisionOptions,
    OffloadDevice,
    OverlapOptions,
    ParallelDims,
    ParallelPlan,
    PipelineOptions,
    Precision,
    Recompute,
    RecomputeOptions,
    Schedule,
    ShardingOptions,
    Zero3ParamFetch,
    offload_devices,
)
from plansim.specs.sharding import PER_LAYER_FETCH
from plansim.specs.stage_placement import StagePlacement

_G = TypeVar("_G")


def divisors(n: int) -> list[int]:
    """Positive divisors of n in increasing order."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def block_recompute_options(chunk_layers: int) -> tuple[int, ...]:
    """``recompute_num_layers`` values the planner tries for chunks of ``chunk_layers``:
    ceil(c/4), ceil(c/2) and ceil(3c/4) below c, distinct (a 2-layer chunk: 1; 12: 3, 6, 9).
    A few fractions rather than every N keep the search small; the memory check then keeps
    the ones that fit and the simulation ranks them."""
    return tuple(sorted({-(-chunk_layers * q // 4) for q in (1, 2, 3)} - {chunk_layers}))


@dataclass(frozen=True, slots=True)
class Layout:
    """One (tp, cp, pp, dp) with tp * cp * pp * dp = num_gpus."""

    tp: int
    cp: int
    pp: int
    dp: int


def layouts(num_gpus: int, space: SearchSpace) -> Iterator[Layout]:
    """Every layout the space allows, in (tp, cp, pp) order; cp > 1 only with FlashAttention."""
    flash = space.execution.attention is AttentionKernel.FLASH
    for tp in space.tp or divisors(num_gpus):
        if num_gpus % tp:
            continue
        for cp in space.cp or divisors(num_gpus // tp):
            if (num_gpus // tp) % cp or (cp > 1 and not flash):
                continue
            rest = num_gpus // (tp * cp)
            for pp in space.pp or divisors(rest):
                if rest % pp:
                    continue
                dp = rest // pp
                if space.dp is None or dp in space.dp:
                    yield Layout(tp=tp, cp=cp, pp=pp, dp=dp)


def restrict_to_layout(space: SearchSpace, layout: Layout) -> SearchSpace:
    """``space`` with (tp, cp, pp, dp) fixed to ``layout``: enumerating it yields exactly
    the plans of that layout, in the same order as the full enumeration does."""
    return replace(space, tp=(layout.tp,), cp=(layout.cp,), pp=(layout.pp,), dp=(layout.dp,))


def vpp_values(pp: int, *, num_layers: int | None, space: SearchSpace) -> tuple[int, ...]:
    """Virtual pipeline sizes tried with ``pp`` pipeline ranks, increasing.

    ``space.vpps`` when given (values > 1 dropped when pp == 1, since interleaving needs
    several ranks); otherwise 1 plus every divisor v in 2..max_vpp of num_layers / pp
    (a chunk must hold whole layers), or 1 alone when pp < 2 or ``space.min_interleaved_pp``
    or num_layers is unknown. When pp does not divide the layers: 1 plus every v in
    2..max_vpp that an uneven split allows (``space.uneven_pipeline``;
    ``plansim.specs.layer_split.uneven_split_fields``).
    """
    if space.vpps is not None:
        return tuple(sorted({v for v in space.vpps if v == 1 or pp > 1}))
    if pp < max(2, space.min_interleaved_pp) or num_layers is None:
        return (1,)
    if num_layers % pp:
        if not space.uneven_pipeline:
            return (1,)
        fits = range(2, space.max_vpp + 1)
        layouts = space.pipeline_layouts
        return (
            1,
            *(v for v in fits if uneven_split_fields(num_layers, pp=pp, vpp=v, layouts=layouts)),
        )
    per_rank = num_layers // pp
    return (1, *(v for v in divisors(per_rank) if 1 < v <= space.max_vpp))


def enumerate_plans(
    *, num_gpus: int, global_batch_size: int, space: SearchSpace, num_layers: int | None = None
) -> Iterator[ParallelPlan]:
    """Every candidate plan for ``num_gpus`` GPUs and ``global_batch_size`` sequences.

    Args:
        num_gpus: GPUs in the job.
        global_batch_size: sequences per optimizer step.
        space: knob values to try.
        num_layers: the model's layers; needed to search vpp when ``space.vpps`` is None
            (without it only vpp = 1 is generated).
    """
    for group in enumerate_plan_groups(
        num_gpus=num_gpus, global_batch_size=global_batch_size, space=space, num_layers=num_layers
    ):
        yield from group


def enumerate_plan_groups(
    *, num_gpus: int, global_batch_size: int, space: SearchSpace, num_layers: int | None = None
) -> Iterator[tuple[ParallelPlan, ...]]:
    """:func:`enumerate_plans` (same plans, same order) in groups of plans that differ only
    in the overlap flags (``overlap_p2p_comm``, ``overlap_grad_reduce``, ``overlap_param_gather``;
    not ``grad_reduce_in_bf16``), which neither divisibility nor memory depends on."""
    groups = _Groups(space)
    for layout in layouts(num_gpus, space):
        dp = layout.dp
        if global_batch_size % dp:
            continue
        per_replica = global_batch_size // dp
        mbs_values = space.micro_batch_size or tuple(
            d for d in divisors(per_replica) if d <= space.max_micro_batch_size
        )
        vpps = vpp_values(layout.pp, num_layers=num_layers, space=space)
        for mbs in mbs_values:
            if global_batch_size % (mbs * dp):
                continue
            batch = groups.get(
                BatchOptions, micro_batch_size=mbs, global_batch_size=global_batch_size
            )
            for vpp in vpps:
                split = (
                    uneven_split_fields(
                        num_layers, pp=layout.pp, vpp=vpp, layouts=space.pipeline_layouts
                    )
                    if num_layers is not None and space.uneven_pipeline
                    else None
                )
                # layers per model chunk for the block-recompute options (none for a layout
                # the layers do not split over: it is rejected whatever its recompute)
                splits = num_layers is not None and (num_layers % (layout.pp * vpp) == 0 or split)
                chunk = -(-num_layers // (layout.pp * vpp)) if splits and num_layers else 0
                yield from _knobs(layout, batch, vpp, groups, split=split or {}, chunk=chunk)


def _sp_modes(space: SearchSpace, *, tp: int) -> list[tuple[bool, bool]]:
    """(sequence_parallel, tp_comm_overlap) pairs for a layout of TP size ``tp``: SP only with
    tp > 1 (asked for at tp 1 it is off, as Megatron-LM turns ``--sequence-parallel`` off when
    tensor parallelism is), TP communication overlap only with SP."""
    sps = dict.fromkeys(sp and tp > 1 for sp in space.sequence_parallel)
    return [(sp, overlap) for sp in sps for overlap in (space.tp_comm_overlap if sp else (False,))]


def _schedules(pp: int, vpp: int, num_microbatches: int, space: SearchSpace) -> list[Schedule]:
    """Schedules that go with (pp, vpp, m): interleaved for vpp > 1 (m a multiple of pp),
    ZB-V and DualPipeV for vpp == 2 and pp > 1 (DualPipeV: m >= 2 pp, torch's rule), the
    others for vpp == 1; GPipe and ZB-H1 only with pp > 1 (one stage makes GPipe and 1F1B
    coincide, and leaves ZB-H1 no bubble to fill: ``ParallelPlan`` refuses it); DualPipe for
    vpp == 1 with an even pp and an even m >= 2 pp (deepseek-ai/DualPipe's asserts)."""
    m = num_microbatches
    if vpp > 1:
        found = []
        if Schedule.INTERLEAVED_1F1B in space.schedules and m % pp == 0:
            found.append(Schedule.INTERLEAVED_1F1B)
        if vpp == 2 and pp > 1:
            found += [s for s in (Schedule.ZB_V,) if s in space.schedules]
            if Schedule.DUALPIPE_V in space.schedules and m >= 2 * pp:
                found.append(Schedule.DUALPIPE_V)
        return found
    needs_pipeline = (Schedule.GPIPE, Schedule.ZB_H1)
    flat = [
        s
        for s in space.schedules
        if s.placement is StagePlacement.LOOP
        and not s.interleaved
        and not (s in needs_pipeline and pp == 1)
    ]
    dual_ok = pp >= 2 and pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp
    if Schedule.DUALPIPE in space.schedules and dual_ok:
        flat.append(Schedule.DUALPIPE)
    return flat


class _Groups:
    """The option groups of one enumeration, each built (and validated) once per distinct
    value and shared by every plan that has it: a search builds ~150K plans from a few
    hundred groups."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.execution = space.execution
        self._cache: dict[tuple[object, ...], object] = {}

    def get(self, cls: type[_G], **fields: object) -> _G:
        """The ``cls`` group of these field values (the same instance each time)."""
        key = (cls, *fields.values())
        group = self._cache.get(key)
        if group is None:
            group = self._cache[key] = cls(**fields)
        return group  # type: ignore[return-value]

    def mixed_precision(self, grad_reduce_in_bf16: bool) -> MixedPrecisionOptions:
        """The space's precision and bf16 edge layers with this gradient-reduction dtype."""
        return self.get(
            MixedPrecisionOptions,
            precision=self.space.precision,
            grad_reduce_in_bf16=grad_reduce_in_bf16,
            num_layers_at_start_in_bf16=self.space.bf16_layers[0],
            num_layers_at_end_in_bf16=self.space.bf16_layers[1],
        )


@dataclass(frozen=True, slots=True)
class _Zero:
    """One ZeRO mode of a layout: stage, DP synchronisation, offload devices, fetch."""

    zero_stage: int
    dp_sync: DpSync
    ps_servers: int
    offload_optimizer: OffloadDevice
    offload_param: OffloadDevice
    zero3_param_fetch: Zero3ParamFetch
    use_torch_fsdp2: bool


def _knobs(
    layout: Layout,
    batch: BatchOptions,
    vpp: int,
    groups: _Groups,
    *,
    split: dict[str, object],
    chunk: int = 0,
) -> Iterator[tuple[ParallelPlan, ...]]:
    """Plans of one (layout, micro-batch, vpp) grouped by overlap flags; ``split``: the plan
    fields of an uneven pipeline split (``uneven_split_fields``), empty for an even one;
    ``chunk``: the layers of a model chunk (0: unknown), for the block-recompute options."""
    space = groups.space
    dp_cp = layout.dp * layout.cp  # ranks that reduce gradients and shard ZeRO states together
    m = batch.global_batch_size // (batch.micro_batch_size * layout.dp)
    schedules = _schedules(layout.pp, vpp, m, space)
    if "decoder_first_pipeline_num_layers" in split or "decoder_last_pipeline_num_layers" in split:
        # a per-rank uneven split: the V and dual schedules split per stage only
        schedules = [s for s in schedules if s.placement is StagePlacement.LOOP]
    fetch = _fetch(space, pp=layout.pp)
    for zero, dp_sync, opt_dev, param_dev in _zero_modes(space, dp_cp=dp_cp):
        mode = _Zero(
            zero_stage=zero,
            dp_sync=dp_sync,
            ps_servers=space.ps_servers if dp_sync is DpSync.PARAMETER_SERVER else 0,
            offload_optimizer=opt_dev,
            offload_param=param_dev,
            zero3_param_fetch=fetch,
            use_torch_fsdp2=space.use_torch_fsdp2
            and zero == 3
            and opt_dev is param_dev is OffloadDevice.NONE,
        )
        shards = dp_shard_options(
            space.hsdp_shard_gpus,
            tp=layout.tp,
            cp=layout.cp,
            dp=layout.dp,
            zero_stage=zero,
            offload=(opt_dev, param_dev),
            fetch=fetch,
            only=space.hsdp_only,
        )
        comm = [
            (groups.get(PipelineOptions, schedule=schedule, **split), flags)
            for schedule, flags in _comm_modes(schedules, space, dp_cp=dp_cp, zero=zero)
        ]
        reshards = _reshard_modes(space, zero=zero, offload=(opt_dev, param_dev), fetch=fetch)
        yield from _recompute_groups(
            layout, vpp, batch, mode, groups, chunk=chunk, shards=shards, comm=comm,
            reshards=reshards,
        )  # fmt: skip


def _recompute_groups(
    layout: Layout,
    vpp: int,
    batch: BatchOptions,
    mode: _Zero,
    groups: _Groups,
    *,
    chunk: int,
    shards: tuple[int | None, ...],
    comm: list[tuple[PipelineOptions, list[tuple[bool, bool, bool]]]],
    reshards: tuple[bool, ...],
) -> Iterator[tuple[ParallelPlan, ...]]:
    """The plan groups of one ZeRO mode: each recompute mode and hybrid-shard option, SP
    mode, schedule with its overlap flags (``comm``), bf16-gradient choice and reshard
    choice."""
    space = groups.space
    bf16_modes = [groups.mixed_precision(b) for b in _bf16_grad_modes(space)]
    for (recompute, block), shard in product(_recompute_modes(space, chunk=chunk), shards):
        if (
            recompute is Recompute.SELECTIVE
            and space.execution.attention.fused
            and Recompute.NONE in space.recomputes
        ):
            continue  # FlashAttention stores no s x s scores: selective ~ none, but slower
        recomputation = groups.get(
            RecomputeOptions,
            recompute=recompute,
            recompute_num_layers=block,
            recompute_early_stop=space.recompute_early_stop and recompute is Recompute.FULL,
        )
        shardings = [
            groups.get(ShardingOptions, dp_shard=shard, reshard_after_forward=r, **_fields(mode))
            for r in reshards
        ]
        sp_modes = _sp_modes(space, tp=layout.tp)
        for (sp, tp_overlap), (ep, etp) in product(sp_modes, _expert_modes(space, layout)):
            dims = groups.get(
                ParallelDims,
                dp=layout.dp,
                tp=layout.tp,
                pp=layout.pp,
                cp=layout.cp,
                vpp=vpp,
                sequence_parallel=sp,
                **_expert_fields(space, ep, etp),
            )
            for (pipeline, flags), mixed, sharding in product(comm, bf16_modes, shardings):
                yield tuple(
                    ParallelPlan(
                        dims=dims,
                        batch=batch,
                        sharding=sharding,
                        recomputation=recomputation,
                        pipeline=pipeline,
                        overlap=groups.get(
                            OverlapOptions,
                            overlap_p2p_comm=overlap,
                            tp_comm_overlap=tp_overlap,
                            overlap_grad_reduce=grad,
                            overlap_param_gather=param,
                        ),
                        mixed_precision=mixed,
                        execution=groups.execution,
                    )
                    for overlap, grad, param in flags
                )


def _expert_modes(space: SearchSpace, layout: Layout) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs of ``space`` that fold into ``layout``: ep x etp (etp None = tp)
    divides tp x cp x dp (MoE parallel folding, arXiv 2504.14960)."""
    folded = layout.tp * layout.cp * layout.dp
    return [
        (ep, etp)
        for ep in space.ep
        for etp in space.etp
        if folded % (ep * (layout.tp if etp is None else etp)) == 0
    ]


def _expert_fields(space: SearchSpace, ep: int, etp: int | None) -> dict[str, object]:
    """The ParallelDims expert fields of one (ep, etp) pair; none for a dense space, so its
    dims stay the same objects as without experts."""
    if ep == 1 and etp is None and space.expert_load_imbalance == 1.0:
        return {}
    return {"ep": ep, "etp": etp, "expert_load_imbalance": space.expert_load_imbalance}


def _fields(mode: _Zero) -> dict[str, object]:
    """A ZeRO mode's ShardingOptions fields."""
    return {name: getattr(mode, name) for name in _Zero.__dataclass_fields__}


def _recompute_modes(space: SearchSpace, *, chunk: int) -> Iterator[tuple[Recompute, int | None]]:
    """(recompute, recompute_num_layers): each mode of the space, and after full every
    block-method option (:func:`block_recompute_options`) when ``space.partial_recompute``."""
    for recompute in space.recomputes:
        yield recompute, None
        if recompute is Recompute.FULL and space.partial_recompute:
            for block in block_recompute_options(chunk):
                yield recompute, block


def _sync_modes(space: SearchSpace, *, dp_cp: int) -> Iterator[tuple[int, DpSync]]:
    """(zero_stage, dp_sync) pairs: ZeRO > 0 needs dp * cp > 1 (else it is plain DP); a
    parameter server needs ZeRO 0 and, colocated, dp * cp > 1."""
    for zero in space.zero_stages:
        if zero > 0 and dp_cp == 1:
            continue  # ZeRO without data parallelism is plain DP
        for dp_sync in space.dp_syncs:
            if dp_sync is DpSync.PARAMETER_SERVER and (
                zero > 0 or (dp_cp == 1 and space.ps_servers == 0)
            ):
                continue
            yield zero, dp_sync


def _zero_modes(
    space: SearchSpace, *, dp_cp: int
) -> Iterator[tuple[int, DpSync, OffloadDevice, OffloadDevice]]:
    """(zero_stage, dp_sync, offload_optimizer, offload_param): the :func:`_sync_modes` pairs
    without offload, then every ZeRO stage of the space with each offload pair of
    ``space.offloads`` the stage allows (``plansim.specs.plan.offload_devices``), ring DP
    only, and also with dp * cp == 1 (ZeRO-Offload on one data-parallel rank is the paper's
    single-GPU case: Ren et al. USENIX ATC 2021); no offload for ZeRO-3 in a ``per-step``
    search (FSDP2 under ``torch.distributed.pipelining`` has no DeepSpeed offload)."""
    none = OffloadDevice.NONE
    if (none, none) in space.offloads:
        for zero, dp_sync in _sync_modes(space, dp_cp=dp_cp):
            yield zero, dp_sync, none, none
    # a search for FSDP2 under pipelining (torchtitan) has no DeepSpeed offload, pp 1 too
    per_step = space.zero3_param_fetch is Zero3ParamFetch.PER_STEP
    for zero in space.zero_stages:
        for opt_dev, param_dev in space.offloads:
            opt_ok = opt_dev.value in offload_devices("offload_optimizer", zero)
            param_ok = param_dev.value in offload_devices("offload_param", zero)
            fsdp2 = per_step and zero == 3
            if opt_ok and param_ok and (opt_dev, param_dev) != (none, none) and not fsdp2:
                yield zero, DpSync.RING, opt_dev, param_dev


def _fetch(space: SearchSpace, *, pp: int) -> Zero3ParamFetch:
    """``space.zero3_param_fetch`` for plans of ``pp`` pipeline ranks: ``per-step`` (FSDP2
    under ``torch.distributed.pipelining``) only with a pipeline; without one FSDP2 gathers
    layer by layer every micro-batch (``layer-prefetch``)."""
    if space.zero3_param_fetch is Zero3ParamFetch.PER_STEP and pp == 1:
        return Zero3ParamFetch.LAYER_PREFETCH
    return space.zero3_param_fetch


def _reshard_modes(
    space: SearchSpace,
    *,
    zero: int,
    offload: tuple[OffloadDevice, OffloadDevice],
    fetch: Zero3ParamFetch,
) -> tuple[bool, ...]:
    """``space.reshard_after_forward`` for ZeRO-3 plans that gather per layer (``fetch``)
    without DeepSpeed's offload (PyTorch FSDP's knob, ``ParallelPlan.reshard_after_forward``),
    else resharding only."""
    none = (OffloadDevice.NONE, OffloadDevice.NONE)
    fsdp_like = zero == 3 and fetch in PER_LAYER_FETCH and offload == none
    return space.reshard_after_forward if fsdp_like else (True,)


def _bf16_grad_modes(space: SearchSpace) -> tuple[bool, ...]:
    """``space.grad_reduce_in_bf16`` where the precision has an fp32 gradient buffer to
    replace (``ParallelPlan.grad_reduce_in_bf16``), else off only."""
    fp32_buffer = space.precision in (Precision.BF16, Precision.FP8, Precision.FP4)
    return space.grad_reduce_in_bf16 if fp32_buffer else (False,)


def _comm_modes(
    schedules: list[Schedule], space: SearchSpace, *, dp_cp: int, zero: int
) -> Iterator[tuple[Schedule, list[tuple[bool, bool, bool]]]]:
    """Per schedule, its (overlap_p2p_comm, overlap_grad_reduce, overlap_param_gather)
    triples: p2p overlap is an option of interleaved 1F1B only; gradient-reduction overlap
    needs dp * cp > 1 and ZeRO 0-2 (ZeRO-3 reduce-scatters every micro-batch); parameter-gather
    overlap needs gradient-reduction overlap and ZeRO 1-2 (Megatron's distributed optimizer)."""
    grads = space.overlap_grad_reduce if dp_cp > 1 and zero < 3 else (False,)
    params = space.overlap_param_gather if zero in (1, 2) else (False,)
    for schedule in schedules:
        overlaps = space.overlap_p2p_comm if schedule.interleaved else (False,)
        modes = [(o, g, p) for o in overlaps for g in grads for p in (params if g else (False,))]
        yield schedule, modes
