"""A plan as Megatron-LM command-line arguments (pure: returns text, imports no torch).

Names follow Megatron-LM core_v0.16.1 (the release of the ``megatron-core`` 0.16.1 wheel):
``megatron/training/arguments.py``, where most names are generated from the fields of
``megatron/core/transformer/transformer_config.py`` (``TransformerConfig``) and
``megatron/core/model_parallel_config.py`` (``ModelParallelConfig``) by
``megatron/training/argument_utils.py`` (``ArgumentGroupFactory``: ``field_name`` becomes
``--field-name``; a boolean that defaults to True becomes ``--no-field-name``). Checks that
``validate_args`` in ``arguments.py`` would fail with an assertion are raised here first, as
:class:`~plansim.errors.SpecError` naming the plan field.

The arguments cover the parallel layout, the batch, data-parallel sharding, recompute,
precision, communication overlap, kernels and the model's shape. Data, tokenizer (which
sets the vocabulary), optimizer, learning-rate and checkpoint-path arguments are the user's.

Mappings that are a judgement (each with its source):

* ``vpp`` is written as ``--num-virtual-stages-per-pipeline-rank``, which ``validate_args``
  takes as the virtual pipeline size directly and, unlike
  ``--num-layers-per-virtual-pipeline-stage``, allows with an uneven split
  (``--decoder-first/last-pipeline-num-layers``).
* ``overlap_p2p_comm``: Megatron-LM overlaps pipeline transfers by default
  (``--no-overlap-p2p-communication`` turns it off, ``dest='overlap_p2p_comm'``) and turns
  the overlap off itself without interleaving; so only an interleaved plan without overlap
  writes an argument. With pp == 2 that is refused, as ``validate_args`` asserts
  "pipeline-model-parallel size should be greater than 2" there.
* ``attention``: ``--attention-backend flash`` (Transformer Engine's FlashAttention) for
  FLASH, ``unfused`` for UNFUSED (``AttnBackend`` in ``megatron/core/transformer/enums.py``);
  the 2022 Triton FlashAttention has no backend.
* ``precision`` fp8: ``--bf16 --fp8-format hybrid`` (e4m3 forward, e5m2 gradients, Transformer
  Engine's recipe for training) with ``--fp8-recipe delayed`` (Megatron-LM's default), or
  ``tensorwise`` (current scaling) when layers stay in bf16, since ``TransformerConfig``
  raises "Delayed scaling does not support first / last layer in BF16" (Megatron-Bridge's
  current-scaling preset keeps one first and one last layer in bf16); fp4: ``--bf16
  --fp4-format e2m1`` with the default ``fp4_recipe = "nvfp4"``.
* ``recompute`` full: ``--recompute-method uniform --recompute-num-layers 1`` (every layer
  checkpointed on its own) or, with ``recompute_num_layers`` N, ``--recompute-method block
  --recompute-num-layers N``; selective: ``--recompute-granularity selective`` with
  Megatron-LM's default ``recompute_modules`` (``core_attn``, Korthikanti et al. 2022 §5).
* ``zero_stage`` 1: ``--use-distributed-optimizer``; with ``dp_shard`` also
  ``--num-distributed-optimizer-instances dp / dp_shard``. ``zero_stage`` 3 with
  ``use_torch_fsdp2``: ``--use-torch-fsdp2 --ckpt-format torch_dist`` and
  ``--torch-fsdp2-no-reshard-after-forward`` when ``reshard_after_forward`` is False.
  Megatron-FSDP (``--use-megatron-fsdp``) is another ZeRO-2/3 implementation, which plansim
  does not model, so ZeRO-2 and DeepSpeed-style ZeRO-3 are refused.
* ``model.dropout`` False: ``--hidden-dropout 0.0 --attention-dropout 0.0`` (defaults 0.1).

Not an argument: ``dp``. Megatron-LM derives it from the world size the launcher starts
(``num_gpus`` ranks: ``torchrun --nnodes ... --nproc-per-node ...``) as
world / (tp * pp * cp); every other plan field is written, left at a default that matches it,
or refused.
"""

from __future__ import annotations

