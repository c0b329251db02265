"""What a published run's framework and date allow the back-test's search (pure).

Rules that depend on which framework ran a row (its ``framework`` cell) rather than on when:
DeepSpeed's pipeline engine runs only 1F1B and refuses ZeRO-2/3, DeepSpeed's 2021 ZeRO-3
gathered parameters per tensor, NVIDIA's Megatron family (Megatron-LM, Megatron-core, NeMo,
Megatron-Bridge) shards only the optimizer unless FSDP is named, the DeepSpeed-based forks of
Megatron-LM lacked sequence parallelism, selective recompute and gradient-accumulation fusion,
the Megatron family reduces gradients in bf16 or fp32 from 2024 (searched) and interleaves only
pipelines of three or more ranks before 2024, torchtitan's selective recompute is its per-op
policy, and a blank ``zero_stage`` may be named in the free-text ``zero_stage_or_sharding``
cell.
``plansim.planner.run_space`` applies them; each rule cites its source.
"""

from __future__ import annotations

import re

from plansim.io.runs import RunRow
from plansim.specs.plan import Framework, Zero3ParamFetch

#: Megatron-LM's uneven pipeline split (``--decoder-first/last-pipeline-num-layers``) came
#: after mid-2024 (NVIDIA/Megatron-LM issue #857, June 2024, asks how to set per-stage layer
#: counts); DeepSpeed's ``PipelineModule`` partitions layers unevenly since its pipeline
#: engine appeared (2020).
UNEVEN_PIPELINE_YEAR = 2024
#: DeepSpeed ZeRO-3 fetched parameters per tensor, synchronously, in its 2021 releases (v0.3.x
#: ``partition_parameters.py``); bucketed, coalesced prefetch replaced it from 2022.
DEEPSPEED_PREFETCH_YEAR = 2022
#: Sequence parallelism and selective recompute (Korthikanti et al., arXiv:2205.05198) shipped
#: in NVIDIA's Megatron-LM in 2022, with gradient-accumulation fusion; the DeepSpeed-based
#: forks that trained BLOOM (bigscience-workshop/Megatron-DeepSpeed) and GPT-NeoX branched
#: from Megatron-LM before that, so their runs dated before this year are offered none of
#: them. BigScience's ``megatron/mpu/layers.py`` computes every parallel linear with a plain
#: ``F.linear``: autograd writes each micro-batch's weight gradient, and DeepSpeed's pipeline
#: engine adds it to the fp32 copy in a separate pass after every micro-batch's backward
#: (``PipelineEngine._exec_backward_pass`` -> ``BF16_Optimizer.update_hp_grads``; with fp16,
#: autograd's own ``.grad`` accumulation).
FORK_SP_YEAR = 2023
#: Megatron-LM's distributed optimizer (``--use-distributed-optimizer``: fp32 main weights,
#: Adam states and gradients sharded over data-parallel ranks, M02 dist_optimizer.md) arrived
#: with its 2022 releases, after the SC21 runs.
DISTRIBUTED_OPTIMIZER_YEAR = 2022
#: bf16 gradient reduction in NVIDIA's Megatron family: Megatron-core's
#: ``DistributedDataParallelConfig(grad_reduce_in_fp32=False)`` (Megatron-LM
#: ``--grad-reduce-in-bf16``), which NeMo 2's fp8 recipe ``bf16_with_fp8_mixed`` sets ("NVIDIA
#: recommends False for FP8"), 2024 releases; before, bf16 training reduced in fp32.
GRAD_REDUCE_IN_BF16_YEAR = 2024
#: Megatron-LM interleaved only pipelines of more than two ranks from the schedule's first
#: release (2021) until mid-2024: its argument check and ``initialize_model_parallel`` raise
#: "pipeline-model-parallel size should be greater than 2 with interleaved schedule" (with
#: pp = 2 the tensors for the next and the previous rank were not told apart). Relaxed to
#: pp > 1 in June 2024 (NVIDIA/Megatron-LM issue #750, maintainer's reply of 2024-06-06
#: naming commit 152c5620); the current ``parallel_state.py`` says "greater than 1".
INTERLEAVED_PP2_YEAR = 2024


