"""fp32 training: precision, memory, optimizer traffic, messages, validation's simulated side.

Hand numbers: fp32 keeps 4 (param) + 4 (grad) + 8 (Adam m, v) = 16 B per parameter (no
master copy; mixed bf16 keeps 2 + 4 + 12 = 18); torch AdamW (fused/foreach) moves 28 B per
parameter (read param, grad, m, v; write param, m, v) against Megatron mixed precision's 42;
activations and pipeline messages are 4 B per element instead of 2.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plansim.analytic import flops as fl
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.elementwise import adam_step_bytes
from plansim.analytic.layer_cost import gemm_time_s
from plansim.analytic.memory import model_state_bytes, rank_parameters, state_bytes_per_param
from plansim.analytic.stored_activations import microbatch_activation_bytes
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.curves import Curve
from plansim.specs.plan import Framework, Precision, plan_from_fields
from plansim.validate.eager_layer import eager_layer_extra
from plansim.validate.executed_loss import runner_loss_time_s
from plansim.validate.result import ValidateError
from plansim.validate.simulated import run_plan, simulate_plan
from tests.unit.synthetic import round_profile
from tests.unit.test_attention_efficiency import MODEL
from tests.unit.test_validate_compare import profile_with_fp32

PLAN = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)
FP32 = PLAN.with_fields(precision=Precision.FP32)


def test_precision_bytes() -> None:
    assert Precision("fp32") is Precision.FP32
    assert (Precision.FP32.param_bytes, Precision.FP32.activation_bytes) == (4, 4)
    assert (Precision.BF16.param_bytes, Precision.BF16.activation_bytes) == (2, 2)


def test_model_states_are_16_bytes_per_parameter() -> None:
    per = state_bytes_per_param(Precision.FP32)
    assert (per.param, per.grad, per.optimizer) == (4.0, 4.0, 8.0)
    states = model_state_bytes(1000.0, dp=2, zero_stage=1, per_param=per)
    assert (states.weights_bytes, states.gradients_bytes, states.optimizer_bytes) == (
        4000.0,
        4000.0,
        4000.0,
    )
    bf16 = state_bytes_per_param(Precision.BF16)
    assert (bf16.param, bf16.grad, bf16.optimizer) == (2.0, 4.0, 12.0)


def test_adam_traffic_is_28_bytes_per_parameter() -> None:
    assert adam_step_bytes(100.0, precision=Precision.FP32) == 2800.0
    assert adam_step_bytes(100.0) == 4200.0
    assert adam_step_bytes(100.0, precision=Precision.BF16) == 4200.0
    # fp16: + fp16 -> fp32 main-grad copy (6 B) + loss-scaler unscale (8 B) - 2 B of zeroing
    assert adam_step_bytes(100.0, precision=Precision.FP16) == 5400.0


def test_activations_are_twice_the_16_bit_bytes() -> None:
    for rank in (0, 1):
        bf16 = microbatch_activation_bytes(MODEL, PLAN, rank=rank)
        assert microbatch_activation_bytes(MODEL, FP32, rank=rank) == 2 * bf16


def test_optimizer_and_pipeline_message_in_fp32() -> None:
    profile = profile_with_fp32()
    work = build_pipeline_work(MODEL, FP32, profile)
    params = rank_parameters(MODEL, FP32, rank=0)
    (adam,) = [s for s in work.ranks[0].optimizer if s.kind == "optimizer"]
    assert adam.duration_s == pytest.approx(28 * params / profile.streaming_bytes_per_s())
    # b * s * h fp32 values between stages: 1 * 32 * 64 * 4 B
    assert work.stages[0].send_forward.num_bytes == 4 * 32 * 64


def test_hbm_bound_gemm_moves_4_byte_operands() -> None:
    profile = dataclasses.replace(
        round_profile(),
        peak_flops_per_s={"bf16": 100e12, "fp32": 100e12},
        matmul_efficiency={"bf16": Curve(x=(1.0,), y=(1.0,)), "fp32": Curve(x=(1.0,), y=(1.0,))},
    )
    gemm = fl.Gemm(name="qkv", m=16, n=16, k=16)  # 3 x 256 elements: HBM-bound
    assert gemm_time_s(gemm, profile, dtype="fp32") == pytest.approx(4 * 768 / 1000e9)
    assert gemm_time_s(gemm, profile, dtype="bf16") == pytest.approx(2 * 768 / 1000e9)


def test_validation_simulates_the_run_in_its_own_precision() -> None:
    profile = profile_with_fp32()
    assert run_plan(PLAN, profile, dtype="fp32").precision is Precision.FP32
    # as the run executes it: autograd's unfused gradient accumulation, and (a GPU
    # profile) torch's two-kernel norm backward
    assert run_plan(FP32, profile, dtype="fp32") == FP32.with_fields(
        framework=Framework.PYTORCH, gradient_accumulation_fusion=False, persist_layer_norm=False
    )
    one = PLAN.with_fields(pp=1, global_batch_size=2)
    executed = run_plan(one, profile, dtype="fp32")
    direct = evaluate(MODEL, executed, profile)
    assert isinstance(direct, Evaluation)
    # pp = 1, everything serial: + the eager layer's extra in every layer and micro-batch,
    # and the runner's loss as torch runs it
    extra = eager_layer_extra(MODEL, executed, profile)
    per_mb = MODEL.num_layers * (extra.forward_s + extra.backward_s)
    per_mb += sum(runner_loss_time_s(MODEL, executed, profile))
    assert simulate_plan(MODEL, one, profile, dtype="fp32").step_time_s == pytest.approx(
        direct.step_time_s + executed.num_microbatches * per_mb, rel=1e-12
    )
    with pytest.raises(ValidateError, match="no matmul data for the run's dtype 'fp32'"):
        simulate_plan(MODEL, PLAN, round_profile(), dtype="fp32")
    with pytest.raises(ValidateError, match="dtype='int8' is not allowed"):
        run_plan(PLAN, profile, dtype="int8")


def test_a_gpu_profile_without_fp32_data_rejects_fp32_plans() -> None:
    outcome = evaluate(MODEL, FP32, load_profile("h100-sxm5-80gb"))
    assert not isinstance(outcome, Evaluation)
    assert outcome.category == "precision not supported"


def test_cli_simulate_and_plan_take_precision_fp32(capsys: pytest.CaptureFixture[str]) -> None:
    gpt2 = str(Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gpt2.json")
    common = ["--model", gpt2, "--gpu", "cpu-2core-gloo", "--gpus", "2"]
    common += ["--gbs", "8", "--seq-len", "128", "--precision", "fp32"]
    assert main(["simulate", *common, "--tp", "1", "--pp", "2", "--mbs", "1"]) == 0
    assert "step" in capsys.readouterr().out
    assert main(["plan", *common, "--top", "2"]) == 0
    assert "fp32" in capsys.readouterr().out