from plansim.export.common import Problems, check_fits
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.plan import (
    AttentionKernel,
    DdpImpl,
    DpSync,
    OffloadDevice,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)

__all__ = ["MEGATRON_VERSION", "megatron_arguments", "megatron_text"]

#: The Megatron-LM release whose argument names this module writes.
MEGATRON_VERSION = "core_v0.16.1"
_FRAMEWORK = f"Megatron-LM {MEGATRON_VERSION}"

#: One argument: the flag alone, or the flag and its value.
Arg = tuple[str, ...]


def megatron_arguments(plan: ParallelPlan, model: ModelSpec) -> tuple[str, ...]:
    """The plan and the model as Megatron-LM arguments, in a fixed order (parallel layout,
    batch, data parallelism, recompute, precision, overlap, kernels, model shape).

    Args:
        plan: the layout to launch.
        model: its model (shape arguments; checked to split over the plan).

    Returns:
        The argument vector, flags and values as separate strings (``sys.argv`` style).

    Raises:
        SpecError: the plan does not split the model, or it sets fields Megatron-LM has no
            argument for (every such field in one message, with what Megatron-LM supports).
    """
    return tuple(token for arg in _arguments(plan, model) for token in arg)


def megatron_text(plan: ParallelPlan, model: ModelSpec) -> str:
    """:func:`megatron_arguments` as text, one argument (flag and value) per line, ending in a
    newline: ``pretrain_gpt.py $(cat args.txt) <data arguments>``.

    Raises:
        SpecError: as :func:`megatron_arguments`.
    """
    return "".join(" ".join(arg) + "\n" for arg in _arguments(plan, model))


def _arguments(plan: ParallelPlan, model: ModelSpec) -> list[Arg]:
    check_fits(plan, model)
    problems = Problems(_FRAMEWORK)
    _sharding_problems(plan, model, problems)
    _schedule_problems(plan, problems)
    _other_problems(plan, model, problems)
    problems.raise_any()
    return [
        *_parallel_args(plan),
        ("--micro-batch-size", str(plan.micro_batch_size)),
        ("--global-batch-size", str(plan.global_batch_size)),
        *_data_parallel_args(plan),
        *_recompute_args(plan),
        *_precision_args(plan),
        *_overlap_args(plan),
        *_kernel_args(plan),
        *_model_args(model, plan),
    ]


def _sharding_problems(plan: ParallelPlan, model: ModelSpec, problems: Problems) -> None:
    """ZeRO stage, FSDP2's own rules (``validate_args``' ``use_torch_fsdp2`` asserts),
    offload and parameter servers."""
    zero_note = (
        "Megatron-LM shards the optimizer with --use-distributed-optimizer (zero_stage 1) and "
        "everything with --use-torch-fsdp2 (zero_stage 3 with use_torch_fsdp2); its "
        "Megatron-FSDP is not modelled"
    )
    if plan.zero_stage == 2:
        problems.add("zero_stage", 2, zero_note)
    if plan.zero_stage == 3 and not plan.use_torch_fsdp2:
        problems.add(
            "use_torch_fsdp2", False, f"zero_stage 3 is DeepSpeed's ZeRO-3 then; {zero_note}"
        )
    if plan.zero_stage == 3 and plan.zero3_param_fetch not in (
        Zero3ParamFetch.LAYER_PREFETCH,
        Zero3ParamFetch.LAYER_SYNC,
    ):
        problems.add(
            "zero3_param_fetch",
            plan.zero3_param_fetch,
            "PyTorch FSDP2 gathers one layer at a time (layer-prefetch, or layer-sync without "
            "side streams)",
        )
    if plan.use_torch_fsdp2:
        _fsdp2_problems(plan, model, problems)
    for field in ("offload_optimizer", "offload_param"):
        device = getattr(plan, field)
        if device is not OffloadDevice.NONE:
            problems.add(
                field,
                device,
                "DeepSpeed's ZeRO-Offload / ZeRO-Infinity has no Megatron-LM argument "
                "(its --optimizer-cpu-offload is another implementation, not modelled); use none",
            )
    if plan.dp_sync is DpSync.PARAMETER_SERVER:
        problems.add(
            "dp_sync",
            plan.dp_sync,
            f"Megatron-LM synchronises data parallelism with collectives ({DpSync.RING.value})",
        )


