"""torchtitan's per-op selective activation checkpointing (``Recompute.SELECTIVE_OP``): the
GEMMs it recomputes, what it stores, its cost between Megatron's selective and full
recompute, the plan and CLI checks, the back-test's reading of torchtitan rows, and the
validator's torch policy recomputing exactly the GEMMs plansim prices.

Oracles: torchtitan's policy saves every odd ``aten.mm`` of a block (wq, wv, w1, w2 for
Llama) and recomputes the even ones (wk, wo, w3); for Llama 3 8B those are
(1024 + 4096 + 14336) x 4096 of the 218.1M weights per layer, 36.5% of the weight FLOPs.
"""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.activations import full_layer_bytes, layer_activations
from plansim.analytic.flops import (
    hardware_flops_per_step,
    layer_forward_gemms,
    layer_recompute_gemms,
    op_selective_recompute_gemms,
)
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.backtest import predict_row
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.model import Activation
from plansim.specs.plan import AttentionKernel, ParallelPlan, Recompute, plan_from_fields
from tests.unit.test_backtest_rows import ROW

LLAMA = resolve_model("llama3-8b")
PROFILE = load_profile("a100-sxm4-80gb")


def _plan(recompute: Recompute, **kw: object) -> ParallelPlan:
    fields: dict[str, object] = {
        "dp": 8,
        "tp": 1,
        "pp": 1,
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "zero_stage": 3,
        "use_torch_fsdp2": True,
        "recompute": recompute,
    }
    fields.update(kw)
    return plan_from_fields(**fields)  # type: ignore[arg-type]


def test_llama3_8b_recomputes_wk_wo_w3_365_percent_of_the_weight_flops() -> None:
    again = op_selective_recompute_gemms(LLAMA, micro_batch_size=1, tp=1)
    assert [(g.name, g.n, g.k) for g in again] == [
        ("k_proj", 1024, 4096),
        ("attn_out", 4096, 4096),
        ("mlp_up", 14336, 4096),
    ]
    weights = [g for g in layer_forward_gemms(LLAMA, micro_batch_size=1, tp=1) if g.has_weight]
    share = sum(g.flops for g in again) / sum(g.flops for g in weights)
    assert share == pytest.approx(79_691_776 / 218_103_808, rel=1e-12)
    assert round(100 * share, 1) == 36.5
    same = layer_recompute_gemms(LLAMA, micro_batch_size=1, tp=1, recompute=Recompute.SELECTIVE_OP)
    assert same == again


def test_a_gelu_model_stops_before_its_last_matmul_and_tp_splits_the_others() -> None:
    gpt = resolve_model("megatron-1.7b")  # 24 heads, h 2304, ffn 9216, GELU
    assert gpt.activation is Activation.GELU
    again = op_selective_recompute_gemms(gpt, micro_batch_size=2, tp=2)
    # the down projection is the even sixth matmul but the block's last: early stop skips it
    assert [(g.name, g.m, g.n, g.k) for g in again] == [
        ("k_proj", 4096, 1152, 2304),
        ("attn_out", 4096, 2304, 1152),
    ]
    with pytest.raises(SpecError, match="tp"):
        op_selective_recompute_gemms(gpt, micro_batch_size=1, tp=5)