def framework_text(row: RunRow) -> str:
    """The row's ``framework`` cell, lower-cased ('' when blank)."""
    return (row.text("framework") or "").lower()


def is_deepspeed(row: RunRow) -> bool:
    """Whether the row's framework names DeepSpeed or GPT-NeoX (which runs on DeepSpeed)."""
    framework = framework_text(row)
    return "deepspeed" in framework or "neox" in framework


#: Framework names of NVIDIA's Megatron family: Megatron-LM, its core library and the NeMo
#: framework and Megatron-Bridge built on it. Without FSDP their data-parallel sharding is
#: the distributed optimizer alone (``DistributedDataParallel`` + ``DistributedOptimizer``,
#: M02 dist_optimizer.md); ZeRO-3 comes only as the separately named Megatron FSDP.
_NVIDIA_MEGATRON = re.compile(
    r"megatron[- ]?lm|megatron[- ]?core|\bmcore\b|\bnemo\b|megatron[- ]?bridge"
)


def is_nvidia_megatron(row: RunRow) -> bool:
    """Whether the row ran on NVIDIA's Megatron family (Megatron-LM, Megatron-core, NeMo,
    Megatron-Bridge) without DeepSpeed."""
    return bool(_NVIDIA_MEGATRON.search(framework_text(row))) and not is_deepspeed(row)


def is_megatron_fork(row: RunRow, year: int | None) -> bool:
    """A DeepSpeed-based fork of Megatron-LM (DeepSpeed or NeoX named, NVIDIA's Megatron-LM
    not) dated before FORK_SP_YEAR: no sequence parallelism, selective recompute or
    gradient-accumulation fusion."""
    return deepspeed_pipeline_engine(row) and year is not None and year < FORK_SP_YEAR


def deepspeed_pipeline_engine(row: RunRow) -> bool:
    """Whether the row's pipeline ran on DeepSpeed's ``PipelineEngine`` (DeepSpeed or NeoX
    named, NVIDIA's Megatron-LM not): its only training schedule is 1F1B-like
    (``TrainSchedule``, ``deepspeed/runtime/pipe/schedule.py``), with no virtual stages, so
    neither interleaving nor GPipe nor ZB-H1 is offered."""
    return is_deepspeed(row) and "megatron-lm" not in framework_text(row)


def zero_stages(
    row: RunRow, zero: int | None, year: int | None, notes: list[str]
) -> tuple[int, ...]:
    """ZeRO stages to search: the stated (or sharding-named) one; blank: all four, except

    * DeepSpeed with a stated pp > 1: 0 and 1 (its ``PipelineEngine`` asserts "ZeRO-2 and
      ZeRO-3 are incompatible with pipeline parallelism", ``deepspeed/runtime/pipe/engine.py``);
    * NVIDIA's Megatron family alone (Megatron-LM, Megatron-core, NeMo, Megatron-Bridge;
      no DeepSpeed or FSDP named): its only sharding is the distributed optimizer
      (``--use-distributed-optimizer``, ZeRO-1, M02), from DISTRIBUTED_OPTIMIZER_YEAR;
      before that, none.
    """
    if zero is not None:
        return (zero,)
    if is_deepspeed(row) and (row.integer("pp") or 1) > 1:
        notes.append("ZeRO 0 or 1 (DeepSpeed's pipeline engine refuses ZeRO-2/3)")
        return (0, 1)
    framework = framework_text(row)
    if is_nvidia_megatron(row) and "fsdp" not in framework:
        if year is not None and year < DISTRIBUTED_OPTIMIZER_YEAR:
            notes.append(f"ZeRO 0 (Megatron-LM before its distributed optimizer, run {year})")
            return (0,)
        notes.append("ZeRO 0 or 1 (Megatron shards only the optimizer without FSDP)")
        return (0, 1)
    return (0, 1, 2, 3)


