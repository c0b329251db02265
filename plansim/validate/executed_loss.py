"""The validate runner's loss as torch runs it, against the Megatron-LM loss plansim prices
(pure).

plansim's memory model holds one fp32 copy of the logits at the last stage (Megatron-LM's
vocab-parallel cross-entropy works in place on the fp32 logits, 4*s*b*V/tp bytes;
``analytic.memory.transient_bytes``). The runner's loss (``plansim.validate.model.loss_fn``)
is ``F.cross_entropy`` on the output layer's fp32 logits of the whole vocabulary (its output
layer is not vocab-parallel, so every TP rank holds all V): ``log_softmax`` keeps its
output for the backward, and at the start of the backward ``nll_loss``'s gradient (dense,
like the log-probabilities) and ``log_softmax``'s gradient (the logits') are alive beside
it: three fp32 tensors of s*b*V. Measured on one H100 (benchmarks/gpu_runs/h100-2026-11-27,
fp32, 8 layers, h 2048, s 2048, b 2, V 50304: 824 MB a copy): peak 15.07 GB; weights,
gradients and Adam states 8.16 GB and stored activations 4.30 GB leave 2.61 GB, three copies
(2.47 GB) and the final norm's input.
"""

from __future__ import annotations

import dataclasses

from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import PipelineWork

#: fp32 logits-sized tensors alive at the start of the runner's backward (module docstring).
RUNNER_LOSS_COPIES = 3


def runner_loss_extra_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes the runner's last stage holds at its loss beyond plansim's one fp32 logits copy
    of 4*s*b*V/tp: 3 x 4*s*b*V - 4*s*b*V/tp."""
    tokens = model.seq_length / plan.cp * plan.micro_batch_size
    copy = 4.0 * tokens * model.vocab_size
    return RUNNER_LOSS_COPIES * copy - copy / plan.tp


def with_runner_loss(work: PipelineWork, model: ModelSpec, plan: ParallelPlan) -> PipelineWork:
    """``work`` with :func:`runner_loss_extra_bytes` on the last pipeline rank's static bytes
    (held through its micro-batches' loss: the peak of a last stage is at a backward's start)."""
    extra = runner_loss_extra_bytes(model, plan)
    ranks = list(work.ranks)
    last = ranks[-1]
    ranks[-1] = dataclasses.replace(last, static_bytes=last.static_bytes + extra)
    return dataclasses.replace(work, ranks=tuple(ranks))
