"""The ``elementwise`` calibration item: a GELU layer's non-GEMM kernels in eager torch.

Forward, for x, a, m ``[tokens, hidden]`` and u ``[tokens, 4 hidden]`` (a, m and u stand for
the attention output, the MLP output and the MLP's up-projection, which GEMMs produce)::

    n1 = layer_norm(x); r1 = x + a; n2 = layer_norm(r1); g = gelu(u); r2 = r1 + m

and with ``layer_fwd_bwd`` the backward of (r2, n1, n2, g) by autograd (two layer-norm
backwards, the GELU backward, the residual-gradient sums): the kernels
``plansim.analytic.elementwise`` counts for a pre-norm GELU layer without dropout (bias adds
run inside the GEMMs in eager torch). Imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Fn = Callable[[], object]


def elementwise_layer(
    shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device, backward: bool
) -> Fn:
    """The item's call: forward only, or forward + backward (``backward``)."""
    tokens, hidden = shape

    def tensor(*dims: int, fill: float | None = None) -> torch.Tensor:
        t = (
            torch.full(dims, fill, device=device, dtype=dtype)
            if fill is not None
            else torch.randn(*dims, device=device, dtype=dtype)
        )
        return t.requires_grad_(backward)

    x, a, m = (tensor(tokens, hidden) for _ in range(3))
    u = tensor(tokens, 4 * hidden)
    w1, w2 = tensor(hidden, fill=1.0), tensor(hidden, fill=1.0)
    b1, b2 = tensor(hidden, fill=0.0), tensor(hidden, fill=0.0)
    leaves = (x, a, m, u, w1, w2, b1, b2)

    def forward() -> tuple[torch.Tensor, ...]:
        n1 = F.layer_norm(x, (hidden,), w1, b1)
        r1 = x + a
        n2 = F.layer_norm(r1, (hidden,), w2, b2)
        g = F.gelu(u)
        return r1 + m, n1, n2, g

    if not backward:

        def forward_only() -> None:
            with torch.no_grad():
                forward()

        return forward_only
    grad_h = torch.randn(tokens, hidden, device=device, dtype=dtype)
    grad_f = torch.randn(tokens, 4 * hidden, device=device, dtype=dtype)

    def forward_backward() -> None:
        torch.autograd.backward(forward(), (grad_h, grad_h, grad_h, grad_f))
        for leaf in leaves:
            leaf.grad = None

    return forward_backward