_TORCH_FSDP = re.compile(r"(?:py)?torch[- ]fsdp|\bfsdp2\b|fully_shard")
#: NVIDIA's own FSDP (Megatron-core ``--use-megatron-fsdp`` / custom FSDP), not PyTorch's.
_MEGATRON_FSDP = re.compile(r"megatron[- ]fsdp|custom[- ]fsdp|\bmfsdp\b")


def is_torch_fsdp(row: RunRow, notes: list[str]) -> bool:
    """Whether the row's ZeRO-3 is PyTorch FSDP (``ParallelPlan.use_torch_fsdp2``): named
    ("PyTorch FSDP", "torch FSDP", "FSDP2", ``fully_shard``) in the framework or sharding
    cell, or FSDP named by a row that is neither DeepSpeed nor NVIDIA's Megatron family (whose
    FSDP is Megatron-FSDP); never when Megatron-FSDP is named."""
    sharding = (row.text("zero_stage_or_sharding") or "").lower()
    text = f"{framework_text(row)} {sharding}"
    megatron_fsdp = bool(_MEGATRON_FSDP.search(text))
    torch_fsdp = not megatron_fsdp and (
        bool(_TORCH_FSDP.search(text))
        or (
            ("fsdp" in text or "hsdp" in text)  # HSDP is PyTorch FSDP's hybrid sharding
            and not is_deepspeed(row)
            and not is_nvidia_megatron(row)
        )
    )
    if torch_fsdp:
        notes.append("PyTorch FSDP: fp32 sharded parameters are the master weights")
    return torch_fsdp


#: MosaicML's llm-foundry trained its MPT models with the Triton FlashAttention of 2022
#: (``attn_config: attn_impl: triton`` in every ``scripts/train/yamls/pretrain/mpt-*.yaml``,
#: e.g. mpt-125m.yaml @2a59782a; ``llmfoundry/models/layers/flash_attn_triton.py``, a copy
#: of ``flash_attn/flash_attn_triton.py`` on the ``triton_pre_mlir`` compiler); its yamls
#: moved to FlashAttention-2 (``attn_impl: flash``) with its 2024 releases.
LLM_FOUNDRY_FLASH2_YEAR = 2024


def is_llm_foundry(row: RunRow) -> bool:
    """Whether the row's framework cell names MosaicML's llm-foundry."""
    return "llm-foundry" in framework_text(row).replace("_", "-")


def is_torchtitan(row: RunRow) -> bool:
    """Whether the row's framework cell names torchtitan."""
    return "torchtitan" in framework_text(row)


#: Megatron-Core, the library Megatron-LM trains on today, had its first releases in 2023
#: (NVIDIA/Megatron-LM tags ``core_r0.2.0`` onwards); Megatron-LM rows dated before ran on
#: the monolithic Megatron-LM.
MEGATRON_CORE_YEAR = 2023


def row_framework(row: RunRow, year: int | None) -> Framework:
    """The :class:`~plansim.specs.execution.Framework` a row's ``framework`` cell names
    (the execution spec of its plans): torchtitan, llm-foundry (Composer), a DeepSpeed fork
    of Megatron-LM, DeepSpeed, NVIDIA's Megatron family before and after Megatron-Core
    (:data:`MEGATRON_CORE_YEAR`); a blank or other cell: plain PyTorch."""
    if is_torchtitan(row):
        return Framework.TORCHTITAN
    if is_llm_foundry(row):
        return Framework.COMPOSER
    if is_deepspeed(row):
        megatron = "megatron" in framework_text(row) or "neox" in framework_text(row)
        return Framework.MEGATRON_DEEPSPEED if megatron else Framework.DEEPSPEED
    if is_nvidia_megatron(row):
        if year is not None and year < MEGATRON_CORE_YEAR:
            return Framework.MEGATRON_LM
        return Framework.MEGATRON_CORE
    return Framework.PYTORCH


