"""The dense feed-forward block of the validator's decoder and its activations (torch).

``MLP`` is ``down(act(up(x)))``, or ``down(silu(gate(x)) * up(x))`` for SwiGLU (Shazeer 2020),
with separate ``up`` / ``gate`` (column-parallel) and ``down`` (row-parallel) ``nn.Linear``
layers, so tensor parallelism can shard them (``plansim.validate.parallelize``). The MoE
layer's experts use the same activations (``plansim.validate.moe_layer``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plansim.specs.model import Activation, ModelSpec


def activate(activation: Activation, up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """The MLP's activation of ``up`` (and, for SwiGLU, ``gate``): ``silu(gate) * up``,
    ``gelu(up)``, ``relu(up)`` or ``relu(up)**2``."""
    if gate is not None:
        return F.silu(gate) * up
    if activation is Activation.GELU:
        return F.gelu(up)
    if activation is Activation.RELU:
        return F.relu(up)
    return F.relu(up).square()


class MLP(nn.Module):
    """Feed-forward: ``down(act(up(x)))``, or ``down(silu(gate(x)) * up(x))`` for SwiGLU."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn_hidden_size, spec.add_bias_linear
        self.activation = spec.activation
        self.up = nn.Linear(h, f, bias=bias)
        self.gate = nn.Linear(h, f, bias=bias) if spec.activation is Activation.SWIGLU else None
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up(x)
        gate = self.gate(x) if self.gate is not None else None
        out: torch.Tensor = self.down(activate(self.activation, up, gate))
        return out
