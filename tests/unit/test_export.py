"""Export of a plan as Megatron-LM arguments, a torchtitan TOML job config and a DeepSpeed JSON
config (``plansim.export``): exact outputs for reference plans, each value checked, and the
message of every field a framework has no equivalent for."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import pytest

from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.export import ExportedConfig, ExportTarget, export_plan
from plansim.export.deepspeed import deepspeed_config
from plansim.export.megatron import megatron_arguments
from plansim.export.torchtitan import LLAMA3_FLAVORS
from plansim.specs.model import Activation
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
    plan_from_fields,
)


def _plan(**fields: Any) -> ParallelPlan:
    """A plan from flat field names: the one place the tests build plans."""
    return plan_from_fields(**fields)


def _toml(text: str) -> dict[str, Any]:
    """``tomllib.loads`` (Python 3.11+; the tomli backport on 3.10, where installed)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads(text)


GPT3 = resolve_model("gpt3-175b")
LLAMA3_8B = resolve_model("llama3-8b")

MEGATRON = "cannot export the plan to Megatron-LM core_v0.16.1: "
TORCHTITAN = "cannot export the plan to torchtitan 0.2.2: "
DEEPSPEED = "cannot export the plan to DeepSpeed 0.19.8: "


def _demo_plan(**changes: Any) -> ParallelPlan:
    """The demo's best plan for GPT-3 175B on 1024 A100s."""
    fields: dict[str, Any] = dict(
        tp=4,
        pp=8,
        dp=32,
        vpp=6,
        micro_batch_size=1,
        global_batch_size=1536,
        zero_stage=1,
        recompute=Recompute.NONE,
        sequence_parallel=True,
        schedule=Schedule.INTERLEAVED_1F1B,
        overlap_p2p_comm=True,
        overlap_grad_reduce=True,
    )
    fields.update(changes)
    return _plan(**fields)


def _deepspeed_plan(**changes: Any) -> ParallelPlan:
    """DeepSpeed ZeRO-3 on 384 GPUs, full recompute, fp16."""
    fields: dict[str, Any] = dict(
        tp=1,
        pp=1,
        dp=384,
        micro_batch_size=4,
        global_batch_size=1536,
        zero_stage=3,
        recompute=Recompute.FULL,
        precision=Precision.FP16,
    )
    fields.update(changes)
    return _plan(**fields)


def _fsdp2_plan(**changes: Any) -> ParallelPlan:
    """torchtitan-style FSDP2 for Llama 3 8B on 128 GPUs: tp 2, dp 64, per-op selective."""
    fields: dict[str, Any] = dict(
        tp=2,
        pp=1,
        dp=64,
        micro_batch_size=1,
        global_batch_size=512,
        zero_stage=3,
        use_torch_fsdp2=True,
        precision=Precision.BF16,
        recompute=Recompute.SELECTIVE_OP,
        sequence_parallel=True,
    )
    fields.update(changes)
    return _plan(**fields)


def _flags(arguments: tuple[str, ...]) -> dict[str, str | None]:
    """Megatron-LM arguments as {flag: value or None}."""
    flags: dict[str, str | None] = {}
    for token in arguments:
        if token.startswith("--"):
            flags[token] = None
            last = token
        else:
            flags[last] = token
    return flags


def _error(plan: ParallelPlan, model: Any, target: ExportTarget) -> str:
    with pytest.raises(SpecError) as caught:
        export_plan(plan, model, to=target)
    return str(caught.value)


# --- Megatron-LM -----------------------------------------------------------------------------

DEMO_MEGATRON_TEXT = """\
--tensor-model-parallel-size 4
--pipeline-model-parallel-size 8
--context-parallel-size 1
--num-virtual-stages-per-pipeline-rank 6
--sequence-parallel
--micro-batch-size 1
--global-batch-size 1536
--use-distributed-optimizer
--overlap-grad-reduce
--bf16
--attention-backend flash
--num-layers 96
--hidden-size 12288
--ffn-hidden-size 49152
--num-attention-heads 96
--seq-length 2048
--max-position-embeddings 2048
--normalization LayerNorm
--position-embedding-type learned_absolute
"""


def test_megatron_demo_plan_exact_text() -> None:
    exported = export_plan(_demo_plan(), GPT3, to=ExportTarget.MEGATRON)
    assert exported == ExportedConfig(
        target=ExportTarget.MEGATRON, text=DEMO_MEGATRON_TEXT, suffix=".txt"
    )
    assert megatron_arguments(_demo_plan(), GPT3) == tuple(DEMO_MEGATRON_TEXT.split())


