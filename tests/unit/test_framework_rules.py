"""What a published run's framework and date allow the back-test's search:

* Megatron-LM refused interleaved 1F1B with two pipeline ranks until mid-2024 ("pipeline-model-
  parallel size should be greater than 2 with interleaved schedule"; relaxed after
  NVIDIA/Megatron-LM issue #750);
* the DeepSpeed-based forks of Megatron-LM before 2023 (BLOOM's, GPT-NeoX) accumulate each
  micro-batch's weight gradients in a separate pass (plain ``F.linear``; DeepSpeed's pipeline
  engine calls ``update_hp_grads`` after every micro-batch's backward).
"""

from __future__ import annotations

import pytest

from plansim.analytic.layer_timing import layer_wall_times
from plansim.analytic.sustained import job_compute_profile
from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.framework_releases import NVIDIA_MEGATRON, first_year
from plansim.planner.run_framework import min_interleaved_pp
from plansim.planner.run_space import row_space, run_year
from plansim.specs.plan import Precision, Recompute, Schedule, plan_from_fields


def _row(**cells: str) -> RunRow:
    base = {"row_id": "Z1", "precision": "fp16", "num_gpus": "64", "tp": "8"}
    return RunRow(path="runs.csv", line=2, cells={**base, **cells})


@pytest.mark.parametrize(
    ("framework", "fewest"),
    [
        ("Megatron-LM (2021)", 3),
        ("Megatron-LM (2023)", 3),
        ("NeMo (nvcr.io/nvidia/nemo:23.11)", 3),
        ("Megatron-LM (2024)", 2),
        ("NeMo 24.07", 2),
        ("Megatron-Bridge 25.11", 2),
        ("torchtitan (2024)", 2),
        ("PyTorch 2.1 FSDP", 2),
        ("", 2),
    ],
)
def test_fewest_interleaved_ranks_by_framework_and_date(framework: str, fewest: int) -> None:
    row = _row(framework=framework)
    assert first_year("interleaved_pp2", frozenset({NVIDIA_MEGATRON})) == 2024
    assert min_interleaved_pp(row, run_year(row)) == fewest
    notes: list[str] = []
    assert row_space(row, notes).min_interleaved_pp == fewest
    assert any("interleaving only with pp >= 3" in n for n in notes) is (fewest == 3)


def _interleaved_pps(space: SearchSpace) -> set[int]:
    plans = enumerate_plans(num_gpus=64, global_batch_size=64, space=space, num_layers=48)
    return {p.pp for p in plans if p.schedule is Schedule.INTERLEAVED_1F1B}


def test_search_drops_interleaving_on_two_ranks_only() -> None:
    space = SearchSpace(tp=(8,), zero_stages=(0,), micro_batch_size=(1,), max_vpp=4)
    assert _interleaved_pps(space) == {2, 4, 8}
    old_megatron = SearchSpace(
        tp=(8,), zero_stages=(0,), micro_batch_size=(1,), max_vpp=4, min_interleaved_pp=3
    )
    assert _interleaved_pps(old_megatron) == {4, 8}
    flat = {
        p.pp
        for p in enumerate_plans(
            num_gpus=64, global_batch_size=64, space=old_megatron, num_layers=48
        )
        if p.schedule is Schedule.ONE_F_ONE_B
    }
    assert 2 in flat  # pp 2 stays, without interleaving


def test_a_stated_vpp_is_kept_whatever_the_rule() -> None:
    space = SearchSpace(tp=(8,), zero_stages=(0,), micro_batch_size=(1,), vpps=(2,))
    stated = SearchSpace(
        tp=(8,), zero_stages=(0,), micro_batch_size=(1,), vpps=(2,), min_interleaved_pp=3
    )
    assert _interleaved_pps(stated) == _interleaved_pps(space) == {2, 4, 8}


@pytest.mark.parametrize(
    ("framework", "fused"),
    [
        ("Megatron-DeepSpeed (2022)", False),
        ("Megatron-DeepSpeed (2021)", False),
        ("GPT-NeoX (2022)", False),
        ("Megatron-DeepSpeed (2024)", True),
        ("Megatron-LM (2022)", True),
        ("NeMo 24.07", True),
        ("Megatron-LM (2021)", False),  # before the fusion existed at all
    ],
)
def test_gradient_accumulation_fusion_by_framework_and_date(framework: str, fused: bool) -> None:
    notes: list[str] = []
    space = row_space(_row(framework=framework), notes)
    assert space.execution.gradient_accumulation_fusion is fused


def test_the_fork_pays_a_separate_accumulation_pass_per_micro_batch() -> None:
    """BLOOM's layout (tp4 pp12, mbs 2, bf16, full recompute): unfused, one layer's backward
    also reads the bf16 weight gradient and reads and writes its fp32 copy (2 + 4 + 4 bytes
    per local parameter) at the streaming bandwidth."""
    model = resolve_model("bloom-176b")
    profile = load_profile("a100-sxm4-80gb")
    fused = plan_from_fields(
        tp=4,
        pp=12,
        dp=8,
        micro_batch_size=2,
        global_batch_size=2048,
        recompute=Recompute.FULL,
        zero_stage=1,
        precision=Precision.BF16,
    )
    unfused = fused.with_fields(gradient_accumulation_fusion=False)
    extra_s = (
        layer_wall_times(model, unfused, profile).backward_s
        - layer_wall_times(model, fused, profile).backward_s
    )
    h = model.hidden_size
    # QKV, projection and the two MLP matrices split over tp 4; biases and norms are < 0.1%
    local_params = (4 * h * h + 2 * h * model.ffn_hidden_size) / 4
    job = job_compute_profile(profile, fused.num_gpus)
    assert extra_s == pytest.approx(local_params * 10 / job.streaming_bytes_per_s(), rel=0.01)
