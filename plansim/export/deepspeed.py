"""A plan as a DeepSpeed JSON config (pure: returns text, imports no torch).

Key names follow DeepSpeed 0.19.8: ``deepspeed/runtime/config.py`` (``DeepSpeedConfig``:
batch keys, ``communication_data_type``, ``data_types``, ``pipeline``),
``deepspeed/runtime/zero/config.py`` (``DeepSpeedZeroConfig``; extra keys are refused),
``deepspeed/runtime/zero/offload_config.py`` (``offload_optimizer`` / ``offload_param``),
``deepspeed/runtime/precision_config.py`` (``bf16`` / ``fp16``),
``deepspeed/runtime/activation_checkpointing/config.py`` and
``deepspeed/runtime/tensor_parallel/config.py`` (``tensor_parallel.autotp_size``), as the
config-json page of DeepSpeed's documentation lists them.

DeepSpeed's JSON is per data-parallel rank: ``train_batch_size`` must equal
``train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`` where DeepSpeed takes
dp from its model-parallel unit (``mpu``) or the world size. What it cannot say, and how
this module decides:

* pp: the pipeline degree is ``PipelineModule(num_stages=pp)`` in the model code; the
  ``pipeline`` section's ``stages`` key is parsed (default ``"auto"``) but not read by the
  engine. A pp > 1 plan is exported with ``"pipeline": {"stages": pp, ...}`` as the
  statement of the layout the module must be built with; DeepSpeed's ``PipelineEngine``
  runs one schedule, ``TrainSchedule`` (1F1B, ``deepspeed/runtime/pipe/schedule.py``), no
  virtual stages, and asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
  parallelism" (``deepspeed/runtime/pipe/engine.py``); its layer partition
  (``partition_method``) has no per-stage counts, so an uneven split is refused.
  With pp > 1 and full recompute, ``pipeline.activation_checkpoint_interval`` = 1 (every
  layer, ``PipelineModule.activation_checkpoint_interval``).
* tp: ``tensor_parallel.autotp_size`` (AutoTP training, which shards the ``nn.Linear``
  layers of a model the engine wraps; no sequence parallelism), only with pp = 1 (AutoTP is
  set up by ``DeepSpeedEngine``, a ``PipelineModule`` brings its own topology). Megatron
  tensor parallelism inside Megatron-DeepSpeed is that fork's arguments: export those
  with the Megatron-LM target instead.
* cp: refused; DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not the
  ring attention that ``cp`` models.

Other mappings that are a judgement:

* ``overlap_grad_reduce`` -> ``zero_optimization.overlap_comm`` for ZeRO-1/2; ZeRO-3 always
  writes ``overlap_comm: true`` (DeepSpeed's stage-3 default, and the plan's ZeRO-3 ignores
  the field); ZeRO-0 all-reduces after the backward in DeepSpeed, so overlap there is
  refused.
* ``zero3_param_fetch`` layer-prefetch -> ``stage3_prefetch_bucket_size`` 50000000 (the
  default), layer-sync -> 0 (no prefetch: each module's gather is waited for when it runs);
  DeepSpeed 0.19 gathers per module, so the 2021 per-tensor fetch and FSDP2's per-step one
  are refused.
* ``recompute`` full with pp = 1 -> an ``activation_checkpointing`` section with DeepSpeed's
  defaults (no partitioned or CPU activations): it configures
  ``deepspeed.checkpointing.checkpoint``, which the model code calls per layer. Selective,
  per-op, block and early-stop recompute are refused.
* ``grad_reduce_in_bf16`` -> ``communication_data_type: "bf16"`` and
  ``data_types.grad_accum_dtype: "bf16"`` (no fp32 gradient copy).
* NVMe offload writes ``nvme_path: "/local_nvme"``, the placeholder of DeepSpeed's
  documentation, to be replaced by the node's NVMe mount.

Not represented (the model code's choice, not the config's): ``attention``,
``fused_elementwise``, ``persist_layer_norm``, ``gradient_accumulation_fusion``,
``scatter_gather_p2p`` and ``ddp_impl``.
"""

from __future__ import annotations

import json

from plansim.export.common import Problems, check_fits
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    DpSync,
    OffloadDevice,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
)