def test_megatron_demo_plan_field_by_field() -> None:
    flags = _flags(megatron_arguments(_demo_plan(), GPT3))
    assert flags["--tensor-model-parallel-size"] == "4"  # tp
    assert flags["--pipeline-model-parallel-size"] == "8"  # pp
    assert flags["--context-parallel-size"] == "1"  # cp
    assert flags["--num-virtual-stages-per-pipeline-rank"] == "6"  # vpp, interleaved
    assert flags["--sequence-parallel"] is None
    assert flags["--micro-batch-size"] == "1"
    assert flags["--global-batch-size"] == "1536"  # dp 32 comes from the world size
    assert flags["--use-distributed-optimizer"] is None  # zero_stage 1
    assert flags["--overlap-grad-reduce"] is None
    assert flags["--bf16"] is None
    assert flags["--attention-backend"] == "flash"
    # overlap_p2p_comm is Megatron-LM's default with interleaving: no --no-overlap-...
    assert "--no-overlap-p2p-communication" not in flags
    # recompute none, gradient-accumulation fusion and persistent layer norm on: no flag
    assert not {"--recompute-granularity", "--no-gradient-accumulation-fusion"} & set(flags)
    assert (flags["--num-layers"], flags["--hidden-size"]) == ("96", "12288")
    assert (flags["--ffn-hidden-size"], flags["--num-attention-heads"]) == ("49152", "96")
    assert "--group-query-attention" not in flags  # MHA
    assert (flags["--seq-length"], flags["--max-position-embeddings"]) == ("2048", "2048")
    assert flags["--normalization"] == "LayerNorm"
    assert flags["--position-embedding-type"] == "learned_absolute"
    assert "--untie-embeddings-and-output-weights" not in flags  # GPT-3 ties them
    assert "--disable-bias-linear" not in flags


def test_megatron_fsdp2_llama_plan() -> None:
    plan = _plan(
        tp=2,
        pp=1,
        dp=64,
        micro_batch_size=1,
        global_batch_size=512,
        zero_stage=3,
        use_torch_fsdp2=True,
        reshard_after_forward=False,
        gradient_accumulation_fusion=False,
        sequence_parallel=True,
        tp_comm_overlap=True,
        recompute=Recompute.FULL,
        recompute_num_layers=2,
        ddp_impl=DdpImpl.AVERAGE_IN_COLLECTIVE,
    )
    assert megatron_arguments(plan, LLAMA3_8B) == (
        *("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1"),
        *("--context-parallel-size", "1", "--sequence-parallel"),
        *("--micro-batch-size", "1", "--global-batch-size", "512"),
        *("--use-torch-fsdp2", "--ckpt-format", "torch_dist"),
        "--torch-fsdp2-no-reshard-after-forward",
        "--ddp-average-in-collective",
        "--no-gradient-accumulation-fusion",
        *("--recompute-granularity", "full", "--recompute-method", "block"),
        *("--recompute-num-layers", "2"),
        "--bf16",
        "--tp-comm-overlap",
        *("--attention-backend", "flash"),
        *("--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336"),
        *("--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8"),
        *("--seq-length", "8192", "--max-position-embeddings", "8192", "--swiglu"),
        *("--normalization", "RMSNorm", "--position-embedding-type", "rope"),
        *("--disable-bias-linear", "--untie-embeddings-and-output-weights"),
        *("--hidden-dropout", "0.0", "--attention-dropout", "0.0"),
    )


def test_megatron_recompute_precision_and_kernel_flags() -> None:
    plan = _demo_plan(
        overlap_p2p_comm=False,
        recompute=Recompute.FULL,
        precision=Precision.FP8,
        num_layers_at_start_in_bf16=1,
        num_layers_at_end_in_bf16=2,
        grad_reduce_in_bf16=True,
        overlap_param_gather=True,
        persist_layer_norm=False,
        scatter_gather_p2p=False,
        attention=AttentionKernel.UNFUSED,
        dp_shard=8,
    )
    flags = _flags(megatron_arguments(plan, GPT3))
    assert flags["--recompute-granularity"] == "full"
    assert flags["--recompute-method"] == "uniform"
    assert flags["--recompute-num-layers"] == "1"
    assert flags["--bf16"] is None and flags["--fp8-format"] == "hybrid"
    assert flags["--fp8-recipe"] == "tensorwise"  # delayed scaling refuses bf16 layers
    assert flags["--first-last-layers-bf16"] is None
    assert flags["--num-layers-at-start-in-bf16"] == "1"
    assert flags["--num-layers-at-end-in-bf16"] == "2"
    assert flags["--grad-reduce-in-bf16"] is None
    assert flags["--overlap-param-gather"] is None
    assert flags["--num-distributed-optimizer-instances"] == "4"  # dp 32 / dp_shard 8
    assert flags["--no-overlap-p2p-communication"] is None  # interleaved, pp 8 > 2
    assert flags["--no-persist-layer-norm"] is None
    assert flags["--no-scatter-gather-tensors-in-pipeline"] is None
    assert flags["--attention-backend"] == "unfused"


