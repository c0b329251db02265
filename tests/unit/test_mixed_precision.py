"""bf16 mixed precision in the validate runner (``plansim.validate.mixed_precision``): the
bytes it keeps a parameter are the 2 + 4 + 12 that plansim's memory model prices, and the
main gradient accumulates each micro-batch's bf16 gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from plansim.analytic.memory import state_bytes_per_param  # noqa: E402
from plansim.specs.plan import Precision, plan_from_fields  # noqa: E402
from plansim.validate.measure import state_tensors  # noqa: E402
from plansim.validate.mixed_precision import MasterWeights, fsdp_policy  # noqa: E402
from plansim.validate.parallelize import build_optimizer  # noqa: E402
from plansim.validate.result import ValidateError  # noqa: E402
from plansim.validate.run_dtype import check_dtype_supported, uses_fsdp  # noqa: E402


def _bf16_linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(64, 32, bias=False).to(torch.bfloat16)


def test_main_gradient_accumulates_micro_batches_and_frees_the_bf16_gradient() -> None:
    layer = _bf16_linear()
    master = MasterWeights(list(layer.parameters()))
    x1, x2 = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
    layer(x1).sum().backward()
    assert layer.weight.grad is None  # dropped once added into the main gradient
    first = master.masters[0].grad.clone()
    layer(x2).sum().backward()
    main = master.masters[0].grad
    assert main.dtype == torch.float32
    # each micro-batch's bf16 weight gradient is sum over rows of x: ones^T x
    expected = (x1.float().sum(0) + x2.float().sum(0)).expand(32, 64)
    assert torch.allclose(main, expected, atol=0.1)
    assert not torch.equal(main, first)


def test_pipelining_scales_main_gradients_and_folds_in_assigned_ones() -> None:
    """Under pipelining the hook adds 1/m of each gradient; a gradient assigned to ``.grad``
    outside autograd's accumulation (the zero-bubble weight step, already scaled) is folded
    in after the step."""
    layer = _bf16_linear()
    master = MasterWeights(list(layer.parameters()), grad_scale=0.25)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    layer(x).sum().backward()
    once = master.masters[0].grad.clone()
    assert torch.allclose(once, 0.25 * x.float().sum(0).expand(32, 64), atol=0.05)
    layer.weight.grad = torch.ones_like(layer.weight)  # as stage_backward_weight assigns it
    master.fold_in_grads()
    assert layer.weight.grad is None
    assert torch.equal(master.masters[0].grad, once + 1.0)
    assert master.master_of(layer.weight) is master.masters[0]


def test_masters_update_the_bf16_weights_and_main_gradients_are_zeroed_in_place() -> None:
    layer = _bf16_linear()
    master = MasterWeights(list(layer.parameters()))
    plan = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    opt = build_optimizer(master.masters, plan, dp_group=None, name="sgd")
    before = layer.weight.detach().clone()
    layer(torch.randn(4, 64, dtype=torch.bfloat16)).sum().backward()
    grad = master.masters[0].grad
    opt.step()
    master.copy_to_model()
    master.zero_main_grads()
    assert layer.weight.dtype == torch.bfloat16
    assert torch.equal(layer.weight.detach(), master.masters[0].detach().to(torch.bfloat16))
    assert not torch.equal(layer.weight.detach(), before)
    assert master.masters[0].grad is grad and not grad.any()  # the same buffer, zeroed


def test_a_bf16_parameter_holds_the_18_bytes_plansim_prices() -> None:
    layer = _bf16_linear()
    master = MasterWeights(list(layer.parameters()))
    plan = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    opt = build_optimizer(master.masters, plan, dp_group=None, name="adamw")
    layer(torch.randn(4, 64, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    tensors = {t.untyped_storage().data_ptr(): t for t in state_tensors([layer], opt)}
    total = sum(t.untyped_storage().nbytes() for t in tensors.values() if t.dim() > 0)
    per = state_bytes_per_param(Precision.BF16)
    assert total == layer.weight.numel() * (per.param + per.grad + per.optimizer)


def test_which_plans_run_in_bf16() -> None:
    base = plan_from_fields(dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=2)
    for zero in (0, 2, 3):
        check_dtype_supported("bf16", base.with_fields(zero_stage=zero))
    with pytest.raises(ValidateError, match=r"plan.zero_stage 1 with dtype bf16"):
        check_dtype_supported("bf16", base.with_fields(zero_stage=1))
    pp2 = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=2)
    check_dtype_supported("bf16", pp2)
    check_dtype_supported("fp32", base.with_fields(zero_stage=1))
    with pytest.raises(ValidateError, match=r"dtype 'fp16'; choose one of: fp32, bf16"):
        check_dtype_supported("fp16", base)
    assert uses_fsdp(base.with_fields(zero_stage=3))
    assert not uses_fsdp(base)
    assert fsdp_policy("fp32") is None
    policy = fsdp_policy("bf16")
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
