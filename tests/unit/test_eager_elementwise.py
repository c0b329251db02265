"""Eager PyTorch elementwise ops (Meta's reference Llama code, torchtitan 2024 without
torch.compile) priced op by op beyond Megatron-LM's fused kernels
(``plansim.analytic.eager_elementwise``), and where plansim applies them."""

from __future__ import annotations

import pytest

from plansim.analytic.eager_elementwise import eager_extra_traffic
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.runs import RunRow
from plansim.planner.run_space import row_space
from plansim.specs.plan import Recompute, plan_from_fields
from tests.unit.synthetic import round_profile


def test_a_llama_layer_adds_the_tables_bytes_per_token() -> None:
    """Llama 3 8B (RMSNorm, RoPE, GQA, SwiGLU): forward 64h + 20(h + kv) + 4f + 4h and
    backward 140h + 20(h + kv) + 8f + 4h bytes per token, 23 kernels; split over TP except
    the norms, which sequence parallelism splits too."""
    model = resolve_model("llama3-8b")
    h, kv, f = model.hidden_size, model.kv_size, model.ffn_hidden_size
    one = eager_extra_traffic(model, micro_batch_size=1, tp=1, sequence_parallel=False)
    tokens = model.seq_length
    assert one.forward_bytes == tokens * (64 * h + 20 * (h + kv) + 4 * f + 4 * h)
    assert one.backward_bytes == tokens * (140 * h + 20 * (h + kv) + 8 * f + 4 * h)
    assert one.num_kernels == 23
    two = eager_extra_traffic(model, micro_batch_size=2, tp=2, sequence_parallel=False)
    norms = tokens * 2 * 64 * h
    assert two.forward_bytes == pytest.approx(norms + (2 * one.forward_bytes - norms) / 2)
    sp = eager_extra_traffic(model, micro_batch_size=2, tp=2, sequence_parallel=True)
    assert sp.forward_bytes == pytest.approx(one.forward_bytes)


def test_a_gpt_layer_adds_the_output_copy_and_the_norms_second_backward_pass() -> None:
    """GELU, learned positions, MHA and a LayerNorm's forward run as one kernel each in eager
    PyTorch too. Extra: the attention output's contiguous copy (4h each way, split over TP)
    and, in backward, each LayerNorm's weight-and-bias-gradient kernel reading dy and x
    again (4h per norm, replicated over TP, split by sequence parallelism)."""
    model = resolve_model("gpt3-175b")
    h, tokens = model.hidden_size, model.seq_length
    extra = eager_extra_traffic(model, micro_batch_size=1, tp=8, sequence_parallel=True)
    assert extra.forward_bytes == tokens * 4 * h / 8
    assert extra.backward_bytes == tokens * (4 * h + 2 * 4 * h) / 8
    assert extra.num_kernels == 1
    no_sp = eager_extra_traffic(model, micro_batch_size=1, tp=8, sequence_parallel=False)
    assert no_sp.backward_bytes == tokens * (4 * h / 8 + 2 * 4 * h)
    llama = resolve_model("llama3-8b")  # RMSNorm: its own count, no LayerNorm term
    rms = eager_extra_traffic(llama, micro_batch_size=1, tp=1, sequence_parallel=False)
    assert rms.backward_bytes == llama.seq_length * (
        140 * llama.hidden_size
        + 20 * (llama.hidden_size + llama.kv_size)
        + 8 * llama.ffn_hidden_size
        + 4 * llama.hidden_size
    )


def test_the_layer_moves_the_extra_bytes_at_the_elementwise_rate() -> None:
    model = resolve_model("llama3-8b")
    profile = round_profile()
    plan = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    eager = plan.with_fields(fused_elementwise=False)
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    fused_t = layer_pass_times(model, plan, profile, groups)
    eager_t = layer_pass_times(model, eager, profile, groups)
    extra = eager_extra_traffic(model, micro_batch_size=1, tp=1, sequence_parallel=False)
    launches = extra.num_kernels * profile.kernel_launch_s
    forward = extra.forward_bytes / profile.elementwise_bytes_per_s(backward=False) + launches
    backward = extra.backward_bytes / profile.elementwise_bytes_per_s(backward=True) + launches
    assert eager_t.forward_s - fused_t.forward_s == pytest.approx(forward)
    assert eager_t.backward_input_s - fused_t.backward_input_s == pytest.approx(backward)
    assert eager_t.backward_weight_s == fused_t.backward_weight_s
    # recompute re-runs the forward's elementwise work, eager ops included
    full = plan.with_fields(recompute=Recompute.FULL)
    full_eager = full.with_fields(fused_elementwise=False)
    assert layer_pass_times(model, full_eager, profile, groups).recompute_s == pytest.approx(
        layer_pass_times(model, full, profile, groups).recompute_s + forward
    )


@pytest.mark.parametrize(
    ("framework", "fused"),
    [
        ("torchtitan (FSDP2, 2024)", False),
        ("torchtitan (FSDP2, torch.compile, 2024)", True),
        ("Megatron-LM (2024)", True),
        ("llm-foundry (2023)", False),
        ("llm-foundry (Composer, torch.compile, 2024)", True),
    ],
)
def test_the_backtest_prices_eager_ops_for_eager_frameworks_without_compile(
    framework: str, fused: bool
) -> None:
    row = RunRow(
        path="runs.csv",
        line=2,
        cells={"row_id": "Z1", "precision": "bf16", "framework": framework, "zero_stage": "3"},
    )
    notes: list[str] = []
    assert row_space(row, notes).execution.fused_elementwise is fused
    assert any(n.startswith("eager elementwise ops (") for n in notes) is not fused


def _fused_and_eager(command: str, capsys: pytest.CaptureFixture[str], *extra: str) -> list[str]:
    """JSON output of ``command`` for Llama 3 8B on 8 A100s (tp 1, pp 1, ZeRO-3), without
    and with ``--eager-elementwise``; the flag shows in the plan only when given."""
    args = [command, "--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    args += ["--gbs", "8", "--tp", "1", "--pp", "1", "--zero", "3", "--format", "json", *extra]
    outs = []
    for flags in ([], ["--eager-elementwise"]):
        assert main([*args, *flags]) == 0
        outs.append(capsys.readouterr().out)
    assert '"fused_elementwise": false' in outs[1] and "fused_elementwise" not in outs[0]
    return outs


def test_simulate_flag_labels_the_plan_and_slows_the_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fused, eager = _fused_and_eager("simulate", capsys, "--mbs", "1", "--recompute", "full")
    plan = plan_from_fields(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8)
    assert "eager-ops" in plan.with_fields(fused_elementwise=False).label()
    assert "eager-ops" not in plan.label()

    def step(text: str) -> float:
        line = next(x for x in text.splitlines() if '"step_time_s"' in x)
        return float(line.split(":")[1].strip().rstrip(","))

    assert step(eager) > step(fused)


def test_plan_flag_prices_every_plan_eager(capsys: pytest.CaptureFixture[str]) -> None:
    _fused_and_eager("plan", capsys, "--top", "1", "--jobs", "1")