def test_megatron_selective_fp4_fp16_fp32_and_uneven_split() -> None:
    selective = _flags(megatron_arguments(_demo_plan(recompute=Recompute.SELECTIVE), GPT3))
    assert selective["--recompute-granularity"] == "selective"
    assert "--recompute-method" not in selective
    fp8 = _flags(megatron_arguments(_demo_plan(precision=Precision.FP8), GPT3))
    assert (fp8["--fp8-format"], fp8["--fp8-recipe"]) == ("hybrid", "delayed")
    fp4 = _flags(megatron_arguments(_demo_plan(precision=Precision.FP4), GPT3))
    assert fp4["--bf16"] is None and fp4["--fp4-format"] == "e2m1"
    fp16 = _flags(megatron_arguments(_demo_plan(precision=Precision.FP16), GPT3))
    assert "--fp16" in fp16 and "--bf16" not in fp16
    fp32 = _flags(megatron_arguments(_demo_plan(precision=Precision.FP32), GPT3))
    assert not {"--fp16", "--bf16"} & set(fp32)
    uneven = _plan(
        tp=8,
        pp=16,
        dp=8,
        micro_batch_size=1,
        global_batch_size=128,
        zero_stage=1,
        sequence_parallel=True,
        decoder_first_pipeline_num_layers=7,
        decoder_last_pipeline_num_layers=7,
    )
    flags = _flags(megatron_arguments(uneven, resolve_model("llama3-405b")))
    assert flags["--decoder-first-pipeline-num-layers"] == "7"
    assert flags["--decoder-last-pipeline-num-layers"] == "7"
    assert "--num-virtual-stages-per-pipeline-rank" not in flags  # 1f1b
    accounted = _demo_plan(
        vpp=1,
        schedule=Schedule.ONE_F_ONE_B,
        overlap_p2p_comm=False,
        pp=2,
        dp=128,
        global_batch_size=1536,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    flags = _flags(megatron_arguments(accounted, resolve_model("llama2-70b")))
    assert flags["--account-for-embedding-in-pipeline-split"] is None
    assert flags["--account-for-loss-in-pipeline-split"] is None


def test_megatron_refuses_zero2_offload_and_parameter_server() -> None:
    zero2 = _demo_plan(zero_stage=2, offload_optimizer=OffloadDevice.CPU)
    assert _error(zero2, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.zero_stage=2: Megatron-LM shards the optimizer with --use-distributed-optimizer "
        "(zero_stage 1) and everything with --use-torch-fsdp2 (zero_stage 3 with "
        "use_torch_fsdp2); its Megatron-FSDP is not modelled; "
        "plan.offload_optimizer=cpu: DeepSpeed's ZeRO-Offload / ZeRO-Infinity has no "
        "Megatron-LM argument (its --optimizer-cpu-offload is another implementation, not "
        "modelled); use none"
    )
    server = _demo_plan(zero_stage=0, dp_sync=DpSync.PARAMETER_SERVER, overlap_grad_reduce=False)
    assert _error(server, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.dp_sync=parameter-server: Megatron-LM synchronises data parallelism with "
        "collectives (ring)"
    )


def test_megatron_refuses_deepspeed_zero3_with_per_tensor_fetch() -> None:
    plan = _deepspeed_plan(zero3_param_fetch=Zero3ParamFetch.PER_TENSOR_SYNC)
    assert _error(plan, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.use_torch_fsdp2=False: zero_stage 3 is DeepSpeed's ZeRO-3 then; Megatron-LM "
        "shards the optimizer with --use-distributed-optimizer (zero_stage 1) and everything "
        "with --use-torch-fsdp2 (zero_stage 3 with use_torch_fsdp2); its Megatron-FSDP is not "
        "modelled; plan.zero3_param_fetch=per-tensor-sync: PyTorch FSDP2 gathers one layer "
        "at a time (layer-prefetch, or layer-sync without side streams)"
    )


def test_megatron_refuses_what_validate_args_asserts_for_fsdp2() -> None:
    plan = _plan(
        tp=1,
        pp=2,
        dp=64,
        micro_batch_size=1,
        global_batch_size=128,
        zero_stage=3,
        use_torch_fsdp2=True,
        precision=Precision.FP16,
        dp_shard=8,
    )
    assert _error(plan, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.pp=2: --use-torch-fsdp2 is not supported with pipeline parallelism; "
        "plan.gradient_accumulation_fusion=True: --use-torch-fsdp2 is not supported with "
        "gradient accumulation fusion; "
        "plan.precision=fp16: --use-torch-fsdp2 not supported with fp16; "
        "model.tied_embeddings=True: --use-torch-fsdp2 requires "
        "--untie-embeddings-and-output-weights; "
        "plan.dp_shard=8: --use-torch-fsdp2 shards over the whole data-parallel group "
        "(hybrid sharding is Megatron-FSDP's); leave dp_shard unset"
    )


def test_megatron_refuses_schedules_it_lacks() -> None:
    gpipe = _demo_plan(vpp=1, schedule=Schedule.GPIPE, overlap_p2p_comm=False)
    assert _error(gpipe, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.schedule=gpipe: Megatron-LM runs 1f1b and interleaved-1f1b only"
    )
    zb = _demo_plan(vpp=1, schedule=Schedule.ZB_H1, overlap_p2p_comm=False)
    assert _error(zb, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.schedule=zb-h1: Megatron-LM runs 1f1b and interleaved-1f1b only"
    )
    pp2 = _demo_plan(pp=2, dp=128, vpp=2, overlap_p2p_comm=False)
    assert _error(pp2, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.overlap_p2p_comm=False: interleaving on pp(2) without p2p overlap needs pp > 2 "
        "in Megatron-LM; set overlap_p2p_comm"
    )


def test_megatron_refuses_other_frameworks_behaviour() -> None:
    plan = _demo_plan(
        ddp_impl=DdpImpl.LOCAL,
        recompute=Recompute.SELECTIVE_OP,
        fused_elementwise=False,
    )
    relu = dataclasses.replace(GPT3, activation=Activation.RELU)
    assert _error(plan, relu, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.ddp_impl=local: Megatron-LM removed --DDP-impl; it runs Megatron-core's DDP "
        "(megatron-core, or average-in-collective with --ddp-average-in-collective); "
        "plan.recompute=selective-op: that is torchtitan's per-op policy; Megatron-LM "
        "recomputes none, selective (--recompute-granularity selective) or full; "
        "plan.fused_elementwise=False: that is eager PyTorch code; Megatron-LM runs fused "
        "norms, RoPE and activations; "
        "model.activation=relu: Megatron-LM's arguments offer gelu (default), --swiglu and "
        "--squared-relu"
    )
    early = _demo_plan(
        recompute=Recompute.FULL, recompute_early_stop=True, attention=AttentionKernel.FLASH_TRITON
    )
    assert _error(early, GPT3, ExportTarget.MEGATRON) == MEGATRON + (
        "plan.recompute_early_stop=True: Megatron-LM's checkpoint function reruns the whole "
        "forward of a layer; "
        "plan.attention=flash-triton: Megatron-LM's --attention-backend runs flash "
        "(Transformer Engine) or unfused"
    )


def test_every_target_refuses_a_plan_that_does_not_split_the_model() -> None:
    plan = _demo_plan(tp=8, dp=16, global_batch_size=1536)
    for target in ExportTarget:
        message = _error(plan, resolve_model("llama2-7b"), target)
        assert message == (
            "the plan does not split model llama2-7b: num_layers(32) is not divisible by "
            "pp(8) * vpp(6) = 48: vpp must divide the 4 layers per pipeline rank (2, 4)"
        )


# --- DeepSpeed -------------------------------------------------------------------------------

DEEPSPEED_ZERO3_TEXT = """\
{
  "train_batch_size": 1536,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "fp16": {
    "enabled": true
  },
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "reduce_bucket_size": 500000000,
    "stage3_prefetch_bucket_size": 50000000
  },
  "activation_checkpointing": {
    "partition_activations": false,
    "cpu_checkpointing": false,
    "contiguous_memory_optimization": false,
    "synchronize_checkpoint_boundary": false,
    "profile": false
  }
}
"""


def test_deepspeed_zero3_plan_exact_text() -> None:
    exported = export_plan(_deepspeed_plan(), GPT3, to=ExportTarget.DEEPSPEED)
    assert exported == ExportedConfig(
        target=ExportTarget.DEEPSPEED, text=DEEPSPEED_ZERO3_TEXT, suffix=".json"
    )


def test_deepspeed_zero3_plan_field_by_field() -> None:
    config = json.loads(export_plan(_deepspeed_plan(), GPT3, to=ExportTarget.DEEPSPEED).text)
    assert list(config) == [
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "fp16",
        "zero_optimization",
        "activation_checkpointing",
    ]
    assert config["train_batch_size"] == 1536  # global_batch_size
    assert config["train_micro_batch_size_per_gpu"] == 4  # micro_batch_size
    assert config["gradient_accumulation_steps"] == 1  # 1536 / (4 * 384)
    assert config["fp16"] == {"enabled": True}
    assert "bf16" not in config
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["overlap_comm"] is True
    assert zero["reduce_bucket_size"] == 500_000_000
    assert zero["stage3_prefetch_bucket_size"] == 50_000_000  # layer-prefetch
    assert "offload_optimizer" not in zero and "offload_param" not in zero
    assert config["activation_checkpointing"]["partition_activations"] is False
    assert "pipeline" not in config and "tensor_parallel" not in config


def test_deepspeed_pipeline_autotp_offload_and_dtypes() -> None:
    pipeline = _plan(
        tp=1,
        pp=4,
        dp=16,
        micro_batch_size=2,
        global_batch_size=256,
        zero_stage=1,
        recompute=Recompute.FULL,
        overlap_grad_reduce=True,
        grad_reduce_in_bf16=True,
    )
    assert deepspeed_config(pipeline, GPT3) == {
        "train_batch_size": 256,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 8,
        "bf16": {"enabled": True},
        "communication_data_type": "bf16",
        "data_types": {"grad_accum_dtype": "bf16"},
        "zero_optimization": {"stage": 1, "overlap_comm": True, "reduce_bucket_size": 500_000_000},
        "pipeline": {"stages": 4, "activation_checkpoint_interval": 1},
    }
    autotp = _plan(tp=2, pp=1, dp=8, micro_batch_size=1, global_batch_size=16, zero_stage=0)
    assert deepspeed_config(autotp, LLAMA3_8B) == {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 0},
        "tensor_parallel": {"autotp_size": 2},
    }
    offload = _deepspeed_plan(
        precision=Precision.FP32,
        recompute=Recompute.NONE,
        offload_optimizer=OffloadDevice.NVME,
        offload_param=OffloadDevice.CPU,
        zero3_param_fetch=Zero3ParamFetch.LAYER_SYNC,
    )
    assert deepspeed_config(offload, GPT3) == {
        "train_batch_size": 1536,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "reduce_bucket_size": 500_000_000,
            "stage3_prefetch_bucket_size": 0,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
            "offload_param": {"device": "cpu"},
        },
    }