__all__ = ["DEEPSPEED_VERSION", "NVME_PATH_PLACEHOLDER", "deepspeed_config", "deepspeed_text"]

#: The DeepSpeed release whose config keys this module writes.
DEEPSPEED_VERSION = "0.19.8"
_FRAMEWORK = f"DeepSpeed {DEEPSPEED_VERSION}"
#: ``nvme_path`` written for NVMe offload (DeepSpeed's documentation example).
NVME_PATH_PLACEHOLDER = "/local_nvme"
#: DeepSpeed's default bucket sizes (elements), written so the file states them.
_REDUCE_BUCKET_SIZE = 500_000_000
_PREFETCH_BUCKET_SIZE = 50_000_000

#: The plan fields of an uneven pipeline split.
_UNEVEN_FIELDS = (
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)

JsonValue = bool | int | str | dict[str, "JsonValue"]


def deepspeed_config(plan: ParallelPlan, model: ModelSpec) -> dict[str, JsonValue]:
    """The plan as a DeepSpeed config dictionary, keys in a fixed order (batch, precision,
    ZeRO, tensor parallelism, pipeline, activation checkpointing).

    Args:
        plan: the layout to launch.
        model: its model (checked to split over the plan; DeepSpeed's JSON has no shape).

    Raises:
        SpecError: the plan does not split the model, or it sets fields DeepSpeed's config has
            no key for (all of them in one message, with what DeepSpeed supports).
    """
    check_fits(plan, model)
    problems = Problems(_FRAMEWORK)
    _layout_problems(plan, problems)
    _sharding_problems(plan, problems)
    _other_problems(plan, problems)
    problems.raise_any()
    config: dict[str, JsonValue] = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        **_precision(plan),
        "zero_optimization": _zero(plan),
    }
    if plan.tp > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.pp > 1:
        interval = 1 if plan.recompute is Recompute.FULL else 0
        config["pipeline"] = {"stages": plan.pp, "activation_checkpoint_interval": interval}
    elif plan.recompute is Recompute.FULL:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return config


def deepspeed_text(plan: ParallelPlan, model: ModelSpec) -> str:
    """:func:`deepspeed_config` as JSON text (two-space indent, key order kept, final newline).

    Raises:
        SpecError: as :func:`deepspeed_config`.
    """
    return json.dumps(deepspeed_config(plan, model), indent=2) + "\n"


def _layout_problems(plan: ParallelPlan, problems: Problems) -> None:
    """tp, cp, the pipeline schedule and split (see the module docstring)."""
    if plan.cp > 1:
        problems.add(
            "cp",
            plan.cp,
            "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not ring "
            "context parallelism; use cp 1",
        )
    if plan.tp > 1 and plan.pp > 1:
        problems.add(
            "tp",
            plan.tp,
            f"DeepSpeed's config sets tp only for AutoTP (tensor_parallel.autotp_size), not "
            f"with a PipelineModule (pp({plan.pp})); Megatron-DeepSpeed's tensor parallelism "
            "is its own arguments",
        )
    if plan.sequence_parallel:
        problems.add("sequence_parallel", True, "DeepSpeed's AutoTP has no sequence parallelism")
    if plan.schedule is not Schedule.ONE_F_ONE_B:
        problems.add(
            "schedule",
            plan.schedule,
            f"DeepSpeed runs {Schedule.ONE_F_ONE_B.value} only (its pipeline engine's "
            "TrainSchedule, one model chunk per stage; without a pipeline, forward and "
            "backward per micro-batch)",
        )
    for field in _UNEVEN_FIELDS:
        value = getattr(plan, field)
        if value is not None and value is not False:
            problems.add(
                field,
                value,
                "PipelineModule partitions layers uniformly or by parameters, with no "
                "per-stage layer counts; use an even split",
            )


