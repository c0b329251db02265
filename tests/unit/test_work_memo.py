"""A search's shared costing memo never hands one plan another plan's work."""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.specs.plan import (
    AttentionKernel,
    DpSync,
    Precision,
    Recompute,
    Schedule,
    Zero3ParamFetch,
    plan_from_fields,
)

MODEL = resolve_model("llama2-7b")
H100 = load_profile("h100-sxm5-80gb")
BASE = plan_from_fields(
    dp=4,
    tp=2,
    pp=2,
    micro_batch_size=1,
    global_batch_size=16,
    zero_stage=1,
    recompute=Recompute.NONE,
    precision=Precision.BF16,
    overlap_grad_reduce=True,
)

# One plan field changed at a time: each changes the work (checked below), so a memo key
# that leaves the field out hands the second plan the first plan's work.
VARIANTS: dict[str, dict[str, object]] = {
    "grad_reduce_in_bf16": {"grad_reduce_in_bf16": True},
    "gradient_accumulation_fusion": {"gradient_accumulation_fusion": False},
    "precision": {"precision": Precision.FP8},
    "recompute": {"recompute": Recompute.FULL},
    "sequence_parallel": {"sequence_parallel": True},
    "attention": {"attention": AttentionKernel.UNFUSED},
    "zero_stage": {"zero_stage": 2},
    "overlap_grad_reduce": {"overlap_grad_reduce": False},
    "micro_batch_size": {"micro_batch_size": 2},
    "vpp": {"vpp": 2, "schedule": Schedule.INTERLEAVED_1F1B},
    "dp_sync": {"dp_sync": DpSync.PARAMETER_SERVER, "zero_stage": 0},
    "zero3_param_fetch": {
        "zero_stage": 3,
        "zero3_param_fetch": Zero3ParamFetch.PER_TENSOR_SYNC,
        "overlap_grad_reduce": False,
    },
    "scatter_gather_p2p": {"scatter_gather_p2p": False},
    "dp_shard": {"dp_shard": 2},  # ZeRO-1 with a partial distributed optimizer
    "dp_shard zero3": {"zero_stage": 3, "dp_shard": 2, "overlap_grad_reduce": False},
}


#: The same, on a plan without gradient-accumulation fusion (where the per-layer pass times
#: depend on the gradient dtype too: the separate accumulation pass).
UNFUSED = {"gradient_accumulation_fusion": False}
#: An fp8 plan, beside which some layers run in bf16 (``num_layers_at_*_in_bf16``).
FP8 = {"precision": Precision.FP8}


@pytest.mark.parametrize(
    ("first", "second"),
    [({}, changes) for changes in VARIANTS.values()]
    + [(UNFUSED, {**UNFUSED, "grad_reduce_in_bf16": True})]
    + [(FP8, {**FP8, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 2})],
    ids=[*VARIANTS, "grad_reduce_in_bf16 without fusion", "bf16 layers under fp8"],
)
def test_a_plan_costed_after_its_neighbour_gets_its_own_work(
    first: dict[str, object], second: dict[str, object]
) -> None:
    neighbour = BASE.with_fields(**first)  # type: ignore[arg-type]
    variant = BASE.with_fields(**second)  # type: ignore[arg-type]
    alone = build_pipeline_work(MODEL, variant, H100)
    assert alone != build_pipeline_work(MODEL, neighbour, H100), "the change must matter"
    memo: dict[object, object] = {}
    build_pipeline_work(MODEL, neighbour, H100, memo=memo)
    assert build_pipeline_work(MODEL, variant, H100, memo=memo) == alone
