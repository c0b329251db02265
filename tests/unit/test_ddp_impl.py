"""The data-parallel wrapper's once-per-step gradient average (``ParallelPlan.ddp_impl``,
``plansim.analytic.elementwise.grad_average_bytes``).

Hand numbers: a rank's gradient buffer of G bytes costs Megatron-core 2G (``grad_data *=
gradient_scaling_factor``: read + write, skipped when the factor is 1 at dp * cp == 1),
Megatron-LM's legacy local DDP 2G at every dp (``buffer_.data /= dp``), PyTorch DDP 4G (copy
into the bucket dividing, copy back), an averaging collective none; ZeRO-2/3 and parameter
servers none here.
"""

from __future__ import annotations

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.elementwise import adam_step_bytes, grad_average_bytes
from plansim.analytic.memory import rank_parameters
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.run_space import row_space
from plansim.specs.plan import DdpImpl, DpSync, ExecutionSpec, ParallelPlan, plan_from_fields
from tests.unit.test_attention_efficiency import MODEL

G = 1000.0
DP1 = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=4)
DP4 = DP1.with_fields(dp=4)


@pytest.mark.parametrize(
    ("plan", "impl", "expected"),
    [
        (DP1, DdpImpl.MEGATRON_CORE, 0.0),
        (DP4, DdpImpl.MEGATRON_CORE, 2 * G),
        (DP1, DdpImpl.LOCAL, 2 * G),
        (DP4, DdpImpl.LOCAL, 2 * G),
        (DP1, DdpImpl.TORCH, 4 * G),
        (DP4, DdpImpl.TORCH, 4 * G),
        (DP4, DdpImpl.AVERAGE_IN_COLLECTIVE, 0.0),
        (DP4.with_fields(zero_stage=1), DdpImpl.MEGATRON_CORE, 2 * G),
        (DP4.with_fields(zero_stage=2), DdpImpl.LOCAL, 0.0),
        (DP4.with_fields(zero_stage=3), DdpImpl.TORCH, 0.0),
        (DP4.with_fields(dp_sync=DpSync.PARAMETER_SERVER), DdpImpl.LOCAL, 0.0),
        (DP1.with_fields(cp=2, attention=DP1.attention), DdpImpl.MEGATRON_CORE, 2 * G),
    ],
)
def test_grad_average_bytes_per_wrapper(plan: ParallelPlan, impl: DdpImpl, expected: float) -> None:
    plan = plan.with_fields(ddp_impl=impl)
    assert grad_average_bytes(plan, grad_buffer_bytes=G) == expected


def test_the_optimizer_segment_carries_the_average_pass() -> None:
    """The legacy local DDP at dp 1 adds exactly 2 x the fp32 gradient buffer (4 B per
    parameter) at the streaming rate to the optimizer segment; Megatron-core adds nothing."""
    profile = load_profile("a100-sxm4-80gb")
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)
    local = plan.with_fields(ddp_impl=DdpImpl.LOCAL)
    for rank in (0, 1):
        core = build_pipeline_work(MODEL, plan, profile).ranks[rank].optimizer[0]
        legacy = build_pipeline_work(MODEL, local, profile).ranks[rank].optimizer[0]
        params = rank_parameters(MODEL, plan, rank=rank)
        stream = profile.streaming_bytes_per_s()
        assert core.duration_s == pytest.approx(adam_step_bytes(params) / stream)
        assert legacy.duration_s - core.duration_s == pytest.approx(2 * 4.0 * params / stream)


def test_the_search_carries_the_space_s_wrapper_into_every_plan() -> None:
    space = SearchSpace(execution=ExecutionSpec(ddp_impl=DdpImpl.TORCH), zero_stages=(0, 1))
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=space, num_layers=4))
    assert plans and {p.ddp_impl for p in plans} == {DdpImpl.TORCH}
    assert "ddp-torch" in plans[0].label()
    assert "ddp-" not in DP4.label()  # the default is not labelled
    zero3 = DP4.with_fields(zero_stage=3, ddp_impl=DdpImpl.LOCAL)
    assert "ddp-" not in zero3.label()  # no effect with ZeRO-3: not labelled


def _row(**cells: str) -> RunRow:
    base = {
        "row_id": "Z1",
        "source_locator": "Korthikanti et al. 2022 (arXiv:2205.05198) Table 3",
        "framework": "Megatron-LM (2022)",
        "precision": "bf16",
        "num_layers": "48",
        "hidden_size": "6144",
        "num_gpus": "8",
    }
    return RunRow(path="runs.csv", line=2, cells={**base, **cells})


def test_back_test_rows_get_their_framework_s_wrapper() -> None:
    notes: list[str] = []
    assert row_space(_row(), notes).execution.ddp_impl is DdpImpl.LOCAL
    assert any("DDP local" in n for n in notes)
    modern = _row(framework="NeMo 24.07 (Megatron-core, 2024)")
    assert row_space(modern, []).execution.ddp_impl is DdpImpl.MEGATRON_CORE
    torchtitan = _row(framework="torchtitan (2024)", source_locator="torchtitan docs")
    assert row_space(torchtitan, []).execution.ddp_impl is DdpImpl.MEGATRON_CORE
    # SC21 Table 1's 18.4B case runs --DDP-impl torch (examples/sc21/run_table_1.sh)
    sc21 = _row(
        source_locator="Narayanan et al. SC21 (arXiv:2104.04473) Table 1",
        framework="Megatron-LM (2021)",
        precision="fp16",
        num_layers="40",
        num_gpus="256",
    )
    notes = []
    assert row_space(sc21, notes).execution.ddp_impl is DdpImpl.TORCH
    assert "DDP torch (the launch script's --DDP-impl)" in notes


def test_simulate_flag_and_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "64",
        "--gbs", "64", "--tp", "8", "--pp", "8", "--mbs", "1", "--recompute", "full",
        "--format", "json",
    ]  # fmt: skip
    assert main([*args, "--ddp-impl", "local"]) == 0
    assert '"ddp_impl": "local"' in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([*args, "--ddp-impl", "apex"])
    assert exc.value.code == 2
    assert "megatron-core" in capsys.readouterr().err


def test_plan_rejects_a_non_member() -> None:
    with pytest.raises(Exception, match="ddp_impl"):
        plan_from_fields(
            dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1, ddp_impl="local"
        )  # type: ignore[arg-type]