def _fsdp2_problems(plan: ParallelPlan, model: ModelSpec, problems: Problems) -> None:
    """``validate_args`` with ``--use-torch-fsdp2``: no pipeline parallelism, no gradient
    accumulation fusion, untied embeddings, no fp16; no hybrid sharding in that path."""
    if plan.pp > 1:
        problems.add("pp", plan.pp, "--use-torch-fsdp2 is not supported with pipeline parallelism")
    if plan.gradient_accumulation_fusion:
        problems.add(
            "gradient_accumulation_fusion",
            True,
            "--use-torch-fsdp2 is not supported with gradient accumulation fusion",
        )
    if plan.precision is Precision.FP16:
        problems.add("precision", plan.precision, "--use-torch-fsdp2 not supported with fp16")
    if model.tied_embeddings:
        problems.add(
            "model.tied_embeddings",
            True,
            "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights",
        )
    if plan.dp_shard is not None:
        problems.add(
            "dp_shard",
            plan.dp_shard,
            "--use-torch-fsdp2 shards over the whole data-parallel group (hybrid sharding is "
            "Megatron-FSDP's); leave dp_shard unset",
        )


def _schedule_problems(plan: ParallelPlan, problems: Problems) -> None:
    """Megatron-core's schedules (``megatron/core/pipeline_parallel/schedules.py``): 1F1B
    (also with pp 1) and interleaved 1F1B; no GPipe, no zero bubble."""
    if plan.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
        problems.add(
            "schedule",
            plan.schedule,
            f"Megatron-LM runs {Schedule.ONE_F_ONE_B.value} and "
            f"{Schedule.INTERLEAVED_1F1B.value} only",
        )
    if plan.schedule.interleaved and not plan.overlap_p2p_comm and plan.pp <= 2:
        problems.add(
            "overlap_p2p_comm",
            False,
            f"interleaving on pp({plan.pp}) without p2p overlap needs pp > 2 in Megatron-LM; "
            "set overlap_p2p_comm",
        )


def _other_problems(plan: ParallelPlan, model: ModelSpec, problems: Problems) -> None:
    """Data-parallel wrapper, recompute, attention, elementwise kernels and activation."""
    if plan.ddp_impl in (DdpImpl.LOCAL, DdpImpl.TORCH):
        problems.add(
            "ddp_impl",
            plan.ddp_impl,
            f"Megatron-LM removed --DDP-impl; it runs Megatron-core's DDP "
            f"({DdpImpl.MEGATRON_CORE.value}, or {DdpImpl.AVERAGE_IN_COLLECTIVE.value} with "
            f"--ddp-average-in-collective)",
        )
    if plan.recompute is Recompute.SELECTIVE_OP:
        problems.add(
            "recompute",
            plan.recompute,
            "that is torchtitan's per-op policy; Megatron-LM recomputes none, selective "
            "(--recompute-granularity selective) or full",
        )
    if plan.recompute_early_stop:
        problems.add(
            "recompute_early_stop",
            True,
            "Megatron-LM's checkpoint function reruns the whole forward of a layer",
        )
    if plan.attention is AttentionKernel.FLASH_TRITON:
        problems.add(
            "attention",
            plan.attention,
            "Megatron-LM's --attention-backend runs flash (Transformer Engine) or unfused",
        )
    if not plan.fused_elementwise:
        problems.add(
            "fused_elementwise",
            False,
            "that is eager PyTorch code; Megatron-LM runs fused norms, RoPE and activations",
        )
    if model.activation is Activation.RELU:
        problems.add(
            "model.activation",
            model.activation,
            "Megatron-LM's arguments offer gelu (default), --swiglu and --squared-relu",
        )


