"""Megatron-LM --grad-reduce-in-bf16: bf16 gradient buffer and reduction instead of fp32."""

from __future__ import annotations

import dataclasses
import json

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import plan_state_bytes, rank_memory
from plansim.analytic.ranks import layout_groups
from plansim.analytic.zero3 import Zero3Traffic
from plansim.analytic.zero_segments import sharded_traffic
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.run_framework import bf16_grad_modes
from plansim.specs.plan import ParallelPlan, Precision, Recompute, plan_from_fields

H100 = load_profile("h100-sxm5-80gb")
MODEL = resolve_model("llama2-7b")


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = dict(
        dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=64, zero_stage=1
    )
    base.update(kw)
    return plan_from_fields(**base)  # type: ignore[arg-type]


def test_gradient_bytes_halve_in_memory_and_on_the_wire() -> None:
    fp32, bf16 = _plan(), _plan(grad_reduce_in_bf16=True)
    assert plan_state_bytes(fp32).grad == 4.0 and plan_state_bytes(bf16).grad == 2.0
    assert plan_state_bytes(_plan(precision=Precision.FP8, grad_reduce_in_bf16=True)).grad == 2.0
    mem32 = rank_memory(MODEL, fp32, H100, rank=0)
    mem16 = rank_memory(MODEL, bf16, H100, rank=0)
    assert mem16.gradients_bytes == pytest.approx(mem32.gradients_bytes / 2)
    assert mem16.optimizer_bytes == mem32.optimizer_bytes
    assert mem16.weights_bytes == mem32.weights_bytes

    def dp_bytes(plan: ParallelPlan) -> float:
        work = build_pipeline_work(MODEL, plan, H100)
        return sum(s.num_bytes for s in work.ranks[0].grad_sync if s.kind == "dp_comm")

    assert dp_bytes(bf16) == pytest.approx(dp_bytes(fp32) / 2)
    assert dp_bytes(fp32) > 0


def test_plan_rule_label_and_search() -> None:
    with pytest.raises(SpecError, match="grad_reduce_in_bf16 needs precision bf16, fp8, fp4"):
        _plan(precision=Precision.FP16, grad_reduce_in_bf16=True)
    assert "bf16-grads" in _plan(grad_reduce_in_bf16=True).label()
    narrow = dict(zero_stages=(0, 1), recomputes=(Recompute.NONE,), micro_batch_size=(1,))
    off = list(enumerate_plans(num_gpus=8, global_batch_size=16, space=SearchSpace(**narrow)))  # type: ignore[arg-type]
    on = list(
        enumerate_plans(
            num_gpus=8,
            global_batch_size=16,
            space=SearchSpace(**narrow, grad_reduce_in_bf16=(False, True)),  # type: ignore[arg-type]
        )
    )
    added = [p for p in on if p.grad_reduce_in_bf16]
    assert not any(p.grad_reduce_in_bf16 for p in off)
    assert len(added) == len(off) and len(on) == 2 * len(off)
    assert {p.with_fields(grad_reduce_in_bf16=False) for p in added} == set(off)
    fp16 = SearchSpace(**narrow, grad_reduce_in_bf16=(False, True), precision=Precision.FP16)  # type: ignore[arg-type]
    assert not any(
        p.grad_reduce_in_bf16 for p in enumerate_plans(num_gpus=8, global_batch_size=16, space=fp16)
    )


def test_backtest_searches_it_for_recent_megatron_family_rows() -> None:
    def modes(framework: str, precision: str = "fp8") -> tuple[bool, ...]:
        row = RunRow(path="r.csv", line=2, cells={"framework": framework, "precision": precision})
        return bf16_grad_modes(row, 2025 if "25" in framework else 2022, [])

    assert modes("Megatron-Bridge 25.11") == (False, True)
    assert modes("Megatron-LM (2022)") == (False,)
    assert modes("DeepSpeed 0.15 (2025)") == (False,)
    fsdp_notes: list[str] = []
    llm_foundry = RunRow(
        path="r.csv", line=2, cells={"framework": "llm-foundry (2023)", "precision": "bf16"}
    )
    # PyTorch FSDP's reduce dtype is the job's choice, which no column states: searched
    assert bf16_grad_modes(llm_foundry, 2023, fsdp_notes, torch_fsdp=True) == (False, True)
    assert fsdp_notes == ["PyTorch FSDP reduce dtype (fp32 or bf16) searched"]
    assert bf16_grad_modes(llm_foundry, 2023, []) == (False,)
    # torchtitan's mixed_precision_reduce had one choice, float32: not searched
    titan_notes: list[str] = []
    titan = RunRow(
        path="r.csv", line=2, cells={"framework": "torchtitan (FSDP2, 2024)", "precision": "bf16"}
    )
    assert bf16_grad_modes(titan, 2024, titan_notes, torch_fsdp=True) == (False,)
    assert titan_notes == ["fp32 gradient reduction (torchtitan's mixed_precision_reduce: float32)"]
    notes: list[str] = []
    undated = RunRow(path="r.csv", line=2, cells={"precision": "bf16"})
    assert bf16_grad_modes(undated, None, notes) == (False, True)
    assert notes == ["gradient reduction in fp32 or bf16 searched"]


