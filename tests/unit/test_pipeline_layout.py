"""Megatron-Core pipeline layout strings: parsing, the balanced layout, and plans that use one."""

from __future__ import annotations

import pytest

from plansim.catalog import MOE_PRESETS
from plansim.errors import SpecError
from plansim.specs.layer_split import pipeline_layer_counts, stage_layer_counts
from plansim.specs.pipeline_layout import balanced_layout, expand_layout, layout_stage_layers
from plansim.specs.plan import Schedule, plan_from_fields


def test_deepseek_v3_guide_layout() -> None:
    # Megatron-LM's DeepSeek-V3 GB200 guide: pp 8 x vpp 4, "Et|(tt|)*30L"
    counts = layout_stage_layers("Et|(tt|)*30L", num_stages=32)
    assert counts == (1, *([2] * 30), 0)
    assert sum(counts) == 61
    assert balanced_layout(61, num_stages=32) == "Et|(tt|)*30L"


def test_repeats_and_groups_expand() -> None:
    assert expand_layout("Et*3|(tt|)*2t*2L") == ("Ettt", "tt", "tt", "ttL")
    assert expand_layout("((t|)*2)*2tL") == ("t", "t", "t", "t", "tL")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("Ex|tL", "unknown symbol"),
        ("(Et|tL", "unbalanced"),
        ("tE|tL", None),
        ("Et|Lt|t", "'L' sits in stage 1"),
        ("", "non-empty"),
    ],
)
def test_bad_layouts_name_the_problem(text: str, match: str | None) -> None:
    if match is None:  # E in the first stage, but not first in it: still the first stage
        assert layout_stage_layers(text, num_stages=2) == (1, 1)
        return
    with pytest.raises(SpecError, match=match):
        layout_stage_layers(text, num_stages=3)


def test_stage_count_must_match_the_plan() -> None:
    with pytest.raises(SpecError, match="has 3 stages; pp x vpp = 4"):
        plan_from_fields(
            dp=1, tp=1, pp=4, micro_batch_size=1, global_batch_size=4,
            pipeline_model_parallel_layout="Et|tt|tL",
        )  # fmt: skip


@pytest.mark.parametrize(("layers", "stages"), [(61, 16), (94, 48), (10, 3), (7, 2), (126, 128)])
def test_balanced_layout_holds_every_layer(layers: int, stages: int) -> None:
    counts = layout_stage_layers(balanced_layout(layers, num_stages=stages), num_stages=stages)
    assert sum(counts) == layers
    slots = [c + (i == 0) + (i == stages - 1) for i, c in enumerate(counts)]
    assert max(slots) - min(slots) <= 1  # embedding and loss each a layer's slot


def test_plan_with_a_layout_splits_the_model() -> None:
    model = MOE_PRESETS["deepseek-v3"]()
    plan = plan_from_fields(
        dp=32, tp=1, pp=8, vpp=4, ep=32, micro_batch_size=1, global_batch_size=2048,
        schedule=Schedule.INTERLEAVED_1F1B, pipeline_model_parallel_layout="Et|(tt|)*30L",
    )  # fmt: skip
    assert stage_layer_counts(model.num_layers, plan)[:2] == (1, 2)
    assert pipeline_layer_counts(model.num_layers, plan) == (7, 8, 8, 8, 8, 8, 8, 6)
    assert "layout-Et|(tt|)*30L" in plan.label()
    with pytest.raises(SpecError, match="holds 61 layers; the model has num_layers"):
        stage_layer_counts(60, plan)
    with pytest.raises(SpecError, match="leave decoder_first"):
        plan_from_fields(
            dp=32, tp=1, pp=8, vpp=4, micro_batch_size=1, global_batch_size=2048,
            schedule=Schedule.INTERLEAVED_1F1B, pipeline_model_parallel_layout="Et|(tt|)*30L",
            decoder_first_pipeline_num_layers=3,
        )  # fmt: skip