def fused_elementwise(row: RunRow, notes: list[str]) -> bool:
    """Whether the row's elementwise work runs as fused kernels
    (``ParallelPlan.fused_elementwise``): not for the eager-PyTorch frameworks, torchtitan and
    MosaicML's llm-foundry, unless the framework cell names ``torch.compile``.

    * torchtitan's Llama is Meta's reference code in eager ops
      (``torchtitan/models/llama/model.py``: complex-number RoPE, ``repeat_kv``, silu and mul;
      ``torchtitan/models/norms.py`` ``RMSNorm`` for the ``norm_type = "rmsnorm"`` of its
      train configs) and ``--training.compile`` is off by default.
    * llm-foundry's MPT block is eager PyTorch modules (``llmfoundry/models/layers/blocks.py``
      ``MPTBlock.forward``: ``norm_1``, attention, ``x = x + self.resid_attn_dropout(b)``,
      ``norm_2``, ``ffn``, ``x = x + self.resid_ffn_dropout(n)``; the norms PyTorch's
      ``F.layer_norm`` in low precision, ``norm.py`` ``LPLayerNorm``; the FFN
      ``down_proj(act(up_proj(x)))`` with ``nn.GELU``, ``ffn.py`` ``MPTMLP``); only attention
      is a fused kernel (its Triton FlashAttention, ``AttentionKernel.FLASH_TRITON``), and the
      benchmarking yamls of its 2023 tables compile nothing.

    With ``torch.compile``, Inductor fuses those ops, which the fused count stands for."""
    if "compile" in framework_text(row):
        return True
    if is_torchtitan(row):
        notes.append("eager elementwise ops (torchtitan without torch.compile)")
        return False
    if is_llm_foundry(row):
        notes.append("eager elementwise ops (llm-foundry's MPT block in eager PyTorch)")
        return False
    return True


def framework_recompute(row: RunRow, recompute: str | None, notes: list[str]) -> str | None:
    """The row's recompute as plansim names it: a torchtitan row's ``selective`` is its per-op
    policy (``Recompute.SELECTIVE_OP``: ``--activation_checkpoint.selective_ac_option op``,
    the setting of its Llama 3 8B training config and the "selective op" rows of its
    ``docs/performance.md``), not Megatron-LM's attention-core recompute; any other value is
    returned unchanged."""
    if recompute == "selective" and is_torchtitan(row):
        notes.append("recompute selective on torchtitan: its per-op policy (selective-op)")
        return "selective-op"
    return recompute


def recompute_early_stop(row: RunRow, recompute: str | None, notes: list[str]) -> bool:
    """Whether the row's full recompute stops early (``ParallelPlan.recompute_early_stop``):
    the layers are checkpointed through PyTorch's ``checkpoint_wrapper`` without reentrant
    autograd, whose recompute ends once the saved tensors are back (on by default since
    pytorch/pytorch PR #96866, March 2023, so from torch 2.1): no MLP down projection again.
    Measured on an H100: 52.7 ms of recompute against 74.3 ms without early stop
    (benchmarks/gpu_runs/h100-2026-11-27). Two frameworks checkpoint that way:

    * torchtitan wraps each block in ``checkpoint_wrapper(module, preserve_rng_state=False)``
      (``_apply_ac_to_transformer_block`` in ``torchtitan/models/llama3/infra/parallelize.py``),
      non-reentrant by default.
    * MosaicML's llm-foundry (Composer's FSDP): its MPT yamls set ``fsdp_config:
      activation_checkpointing_reentrant: false`` (``scripts/train/yamls/pretrain/mpt-*.yaml``),
      so does ``scripts/train/benchmarking/submit_benchmarks.py`` (``mod_parameters``), and
      Composer then wraps each block in ``checkpoint_wrapper(m,
      checkpoint_impl=CheckpointImpl.NO_REENTRANT)`` (``composer/trainer/dist_strategy.py``).
      The benchmarking README's tables ran on ``mosaicml/pytorch:2.1.0_cu121-nightly20230827``
      (``h100new.md`` @beb8dee6), which has early stop. Assumed for every llm-foundry row; a
      run on torch 2.0 or older reran the whole forward.

    Not for other frameworks: Megatron-LM and DeepSpeed checkpoint with their own functions,
    which rerun the whole forward. Early stop saves nothing where a dropout follows the down
    projection (``layer_cost`` checks the model)."""
    if recompute not in (None, "full"):
        return False
    if is_torchtitan(row):
        framework = "torchtitan"
    elif is_llm_foundry(row):
        framework = "llm-foundry (activation_checkpointing_reentrant: false)"
    else:
        return False
    notes.append(
        f"full recompute on {framework}: torch's checkpoint stops early (no MLP down "
        "projection again)"
    )
    return True


