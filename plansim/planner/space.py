"""The planner's search space: which knob values a search tries (pure data).

``plansim.planner.enumerate`` turns a :class:`SearchSpace` into candidate plans; the
back-test (``plansim.planner.run_space``) and the commands build one.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.specs.plan import (
    DpSync,
    ExecutionSpec,
    OffloadDevice,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)

#: The default execution spec: Megatron-Core's of today.
_MEGATRON_CORE = ExecutionSpec()


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Which knob values the planner tries (all of them by default).

    Attributes:
        tp, pp, dp, micro_batch_size: fixed values to try, or None for every divisor.
        cp: context-parallel sizes to try, or None for every divisor of num_gpus / tp. The
            default (1,) keeps the search as small as without context parallelism; long-context
            searches (s >= 16k tokens, where activations dominate) should pass e.g.
            (1, 2, 4, 8). cp > 1 is tried only with FlashAttention.
        vpps: virtual pipeline sizes to try, or None for vpp = 1 plus every vpp in
            2..``max_vpp`` dividing num_layers / pp (only with pp > 1, and only when the
            enumeration is given num_layers). vpp = 1 pairs with the non-interleaved schedules
            (GPipe and ZB-H1 only with pp > 1), vpp > 1 with interleaved 1F1B.
        max_micro_batch_size: largest micro-batch size tried when not fixed.
        max_vpp: largest vpp tried when ``vpps`` is None (bounds the search and the events).
        min_interleaved_pp: fewest pipeline ranks a searched vpp > 1 is tried with (2; 3 for
            Megatron-LM before mid-2024, which refused interleaving with pp = 2).
        zero_stages, recomputes, sequence_parallel, schedules: values tried; leave
            INTERLEAVED_1F1B out of ``schedules`` to search vpp = 1 only.
        overlap_p2p_comm: values tried for interleaved plans (the others are synchronous).
        overlap_grad_reduce: values tried for plans with dp > 1 and ZeRO 0-2.
        overlap_param_gather: values tried for ZeRO-1/2 plans with overlap_grad_reduce
            (Megatron-LM ``--overlap-param-gather``); default off only.
        tp_comm_overlap: values tried for sequence-parallel plans (Megatron-LM
            ``--tp-comm-overlap``); default off only, as Megatron-LM's default.
        reshard_after_forward: values tried for ZeRO-3 plans that gather per layer without
            offload (PyTorch FSDP's ``reshard_after_forward``); default resharding only.
        grad_reduce_in_bf16: values tried when the precision keeps an fp32 main-gradient
            buffer (bf16, fp8, fp4; Megatron-LM ``--grad-reduce-in-bf16``); default off only.
        execution: the execution spec of every plan (``plansim.specs.execution``: the
            framework, its attention kernel, gradient-accumulation fusion, elementwise
            kernels, layer-norm kernel, pipeline scatter/gather and DDP wrapper): the
            implementation facts of the software, fixed for the whole search, not layout
            choices (the back-test builds the row's from its framework and date).
        precision, zero3_param_fetch, use_torch_fsdp2, recompute_early_stop, bf16_layers: fixed
            for the whole search (use_torch_fsdp2 for ZeRO-3 plans only,
            recompute_early_stop for full-recompute plans only, bf16_layers the (start, end)
            layers kept in bf16 under fp8 / fp4)
            (``per-step`` for the plans with pp > 1: without a pipeline FSDP2 gathers layer
            by layer).
        uneven_pipeline: when the layers do not split evenly over pp * vpp stages, offer
            the uneven split of ``plansim.specs.layer_split.uneven_split_fields`` (Megatron-LM
            ``--account-for-embedding/loss-in-pipeline-split`` or
            ``--decoder-first/last-pipeline-num-layers``: lighter first and last stages);
            False drops such (pp, vpp) pairs, as frameworks without uneven splits must.
        partial_recompute: with full recompute, also try Megatron-LM's block method
            (``--recompute-method block --recompute-num-layers N``: only the first N layers
            of every model chunk recomputed) for N of about 1/4, 1/2 and 3/4 of a chunk's
            layers (:func:`block_recompute_options`); False: every layer or none.
        dp_syncs: DP synchronisations tried (default ring only, as before parameter
            servers existed); parameter-server plans are generated with ZeRO 0 only (the
            servers hold the optimizer: ``ParallelPlan``) and, with colocated servers, only
            when dp * cp > 1 (one colocated worker is plain data parallelism).
        ps_servers: dedicated server count of the parameter-server plans (0 = colocated):
            fixed for the search (a resource the user has, not a layout choice).
        hsdp_shard_gpus: GPUs of one hybrid-sharding shard group (e.g. a node's): ZeRO 1-3
            plans also try ``dp_shard`` = hsdp_shard_gpus / (tp * cp) where it fits
            (``plansim.planner.hsdp``); None (default): full sharding only. hsdp_only: where
            that hybrid sharding fits, try it instead of full sharding (a stated HSDP run).
        offloads: (offload_optimizer, offload_param) pairs tried (default: none only);
            each pair with every ZeRO stage that allows it. ``plansim plan`` passes
            ``plansim.analytic.offload.offload_choices(profile)``: offload only on a profile
            with a host section.
        ep, etp: expert-parallel and expert tensor-parallel sizes tried (``ParallelDims``;
            etp None = tp); pairs whose ep x etp does not divide tp x cp x dp are not
            generated (parallel folding). Dense models: ep 1 and etp None only.
        expert_load_imbalance: ``ParallelDims.expert_load_imbalance`` of every plan.
        pipeline_layouts: where no other uneven split fits, offer a balanced Megatron-Core
            layout string (``layer_split.uneven_split_fields``); on for models with experts.
    """

    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = (1,)
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    micro_batch_size: tuple[int, ...] | None = None
    vpps: tuple[int, ...] | None = None
    max_micro_batch_size: int = 16
    max_vpp: int = 8
    min_interleaved_pp: int = 2
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recomputes: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    sequence_parallel: tuple[bool, ...] = (False, True)
    schedules: tuple[Schedule, ...] = (
        Schedule.ONE_F_ONE_B,
        Schedule.GPIPE,
        Schedule.INTERLEAVED_1F1B,
        Schedule.ZB_H1,
    )
    overlap_p2p_comm: tuple[bool, ...] = (False, True)
    overlap_grad_reduce: tuple[bool, ...] = (False, True)
    overlap_param_gather: tuple[bool, ...] = (False,)
    tp_comm_overlap: tuple[bool, ...] = (False,)
    grad_reduce_in_bf16: tuple[bool, ...] = (False,)
    precision: Precision = Precision.BF16
    execution: ExecutionSpec = _MEGATRON_CORE
    dp_syncs: tuple[DpSync, ...] = (DpSync.RING,)
    ps_servers: int = 0
    offloads: tuple[tuple[OffloadDevice, OffloadDevice], ...] = (
        (OffloadDevice.NONE, OffloadDevice.NONE),
    )
    zero3_param_fetch: Zero3ParamFetch = Zero3ParamFetch.LAYER_PREFETCH
    use_torch_fsdp2: bool = False
    recompute_early_stop: bool = False
    reshard_after_forward: tuple[bool, ...] = (True,)
    hsdp_shard_gpus: int | None = None
    hsdp_only: bool = False
    bf16_layers: tuple[int, int] = (0, 0)
    ep: tuple[int, ...] = (1,)
    etp: tuple[int | None, ...] = (None,)
    expert_load_imbalance: float = 1.0
    pipeline_layouts: bool = False
    uneven_pipeline: bool = True
    partial_recompute: bool = True
