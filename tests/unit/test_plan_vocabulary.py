"""The plan vocabulary: ParallelDims, the option groups, the flat-field builder and the
cross-group rules of ParallelPlan."""

from __future__ import annotations

import functools
import pickle
import random

import pytest

from plansim.errors import SpecError
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.specs.execution import AttentionKernel, ExecutionSpec, Framework
from plansim.specs.layer_split import check_plan_divides_model
from plansim.specs.parallel_dims import ParallelDims
from plansim.specs.plan import (
    FIELD_GROUP,
    GROUPS,
    PLAN_FIELDS,
    BatchOptions,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    ShardingOptions,
    plan_from_fields,
)
from plansim.specs.sharding import DpSync

DEMO = {
    "dp": 32,
    "tp": 4,
    "pp": 8,
    "vpp": 6,
    "micro_batch_size": 1,
    "global_batch_size": 1536,
    "zero_stage": 1,
    "sequence_parallel": True,
    "schedule": Schedule.INTERLEAVED_1F1B,
    "overlap_p2p_comm": True,
    "overlap_grad_reduce": True,
}


def test_every_flat_field_lives_in_exactly_one_group() -> None:
    names = [n for _, cls in GROUPS for n in cls.__dataclass_fields__]
    assert len(names) == len(set(names)) == len(PLAN_FIELDS)
    assert set(names) == set(PLAN_FIELDS)
    plan = plan_from_fields(**DEMO)
    for name in PLAN_FIELDS:  # the flat read is the group's field
        assert getattr(plan, name) == getattr(getattr(plan, FIELD_GROUP[name]), name)


def test_flat_builder_places_fields_in_their_groups() -> None:
    plan = plan_from_fields(**DEMO)
    assert plan.dims == ParallelDims(dp=32, tp=4, pp=8, vpp=6, sequence_parallel=True)
    assert plan.batch == BatchOptions(micro_batch_size=1, global_batch_size=1536)
    assert plan.sharding == ShardingOptions(zero_stage=1)
    assert plan.execution == ExecutionSpec()
    assert plan.num_gpus == 1024 and plan.num_microbatches == 48 and plan.num_stages == 48
    assert (
        plan.label()
        == "tp4 pp8 dp32 vpp6 mbs1 zero1 none sp interleaved-1f1b overlap-p2p overlap-grad"
    )
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_with_fields_is_the_flat_rebuild() -> None:
    plan = plan_from_fields(**DEMO)
    changed = plan.with_fields(zero_stage=2, precision=Precision.FP8, tp=2, dp=64)
    assert changed == plan_from_fields(
        **(DEMO | {"zero_stage": 2, "precision": Precision.FP8, "tp": 2, "dp": 64})
    )
    assert changed.execution is plan.execution  # untouched groups are shared, not copied
    with pytest.raises(
        SpecError, match=r"plan field 'tensor_parallel' is not known; choose from: dp, tp"
    ):
        plan.with_fields(tensor_parallel=2)


def test_builder_errors_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"plan needs micro_batch_size, global_batch_size"):
        plan_from_fields(dp=1, tp=1, pp=1)
    with pytest.raises(
        SpecError, match=r"plan.zero_stage=4 is not allowed; choose one of: 0, 1, 2, 3"
    ):
        plan_from_fields(**(DEMO | {"zero_stage": 4}))
    with pytest.raises(
        SpecError, match=r"plan.schedule='1F1B' is not allowed; choose one of: gpipe, 1f1b"
    ):
        plan_from_fields(**(DEMO | {"schedule": "1F1B"}))
    with pytest.raises(
        SpecError, match=r"plan.overlap_grad_reduce=1 is not allowed; choose one of: True, False"
    ):
        plan_from_fields(**(DEMO | {"overlap_grad_reduce": 1}))
    with pytest.raises(
        SpecError,
        match=r"plan.global_batch_size\(1000\) is not divisible by "
        r"micro_batch_size\(1\) \* dp\(32\) = 32",
    ):
        plan_from_fields(**(DEMO | {"global_batch_size": 1000}))
    with pytest.raises(SpecError, match=r"plan.framework='nemo' is not allowed"):
        plan_from_fields(**(DEMO | {"framework": "nemo"}))
    with pytest.raises(SpecError, match=r"plan.framework_version must be a non-empty string"):
        plan_from_fields(**(DEMO | {"framework_version": 2021}))
    with pytest.raises(SpecError, match=r"plan.dims must be a ParallelDims, got dict"):
        batch = BatchOptions(micro_batch_size=1, global_batch_size=1)
        ParallelPlan(dims={"dp": 1}, batch=batch)  # type: ignore[arg-type]