def test_deepspeed_refuses_megatron_layouts() -> None:
    assert _error(_demo_plan(), GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.tp=4: DeepSpeed's config sets tp only for AutoTP (tensor_parallel.autotp_size), "
        "not with a PipelineModule (pp(8)); Megatron-DeepSpeed's tensor parallelism is its own "
        "arguments; "
        "plan.sequence_parallel=True: DeepSpeed's AutoTP has no sequence parallelism; "
        "plan.schedule=interleaved-1f1b: DeepSpeed runs 1f1b only (its pipeline engine's "
        "TrainSchedule, one model chunk per stage; without a pipeline, forward and backward "
        "per micro-batch)"
    )
    context = _plan(tp=1, pp=1, dp=8, cp=2, micro_batch_size=1, global_batch_size=8, zero_stage=1)
    assert _error(context, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.cp=2: DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not "
        "ring context parallelism; use cp 1"
    )
    uneven = _plan(
        tp=1,
        pp=4,
        dp=8,
        micro_batch_size=1,
        global_batch_size=32,
        zero_stage=2,
        decoder_first_pipeline_num_layers=5,
    )
    assert _error(uneven, LLAMA3_8B, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.decoder_first_pipeline_num_layers=5: PipelineModule partitions layers uniformly "
        "or by parameters, with no per-stage layer counts; use an even split; "
        "plan.zero_stage=2: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism "
        "(pp(4)) in DeepSpeed; use 0 or 1"
    )