def bf16_grad_modes(
    row: RunRow, year: int | None, notes: list[str], *, torch_fsdp: bool = False
) -> tuple[bool, ...]:
    """Gradient-reduction dtypes to search (``ParallelPlan.grad_reduce_in_bf16``): fp32 and
    bf16 for NVIDIA Megatron-family rows dated GRAD_REDUCE_IN_BF16_YEAR or later, for
    PyTorch FSDP rows (``torch_fsdp``: the reduce-scatter dtype is the job's
    ``MixedPrecisionPolicy.reduce_dtype``, which the runs schema has no column for: fp32 in
    torchtitan's default and Composer's ``DEFAULT`` since mosaicml/composer PR #2628 of
    2023-10-10, the parameter dtype in Composer's ``PURE`` and in its ``DEFAULT`` before that
    patch) and for undated rows; fp32 only otherwise (the search applies it only to bf16 /
    fp8 / fp4). torchtitan rows reduce in fp32 only: its ``--training.mixed_precision_reduce``
    defaults to ``float32`` and offered no other choice (``choices=["float32"]``,
    ``torchtitan/config_manager.py``, 2024; ``MixedPrecisionPolicy(reduce_dtype=...)`` in its
    ``parallelize`` takes it from there)."""
    bf16_precision = (row.choice("precision") or "") in ("bf16", "fp8", "fp4")
    if torch_fsdp and is_torchtitan(row):
        if bf16_precision:
            notes.append("fp32 gradient reduction (torchtitan's mixed_precision_reduce: float32)")
        return (False,)
    if torch_fsdp:
        if bf16_precision:
            notes.append("PyTorch FSDP reduce dtype (fp32 or bf16) searched")
        return (False, True)
    if year is None or (is_nvidia_megatron(row) and year >= GRAD_REDUCE_IN_BF16_YEAR):
        if bf16_precision:
            notes.append("gradient reduction in fp32 or bf16 searched")
        return (False, True)
    return (False,)


#: Words of the free-text ``zero_stage_or_sharding`` column and the ZeRO stage they name, read
#: when ``zero_stage`` is blank (the schema's own mapping: Megatron's distributed optimizer =
#: 1, FSDP full shard = 3, shard-grad-op = 2).
_HYBRID_SHARD = re.compile(r"hybrid[-_ ]shard|\bhsdp\b", re.IGNORECASE)
_SHARDING_WORDS = (
    (re.compile(r"zero[- ]?(?:stage[- ]?)?([0-3])\b", re.IGNORECASE), None),
    (_HYBRID_SHARD, 3),
    (re.compile(r"shard[-_ ]grad[-_ ]op", re.IGNORECASE), 2),
    (re.compile(r"full[-_ ]shard|fsdp", re.IGNORECASE), 3),
    (re.compile(r"distributed[-_ ]optimi[sz]er", re.IGNORECASE), 1),
    (re.compile(r"^\s*(?:none|no)\s*$", re.IGNORECASE), 0),
)