def _parallel_args(plan: ParallelPlan) -> list[Arg]:
    args: list[Arg] = [
        ("--tensor-model-parallel-size", str(plan.tp)),
        ("--pipeline-model-parallel-size", str(plan.pp)),
        ("--context-parallel-size", str(plan.cp)),
    ]
    if plan.schedule.interleaved:
        args.append(("--num-virtual-stages-per-pipeline-rank", str(plan.vpp)))
    if plan.sequence_parallel:
        args.append(("--sequence-parallel",))
    if plan.decoder_first_pipeline_num_layers is not None:
        args.append(
            ("--decoder-first-pipeline-num-layers", str(plan.decoder_first_pipeline_num_layers))
        )
    if plan.decoder_last_pipeline_num_layers is not None:
        args.append(
            ("--decoder-last-pipeline-num-layers", str(plan.decoder_last_pipeline_num_layers))
        )
    if plan.account_for_embedding_in_pipeline_split:
        args.append(("--account-for-embedding-in-pipeline-split",))
    if plan.account_for_loss_in_pipeline_split:
        args.append(("--account-for-loss-in-pipeline-split",))
    if plan.pipeline_model_parallel_layout is not None:
        args.append(("--pipeline-model-parallel-layout", plan.pipeline_model_parallel_layout))
    if plan.ep > 1:
        args.append(("--expert-model-parallel-size", str(plan.ep)))
    if plan.etp is not None:
        args.append(("--expert-tensor-parallel-size", str(plan.etp)))
    return args


def _data_parallel_args(plan: ParallelPlan) -> list[Arg]:
    args: list[Arg] = []
    if plan.zero_stage == 1:
        args.append(("--use-distributed-optimizer",))
        if plan.dp_shard is not None:
            instances = plan.dp // plan.dp_shard
            args.append(("--num-distributed-optimizer-instances", str(instances)))
    if plan.zero_stage == 3:
        args += [("--use-torch-fsdp2",), ("--ckpt-format", "torch_dist")]
        if not plan.reshard_after_forward:
            args.append(("--torch-fsdp2-no-reshard-after-forward",))
    if plan.ddp_impl is DdpImpl.AVERAGE_IN_COLLECTIVE:
        args.append(("--ddp-average-in-collective",))
    if plan.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce",))
    if plan.overlap_param_gather:
        args.append(("--overlap-param-gather",))
    if not plan.gradient_accumulation_fusion:
        args.append(("--no-gradient-accumulation-fusion",))
    return args


def _recompute_args(plan: ParallelPlan) -> list[Arg]:
    if plan.recompute is Recompute.SELECTIVE:
        modules = plan.recomputation.modules
        if not modules:
            return [("--recompute-granularity", "selective")]
        return [
            ("--recompute-granularity", "selective"),
            ("--recompute-modules", "core_attn", *modules),
        ]
    if plan.recompute is not Recompute.FULL:
        return []
    block = plan.recompute_num_layers
    return [
        ("--recompute-granularity", "full"),
        ("--recompute-method", "uniform" if block is None else "block"),
        ("--recompute-num-layers", str(1 if block is None else block)),
    ]


def _precision_args(plan: ParallelPlan) -> list[Arg]:
    bf16_layers = bool(plan.num_layers_at_start_in_bf16 or plan.num_layers_at_end_in_bf16)
    recipe = "tensorwise" if bf16_layers else "delayed"
    modes: dict[Precision, list[Arg]] = {
        Precision.BF16: [("--bf16",)],
        Precision.FP16: [("--fp16",)],
        Precision.FP8: [("--bf16",), ("--fp8-format", "hybrid"), ("--fp8-recipe", recipe)],
        Precision.FP4: [("--bf16",), ("--fp4-format", "e2m1")],
        Precision.FP32: [],
    }
    args = modes[plan.precision]
    if bf16_layers:
        args += [
            ("--first-last-layers-bf16",),
            ("--num-layers-at-start-in-bf16", str(plan.num_layers_at_start_in_bf16)),
            ("--num-layers-at-end-in-bf16", str(plan.num_layers_at_end_in_bf16)),
        ]
    if plan.grad_reduce_in_bf16:
        args.append(("--grad-reduce-in-bf16",))
    return args


def _overlap_args(plan: ParallelPlan) -> list[Arg]:
    args: list[Arg] = []
    if plan.schedule.interleaved and not plan.overlap_p2p_comm:
        args.append(("--no-overlap-p2p-communication",))
    if plan.tp_comm_overlap:
        args.append(("--tp-comm-overlap",))
    return args