def test_deepspeed_refuses_fsdp_hsdp_and_fetch_modes() -> None:
    fsdp = _fsdp2_plan(
        tp=1,
        sequence_parallel=False,
        recompute=Recompute.NONE,
        reshard_after_forward=False,
        dp_shard=8,
    )
    assert _error(fsdp, LLAMA3_8B, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.use_torch_fsdp2=True: that is PyTorch FSDP; DeepSpeed runs its own ZeRO-3; "
        "plan.dp_shard=8: DeepSpeed shards over the whole data-parallel group (its MiCS "
        "hybrid sharding was removed); leave dp_shard unset; "
        "plan.reshard_after_forward=False: DeepSpeed's ZeRO-3 releases a module's gathered "
        "parameters after its forward"
    )
    per_tensor = _deepspeed_plan(zero3_param_fetch=Zero3ParamFetch.PER_TENSOR_SYNC)
    assert _error(per_tensor, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.zero3_param_fetch=per-tensor-sync: DeepSpeed 0.19's ZeRO-3 gathers per module, "
        "prefetched (layer-prefetch) or not (layer-sync)"
    )


def test_deepspeed_refuses_overlap_server_precision_and_recompute_modes() -> None:
    zero0 = _deepspeed_plan(zero_stage=0, overlap_grad_reduce=True, precision=Precision.FP8)
    assert _error(zero0, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.overlap_grad_reduce=True: DeepSpeed all-reduces ZeRO-0 gradients after the "
        "backward; it overlaps the reduction only with ZeRO 1-3 (overlap_comm); "
        "plan.precision=fp8: DeepSpeed's config trains in bf16, fp16 or fp32 (fp8 / fp4 GEMMs "
        "are the model code's, through Transformer Engine)"
    )
    gather = _deepspeed_plan(zero_stage=1, overlap_grad_reduce=True, overlap_param_gather=True)
    assert _error(gather, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.overlap_param_gather=True: DeepSpeed's ZeRO-1/2 all-gather the updated "
        "parameters in the optimizer step"
    )
    server = _deepspeed_plan(zero_stage=0, dp_sync=DpSync.PARAMETER_SERVER, ps_servers=4)
    assert _error(server, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.dp_sync=parameter-server: DeepSpeed uses collectives (ring)"
    )
    block = _deepspeed_plan(recompute_num_layers=2, recompute_early_stop=True)
    assert _error(block, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.recompute_num_layers=2: Megatron-LM's block method; DeepSpeed checkpoints every "
        "layer; plan.recompute_early_stop=True: DeepSpeed's checkpoint function reruns the "
        "whole forward of a layer"
    )
    selective = _deepspeed_plan(recompute=Recompute.SELECTIVE)
    assert _error(selective, GPT3, ExportTarget.DEEPSPEED) == DEEPSPEED + (
        "plan.recompute=selective: DeepSpeed's activation checkpointing recomputes whole "
        "layers (none or full)"
    )