def test_hardware_flops_add_the_recomputed_gemms_of_every_layer() -> None:
    none = hardware_flops_per_step(LLAMA, global_batch_size=4, recompute=Recompute.NONE)
    op = hardware_flops_per_step(LLAMA, global_batch_size=4, recompute=Recompute.SELECTIVE_OP)
    per_layer = sum(g.flops for g in op_selective_recompute_gemms(LLAMA, micro_batch_size=4, tp=1))
    assert op - none == LLAMA.num_layers * per_layer


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (4, False), (4, True)])
def test_stored_bytes_follow_the_saved_tensors(tp: int, sp: bool) -> None:
    s, b, h, kv, ffn, a = 8192, 2, 4096, 1024, 14336, 32
    got = layer_activations(
        LLAMA,
        micro_batch_size=b,
        tp=tp,
        sequence_parallel=sp,
        recompute=Recompute.SELECTIVE_OP,
        flash=True,
    )
    # input 2 (/t with SP); unreduced w2 output 2; Q 2, V 2kv/h, attention output 2,
    # log-sum-exp 4a/h, w1 output 2ffn/h, with SP two reduce-scatter outputs 2 + 2 (all /t)
    sharded = 2 + 2 * kv / h + 2 + 4 * a / h + 2 * ffn / h + (4 if sp else 0)
    expected = s * b * h * (2 / (tp if sp else 1) + 2 + sharded / tp)
    assert got.stored_bytes == pytest.approx(expected, rel=1e-12)
    full = full_layer_bytes(LLAMA, micro_batch_size=b, tp=tp, sequence_parallel=sp, flash=True)
    assert got.working_bytes == pytest.approx(full - expected, rel=1e-12)
    stored = {
        r: layer_activations(
            LLAMA, micro_batch_size=b, tp=tp, sequence_parallel=sp, recompute=r, flash=True
        ).stored_bytes
        for r in (Recompute.NONE, Recompute.SELECTIVE_OP, Recompute.FULL)
    }
    assert stored[Recompute.NONE] > stored[Recompute.SELECTIVE_OP] > stored[Recompute.FULL]


def test_the_recompute_costs_the_three_gemms_and_the_forward_elementwise_work() -> None:
    plan = _plan(Recompute.SELECTIVE_OP)
    groups = layout_groups(plan, gpus_per_node=PROFILE.gpus_per_node)
    op = layer_pass_times(LLAMA, plan, PROFILE, groups)
    full = layer_pass_times(LLAMA, _plan(Recompute.FULL), PROFILE, groups)
    selective = layer_pass_times(LLAMA, _plan(Recompute.SELECTIVE), PROFILE, groups)
    assert op.forward_s == full.forward_s  # the forward itself is the same
    assert selective.recompute_s < op.recompute_s < full.recompute_s
    # more than the three GEMMs' share of the forward's weight GEMMs (36.5%): the norms,
    # RoPE, SiLU and residual adds run again too
    assert op.recompute_s > 0.365 * (full.recompute_s - selective.recompute_s)


def test_step_time_and_memory_sit_between_none_and_full() -> None:
    runs = {r: evaluate(LLAMA, _plan(r), PROFILE) for r in Recompute}
    assert all(isinstance(e, Evaluation) for e in runs.values())
    time = {r: e.step_time_s for r, e in runs.items() if isinstance(e, Evaluation)}
    peak = {r: e.peak_memory_bytes for r, e in runs.items() if isinstance(e, Evaluation)}
    hfu = {r: e.hfu for r, e in runs.items() if isinstance(e, Evaluation)}
    op = Recompute.SELECTIVE_OP
    assert time[Recompute.NONE] < time[op] < time[Recompute.FULL]
    assert peak[Recompute.NONE] > peak[op] > peak[Recompute.FULL]
    assert hfu[op] > runs[op].mfu  # type: ignore[union-attr]


def test_unfused_attention_is_refused_by_the_plan_and_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SpecError, match="selective-op needs attention flash"):
        _plan(Recompute.SELECTIVE_OP, attention=AttentionKernel.UNFUSED)
    args = ["--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--gpus", "8", "--gbs", "8"]
    assert main(["plan", *args, "--recompute-selective-op", "--attention", "unfused"]) == 2
    assert "--recompute-selective-op needs --attention flash" in capsys.readouterr().err
    simulate = ["simulate", *args, "--tp", "1", "--pp", "1", "--mbs", "1"]
    assert main([*simulate, "--recompute", "selective-op", "--attention", "unfused"]) == 2
    assert "selective-op needs attention flash" in capsys.readouterr().err


def _row(**cells: str) -> RunRow:
    llama = {
        **ROW,
        "model_name": "Llama 3 8B",
        "num_layers": "8",
        "hidden_size": "4096",
        "num_attention_heads": "32",
        "num_kv_heads": "8",
        "ffn_hidden_size": "14336",
        "ffn_activation": "swiglu",
        "seq_len_tokens": "8192",
        "vocab_size": "128256",
        "num_gpus": "8",
        "micro_batch_size_seqs": "1",
        "global_batch_size_seqs": "8",
        "zero_stage": "3",
        "zero_stage_or_sharding": "FSDP2",
        "framework": "torchtitan (2024)",
        "step_time_s": "1.0",
    }
    return RunRow(path="runs.csv", line=2, cells={**llama, **cells})