def _kernel_args(plan: ParallelPlan) -> list[Arg]:
    backend = "unfused" if plan.attention is AttentionKernel.UNFUSED else "flash"
    args: list[Arg] = [("--attention-backend", backend)]
    if not plan.persist_layer_norm:
        args.append(("--no-persist-layer-norm",))
    if not plan.scatter_gather_p2p:
        args.append(("--no-scatter-gather-tensors-in-pipeline",))
    return args


def _model_args(model: ModelSpec, plan: ParallelPlan) -> list[Arg]:
    args: list[Arg] = [
        ("--num-layers", str(model.num_layers)),
        ("--hidden-size", str(model.hidden_size)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)),
        ("--num-attention-heads", str(model.num_attention_heads)),
    ]
    if model.num_query_groups != model.num_attention_heads:
        args += [("--group-query-attention",), ("--num-query-groups", str(model.num_query_groups))]
    args += [
        ("--seq-length", str(model.seq_length)),
        ("--max-position-embeddings", str(model.seq_length)),
    ]
    activation = {Activation.SWIGLU: "--swiglu", Activation.SQUARED_RELU: "--squared-relu"}
    if model.activation in activation:
        args.append((activation[model.activation],))
    norm = "RMSNorm" if model.normalization is Normalization.RMSNORM else "LayerNorm"
    rope = model.position_embedding is PositionEmbedding.ROPE
    args += [
        ("--normalization", norm),
        ("--position-embedding-type", "rope" if rope else "learned_absolute"),
    ]
    if not model.add_bias_linear:
        args.append(("--disable-bias-linear",))
    if not model.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights",))
    if not model.dropout:
        args += [("--hidden-dropout", "0.0"), ("--attention-dropout", "0.0")]
    if model.kv_channels is not None:
        args.append(("--kv-channels", str(model.kv_channels)))
    return args + _moe_model_args(model, plan)


def _dispatcher_args(plan: ParallelPlan) -> list[Arg]:
    """``--moe-token-dispatcher-type alltoall``, or ``flex`` with ``--moe-enable-deepep``."""
    if plan.moe_token_dispatcher_type is MoeTokenDispatcher.DEEPEP:
        return [("--moe-token-dispatcher-type", "flex"), ("--moe-enable-deepep",)]
    return [("--moe-token-dispatcher-type", "alltoall")]


def _moe_model_args(model: ModelSpec, plan: ParallelPlan) -> list[Arg]:
    """Megatron-Core's MoE, MLA and MTP arguments (``--num-experts``, ``--moe-router-topk``,
    ``--moe-ffn-hidden-size``, ``--moe-layer-freq`` as a per-layer list, the token
    dispatcher, ...)."""
    args: list[Arg] = []
    moe = model.moe
    if moe is not None:
        pattern = "".join("1" if moe.is_moe_layer(i) else "0" for i in range(model.num_layers))
        freq = "[" + ",".join(pattern) + "]"
        args += [
            ("--num-experts", str(moe.num_experts)),
            ("--moe-router-topk", str(moe.top_k)),
            ("--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size)),
            ("--moe-router-score-function", moe.router.score.value),
            ("--moe-layer-freq", freq),
            *_dispatcher_args(plan),
            ("--moe-grouped-gemm",),
        ]
        if moe.num_shared_experts:
            width = moe.num_shared_experts * moe.shared_ffn_hidden_size
            args.append(("--moe-shared-expert-intermediate-size", str(width)))
    mla = model.mla
    if mla is not None:
        args += [("--multi-latent-attention",), ("--kv-lora-rank", str(mla.kv_lora_rank))]
        if mla.q_lora_rank is not None:
            args.append(("--q-lora-rank", str(mla.q_lora_rank)))
        args += [
            ("--qk-head-dim", str(mla.qk_nope_head_dim)),
            ("--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim)),
            ("--v-head-dim", str(mla.v_head_dim)),
        ]
    if model.mtp_num_layers is not None:
        args.append(("--mtp-num-layers", str(model.mtp_num_layers)))
    return args