# --- torchtitan ------------------------------------------------------------------------------

FSDP2_TOML = """\
[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 1
global_batch_size = 512
seq_len = 8192
mixed_precision_param = "bfloat16"
mixed_precision_reduce = "float32"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = 64
fsdp_reshard_after_forward = "always"
tensor_parallel_degree = 2
enable_async_tensor_parallel = false
context_parallel_degree = 1
pipeline_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
early_stop = false

[compile]
enable = true
"""


def test_torchtitan_fsdp2_plan_exact_text() -> None:
    exported = export_plan(_fsdp2_plan(), LLAMA3_8B, to=ExportTarget.TORCHTITAN)
    assert exported == ExportedConfig(
        target=ExportTarget.TORCHTITAN, text=FSDP2_TOML, suffix=".toml"
    )


def test_torchtitan_fsdp2_plan_reads_back_field_by_field() -> None:
    config = _toml(export_plan(_fsdp2_plan(), LLAMA3_8B, to=ExportTarget.TORCHTITAN).text)
    assert list(config) == ["model", "training", "parallelism", "activation_checkpoint", "compile"]
    assert config["model"] == {"name": "llama3", "flavor": "8B"}
    training = config["training"]
    assert training["local_batch_size"] == 1  # micro_batch_size; 512 / (1 * 64) = 8 steps
    assert training["global_batch_size"] == 512
    assert training["seq_len"] == 8192
    assert training["mixed_precision_param"] == "bfloat16"
    assert training["mixed_precision_reduce"] == "float32"
    par = config["parallelism"]
    assert par["data_parallel_replicate_degree"] == 1
    assert par["data_parallel_shard_degree"] == 64  # dp, ZeRO-3 through FSDP2
    assert par["fsdp_reshard_after_forward"] == "always"
    assert par["tensor_parallel_degree"] == 2
    assert par["enable_async_tensor_parallel"] is False
    assert par["context_parallel_degree"] == 1
    assert par["pipeline_parallel_degree"] == 1
    assert "pipeline_parallel_schedule" not in par
    assert config["activation_checkpoint"] == {
        "mode": "selective",
        "selective_ac_option": "op",
        "early_stop": False,
    }
    assert config["compile"] == {"enable": True}


