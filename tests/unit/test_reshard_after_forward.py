"""ZeRO-3 without resharding after forward (``plan.reshard_after_forward`` False: PyTorch FSDP2
``reshard_after_forward=False``, FSDP1 ``SHARD_GRAD_OP``). Worked on the round-number profile.
"""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import plan_state_bytes, rank_memory, rank_parameters
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.run_space import row_space
from plansim.report.tables import ranked_table
from plansim.specs.plan import ParallelPlan, Zero3ParamFetch
from plansim.validate.simulated import run_plan, simulate_plan
from tests.unit.synthetic import round_profile
from tests.unit.test_validate_framework_overhead import _profile
from tests.unit.test_zero2 import MODEL, _evaluate
from tests.unit.test_zero2 import _plan as zero2_plan


def _plan(**kw: object) -> ParallelPlan:
    """test_zero2's plan (dp 2, pp 2, 8 micro-batches) as ZeRO-3 kept gathered since forward."""
    return zero2_plan(**{"zero_stage": 3, "reshard_after_forward": False, **kw})


def _dp_comm(segments: tuple) -> list:  # type: ignore[type-arg]
    return [seg for seg in segments if seg.kind == "dp_comm"]


@pytest.mark.parametrize("fetch", [Zero3ParamFetch.LAYER_PREFETCH, Zero3ParamFetch.LAYER_SYNC])
def test_the_backward_gathers_nothing_and_still_reduce_scatters(fetch: Zero3ParamFetch) -> None:
    prof = round_profile()
    kept = build_pipeline_work(MODEL, _plan(zero3_param_fetch=fetch), prof)
    resharded = build_pipeline_work(
        MODEL, _plan(zero3_param_fetch=fetch, reshard_after_forward=True), prof
    )
    for k, r in zip(kept.stages, resharded.stages, strict=True):
        assert _dp_comm(k.forward) == _dp_comm(r.forward)  # the forward gathers as before
        k_bytes = sum(seg.num_bytes for seg in _dp_comm(k.backward))
        r_bytes = sum(seg.num_bytes for seg in _dp_comm(r.backward))
        gathered = sum(seg.num_bytes for seg in _dp_comm(r.forward))
        assert r_bytes - k_bytes == pytest.approx(gathered, rel=1e-12) and gathered > 0
        k_s = sum(seg.duration_s for seg in _dp_comm(k.backward))
        assert 0 < k_s < sum(seg.duration_s for seg in _dp_comm(r.backward))
    plans = (
        _plan(zero3_param_fetch=fetch),
        _plan(zero3_param_fetch=fetch, reshard_after_forward=True),
    )
    faster, slower = (_evaluate(p).step_time_s for p in plans)
    assert faster < slower


def test_the_rank_holds_all_its_parameters_gathered() -> None:
    prof = round_profile()
    kept = rank_memory(MODEL, _plan(), prof, rank=0)
    resharded = rank_memory(MODEL, _plan(reshard_after_forward=True), prof, rank=0)
    held = rank_parameters(MODEL, _plan(), rank=0) * plan_state_bytes(_plan()).param
    layer_pair = (
        resharded.transient_bytes
        - rank_memory(
            MODEL, _plan(zero_stage=1, reshard_after_forward=True), prof, rank=0
        ).transient_bytes
    )
    assert kept.transient_bytes - resharded.transient_bytes == pytest.approx(
        held - layer_pair, rel=1e-12
    )
    assert held > 4 * layer_pair