def test_cross_group_rules_stay_on_the_plan() -> None:
    with pytest.raises(SpecError, match=r"plan.overlap_p2p_comm needs schedule interleaved-1f1b"):
        plan_from_fields(**(DEMO | {"vpp": 1, "schedule": Schedule.ONE_F_ONE_B}))
    with pytest.raises(SpecError, match=r"plan.tp_comm_overlap needs sequence_parallel"):
        plan_from_fields(**(DEMO | {"sequence_parallel": False, "tp_comm_overlap": True}))
    with pytest.raises(SpecError, match=r"plan.dp_shard\(3\) needs a divisor of dp\(32\)"):
        plan_from_fields(**(DEMO | {"dp_shard": 3}))
    with pytest.raises(SpecError, match=r"plan.cp\(2\) needs attention flash"):
        plan_from_fields(
            dp=1, tp=1, pp=1, cp=2, micro_batch_size=1, global_batch_size=1,
            attention=AttentionKernel.UNFUSED,
        )  # fmt: skip
    # a rule inside one group is the group's own: no plan needed to see it
    with pytest.raises(SpecError, match=r"plan.dp_sync parameter-server needs zero_stage 0"):
        ShardingOptions(zero_stage=1, dp_sync=DpSync.PARAMETER_SERVER)


def test_parallel_dims_names_every_value() -> None:
    with pytest.raises(SpecError, match=r"plan.cp must be a positive integer, got 0"):
        ParallelDims(dp=1, tp=1, pp=1, cp=0)
    with pytest.raises(SpecError, match=r"plan.sequence_parallel needs tp > 1"):
        ParallelDims(dp=2, tp=1, pp=1, sequence_parallel=True)
    with pytest.raises(
        SpecError,
        match=r"plan.ep\(3\) \* etp\(1\) = 3 does not divide tp\(2\) \* cp\(1\) \* dp\(4\) = 8",
    ):
        ParallelDims(dp=4, tp=2, pp=2, ep=3, etp=1)


def test_parallel_dims_fold_the_expert_layers_onto_the_same_ranks() -> None:
    # Liu et al. 2025 (arXiv 2504.14960) §3: attention tp x cp x dp, experts etp x ep x edp
    dims = ParallelDims(dp=8, tp=2, pp=4, cp=2, ep=8, etp=1)
    assert dims.num_gpus == 128
    assert dims.edp == 4  # 2 * 2 * 8 / (1 * 8)
    assert dims.mesh_dims == (("pp", 4), ("dp", 8), ("cp", 2), ("tp", 2))
    assert dims.expert_mesh_dims == (("pp", 4), ("edp", 4), ("ep", 8), ("etp", 1))
    dense = ParallelDims(dp=8, tp=2, pp=4)
    assert dense.expert_tensor_parallel_size == 2 and dense.edp == 8  # etp defaults to tp
    moe = plan_from_fields(dp=8, tp=2, pp=4, ep=4, micro_batch_size=1, global_batch_size=32)
    assert "ep4" in moe.label()
    reason = check_plan_divides_model(
        moe, num_layers=32, num_attention_heads=32, num_query_groups=8
    )
    assert reason is not None and "this model is dense" in reason


@functools.cache
def _sample_plans(count: int, seed: int) -> list[ParallelPlan]:
    """``count`` plans drawn from a wide planner search space, some with execution and
    expert fields set as a user's file would."""
    space = SearchSpace(
        cp=(1, 2),
        partial_recompute=True,
        overlap_param_gather=(False, True),
        tp_comm_overlap=(False, True),
        reshard_after_forward=(True, False),
        grad_reduce_in_bf16=(False, True),
        hsdp_shard_gpus=8,
        dp_syncs=tuple(DpSync),
    )
    every = list(enumerate_plans(num_gpus=64, global_batch_size=512, space=space, num_layers=32))
    rng = random.Random(seed)
    plans = rng.sample(every, count)
    for i in range(0, count, 7):
        plans[i] = plans[i].with_fields(framework=Framework.TORCHTITAN, framework_version="0.2.0")
    return plans


def test_sample_covers_the_option_groups() -> None:
    plans = _sample_plans(1000, seed=0)
    assert len(set(plans)) == 1000
    for name in ("zero_stage", "recompute", "schedule", "dp_shard", "dp_sync", "cp", "framework"):
        assert len({getattr(p, name) for p in plans}) > 1, name
    assert any(p.recompute is Recompute.FULL and p.recompute_num_layers for p in plans)
