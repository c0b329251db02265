"""torchtitan's per-op selective activation checkpointing (torch): the policy the validator
runs (``plansim.validate.parallelize.apply_recompute``) and whose dispatch cost ``plansim
calibrate`` times (the ``sac_`` host-overhead chains, ``plansim.calibrate.bench_host``).

``Recompute.SELECTIVE_OP`` wraps every transformer block in a non-reentrant checkpoint whose
policy (torch's ``create_selective_checkpoint_contexts``) saves the output of every odd weight
matmul of the block, in execution order, and of the fused attention kernel, and marks
everything else for recomputation: the policy of torchtitan's ``_apply_op_sac``
(``torchtitan/distributed/activation_checkpoint.py``, "Saves output of all compute ops, except
every second mm"). torchtitan's models have no linear biases, so it counts ``aten.mm``; this
model's linear layers may have biases, which dispatch ``aten.addmm``, so both are counted,
keeping the policy the one ``plansim.analytic.flops.op_selective_recompute_gemms`` prices.
Forward and recompute keep separate counters, as torchtitan's do.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_ATEN = torch.ops.aten
#: Weight matmuls as the dispatcher sees ``nn.Linear`` (without and with bias).
MATMUL_OPS = frozenset({_ATEN.mm.default, _ATEN.addmm.default})
#: Fused attention kernels whose outputs are saved (torchtitan's save list names the CUDA
#: flash, memory-efficient and cuDNN kernels; the CPU flash kernel is their CPU counterpart).
ATTENTION_OPS = frozenset(
    getattr(_ATEN, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(_ATEN, name)
)


def _policy(counts: defaultdict[str, int]) -> Any:
    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMUL_OPS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            odd = counts[key] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if odd else CheckpointPolicy.PREFER_RECOMPUTE
        if func in ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _context() -> Any:
    """Fresh counters for each checkpointed forward of a block (torchtitan builds one per
    call of its ``context_fn``)."""
    return create_selective_checkpoint_contexts(_policy(defaultdict(int)))


def op_selective_checkpoint(block: nn.Module) -> nn.Module:
    """``block`` wrapped for per-op selective recompute (non-reentrant checkpoint)."""
    wrapped: nn.Module = checkpoint_wrapper(block, context_fn=_context)
    return wrapped
