"""The release table of what each framework could run (plansim.planner.framework_releases)
and its use by the back-test's search space."""

from __future__ import annotations

import pytest

from plansim.io.runs import RunRow
from plansim.planner.framework_releases import (
    ALWAYS,
    DEEPSPEED,
    DEEPSPEED_PIPELINE,
    EVERY,
    FEATURES,
    LLM_FOUNDRY,
    NEMO,
    NVIDIA_MEGATRON,
    available,
    first_year,
    since,
    undated_note,
)
from plansim.planner.run_framework import framework_tags
from plansim.planner.run_space import row_space
from plansim.specs.plan import AttentionKernel


def _row(framework: str, **cells: str) -> RunRow:
    base = {"row_id": "Z1", "precision": "bf16", "num_gpus": "64", "framework": framework}
    return RunRow(path="runs.csv", line=2, cells={**base, **cells})


def test_every_entry_names_its_release_and_source() -> None:
    for feature, entries in FEATURES.items():
        assert entries, feature
        for tag, entry in entries.items():
            assert entry.release.strip() and entry.source.strip(), (feature, tag)
            assert entry.year == ALWAYS or 2019 <= entry.year <= 2026, (feature, tag)


def test_a_framework_takes_its_own_entry_else_the_default() -> None:
    fork = frozenset({DEEPSPEED, DEEPSPEED_PIPELINE})
    assert first_year("sequence_parallel", fork) == 2023
    assert first_year("sequence_parallel", frozenset({NVIDIA_MEGATRON})) == 2022
    assert first_year("flash_attention", frozenset({LLM_FOUNDRY})) == 2024
    assert first_year("flash_attention", frozenset()) == 2023
    # only NVIDIA's Megatron family has a distributed optimizer of its own
    assert since("distributed_optimizer", fork) is None
    assert not available("distributed_optimizer", fork, None)
    assert available("distributed_optimizer", frozenset({NVIDIA_MEGATRON}), None)
    assert not available("distributed_optimizer", frozenset({NVIDIA_MEGATRON}), 2021)
    assert available("uneven_pipeline", frozenset({DEEPSPEED}), 2020)
    assert EVERY in FEATURES["zero_bubble"]


def test_an_unknown_feature_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: interleaved_1f1b"):
        available("cuda_graphs", frozenset(), 2024)


@pytest.mark.parametrize(
    ("framework", "tags"),
    [
        ("Megatron-LM (2021)", {NVIDIA_MEGATRON}),
        ("NeMo 24.07", {NVIDIA_MEGATRON, NEMO}),
        ("Megatron-Bridge 25.11 (Megatron-core, 2025)", {NVIDIA_MEGATRON, NEMO}),
        ("Megatron-DeepSpeed (2022)", {DEEPSPEED, DEEPSPEED_PIPELINE}),
        ("Megatron-LM (PTD-P) / DeepSpeed ZeRO-3", {DEEPSPEED}),
        ("llm-foundry (Composer, PyTorch FSDP, 2023)", {LLM_FOUNDRY}),
        ("torchtitan (FSDP2, 2024)", {"torchtitan"}),
        ("", set()),
    ],
)
def test_rows_are_tagged_by_their_framework_cell(framework: str, tags: set[str]) -> None:
    assert framework_tags(_row(framework)) == frozenset(tags)


def test_the_search_space_follows_the_release_of_the_run() -> None:
    notes: list[str] = []
    space = row_space(_row("Megatron-DeepSpeed (2022)", tp="4", pp="12"), notes)
    assert space.sequence_parallel == (False,)
    assert space.execution.gradient_accumulation_fusion is False
    assert space.execution.attention is AttentionKernel.UNFUSED
    later = row_space(_row("Megatron-DeepSpeed (2023)", tp="4", pp="12"), [])
    assert later.sequence_parallel == (False, True)
    assert later.execution.attention is AttentionKernel.FLASH


def test_an_undated_row_of_a_known_framework_says_which_release_it_assumed() -> None:
    notes: list[str] = []
    space = row_space(_row("Megatron-LM", tp="8"), notes)
    assert space.sequence_parallel == (False, True)  # the latest release: every feature
    assert any(
        n.startswith("undated Megatron-LM run: searched as its latest release") for n in notes
    )
    quiet: list[str] = []
    row_space(_row("Megatron-LM (2021)", tp="8"), quiet)
    assert not any(n.startswith("undated") for n in quiet)
    assert undated_note("some framework", frozenset()) is None


@pytest.mark.parametrize(
    ("framework", "modes"),
    [
        ("Megatron-LM (2024)", (False,)),  # its CLI forced fp32 reduction for bf16 until 2025
        ("Megatron-LM (2025)", (False, True)),
        ("NeMo 24.07 (Megatron-core, 2024)", (False, True)),
        ("Megatron-Bridge 25.11 (Megatron-core, 2025)", (False, True)),
        ("Megatron-LM (2023)", (False,)),
    ],
)
def test_bf16_gradient_reduction_follows_the_framework_that_configures_it(
    framework: str, modes: tuple[bool, ...]
) -> None:
    space = row_space(_row(framework, tp="8"), [])
    assert space.grad_reduce_in_bf16 == modes
