"""The one-rank calibration calls: GEMM (fp8 through ``torch._scaled_mm``), causal SDPA
forward or forward + backward, STREAM kernels, the launch probe, host Adam, a GELU layer's
elementwise kernels and host<->device copies (imports torch). Each builder makes an item's
tensors once and returns the call that :mod:`.bench` times; none talks to another rank."""

from __future__ import annotations

from collections.abc import Callable

import torch

from plansim.calibrate.bench_elementwise import elementwise_layer
from plansim.calibrate.bench_overlap import DTYPES
from plansim.calibrate.plan import Item

Fn = Callable[[], object]


def gemm_call(item: Item, device: torch.device) -> Fn:
    """``out = a @ b`` of shape ``(m, n, k)`` in the item's dtype (fp8: :func:`_fp8_gemm`)."""
    m, n, k = item.shape
    if item.dtype == "fp8":
        return _fp8_gemm(m, n, k, device)
    dtype = DTYPES[item.dtype]
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


def _fp8_gemm(m: int, n: int, k: int, device: torch.device) -> Fn:
    fp8 = torch.float8_e4m3fn
    a = torch.randn(m, k, device=device).to(fp8)
    b = torch.randn(n, k, device=device).to(fp8).t()  # column-major, as cuBLASLt wants
    scale = torch.ones((), device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def attention_call(item: Item, device: torch.device) -> Fn:
    """Causal ``scaled_dot_product_attention`` of shape ``(batch, heads, seq, head_dim)``:
    forward only (``sdpa_fwd``) or forward + backward (``sdpa_fwd_bwd``)."""
    batch, heads, seq, head_dim = item.shape
    dtype = DTYPES[item.dtype]
    backward = item.op == "sdpa_fwd_bwd"
    q, k, v = (
        torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype).requires_grad_(
            backward
        )
        for _ in range(3)
    )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not backward:

        def forward() -> None:
            with torch.no_grad():
                sdpa(q, k, v, is_causal=True)

        return forward
    grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)

    def forward_backward() -> None:
        sdpa(q, k, v, is_causal=True).backward(grad)
        q.grad = k.grad = v.grad = None

    return forward_backward


def stream_call(item: Item, device: torch.device) -> Fn:
    """One STREAM kernel (``copy``, ``scale``, ``add`` or ``triad``) over ``n`` fp32 values."""
    (n,) = item.shape
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    kernels: dict[str, Fn] = {
        "copy": lambda: c.copy_(a),
        "scale": lambda: torch.mul(a, 3.0, out=c),
        "add": lambda: torch.add(a, b, out=c),
        "triad": lambda: torch.add(a, b, alpha=3.0, out=c),
    }
    return kernels[item.op]


def launch_call(item: Item, device: torch.device) -> Fn:
    """A tiny add: what one kernel launch costs."""
    x = torch.ones(item.shape, device=device)
    return lambda: torch.add(x, x)


def adam_call(item: Item, device: torch.device) -> Fn:
    """One ``torch.optim.Adam(foreach=True)`` step over ``n`` parameters on the host (the
    offloaded optimizer's rate; ``device`` is not used)."""
    (n,) = item.shape
    param = torch.nn.Parameter(torch.randn(n))
    param.grad = torch.randn(n)
    optimizer = torch.optim.Adam([param], lr=1e-4, foreach=True)
    return optimizer.step


def elementwise_call(item: Item, device: torch.device) -> Fn:
    """A GELU layer's non-GEMM kernels, forward (``layer_fwd``) or forward + backward
    (:func:`.bench_elementwise.elementwise_layer`)."""
    backward = item.op != "layer_fwd"
    return elementwise_layer(item.shape, dtype=DTYPES[item.dtype], device=device, backward=backward)


def copy_call(item: Item, device: torch.device) -> Fn:
    """A pinned host <-> device copy of ``size`` bytes (``h2d`` or ``d2h``)."""
    (size,) = item.shape
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    if item.op == "h2d":
        return lambda: dev.copy_(host, non_blocking=True)
    return lambda: host.copy_(dev, non_blocking=True)


#: Item kind -> builder of its one-rank call.
LOCAL_CALLS: dict[str, Callable[[Item, torch.device], Fn]] = {
    "gemm": gemm_call,
    "attention": attention_call,
    "stream": stream_call,
    "launch": launch_call,
    "adam": adam_call,
    "elementwise": elementwise_call,
    "copy": copy_call,
}
