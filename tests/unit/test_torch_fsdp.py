"""ZeRO-3 through PyTorch FSDP (Megatron-LM --use-torch-fsdp2): 16 bytes of state per
parameter, the fp32 shard being the master weight, against DeepSpeed's 18."""

from __future__ import annotations

import json
import re

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memory import rank_memory
from plansim.analytic.params import count_parameters
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.run_framework import is_torch_fsdp
from plansim.specs.plan import (
    OffloadDevice,
    ParallelPlan,
    Recompute,
    Zero3ParamFetch,
    plan_from_fields,
)

A100 = load_profile("a100-sxm4-80gb")
MODEL = resolve_model("llama2-7b")


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = dict(
        dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=64, zero_stage=3
    )
    base.update(kw)
    return plan_from_fields(**base)  # type: ignore[arg-type]


def test_states_are_sixteen_bytes_per_parameter_and_the_wire_is_unchanged() -> None:
    deepspeed, fsdp = _plan(), _plan(use_torch_fsdp2=True)
    ds_mem, fsdp_mem = (
        rank_memory(MODEL, deepspeed, A100, rank=0),
        rank_memory(MODEL, fsdp, A100, rank=0),
    )
    params = count_parameters(MODEL).total
    states = fsdp_mem.weights_bytes + fsdp_mem.gradients_bytes + fsdp_mem.optimizer_bytes
    assert states == pytest.approx(16 * params / 8)
    assert fsdp_mem.weights_bytes == pytest.approx(4 * params / 8)  # the fp32 shard
    ds_states = ds_mem.weights_bytes + ds_mem.gradients_bytes + ds_mem.optimizer_bytes
    assert ds_states == pytest.approx(18 * params / 8)
    assert fsdp_mem.activations_bytes == ds_mem.activations_bytes
    assert fsdp_mem.transient_bytes == ds_mem.transient_bytes  # 16-bit gathered layers
    ds_comm, fsdp_comm = (
        [s.num_bytes for s in build_pipeline_work(MODEL, p, A100).ranks[0].grad_sync]
        for p in (deepspeed, fsdp)
    )
    assert fsdp_comm == ds_comm  # the same 16-bit gathers and reduce-scatters


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"zero_stage": 2}, "needs zero_stage 3 (got 2)"),
        ({"zero3_param_fetch": Zero3ParamFetch.PER_TENSOR_SYNC}, "got per-tensor-sync"),
        ({"offload_optimizer": OffloadDevice.CPU}, "no offload"),
    ],
)
def test_rules(change: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        _plan(use_torch_fsdp2=True, **change)
    assert "torch-fsdp" in _plan(use_torch_fsdp2=True).label()
    assert "torch-fsdp" not in _plan().label()


def test_the_search_applies_it_to_zero3_plans_only() -> None:
    space = SearchSpace(
        zero_stages=(1, 3),
        recomputes=(Recompute.NONE,),
        micro_batch_size=(1,),
        use_torch_fsdp2=True,
        offloads=(
            (OffloadDevice.NONE, OffloadDevice.NONE),
            (OffloadDevice.CPU, OffloadDevice.NONE),
        ),
    )
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=16, space=space))
    fsdp = {
        p.use_torch_fsdp2
        for p in plans
        if p.zero_stage == 3 and p.offload_optimizer is OffloadDevice.NONE
    }
    assert fsdp == {True}
    assert not any(p.use_torch_fsdp2 for p in plans if p.zero_stage == 1)
    assert not any(p.use_torch_fsdp2 for p in plans if p.offload_optimizer is OffloadDevice.CPU)


@pytest.mark.parametrize(
    ("framework", "sharding", "expected"),
    [
        ("llm-foundry (Composer, PyTorch FSDP, 2023)", "FSDP FULL_SHARD", True),
        ("torchtitan", "FSDP2", True),
        ("HF accelerate", "FSDP full shard", True),
        ("NeMo 25.11 (Megatron-core)", "FSDP (sharding group 64)", False),
        ("Megatron-LM (--use-torch-fsdp2)", "", True),
        ("DeepSpeed", "ZeRO-3", False),
        ("DeepSpeed", "FSDP-like ZeRO-3", False),
        ("Megatron-Bridge 26.02", "Megatron-FSDP2 (sharding group 64)", False),
        ("MCore (custom FSDP)", "FSDP2", False),
    ],
)
def test_backtest_rows_naming_pytorch_fsdp(framework: str, sharding: str, expected: bool) -> None:
    row = RunRow(
        path="runs.csv",
        line=2,
        cells={"framework": framework, "zero_stage_or_sharding": sharding},
    )
    notes: list[str] = []
    assert is_torch_fsdp(row, notes) is expected
    assert bool(notes) is expected


def test_simulate_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = "simulate --model llama2-7b --gpu a100-sxm4-80gb --gpus 8 --gbs 64 --tp 1 --pp 1"
    args += " --mbs 1 --zero 3"
    assert main([*args.split(), "--format", "json"]) == 0
    deepspeed = json.loads(capsys.readouterr().out)
    assert main([*args.split(), "--use-torch-fsdp2", "--format", "json"]) == 0
    fsdp = json.loads(capsys.readouterr().out)
    assert fsdp["plan"]["use_torch_fsdp2"] is True and "use_torch_fsdp2" not in deepspeed["plan"]
    # PyTorch FSDP reduce-scatters fp32 gradients (reduce_dtype fp32), DeepSpeed 16-bit ones;
    # with reduce_dtype bf16 (--grad-reduce-in-bf16) the traffic is DeepSpeed's
    assert fsdp["step_time_s"] > deepspeed["step_time_s"]
    assert (
        main([*args.split(), "--use-torch-fsdp2", "--grad-reduce-in-bf16", "--format", "json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["step_time_s"] == deepspeed["step_time_s"]
    saved = 2 * count_parameters(MODEL).total / 8
    assert deepspeed["peak_memory_bytes"] - fsdp["peak_memory_bytes"] == pytest.approx(saved)
    assert main([*args.split(), "--use-torch-fsdp2"]) == 0
    assert "torch-fsdp" in capsys.readouterr().out
    assert main([*args.replace("--zero 3", "--zero 1").split(), "--use-torch-fsdp2"]) == 2
    assert "plan.use_torch_fsdp2 needs zero_stage 3 (got 1)" in capsys.readouterr().err