def test_pytorch_fsdp_reduce_scatters_in_fp32_unless_bf16_and_deepspeed_in_16_bits() -> None:
    """PyTorch FSDP's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (torchtitan's
    default) reduce-scatters fp32 gradients, ``reduce_dtype=bf16`` (``grad_reduce_in_bf16``)
    16-bit ones; DeepSpeed's ZeRO-3 reduces in the model's dtype either way. Gathers stay
    16-bit, and the memory is PyTorch FSDP's fp32 states whichever the reduce dtype."""

    def layer(plan: ParallelPlan) -> Zero3Traffic:
        groups = layout_groups(plan, gpus_per_node=H100.gpus_per_node)
        unit, _ = sharded_traffic(MODEL, plan, H100, groups, first=True, last=True, memo=None)
        return unit

    fsdp = layer(_plan(zero_stage=3, use_torch_fsdp2=True))
    fsdp_bf16 = layer(_plan(zero_stage=3, use_torch_fsdp2=True, grad_reduce_in_bf16=True))
    deepspeed = layer(_plan(zero_stage=3))
    deepspeed_bf16 = layer(_plan(zero_stage=3, grad_reduce_in_bf16=True))
    assert fsdp.scatter_bytes == pytest.approx(2 * fsdp_bf16.scatter_bytes)
    assert fsdp_bf16.scatter_bytes == deepspeed.scatter_bytes == deepspeed_bf16.scatter_bytes
    assert fsdp.scatter_s > fsdp_bf16.scatter_s
    assert fsdp.gather_bytes == fsdp_bf16.gather_bytes == deepspeed.gather_bytes
    assert fsdp.gather_s == fsdp_bf16.gather_s
    plans = [
        _plan(zero_stage=3, use_torch_fsdp2=True, grad_reduce_in_bf16=b) for b in (False, True)
    ]
    assert rank_memory(MODEL, plans[0], H100, rank=0) == rank_memory(MODEL, plans[1], H100, rank=0)


def test_simulate_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "llama2-7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    args += ["--gbs", "64", "--tp", "1", "--pp", "1", "--mbs", "1", "--zero", "1"]
    out = []
    for extra in ([], ["--grad-reduce-in-bf16"]):
        assert main([*args, *extra, "--format", "json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert "grad_reduce_in_bf16" not in out[0]["plan"]
    assert out[1]["plan"]["grad_reduce_in_bf16"] is True
    assert out[1]["peak_memory_bytes"] < out[0]["peak_memory_bytes"]
    assert main([*args, "--grad-reduce-in-bf16", "--precision", "fp16"]) == 2
    assert "grad_reduce_in_bf16 needs precision" in capsys.readouterr().err


def test_search_keeps_the_bf16_plan_that_fits_where_fp32_gradients_do_not() -> None:
    from plansim.planner.search import search

    plan = _plan(recompute=Recompute.FULL)
    need32 = rank_memory(MODEL, plan, H100, rank=0).total_bytes
    need16 = rank_memory(MODEL, _plan(recompute=Recompute.FULL, grad_reduce_in_bf16=True), H100,
                         rank=0).total_bytes  # fmt: skip
    tight = dataclasses.replace(H100, hbm_capacity_bytes=(need32 + need16) / 2)
    space = SearchSpace(
        tp=(1,), pp=(1,), dp=(8,), micro_batch_size=(1,), zero_stages=(1,),
        recomputes=(Recompute.FULL,), partial_recompute=False,
        grad_reduce_in_bf16=(False, True),
    )  # fmt: skip
    result = search(MODEL, tight, num_gpus=8, global_batch_size=64, space=space)
    # one memory check once served fp32 and bf16 gradients alike and rejected both
    assert result.ranked and all(e.plan.grad_reduce_in_bf16 for e in result.ranked)
    assert result.rejected and not any(r.plan.grad_reduce_in_bf16 for r in result.rejected)
