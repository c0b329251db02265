"""bf16 mixed precision for the validate runner, as plansim prices it (torch).

Two ways, one per kind of plan:

* **ZeRO-0 (Megatron-LM's mixed precision).** What ``plansim.analytic.memory.state_bytes_per_param``
  prices for bf16 (M02's table: 2 + 4 + 12 = 18 bytes a parameter):

  - the working weights are bf16, the norms' too (Megatron-LM's ``Float16Module`` casts the
    whole module);
  - each parameter has an fp32 main gradient, alive all step (Megatron-LM's
    ``DistributedDataParallel`` gradient buffer): as soon as backward has accumulated a
    parameter's bf16 gradient, it is added to the main gradient and dropped (Megatron-LM's
    gradient hook, ``param.main_grad.add_(param.grad.data)``, the path without fused
    weight-gradient accumulation);
  - the optimizer updates fp32 master weights with fp32 Adam states
    (``Float16OptimizerWithFloat16Params``) and copies them into the bf16 weights after its
    step;
  - the data-parallel all-reduce averages the fp32 main gradients (Megatron-LM's default;
    ``--grad-reduce-in-bf16`` is not run).

* **ZeRO-2/3 over dp > 1 (PyTorch FSDP2).** ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``: FSDP2 keeps fp32 sharded parameters, gathers them in bf16, and
  reduce-scatters fp32 gradients, which plansim prices as PyTorch FSDP's states
  (``analytic.memory.rank_memory``: fp32 training's 16 bytes a parameter, sharded).

Under pipelining (pp > 1) each main gradient takes 1/m of every micro-batch's gradient
(``torch.distributed.pipelining`` scales its stages' ``.grad`` by 1/m at the end of the
step, where the loop of pp 1 scales the loss), and after the step the gradients that did
not pass through autograd's accumulation are folded in: the zero-bubble schedule's
weight-gradient step assigns ``.grad`` itself (``stage_backward_weight``), already scaled
(:meth:`MasterWeights.fold_in_grads`). ZeRO-1 (``ZeroRedundancyOptimizer`` would keep full
fp32 master weights on every rank, where plansim shards them) is not run in bf16
(``plansim.validate.run_dtype.check_dtype_supported``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

#: torch dtype of each run dtype's working weights and activations.
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a tensor-parallel or FSDP2-sharded parameter or
    gradient), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def fsdp_policy(dtype: str) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``dtype`` (None for fp32: FSDP2's default)."""
    if dtype == "fp32":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[dtype], reduce_dtype=torch.float32)


def _main_grad(master: nn.Parameter) -> torch.Tensor:
    """The local shard of ``master``'s main gradient (allocated with the master)."""
    assert master.grad is not None
    return local(master.grad)


class MasterWeights:
    """fp32 master weights and main gradients of bf16 model parameters (module docstring).

    Args:
        params: the bf16 model parameters (plain tensors or DTensors).
        grad_scale: factor on each gradient added into a main gradient (1/m under
            pipelining, 1 where the loss is already scaled).

    Attributes:
        params: as given.
        masters: one fp32 ``nn.Parameter`` per parameter, same placement; its ``.grad`` is the
            main gradient, zeroed (not freed) after each step. The optimizer and the
            data-parallel all-reduce work on these.
    """

    def __init__(self, params: list[nn.Parameter], *, grad_scale: float = 1.0) -> None:
        self.params = params
        self.masters = [nn.Parameter(p.detach().to(torch.float32)) for p in params]
        self._by_param = {id(p): m for p, m in zip(params, self.masters, strict=True)}
        for param, master in zip(params, self.masters, strict=True):
            master.grad = torch.zeros_like(master)
            param.register_post_accumulate_grad_hook(_accumulate_into(master, grad_scale))

    def master_of(self, param: torch.Tensor) -> nn.Parameter:
        """The master weight of model parameter ``param``.

        Raises:
            KeyError: ``param`` is not one of :attr:`params`.
        """
        return self._by_param[id(param)]

    @torch.no_grad()
    def fold_in_grads(self) -> None:
        """Add every ``.grad`` left on a model parameter into its main gradient and drop it
        (the gradients that bypassed autograd's accumulation, e.g. the zero-bubble
        weight-gradient step's, which pipelining has already scaled)."""
        for param, master in zip(self.params, self.masters, strict=True):
            if param.grad is not None:
                _main_grad(master).add_(local(param.grad))
                param.grad = None

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Copy the master weights into the bf16 weights (after the optimizer step), in
        multi-tensor kernels (``torch._foreach_copy_``) as Megatron-LM's apex
        ``multi_tensor_applier`` does, not one launch per tensor."""
        torch._foreach_copy_([local(p) for p in self.params], [local(m) for m in self.masters])

    @torch.no_grad()
    def zero_main_grads(self) -> None:
        """Zero the main gradients in place, as Megatron-LM zeroes its gradient buffer
        (multi-tensor: ``torch._foreach_zero_``)."""
        torch._foreach_zero_([_main_grad(m) for m in self.masters])


def _accumulate_into(master: nn.Parameter, scale: float) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        assert param.grad is not None
        with torch.no_grad():
            _main_grad(master).add_(local(param.grad), alpha=scale)
        param.grad = None

    return hook