def test_a_torchtitan_rows_selective_is_its_per_op_policy() -> None:
    titan = predict_row(_row(recompute="selective"), simulate_top=2)
    assert titan.status == "ok"
    assert "selective-op" in titan.plan_label
    assert "recompute selective on torchtitan: its per-op policy (selective-op)" in titan.note
    megatron = predict_row(_row(recompute="selective", framework="Megatron-LM (2024)"))
    assert "selective-op" not in megatron.plan_label
    assert "selective" in megatron.plan_label
    stated = predict_row(_row(recompute="selective-op"), simulate_top=2)
    assert stated.predicted_step_time_s == titan.predicted_step_time_s


def test_a_blank_recompute_on_torchtitan_searches_the_per_op_policy() -> None:
    from plansim.planner.run_space import row_space

    notes: list[str] = []
    space = row_space(_row(recompute=""), notes)
    assert Recompute.SELECTIVE_OP in space.recomputes
    megatron = row_space(_row(recompute="", framework="Megatron-LM (2024)"), [])
    assert Recompute.SELECTIVE_OP not in megatron.recomputes


def test_the_validator_recomputes_exactly_the_gemms_plansim_prices() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from plansim.calibrate.op_sac import MATMUL_OPS
    from plansim.validate.model import build_model, split_stage
    from plansim.validate.parallelize import apply_recompute

    class CountMatmuls(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.count += func in MATMUL_OPS
            return func(*args, **(kwargs or {}))

    def run(recompute: Recompute, spec: object) -> tuple[int, list[object]]:
        plan = plan_from_fields(
            dp=1, tp=1, pp=1, micro_batch_size=2, global_batch_size=2, recompute=recompute
        )
        stage = split_stage(build_model(spec, seed=0), spec, plan, 0)  # type: ignore[arg-type]
        apply_recompute(stage, plan)
        tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        with CountMatmuls() as counter:
            stage(tokens).float().pow(2).mean().backward()
        return counter.count, [p.grad.clone() for p in stage.parameters()]

    for activation, bias in ((Activation.SWIGLU, False), (Activation.GELU, True)):
        spec = dataclasses.replace(
            LLAMA,
            num_layers=3,
            hidden_size=32,
            num_attention_heads=4,
            num_query_groups=2,
            ffn_hidden_size=64,
            seq_length=8,
            vocab_size=64,
            activation=activation,
            add_bias_linear=bias,
        )
        plain, grads = run(Recompute.NONE, spec)
        op, op_grads = run(Recompute.SELECTIVE_OP, spec)
        per_layer = len(op_selective_recompute_gemms(spec, micro_batch_size=2, tp=1))
        assert per_layer == (3 if activation is Activation.SWIGLU else 2)
        assert op - plain == spec.num_layers * per_layer
        for want, got in zip(grads, op_grads, strict=True):
            torch.testing.assert_close(got, want)


def test_the_exact_search_ranks_the_per_op_policy_as_the_exhaustive_one_does() -> None:
    from plansim.planner.enumerate import SearchSpace
    from plansim.planner.search import search

    small = dataclasses.replace(LLAMA, num_layers=4, seq_length=2048)
    space = SearchSpace(
        recomputes=(Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE_OP),
        tp=(1, 2),
        pp=(1, 2),
        zero_stages=(1, 3),
        use_torch_fsdp2=True,
        max_micro_batch_size=2,
    )
    kw = {"num_gpus": 8, "global_batch_size": 16, "space": space, "top_k": 60}
    exact = search(small, PROFILE, **kw)  # type: ignore[arg-type]
    every = search(small, PROFILE, exhaustive=True, **kw)  # type: ignore[arg-type]

    def rows(result: object) -> list[tuple[str, float]]:
        ranked = result.ranked[:60]  # type: ignore[attr-defined]
        return [(r.plan.label(), r.step_time_s) for r in ranked]

    assert rows(exact) == rows(every)
    assert any("selective-op" in label for label, _ in rows(every))