def test_torchtitan_pipeline_with_an_uneven_split() -> None:
    plan = _plan(
        tp=1,
        pp=4,
        dp=16,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=128,
        zero_stage=3,
        use_torch_fsdp2=True,
        schedule=Schedule.INTERLEAVED_1F1B,
        overlap_p2p_comm=True,
        zero3_param_fetch=Zero3ParamFetch.PER_STEP,
        recompute=Recompute.FULL,
        recompute_early_stop=True,
        decoder_first_pipeline_num_layers=6,
        decoder_last_pipeline_num_layers=6,
    )
    config = _toml(export_plan(plan, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text)
    assert config["training"]["local_batch_size"] == 8  # 8 micro-batches of 1 per pass
    assert config["parallelism"] == {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": 16,
        "fsdp_reshard_after_forward": "never",
        "tensor_parallel_degree": 1,
        "enable_async_tensor_parallel": False,
        "context_parallel_degree": 1,
        "pipeline_parallel_degree": 4,
        "pipeline_parallel_schedule": "Interleaved1F1B",
        "pipeline_parallel_microbatch_size": 1,
        "module_fqns_per_model_part": [
            ["tok_embeddings", "layers.0", "layers.1", "layers.2"],
            ["layers.3", "layers.4", "layers.5", "layers.6", "layers.7"],
            ["layers.8", "layers.9", "layers.10", "layers.11", "layers.12"],
            ["layers.13", "layers.14", "layers.15"],
            ["layers.16", "layers.17", "layers.18"],
            ["layers.19", "layers.20", "layers.21", "layers.22", "layers.23"],
            ["layers.24", "layers.25", "layers.26", "layers.27", "layers.28"],
            ["layers.29", "layers.30", "layers.31", "norm", "output"],
        ],
    }
    assert config["activation_checkpoint"] == {"mode": "full", "early_stop": True}


def test_torchtitan_v_schedules_and_dualpipe_refused() -> None:
    base = dict(tp=1, pp=2, dp=8, global_batch_size=64, sequence_parallel=False)
    base |= dict(zero3_param_fetch=Zero3ParamFetch.PER_STEP, recompute=Recompute.NONE)
    for schedule, name in ((Schedule.ZB_V, "ZBVZeroBubble"), (Schedule.DUALPIPE_V, "DualPipeV")):
        plan = _fsdp2_plan(**base, vpp=2, schedule=schedule)
        par = _toml(export_plan(plan, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text)
        assert par["parallelism"]["pipeline_parallel_schedule"] == name
    dual = _fsdp2_plan(**base, schedule=Schedule.DUALPIPE)
    for target in (ExportTarget.TORCHTITAN, ExportTarget.MEGATRON):
        message = _error(dual, LLAMA3_8B, target)
        assert "schedule" in message and "dualpipe" in message


def test_torchtitan_zero_bubble_ddp_hsdp_fp8_and_fp32() -> None:
    zb = _fsdp2_plan(
        tp=1,
        pp=2,
        dp=8,
        global_batch_size=64,
        sequence_parallel=False,
        schedule=Schedule.ZB_H1,
        zero3_param_fetch=Zero3ParamFetch.PER_STEP,
        recompute=Recompute.NONE,
    )
    par = _toml(export_plan(zb, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text)
    assert par["parallelism"]["pipeline_parallel_schedule"] == "InterleavedZeroBubble"
    assert par["activation_checkpoint"] == {"mode": "none"}
    ddp = _plan(
        tp=1,
        pp=1,
        dp=8,
        micro_batch_size=2,
        global_batch_size=64,
        zero_stage=0,
        ddp_impl=DdpImpl.TORCH,
        overlap_grad_reduce=True,
        precision=Precision.FP8,
        fused_elementwise=False,
    )
    config = _toml(export_plan(ddp, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text)
    assert config["model"]["converters"] == ["quantize.linear.float8"]
    assert config["training"]["mixed_precision_param"] == "bfloat16"
    assert config["parallelism"]["data_parallel_replicate_degree"] == 8
    assert config["parallelism"]["data_parallel_shard_degree"] == 1
    assert "fsdp_reshard_after_forward" not in config["parallelism"]
    assert config["compile"] == {"enable": False}
    hsdp = _fsdp2_plan(dp_shard=8, cp=2, precision=Precision.FP32, tp_comm_overlap=True)
    config = _toml(export_plan(hsdp, LLAMA3_8B, to=ExportTarget.TORCHTITAN).text)
    assert config["parallelism"]["data_parallel_replicate_degree"] == 8
    assert config["parallelism"]["data_parallel_shard_degree"] == 8
    assert config["parallelism"]["context_parallel_degree"] == 2
    assert config["parallelism"]["enable_async_tensor_parallel"] is True
    assert config["training"]["mixed_precision_param"] == "float32"


def test_torchtitan_refuses_zero1_deepspeed_offload_and_servers() -> None:
    zero1 = _fsdp2_plan(
        zero_stage=1,
        use_torch_fsdp2=False,
        offload_optimizer=OffloadDevice.CPU,
        grad_reduce_in_bf16=True,
    )
    assert _error(zero1, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.zero_stage=1: torchtitan replicates (PyTorch DDP, zero_stage 0) or shards "
        "everything with FSDP2 (zero_stage 3 with use_torch_fsdp2); "
        "plan.offload_optimizer=cpu: DeepSpeed's offload has no torchtitan setting; use none; "
        "plan.grad_reduce_in_bf16=True: torchtitan reduces gradients in fp32 "
        '(mixed_precision_reduce accepts only "float32")'
    )
    server = _plan(
        tp=1,
        pp=1,
        dp=8,
        micro_batch_size=1,
        global_batch_size=8,
        dp_sync=DpSync.PARAMETER_SERVER,
    )
    assert _error(server, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.ddp_impl=megatron-core: torchtitan replicates with PyTorch DDP (torch); "
        "plan.overlap_grad_reduce=False: PyTorch DDP always overlaps its bucketed all-reduce "
        "with the backward; "
        "plan.dp_sync=parameter-server: torchtitan uses collectives (ring)"
    )


def test_torchtitan_refuses_ddp_with_model_parallelism_and_wrong_fetch() -> None:
    ddp_tp = _fsdp2_plan(zero_stage=0, use_torch_fsdp2=False, ddp_impl=DdpImpl.TORCH)
    message = _error(ddp_tp, LLAMA3_8B, ExportTarget.TORCHTITAN)
    assert message == TORCHTITAN + (
        "plan.zero_stage=0: torchtitan's DDP runs without other parallelism (tp(2), pp(1), "
        "cp(1) must be 1: 'DDP has not supported > 1D parallelism'); use zero_stage 3 with "
        "use_torch_fsdp2; "
        "plan.overlap_grad_reduce=False: PyTorch DDP always overlaps its bucketed all-reduce "
        "with the backward"
    )
    deepspeed = _deepspeed_plan(precision=Precision.BF16)
    assert _error(deepspeed, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.use_torch_fsdp2=False: torchtitan's ZeRO-3 is PyTorch FSDP2 (fully_shard)"
    )
    pipelined = _fsdp2_plan(tp=1, pp=2, dp=8, global_batch_size=64, sequence_parallel=False)
    assert _error(pipelined, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.zero3_param_fetch=layer-prefetch: FSDP2 under torch.distributed.pipelining "
        "(pp(2) > 1) gathers once per step: use per-step"
    )
    per_step = _fsdp2_plan(zero3_param_fetch=Zero3ParamFetch.PER_STEP)
    assert _error(per_step, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.zero3_param_fetch=per-step: FSDP2 without a pipeline gathers one layer at a "
        "time: use layer-prefetch (or layer-sync without side streams)"
    )


def test_torchtitan_refuses_megatron_only_modes() -> None:
    plan = _fsdp2_plan(
        schedule=Schedule.GPIPE,
        recompute=Recompute.FULL,
        recompute_num_layers=2,
        sequence_parallel=False,
        precision=Precision.FP16,
        attention=AttentionKernel.UNFUSED,
    )
    assert _error(plan, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.schedule=gpipe: without a pipeline torchtitan runs each micro-batch's forward "
        "and backward in turn (1f1b); "
        "plan.recompute_num_layers=2: Megatron-LM's block method; torchtitan checkpoints "
        "every layer (full) or every n-th layer (selective_ac_option n); "
        "plan.sequence_parallel=False: torchtitan's tensor parallelism (tp(2)) is always "
        "sequence-parallel; "
        "plan.precision=fp16: torchtitan trains in bf16 or fp32 mixed precision, or fp8 "
        "through torchao; "
        "plan.attention=unfused: torchtitan's Llama runs scaled_dot_product_attention's fused "
        "kernels (flash)"
    )
    selective = _fsdp2_plan(
        recompute=Recompute.SELECTIVE,
        tp_comm_overlap=True,
        fused_elementwise=False,
        precision=Precision.FP8,
        num_layers_at_end_in_bf16=1,
    )
    assert _error(selective, LLAMA3_8B, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "plan.recompute=selective: that is Megatron-LM's attention-core recompute; "
        "torchtitan's activation_checkpoint modes are none, full and selective with "
        "selective_ac_option op (selective-op); "
        "plan.tp_comm_overlap=True: async tensor parallelism needs torch.compile "
        "(fused_elementwise); "
        "plan.num_layers_at_end_in_bf16=1: torchtitan quantizes every layer; use 0"
    )


def test_torchtitan_refuses_a_model_it_does_not_ship() -> None:
    plan = _fsdp2_plan(tp=1, sequence_parallel=False, dp=384, global_batch_size=1536)
    assert _error(plan, GPT3, ExportTarget.TORCHTITAN) == TORCHTITAN + (
        "model.name=gpt3-175b: its shape is no torchtitan flavor; torchtitan 0.2.2 ships "
        "llama3 8B, llama3 70B, llama3 405B (Llama 3: SwiGLU, RMSNorm, RoPE, no biases, "
        "untied output)"
    )


def test_torchtitan_flavors_match_the_catalog_llamas() -> None:
    names = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
    for preset, flavor in names.items():
        model = resolve_model(preset)
        assert [f.flavor for f in LLAMA3_FLAVORS if f.matches(model)] == [flavor]
    assert not any(f.matches(resolve_model("llama2-70b")) for f in LLAMA3_FLAVORS)


# --- the entry point -------------------------------------------------------------------------


def test_targets_suffixes_versions_and_determinism() -> None:
    assert [t.value for t in ExportTarget] == ["megatron", "torchtitan", "deepspeed"]
    assert [t.suffix for t in ExportTarget] == [".txt", ".toml", ".json"]
    assert [t.version for t in ExportTarget] == [
        "Megatron-LM core_v0.16.1",
        "torchtitan 0.2.2",
        "DeepSpeed 0.19.8",
    ]
    first = export_plan(_fsdp2_plan(), LLAMA3_8B, to=ExportTarget.TORCHTITAN)
    assert export_plan(_fsdp2_plan(), LLAMA3_8B, to=ExportTarget.TORCHTITAN) == first
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.text = ""  # type: ignore[misc]