def is_hybrid_shard(row: RunRow) -> bool:
    """Whether ``zero_stage_or_sharding`` names hybrid sharding (PyTorch FSDP
    ``HYBRID_SHARD``, HSDP): ZeRO-3 sharded within a node and replicated across nodes."""
    return bool(_HYBRID_SHARD.search(row.text("zero_stage_or_sharding") or ""))


def min_interleaved_pp(row: RunRow, year: int | None) -> int:
    """Fewest pipeline ranks the row's framework runs interleaved 1F1B with: 3 on NVIDIA's
    Megatron family dated before INTERLEAVED_PP2_YEAR, else 2."""
    if is_nvidia_megatron(row) and year is not None and year < INTERLEAVED_PP2_YEAR:
        return 3
    return 2


def zero_stage(row: RunRow, notes: list[str]) -> int | None:
    """The ``zero_stage`` cell; when blank, the stage ``zero_stage_or_sharding`` names (noted);
    None when neither says."""
    stated = row.integer("zero_stage")
    text = row.text("zero_stage_or_sharding")
    if stated is not None or text is None:
        return stated
    for pattern, stage in _SHARDING_WORDS:
        found = pattern.search(text)
        if found:
            value = stage if stage is not None else int(found.group(1))
            notes.append(f"zero_stage {value} from zero_stage_or_sharding {text!r}")
            return value
    return None


def uneven_pipeline(row: RunRow, year: int | None) -> bool:
    """Whether the search may split layers unevenly over the pipeline ranks: always when
    the row states a pp that does not divide its layers (the run did), else for undated
    rows, DeepSpeed runs and runs dated UNEVEN_PIPELINE_YEAR or later."""
    framework = framework_text(row)
    return (
        row.integer("pp") is not None
        or year is None
        or year >= UNEVEN_PIPELINE_YEAR
        or "deepspeed" in framework
    )


def deepspeed_pp(row: RunRow, zero: int | None, notes: list[str]) -> tuple[int, ...] | None:
    """pp values: the stated one; for DeepSpeed with ZeRO stage 2 or 3 only 1 (DeepSpeed's
    ``PipelineEngine`` asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline
    parallelism", ``deepspeed/runtime/pipe/engine.py``); else searched."""
    framework = framework_text(row)
    if row.integer("pp") is None and zero is not None and zero >= 2 and "deepspeed" in framework:
        notes.append(f"pp 1 (DeepSpeed ZeRO-{zero} does not combine with pipeline parallelism)")
        return (1,)
    stated = row.integer("pp")
    if stated is None:
        notes.append("pp searched")
        return None
    return (stated,)


def zero3_fetch(row: RunRow, year: int | None, notes: list[str]) -> Zero3ParamFetch:
    """DeepSpeed runs dated before DEEPSPEED_PREFETCH_YEAR fetch ZeRO-3 parameters one tensor
    at a time, synchronously (``plansim.analytic.zero3``); torchtitan runs whose pp is
    stated above 1 or searched gather once per step (FSDP2 under
    ``torch.distributed.pipelining``, sharded with ``reshard_after_forward`` off:
    ``per-step``, which the search applies to pp > 1 plans only); everything else prefetches
    layers."""
    deepspeed = "deepspeed" in framework_text(row)
    if deepspeed and year is not None and year < DEEPSPEED_PREFETCH_YEAR:
        notes.append(f"ZeRO-3 per-tensor synchronous gathers (DeepSpeed, run dated {year})")
        return Zero3ParamFetch.PER_TENSOR_SYNC
    stated_pp = row.integer("pp")
    if is_torchtitan(row) and (stated_pp is None or stated_pp > 1):
        notes.append(
            "ZeRO-3 gathered and reduce-scattered once per step with pp > 1 (torchtitan: FSDP2 "
            "under torch.distributed.pipelining)"
        )
        return Zero3ParamFetch.PER_STEP
    return Zero3ParamFetch.LAYER_PREFETCH
