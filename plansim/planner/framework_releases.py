"""What each training framework could run, and from when (pure data, each entry cited).

The back-test searches only what a published run's framework could run at the run's date
(``plansim.planner.run_space``): a run of 2021 is not offered sequence parallelism, nor a
DeepSpeed fork of 2022 the fused gradient accumulation NVIDIA's Megatron-LM had by then.
:data:`FEATURES` holds, for each feature, the first year its framework's releases had it,
with the release or paper that brought it and the source that says so; ``"*"`` is every
framework the feature does not name. A row names its framework by the tags of
:func:`row_tags`; a feature with several of a row's tags takes the first it lists.

An undated row is searched as its framework's latest release (every feature it has), and
its note says so (:func:`undated_note`): a date in the framework cell ("Megatron-LM (2021)",
"NeMo 24.07") or the source locator (SC21, arXiv:2104.04473) narrows the search.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Tags of a row's framework (:func:`row_tags`).
NVIDIA_MEGATRON = "nvidia-megatron"  # Megatron-LM, Megatron-Core, NeMo, Megatron-Bridge
NEMO = "nemo"  # NeMo and Megatron-Bridge: they configure Megatron-Core in Python, not its CLI
DEEPSPEED = "deepspeed"  # any run naming DeepSpeed or GPT-NeoX
DEEPSPEED_PIPELINE = "deepspeed-pipeline"  # DeepSpeed's own engine: forks, NeoX, DeepSpeed
LLM_FOUNDRY = "llm-foundry"  # MosaicML Composer / llm-foundry
TORCHTITAN = "torchtitan"
EVERY = "*"

#: The year of a feature every release had (the first release's or earlier).
ALWAYS = 0


@dataclass(frozen=True, slots=True)
class Since:
    """The first year a framework's runs had a feature.

    Attributes:
        year: the year (``ALWAYS``: from the framework's first release).
        release: the release, pull request or paper that brought it.
        source: where that is stated.
    """

    year: int
    release: str
    source: str


_SC21 = "Narayanan et al., SC21 (arXiv:2104.04473, April 2021)"
_SP_PAPER = "Korthikanti et al., arXiv:2205.05198 (May 2022)"

#: feature -> framework tag -> the first year it had the feature (module docstring).
FEATURES: Mapping[str, Mapping[str, Since]] = {
    "interleaved_1f1b": {
        EVERY: Since(
            2021,
            _SC21,
            "NVIDIA/Megatron-LM commit dcef9069 (2021-02-13) adds "
            "--num-layers-per-virtual-pipeline-stage to megatron/arguments.py",
        ),
    },
    "scatter_gather_p2p": {
        EVERY: Since(
            2021,
            _SC21,
            "§4.1; NVIDIA/Megatron-LM commit 72e4230b (2021-02-16) adds "
            "--no-scatter-gather-tensors-in-pipeline; the 2020 training.communicate sent the "
            "whole (seq, mbs, hidden) tensor from every TP rank",
        ),
    },
    "sequence_parallel": {
        DEEPSPEED_PIPELINE: Since(
            2023,
            "the DeepSpeed-based forks of Megatron-LM branched before it",
            "bigscience-workshop/Megatron-DeepSpeed and GPT-NeoX: megatron/mpu/layers.py "
            "computes every parallel linear with a plain F.linear, no sequence parallelism",
        ),
        EVERY: Since(
            2022,
            _SP_PAPER,
            "NVIDIA/Megatron-LM commits cfd2e216 (2022-04-28, --sequence-parallel) and "
            "bbab79f8 (2022-05-16, --recompute-granularity selective, --recompute-method)",
        ),
    },
    "gradient_accumulation_fusion": {
        DEEPSPEED_PIPELINE: Since(
            2023,
            "the DeepSpeed-based forks of Megatron-LM branched before it",
            "PipelineEngine._exec_backward_pass -> BF16_Optimizer.update_hp_grads: a separate "
            "pass per micro-batch (fp16: autograd's own .grad accumulation)",
        ),
        EVERY: Since(
            2022,
            "Megatron-LM's fused weight-gradient accumulation, on by default",
            "NVIDIA/Megatron-LM commit 83b1e42f (2022-02-13) adds "
            "--no-gradient-accumulation-fusion",
        ),
    },
    "persist_layer_norm": {
        EVERY: Since(
            2022,
            "PyTorch 1.11 (2022)",
            "megatron/arguments.py: 'Persistent fused layer norm kernel is supported from "
            "pytorch v1.11', else no_persist_layer_norm (NVIDIA/Megatron-LM commit a2fdcdf0, "
            "2021-10-08)",
        ),
    },
    "flash_attention": {
        LLM_FOUNDRY: Since(
            2024,
            "llm-foundry's 2024 releases (attn_impl: flash); Triton FlashAttention before",
            "scripts/train/yamls/pretrain/mpt-*.yaml (attn_impl: triton @2a59782a); "
            "llmfoundry/models/layers/flash_attn_triton.py on triton_pre_mlir",
        ),
        EVERY: Since(
            2023,
            "FlashAttention (Dao et al., arXiv:2205.14135, 2022) in Megatron-LM",
            "NVIDIA/Megatron-LM commit d693034e (2022-12-08, 'Integrate FlashAttention into "
            "Megatron-LM', --use-flash-attn): runs dated by year take it from 2023",
        ),
    },
    "overlap_p2p_comm": {
        EVERY: Since(
            2023,
            "Megatron-LM --overlap-p2p-communication",
            "NVIDIA/Megatron-LM commit f9283c5a (2023-05-31)",
        ),
    },
    "overlap_grad_reduce": {
        EVERY: Since(
            2023,
            "Megatron-core DistributedDataParallel --overlap-grad-reduce",
            "NVIDIA/Megatron-LM commit 2d5220a4 (2023-08-16); Korthikanti et al. 2022 §6.3: "
            "their runs did not overlap it",
        ),
    },
    "megatron_core_ddp": {
        NVIDIA_MEGATRON: Since(
            2023,
            "Megatron-core's DistributedDataParallel (bucketed)",
            "replaced Megatron-LM's legacy --DDP-impl local (megatron/model/distributed.py); "
            "megatron.core.distributed from NVIDIA/Megatron-LM commit 25c7eb28 (2023-10-18)",
        ),
    },
    "megatron_core": {
        NVIDIA_MEGATRON: Since(
            2023,
            "Megatron-Core core_r0.2.0 onwards",
            "NVIDIA/Megatron-LM release tags; megatron/core begins with commit 2e6a46e4 "
            "(2022-09-22), --use-mcore-models with f3377899 (2023-09-18)",
        ),
    },
    "distributed_optimizer": {
        NVIDIA_MEGATRON: Since(
            2022,
            "Megatron-LM --use-distributed-optimizer (2022 releases)",
            "NVIDIA/Megatron-LM commit 329fe582 (2022-02-10); M02 dist_optimizer.md; after "
            "the SC21 runs",
        ),
    },
    "grad_reduce_in_bf16": {
        NEMO: Since(
            2024,
            "Megatron-core DistributedDataParallelConfig(grad_reduce_in_fp32=False)",
            "NeMo 2's bf16_with_fp8_mixed recipe ('NVIDIA recommends False for FP8'), 2024",
        ),
        NVIDIA_MEGATRON: Since(
            2025,
            "Megatron-LM --grad-reduce-in-bf16",
            "NVIDIA/Megatron-LM commit d165a854 (2025-02-26); before it "
            "megatron/training/arguments.py set accumulate_allreduce_grads_in_fp32 for every "
            "bf16 run ('bfloat16 requires gradient accumulation and all-reduce to be done in "
            "fp32')",
        ),
    },
    "interleaved_pp2": {
        NVIDIA_MEGATRON: Since(
            2024,
            "Megatron-LM commit 3ee489d9 (2024-05-31, 'Enable virtual pipelining and P2P "
            "communication overlap at PP=2')",
            "NVIDIA/Megatron-LM issue #750, maintainer's reply of 2024-06-06 (commit "
            "152c5620): interleaving needed pp > 2 until then",
        ),
        EVERY: Since(ALWAYS, "every pipelining framework", "no pp > 2 rule elsewhere"),
    },
    "zero_bubble": {
        EVERY: Since(
            2024,
            "Qi et al., 'Zero Bubble Pipeline Parallelism', ICLR 2024 (arXiv:2401.10241)",
            "January 2024",
        ),
    },
    "uneven_pipeline": {
        DEEPSPEED: Since(
            ALWAYS,
            "DeepSpeed's PipelineModule",
            "partitions layers unevenly from the pipeline engine's first commit "
            "(microsoft/DeepSpeed 65c2f974, 2020-09-09, #392)",
        ),
        EVERY: Since(
            2024,
            "Megatron-LM --decoder-first/last-pipeline-num-layers",
            "NVIDIA/Megatron-LM commit fa8bb592 (2024-09-05); issue #857 (June 2024) asks how "
            "to set per-stage counts",
        ),
    },
    "zero3_prefetch": {
        DEEPSPEED: Since(
            2022,
            "DeepSpeed's bucketed ZeRO-3 prefetch (PartitionedParameterCoordinator rework)",
            "microsoft/DeepSpeed commit 4912e0ad (2022-01-20, #1453, 'Various ZeRO Stage3 "
            "Optimizations + Improvements'); v0.3.x partition_parameters.py fetched per "
            "tensor, synchronously",
        ),
        EVERY: Since(ALWAYS, "layer-wise prefetch", "PyTorch FSDP and the rest"),
    },
}


def row_tags(
    *,
    nvidia_megatron: bool,
    nemo: bool = False,
    deepspeed: bool,
    deepspeed_pipeline: bool,
    llm_foundry: bool,
    torchtitan: bool,
) -> frozenset[str]:
    """The tags of a row's framework from the predicates ``plansim.planner.run_framework``
    reads its framework cell with."""
    named = (
        (NVIDIA_MEGATRON, nvidia_megatron),
        (NEMO, nemo),
        (DEEPSPEED, deepspeed),
        (DEEPSPEED_PIPELINE, deepspeed_pipeline),
        (LLM_FOUNDRY, llm_foundry),
        (TORCHTITAN, torchtitan),
    )
    return frozenset(tag for tag, has in named if has)


def since(feature: str, tags: frozenset[str]) -> Since | None:
    """When a framework with ``tags`` got ``feature``: its first listed tag's entry, else
    the ``"*"`` one; None when it never had it.

    Raises:
        KeyError: an unknown feature (the message lists them).
    """
    if feature not in FEATURES:
        raise KeyError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
    entries = FEATURES[feature]
    for tag, entry in entries.items():
        if tag != EVERY and tag in tags:
            return entry
    return entries.get(EVERY)


def available(feature: str, tags: frozenset[str], year: int | None) -> bool:
    """Whether a run of ``year`` (None: undated, searched as the latest release) on a
    framework with ``tags`` could use ``feature``.

    Raises:
        KeyError: an unknown feature.
    """
    entry = since(feature, tags)
    if entry is None:
        return False
    return year is None or year >= entry.year


def first_year(feature: str, tags: frozenset[str]) -> int | None:
    """:attr:`Since.year` of :func:`since` (None: never).

    Raises:
        KeyError: an unknown feature.
    """
    entry = since(feature, tags)
    return None if entry is None else entry.year


def undated_note(framework: str, tags: frozenset[str]) -> str | None:
    """The note of an undated row whose framework plansim knows (a tag): which release it
    was searched as; None for an unknown framework (searched over everything anyway)."""
    if not tags:
        return None
    return (
        f"undated {framework} run: searched as its latest release (every feature of "
        "plansim.planner.framework_releases it has)"
    )
