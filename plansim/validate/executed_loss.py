"""The validate runner's output layer and loss as torch runs them, against the Megatron-LM
ones plansim prices (pure).

Time: the runner keeps its output layer replicated over TP (``plansim.validate.parallelize``
shards the blocks only), so every TP rank computes the logits GEMM of the whole vocabulary,
where Megatron-LM's vocab-parallel output layer computes V/tp columns: the last stage's
forward gains the difference of the two GEMMs and its backward twice that (input- and
weight-gradient GEMMs of the same size; ``layer_cost.gemm_time_s``).

Loss time: plansim prices Megatron-LM's vocab-parallel cross-entropy op by op
(``elementwise.cross_entropy_bytes``: 32 B a logit forward, 8 backward, plus the 16-bit cast
each way). The runner's ``F.cross_entropy`` moves about as many bytes in all, split
otherwise (:data:`RUNNER_LOSS_BYTES_PER_LOGIT`): its fused log-softmax forward moves 16 B a
logit, its backward a dense zero-filled NLL gradient and the log-softmax backward, 20 B. The
difference, on all V logits against Megatron-LM's V/tp, is added to the last stage's forward
and backward (:func:`runner_loss_time_s`).

Memory: plansim's memory model holds one fp32 copy of the logits at the last stage (Megatron-LM's
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

from plansim.analytic.elementwise import cross_entropy_bytes, logits_cast_bytes
from plansim.analytic.flops import logits_forward_gemm
from plansim.analytic.layer_cost import cp_local_model, gemm_time_s
from plansim.analytic.sustained import job_compute_profile
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import PipelineWork, Segment, lengthen_longest

#: fp32 logits-sized tensors alive at the start of the runner's backward (module docstring).
RUNNER_LOSS_COPIES = 3
#: HBM bytes a logit of the runner's ``F.cross_entropy`` on fp32 logits, forward and backward,
#: kernel by kernel as torch runs it on a GPU (the 16-bit -> fp32 cast and back, 6 B each
#: way, come on top in bf16). Forward: the log-softmax (``cunn_SoftMaxForward``: a row of
#: the vocabulary is read three times, for its max, its sum of exponentials and the output,
#: and written once) = 16 B; the NLL reads one logit per token. Backward: the NLL gradient
#: (dense, zero-filled: write 4) and the log-softmax backward (the incoming gradient read
#: twice, for its row sum and the output, the saved log-probabilities once, one write: 16) =
#: 20 B. Measured on one H100 (benchmarks/gpu_runs/h100-2026-11-27-bf16/kernels_gpt_names.csv,
#: 4096 x 50304 logits, bf16 run): log-softmax forward 1.09 ms and backward 1.15 ms, 15.1
#: and 15.9 B a logit at the profile's 2848 GB/s; the fill 0.25 ms (4.2 B), the cast back
#: 0.40 ms (5.5 B).
RUNNER_LOSS_BYTES_PER_LOGIT = (16.0, 20.0)


def _logits(model: ModelSpec, plan: ParallelPlan) -> float:
    """Logits of one micro-batch on a rank that holds the whole vocabulary: (s/cp) * b * V."""
    return model.seq_length / plan.cp * plan.micro_batch_size * model.vocab_size


def runner_loss_extra_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes the runner's last stage holds at its loss beyond plansim's one fp32 logits copy
    of 4*s*b*V/tp: 3 x 4*s*b*V - 4*s*b*V/tp."""
    copy = 4.0 * _logits(model, plan)
    return RUNNER_LOSS_COPIES * copy - copy / plan.tp


def with_runner_loss(work: PipelineWork, model: ModelSpec, plan: ParallelPlan) -> PipelineWork:
    """``work`` with :func:`runner_loss_extra_bytes` on the last pipeline rank's static bytes
    (held through its micro-batches' loss: the peak of a last stage is at a backward's start)."""
    extra = runner_loss_extra_bytes(model, plan)
    ranks = list(work.ranks)
    last = ranks[-1]
    ranks[-1] = dataclasses.replace(last, static_bytes=last.static_bytes + extra)
    return dataclasses.replace(work, ranks=tuple(ranks))


def runner_loss_time_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch that the runner's loss takes beyond
    plansim's Megatron-LM loss on the last stage: :data:`RUNNER_LOSS_BYTES_PER_LOGIT` on all
    V logits of each token less ``elementwise.cross_entropy_bytes`` on V/tp, at the
    profile's streaming rate (as ``edge_cost.edge_times`` prices the loss). Negative where
    the runner moves less (the forward at tp 1)."""
    act = float(plan.precision.activation_bytes)
    cast = logits_cast_bytes(act)
    megatron = cross_entropy_bytes(act)
    rate = profile.streaming_bytes_per_s()
    whole = _logits(model, plan)
    shard = whole / plan.tp
    forward, backward = (
        ((runner + cast) * whole - ours * shard) / rate
        for runner, ours in zip(RUNNER_LOSS_BYTES_PER_LOGIT, megatron, strict=True)
    )
    return forward, backward


def with_runner_loss_time(
    work: PipelineWork, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> PipelineWork:
    """``work`` with :func:`runner_loss_time_s` on the last stage's forward and backward (and
    input-gradient backward)."""
    forward, backward = runner_loss_time_s(model, plan, profile)
    return _lengthen_last(work, forward=forward, backward=backward)


def _lengthen_last(work: PipelineWork, *, forward: float, backward: float) -> PipelineWork:
    """``work`` with ``forward`` / ``backward`` seconds more (less, when negative) on the
    longest compute segment of the last stage's forward / backward and input-gradient
    backward: the segment holding its layers, output layer and loss
    (``specs.work.lengthen_longest``; a pipeline action's own short segment comes first)."""
    stages = list(work.stages)
    last = stages[-1]

    def compute(seg: Segment) -> bool:
        return seg.stream == "compute"

    stages[-1] = dataclasses.replace(
        last,
        forward=lengthen_longest(last.forward, forward, compute),
        backward=lengthen_longest(last.backward, backward, compute),
        backward_input=lengthen_longest(last.backward_input, backward, compute),
    )
    return dataclasses.replace(work, stages=tuple(stages))


def replicated_head_extra_s(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> float:
    """Forward seconds the runner's replicated output layer adds per micro-batch on a TP rank:
    the logits GEMM of all V columns less that of V/tp (0 at tp 1). ``profile`` is scaled to
    the job's sustained GEMM rate as the simulator prices (``analytic.sustained``)."""
    if plan.tp == 1:
        return 0.0
    job = job_compute_profile(profile, plan.num_gpus)
    b, dtype = plan.micro_batch_size, plan.precision.value
    local = cp_local_model(model, plan.cp)
    whole = logits_forward_gemm(local, micro_batch_size=b, tp=1)
    shard = logits_forward_gemm(local, micro_batch_size=b, tp=plan.tp)
    return gemm_time_s(whole, job, dtype=dtype) - gemm_time_s(shard, job, dtype=dtype)


def with_replicated_head(
    work: PipelineWork, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> PipelineWork:
    """``work`` with :func:`replicated_head_extra_s` on the last stage: once in its forward,
    twice in its backward (and input-gradient backward, as ``simulated._with_added``)."""
    extra = replicated_head_extra_s(model, plan, profile)
    if extra == 0.0:
        return work
    return _lengthen_last(work, forward=extra, backward=2.0 * extra)
