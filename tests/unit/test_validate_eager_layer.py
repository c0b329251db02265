"""The validate model's eager layer against plansim's Megatron layer (validate/eager_layer)."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.layer_cost import gemm_time_s, layer_gemms, layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.specs.compute_terms import HostOverhead
from plansim.specs.curves import Curve
from plansim.specs.model import ModelSpec
from plansim.specs.plan import plan_from_fields
from plansim.validate.eager_layer import eager_layer_extra, eager_layer_ops
from tests.unit.synthetic import SMALL_GPT, SMALL_LLAMA, round_profile

#: torch functions that launch no kernel (views, shape reads, dtype moves of constants).
NO_KERNEL = {"__get__", "view", "transpose", "reshape", "__getitem__", "to"}

GPT, LLAMA = SMALL_GPT, SMALL_LLAMA


def _counted(model: ModelSpec) -> tuple[int, int]:
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    from plansim.validate.model import Block

    names: list[str] = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    block = Block(model)
    x = torch.randn(2, model.seq_length, model.hidden_size)
    with Count():
        block(x)
    kernels = [n for n in names if n not in NO_KERNEL]
    return len(kernels), names.count("linear")


@pytest.mark.parametrize("model", [GPT, LLAMA], ids=["gpt-gelu-mha", "llama-swiglu-rope-gqa"])
def test_op_count_matches_the_real_block(model: ModelSpec) -> None:
    eager = eager_layer_ops(model)
    assert (eager.num_ops, eager.num_linears) == _counted(model)


def test_gelu_layer_pays_for_separate_q_k_v() -> None:
    plan = plan_from_fields(tp=1, pp=1, dp=1, micro_batch_size=2, global_batch_size=2)
    rising = Curve(x=(1e5, 1e8), y=(0.1, 1.0), source="test")
    profile = dataclasses.replace(round_profile(), matmul_efficiency={"bf16": rising})
    bare = eager_layer_extra(GPT, plan, profile)
    fused = next(g for g in layer_gemms(GPT, plan) if g.name == "qkv")
    third = dataclasses.replace(fused, n=fused.n // 3)
    split = 3 * gemm_time_s(third, profile, dtype="bf16") - gemm_time_s(
        fused, profile, dtype="bf16"
    )
    assert split > 0  # smaller GEMMs run at a lower efficiency on the profile's curve
    assert (bare.forward_s, bare.backward_s) == pytest.approx((split, 2 * split))
    host = HostOverhead(
        serial=True,
        forward_op_s=1e-5,
        backward_op_s=2e-5,
        dtensor_forward_op_s=1e-4,
        dtensor_backward_op_s=3e-4,
    )
    with_host = dataclasses.replace(profile, host_overhead=host)
    one = eager_layer_extra(GPT, plan, with_host)
    # 12 eager ops against plansim's 10 (4 weight GEMMs, the attention core, 5 kernels)
    assert one.forward_s == pytest.approx(split + 2 * 1e-5)
    tp2 = plan.with_fields(tp=2)
    two = eager_layer_extra(GPT, tp2, with_host)
    fused2 = next(g for g in layer_gemms(GPT, tp2) if g.name == "qkv")
    split2 = 3 * gemm_time_s(
        dataclasses.replace(fused2, n=fused2.n // 3), with_host, dtype="bf16"
    ) - gemm_time_s(fused2, with_host, dtype="bf16")
    # and 6 DTensor linears against 4 weight GEMMs
    assert two.forward_s == pytest.approx(split2 + 2 * 1e-5 + 2 * 1e-4)
    assert two.backward_s == pytest.approx(2 * split2 + 2 * 2e-5 + 2 * 3e-4)


def test_on_a_gpu_the_extra_ops_host_time_hides_behind_the_device() -> None:
    """A GPU's host issues kernels ahead of the device (``HostOverhead.pass_s``: max), so the
    eager layer's extra ops cost nothing while the pass stays device-bound, and only the part
    beyond the device's time when they make it host-bound; on a CPU they add up."""
    plan = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    base = round_profile()
    split = eager_layer_extra(GPT, plan, base)
    bare = dataclasses.replace(base, host_overhead=None)
    groups = layout_groups(plan, gpus_per_node=base.gpus_per_node)
    times = layer_pass_times(GPT, plan, bare, groups)
    device = times.forward_s + split.forward_s  # plansim's layer + the split q, k, v GEMMs

    def extra(per_op_s: float, *, serial: bool) -> float:
        host = HostOverhead(serial=serial, forward_op_s=per_op_s, backward_op_s=per_op_s)
        profile = dataclasses.replace(base, host_overhead=host)
        return eager_layer_extra(GPT, plan, profile).forward_s - split.forward_s

    # 12 eager ops against plansim's 10: 2 extra
    assert extra(1e-9, serial=False) == 0.0  # device-bound: hidden
    assert extra(1e-9, serial=True) == pytest.approx(2e-9)
    fast = device / 11  # 10 ops' host time under the device's, 12 ops' over it
    assert extra(fast, serial=False) == pytest.approx(12 * fast - device)
    slow = device  # host-bound already: every extra op shows
    assert extra(slow, serial=False) == pytest.approx(2 * slow)
