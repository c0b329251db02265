"""What a published run's framework and date allow the back-test's search (pure).

Rules that depend on which framework ran a row (its ``framework`` cell), with the dates of
``plansim.planner.framework_releases`` where the rule depends on the release too:
DeepSpeed's pipeline engine runs only 1F1B and refuses ZeRO-2/3, DeepSpeed's 2021 ZeRO-3
gathered parameters per tensor, NVIDIA's Megatron family (Megatron-LM, Megatron-core, NeMo,
Megatron-Bridge) shards only the optimizer unless FSDP is named, the DeepSpeed-based forks of
Megatron-LM lacked sequence parallelism, selective recompute and gradient-accumulation fusion,
the Megatron family reduces gradients in bf16 or fp32 from 2024 in NeMo and from 2025 in
Megatron-LM (searched) and interleaves only
pipelines of three or more ranks before 2024, torchtitan's selective recompute is its per-op
policy, and a blank ``zero_stage`` may be named in the free-text ``zero_stage_or_sharding``
cell.
``plansim.planner.run_space`` applies them; each rule cites its source.
"""

from __future__ import annotations

import re

from plansim.io.runs import RunRow
from plansim.planner.framework_releases import available, row_tags
from plansim.specs.plan import Framework, Zero3ParamFetch


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


#: NeMo and Megatron-Bridge, which build Megatron-core's configs in Python (not through
#: Megatron-LM's command line and its argument rules).
_NEMO = re.compile(r"\bnemo\b|megatron[- ]?bridge")


def is_nvidia_megatron(row: RunRow) -> bool:
    """Whether the row ran on NVIDIA's Megatron family (Megatron-LM, Megatron-core, NeMo,
    Megatron-Bridge) without DeepSpeed."""
    return bool(_NVIDIA_MEGATRON.search(framework_text(row))) and not is_deepspeed(row)


def framework_tags(row: RunRow) -> frozenset[str]:
    """The row's framework as ``plansim.planner.framework_releases`` names it (its tags)."""
    return row_tags(
        nvidia_megatron=is_nvidia_megatron(row),
        nemo=is_nvidia_megatron(row) and bool(_NEMO.search(framework_text(row))),
        deepspeed=is_deepspeed(row),
        deepspeed_pipeline=deepspeed_pipeline_engine(row),
        llm_foundry=is_llm_foundry(row),
        torchtitan=is_torchtitan(row),
    )


def has(row: RunRow, feature: str, year: int | None) -> bool:
    """Whether the row's framework had ``feature`` in ``year``
    (``framework_releases.available``; undated: its latest release)."""
    return available(feature, framework_tags(row), year)


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
      (``--use-distributed-optimizer``, ZeRO-1, M02), from its release
      (``framework_releases``, ``distributed_optimizer``); before that, none.
    """
    if zero is not None:
        return (zero,)
    if is_deepspeed(row) and (row.integer("pp") or 1) > 1:
        notes.append("ZeRO 0 or 1 (DeepSpeed's pipeline engine refuses ZeRO-2/3)")
        return (0, 1)
    framework = framework_text(row)
    if is_nvidia_megatron(row) and "fsdp" not in framework:
        if not has(row, "distributed_optimizer", year):
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


def is_llm_foundry(row: RunRow) -> bool:
    """Whether the row's framework cell names MosaicML's llm-foundry."""
    return "llm-foundry" in framework_text(row).replace("_", "-")


def is_torchtitan(row: RunRow) -> bool:
    """Whether the row's framework cell names torchtitan."""
    return "torchtitan" in framework_text(row)


def row_framework(row: RunRow, year: int | None) -> Framework:
    """The :class:`~plansim.specs.execution.Framework` a row's ``framework`` cell names
    (the execution spec of its plans): torchtitan, llm-foundry (Composer), a DeepSpeed fork
    of Megatron-LM, DeepSpeed, NVIDIA's Megatron family before and after Megatron-Core
    (``framework_releases``, ``megatron_core``: rows dated before ran on the monolithic
    Megatron-LM); a blank or other cell: plain PyTorch."""
    if is_torchtitan(row):
        return Framework.TORCHTITAN
    if is_llm_foundry(row):
        return Framework.COMPOSER
    if is_deepspeed(row):
        megatron = "megatron" in framework_text(row) or "neox" in framework_text(row)
        return Framework.MEGATRON_DEEPSPEED if megatron else Framework.DEEPSPEED
    if is_nvidia_megatron(row):
        if not has(row, "megatron_core", year):
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
    bf16 for NVIDIA Megatron-family rows from its release (``framework_releases``,
    ``grad_reduce_in_bf16``: NeMo and Megatron-Bridge from 2024, Megatron-LM's command line
    from 2025), for
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
    if year is None or has(row, "grad_reduce_in_bf16", year):
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
    Megatron family dated before it allowed pp = 2 (``framework_releases``,
    ``interleaved_pp2``), else 2."""
    return 2 if has(row, "interleaved_pp2", year) else 3


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
    the row states a pp that does not divide its layers (the run did), else where its
    framework had uneven splits (``framework_releases``, ``uneven_pipeline``: DeepSpeed
    always, Megatron-LM from 2024; undated rows)."""
    return row.integer("pp") is not None or has(row, "uneven_pipeline", year)


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
    """DeepSpeed runs dated before its prefetch (``framework_releases``, ``zero3_prefetch``)
    fetch ZeRO-3 parameters one tensor at a time, synchronously
    (``plansim.analytic.zero3``); torchtitan runs whose pp is stated above 1 or searched
    gather once per step (FSDP2 under
    ``torch.distributed.pipelining``, sharded with ``reshard_after_forward`` off:
    ``per-step``, which the search applies to pp > 1 plans only); everything else prefetches
    layers."""
    if not has(row, "zero3_prefetch", year):
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