@pytest.mark.parametrize(
    "kw, got",
    [
        ({"zero_stage": 2}, "got zero_stage 2, zero3_param_fetch layer-prefetch"),
        (
            {"zero3_param_fetch": Zero3ParamFetch.PER_TENSOR_SYNC},
            "got zero_stage 3, zero3_param_fetch per-tensor-sync",
        ),
    ],
)
def test_it_needs_zero3_with_a_per_layer_fetch(kw: dict, got: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(SpecError) as err:
        _plan(**kw)
    assert "plan.reshard_after_forward=False needs zero_stage 3" in str(err.value)
    assert got in str(err.value)
    with pytest.raises(SpecError, match=r"plan\.reshard_after_forward='no' is not allowed"):
        _plan(reshard_after_forward="no")


def test_simulate_flag_and_label(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no-reshard" in _plan().label()
    assert "no-reshard" not in _plan(reshard_after_forward=True).label()
    args = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "16"]
    args += ["--tp", "1", "--pp", "2", "--mbs", "1", "--gbs", "16", "--zero", "3"]
    assert main([*args, "--no-reshard-after-forward", "--format", "json"]) == 0
    assert '"reshard_after_forward": false' in capsys.readouterr().out
    assert main([*args[:-2], "--zero", "2", "--no-reshard-after-forward"]) == 2
    assert "plan.reshard_after_forward=False needs zero_stage 3" in capsys.readouterr().err


def test_the_planner_also_tries_it_for_zero3_plans_only() -> None:
    def plans(values: tuple[bool, ...]) -> list[ParallelPlan]:
        space = SearchSpace(reshard_after_forward=values)
        return list(enumerate_plans(num_gpus=8, global_batch_size=16, space=space))

    both, default = plans((True, False)), plans((True,))
    kept = [p for p in both if not p.reshard_after_forward]
    assert kept and all(p.zero_stage == 3 for p in kept)
    assert sorted(p.label() for p in both if p.reshard_after_forward) == sorted(
        p.label() for p in default
    )
    assert len(kept) == sum(p.zero_stage == 3 for p in default)
    assert all(p.reshard_after_forward for p in default)


def test_the_validator_prices_its_zero2_run_as_zero3_kept_gathered() -> None:
    # FSDP2 shards a ZeRO-2 run's parameters at rest and keeps them gathered from each
    # micro-batch's forward to its backward: one gather and one reduce-scatter per micro-batch
    plan = zero2_plan().with_fields(pp=1, global_batch_size=8)
    executed = run_plan(plan, _profile(), dtype="bf16")
    assert (executed.zero_stage, executed.reshard_after_forward) == (3, False)
    rows = simulate_plan(MODEL, plan, _profile(), dtype="bf16").result.timeline
    assert (rows["kind"] == "dp_comm").sum() == 2 * plan.num_microbatches


@pytest.mark.parametrize(
    "kw",
    [
        {},  # kept gathered since forward
        {"reshard_after_forward": True, "zero3_param_fetch": Zero3ParamFetch.PER_STEP},
    ],
)
def test_engine_peak_memory_equals_analytic(kw: dict) -> None:  # type: ignore[type-arg]
    plan = _plan(**kw)
    ev = _evaluate(plan)
    for rank in range(plan.pp):
        total = rank_memory(MODEL, plan, round_profile(), rank=rank).total_bytes
        assert ev.result.peak_memory_bytes[rank] == pytest.approx(total, rel=1e-12)


def test_the_ranked_table_says_when_zero3_parameters_are_released() -> None:
    evs = [_evaluate(p) for p in (_plan(), _plan(reshard_after_forward=True), zero2_plan())]
    assert list(ranked_table(evs)["zero3_reshard"]) == ["backward", "forward", ""]
    assert "zero3_reshard" not in ranked_table(evs[1:])


@pytest.mark.parametrize(
    ("framework", "zero", "stages", "reshards"),
    [
        ("PyTorch FSDP (2023)", "2", (3,), (False,)),  # shard-grad-op, as the schema says
        ("PyTorch FSDP (2023)", "3", (3,), (True,)),
        ("DeepSpeed (2023)", "2", (2,), (True,)),  # DeepSpeed's own stage 2
    ],
)
def test_the_back_test_prices_fsdp_shard_grad_op_as_zero3_kept_gathered(
    framework: str, zero: str, stages: tuple[int, ...], reshards: tuple[bool, ...]
) -> None:
    cells = {"row_id": "F1", "framework": framework, "zero_stage": zero, "precision": "bf16"}
    notes: list[str] = []
    space = row_space(RunRow(path="runs.csv", line=2, cells=cells), notes)
    assert (space.zero_stages, space.reshard_after_forward) == (stages, reshards)
    assert any("shard-grad-op" in n for n in notes) == (reshards == (False,))