def _sharding_problems(plan: ParallelPlan, problems: Problems) -> None:
    """ZeRO with pipelines, FSDP2, hybrid sharding, fetch modes, overlap, parameter servers."""
    if plan.pp > 1 and plan.zero_stage >= 2:
        problems.add(
            "zero_stage",
            plan.zero_stage,
            f"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (pp({plan.pp})) in "
            "DeepSpeed; use 0 or 1",
        )
    if plan.use_torch_fsdp2:
        problems.add("use_torch_fsdp2", True, "that is PyTorch FSDP; DeepSpeed runs its own ZeRO-3")
    if plan.dp_shard is not None:
        problems.add(
            "dp_shard",
            plan.dp_shard,
            "DeepSpeed shards over the whole data-parallel group (its MiCS hybrid sharding was "
            "removed); leave dp_shard unset",
        )
    if plan.zero_stage == 3 and plan.zero3_param_fetch in (
        Zero3ParamFetch.PER_TENSOR_SYNC,
        Zero3ParamFetch.PER_STEP,
    ):
        problems.add(
            "zero3_param_fetch",
            plan.zero3_param_fetch,
            "DeepSpeed 0.19's ZeRO-3 gathers per module, prefetched (layer-prefetch) or not "
            "(layer-sync)",
        )
    if plan.zero_stage == 3 and not plan.reshard_after_forward:
        problems.add(
            "reshard_after_forward",
            False,
            "DeepSpeed's ZeRO-3 releases a module's gathered parameters after its forward",
        )
    if plan.zero_stage == 0 and plan.overlap_grad_reduce:
        problems.add(
            "overlap_grad_reduce",
            True,
            "DeepSpeed all-reduces ZeRO-0 gradients after the backward; it overlaps the "
            "reduction only with ZeRO 1-3 (overlap_comm)",
        )
    if plan.overlap_param_gather:
        problems.add(
            "overlap_param_gather",
            True,
            "DeepSpeed's ZeRO-1/2 all-gather the updated parameters in the optimizer step",
        )
    if plan.dp_sync is DpSync.PARAMETER_SERVER:
        problems.add("dp_sync", plan.dp_sync, f"DeepSpeed uses collectives ({DpSync.RING.value})")


def _other_problems(plan: ParallelPlan, problems: Problems) -> None:
    """Precision, bf16 layers and recompute."""
    if plan.precision in (Precision.FP8, Precision.FP4):
        problems.add(
            "precision",
            plan.precision,
            "DeepSpeed's config trains in bf16, fp16 or fp32 (fp8 / fp4 GEMMs are the model "
            "code's, through Transformer Engine)",
        )
    if plan.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP):
        problems.add(
            "recompute",
            plan.recompute,
            "DeepSpeed's activation checkpointing recomputes whole layers (none or full)",
        )
    if plan.recompute_num_layers is not None:
        problems.add(
            "recompute_num_layers",
            plan.recompute_num_layers,
            "Megatron-LM's block method; DeepSpeed checkpoints every layer",
        )
    if plan.recompute_early_stop:
        problems.add(
            "recompute_early_stop",
            True,
            "DeepSpeed's checkpoint function reruns the whole forward of a layer",
        )


def _precision(plan: ParallelPlan) -> dict[str, JsonValue]:
    """``bf16`` / ``fp16`` sections (none for fp32, DeepSpeed's default), and the bf16
    gradient dtypes."""
    section: dict[str, JsonValue] = {}
    if plan.precision is Precision.BF16:
        section["bf16"] = {"enabled": True}
    if plan.precision is Precision.FP16:
        section["fp16"] = {"enabled": True}
    if plan.grad_reduce_in_bf16:
        section["communication_data_type"] = "bf16"
        section["data_types"] = {"grad_accum_dtype": "bf16"}
    return section


def _zero(plan: ParallelPlan) -> dict[str, JsonValue]:
    """``zero_optimization``: stage, overlap, buckets, offload."""
    zero: dict[str, JsonValue] = {"stage": plan.zero_stage}
    if plan.zero_stage == 0:
        return zero
    zero["overlap_comm"] = plan.overlap_grad_reduce or plan.zero_stage == 3
    zero["reduce_bucket_size"] = _REDUCE_BUCKET_SIZE
    if plan.zero_stage == 3:
        sync = plan.zero3_param_fetch is Zero3ParamFetch.LAYER_SYNC
        zero["stage3_prefetch_bucket_size"] = 0 if sync else _PREFETCH_BUCKET_SIZE
    for field in ("offload_optimizer", "offload_param"):
        device = getattr(plan, field)
        if device is OffloadDevice.CPU:
            zero[field] = {"device": "cpu"}
        if device is OffloadDevice.NVME:
            zero[field] = {"device": "nvme", "nvme_path": NVME_PATH_PLACEHOLDER}
    return zero
