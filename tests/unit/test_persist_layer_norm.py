"""A norm's backward in one pass (Megatron-LM's persistent layer norm) or two
(``ParallelPlan.persist_layer_norm`` off: the non-persistent kernel Megatron-LM ran before
PyTorch 1.11, apex's FusedLayerNorm), and where plansim applies each."""

from __future__ import annotations

import json

import pytest

from plansim.analytic.elementwise import norm_second_pass_traffic
from plansim.analytic.layer_cost import PassTimes, layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.runs import RunRow
from plansim.planner.run_space import row_space
from plansim.specs.plan import plan_from_fields
from tests.unit.synthetic import round_profile


def test_the_second_pass_reads_dy_and_x_again_for_both_norms() -> None:
    """4h bytes per norm and token, backward only, replicated over TP, split by SP."""
    model = resolve_model("gpt3-175b")
    h, tokens = model.hidden_size, model.seq_length
    plain = norm_second_pass_traffic(model, micro_batch_size=2, tp=8, sequence_parallel=False)
    assert plain.forward_bytes == 0.0 and plain.num_kernels == 0
    assert plain.backward_bytes == 2 * tokens * 2 * 4 * h
    sp = norm_second_pass_traffic(model, micro_batch_size=2, tp=8, sequence_parallel=True)
    assert sp.backward_bytes == pytest.approx(plain.backward_bytes / 8)


PROFILE = round_profile()
GPT = resolve_model("gpt3-175b")
TP8 = plan_from_fields(dp=1, tp=8, pp=1, micro_batch_size=1, global_batch_size=1)


def _times(**changes: object) -> PassTimes:
    """One GPT-3 175B layer's pass times at tp 8 with ``changes`` to the plan."""
    plan = TP8.with_fields(**changes)
    return layer_pass_times(
        GPT, plan, PROFILE, layout_groups(plan, gpus_per_node=PROFILE.gpus_per_node)
    )


def test_the_layer_backward_moves_the_second_pass_at_the_elementwise_rate() -> None:
    one_t, two_t = _times(), _times(persist_layer_norm=False)
    extra = norm_second_pass_traffic(GPT, micro_batch_size=1, tp=8, sequence_parallel=False)
    rate = PROFILE.elementwise_bytes_per_s(backward=True)
    assert two_t.backward_input_s - one_t.backward_input_s == pytest.approx(
        extra.backward_bytes / rate
    )
    assert two_t.forward_s == one_t.forward_s
    assert two_t.backward_weight_s == one_t.backward_weight_s
    # eager ops already count PyTorch's two-pass LayerNorm: the flag adds nothing more
    eager = _times(fused_elementwise=False)
    assert _times(fused_elementwise=False, persist_layer_norm=False) == eager


def test_the_backtest_gives_runs_dated_before_2022_the_two_pass_norm() -> None:
    """Rows dated 2021 (before PyTorch 1.11) get the two-pass norm and a note saying so;
    rows dated 2022 and undated rows the persistent one."""
    for framework, persist in (("Megatron-LM (2021)", False), ("Megatron-LM (2022)", True),
                               ("Megatron-LM", True)):  # fmt: skip
        cells = {"row_id": "Z1", "precision": "fp16", "framework": framework}
        notes: list[str] = []
        space = row_space(RunRow(path="runs.csv", line=2, cells=cells), notes)
        assert space.execution.persist_layer_norm is persist, framework
        assert any("two-pass layer norm backward" in n for n in notes) is not persist


def _one_and_two_pass(command: str, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    """JSON output of ``command`` for GPT-3 175B on 64 A100s at tp 8, pp 8, without and with
    ``--no-persist-layer-norm``."""
    args = [command, "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "64"]
    args += ["--gbs", "64", "--tp", "8", "--pp", "8", "--format", "json", *extra]
    outs = []
    for flags in ([], ["--no-persist-layer-norm"]):
        assert main([*args, *flags]) == 0
        outs.append(capsys.readouterr().out)
    return outs


def test_simulate_flag_labels_the_plan_and_slows_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    one, two = (
        json.loads(out)
        for out in _one_and_two_pass("simulate", capsys, "--mbs", "1", "--recompute", "full")
    )
    assert two["plan"]["persist_layer_norm"] is False and "persist_layer_norm" not in one["plan"]
    assert two["step_time_s"] > one["step_time_s"]
    plan = plan_from_fields(dp=1, tp=8, pp=8, micro_batch_size=1, global_batch_size=64)
    assert "no-persist-ln" in plan.with_fields(persist_layer_norm=False).label()
    assert "no-persist-ln" not in plan.label()


def test_plan_flag_prices_every_plan_with_the_two_pass_norm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    one, two = _one_and_two_pass("plan", capsys, "--top", "1", "--jobs", "1")
    assert '"persist_layer_norm": false' in two and "persist_layer_norm" not in one


def test_the_validator_twin_prices_torchs_norm_backward_by_device() -> None:
    """``plansim validate``'s model runs torch's LayerNorm / RMSNorm: two backward kernels on a
    GPU (the weight gradients re-read dy and x), one pass per row on a CPU."""
    from plansim.validate.simulated import run_plan
    from tests.unit.test_validate_framework_overhead import _profile as cpu_profile

    plan = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=2)
    gpu, cpu = PROFILE, cpu_profile()
    assert gpu.serial_host is False and cpu.serial_host is True
    assert run_plan(plan, gpu, dtype="bf16").persist_layer_norm is False
    assert run_plan(plan, cpu, dtype="bf16").persist_layer_norm is True
    # a plan that already says two passes keeps them on either device
    two_pass = plan.with_fields(persist_layer_norm=False)
    assert run_plan(two_pass, cpu, dtype="bf16").persist_layer_norm is False
