"""ZeRO-3 parameter gathers and ZeRO-2/3 gradient reduce-scatters per micro-batch (pure).

ZeRO stage 2 (Rajbhandari et al., SC20, §5.2, P_os+g) keeps 1/(dp * cp) of the gradients on
each rank, so a rank cannot hold a micro-batch's full gradients until the end of the step:
each micro-batch's gradients are reduce-scattered to their owners as backward produces them,
and the owner adds its shard into its accumulated partition. DeepSpeed does exactly this
("ZeRO stage >= 2 communicates during non gradient accumulation boundaries as well",
``DeepSpeedEngine.allreduce_gradients`` in ``deepspeed/runtime/engine.py``: with
``partition_gradients`` the backward hooks reduce every micro-step's buckets, while stage 1
reduces only at the accumulation boundary), as does PyTorch FSDP's ``SHARD_GRAD_OP`` outside
``no_sync``. So with m micro-batches a ZeRO-2 step moves m times ZeRO-1's gradient bytes.
Priced here as ZeRO-3's reduce-scatter side: one flat reduce-scatter per layer (and one for
a stage's edge parameters) after its backward, overlapped with the next layer's backward as
in ``layer-prefetch`` when ``plan.overlap_grad_reduce`` (DeepSpeed ``overlap_comm``), each
one waited for otherwise; nothing is gathered (the 16-bit parameters are replicated; their
all-gather after the optimizer, once per step, is ``plansim.analytic.rank_work``'s). Limit:
DeepSpeed reduces ``reduce_bucket_size`` buckets, not layers (same bytes, another count of
collectives), and its bucket's transient memory is not added to the memory model.

ZeRO stage 3 (Rajbhandari et al., SC20, §5.3 and §7.2) keeps 1/(dp * cp) of every parameter
on each rank: before a layer runs, forward or backward (and again for a full-recompute
forward), its 16-bit parameters are all-gathered; after its backward its gradients are
reduce-scattered. How much of that traffic shows on the step depends on how the framework
fetches parameters (``plan.zero3_param_fetch``):

* ``layer-prefetch`` (PyTorch FSDP with one unit per transformer layer, Zhao et al.,
  VLDB 2023 §3.3-3.4, forward and backward prefetch; DeepSpeed's bucketed prefetch since
  2022): one all-gather of the layer's flat parameters into one buffer, issued on the
  communication stream one layer ahead, so it hides behind the previous layer's compute;
  one reduce-scatter per layer after its backward, overlapped with the next layer's
  backward. For n layers with per-layer compute c and communication g (two-stage
  producer/consumer pipeline):

      exposed = g + (n - 1) * max(0, g - c)                     (forward, recompute)
      exposed = g + (n - 1) * max(0, g + r - c) + r             (backward, r = reduce-scatter)

  Compute slows while a collective runs beside it (the NCCL kernels take SMs and HBM
  bandwidth): with the profile's ``overlap_compute_slowdown_fraction`` s, each overlapped
  layer adds max(0, g - c, g s / (1 + s)) instead of max(0, g - c)
  (:func:`overlapped_excess_s`; Lee et al. 2025, arXiv:2507.03114, measured compute 18.9%
  slower on average while overlapped with communication).

  The edge parameters (embedding, final norm, output layer) are one more unit, gathered
  before the stage's first layer (exposed).

* ``layer-sync`` (FSDP without prefetch; FSDP2 on a CPU device, where nothing runs ahead of
  the one thread that computes): one collective of the whole unit each way, as
  ``layer-prefetch``, but each one waited for where it is issued, so every gather and
  reduce-scatter is on the critical path: n (g + r) per micro-batch (plus g for the
  forward). Gathered once per backward: FSDP's pre-backward unshard also serves the
  recompute.

  Without resharding after forward (``plan.reshard_after_forward`` False: PyTorch FSDP2
  ``fully_shard(reshard_after_forward=False)``, FSDP1 ``SHARD_GRAD_OP``, torchtitan
  ``fsdp_reshard_after_forward = "never"``) a unit gathered for the forward stays gathered
  until its backward has run, so both modes above drop the backward's gathers (and their
  bytes): exposed = (n - 1) max(0, r - c) + r in backward with prefetch, n r without; the
  rank holds all its 16-bit parameters unsharded (:func:`gathered_bytes`). FSDP2 still
  reshards after backward, so every micro-batch's forward gathers again.

* ``per-step`` (FSDP2 under ``torch.distributed.pipelining``: torchtitan with pp > 1). A
  pipeline stage turns off FSDP2's gradient sync and resharding for every backward but its
  last (``_PipelineStageBase.backward_maybe_with_nosync``: ``set_requires_gradient_sync``,
  ``set_reshard_after_backward`` False), and torchtitan shards with ``reshard_after_forward``
  off when pp > 1 ("For PP, do not reshard after forward to avoid per-microbatch
  all-gathers", ``parallelize.py``): each layer is gathered once per step, in the first
  micro-batch's forward (FSDP2's prefetch puts each gather beside the previous layer's
  forward), and its gradients accumulate unsharded, in the reduce dtype
  (``FSDPParam.to_accumulated_grad_if_needed`` upcasts them to ``reduce_dtype``), until one
  reduce-scatter after the stage's last backward. Priced once per step on each pipeline
  rank: the reduce-scatters after its last action, the gathers (exposed as in
  ``layer-prefetch`` over one forward) after the optimizer, for the next step
  (``plansim.analytic.zero_segments``); the memory model holds the rank's unsharded parameters and
  accumulated gradients all step (``plansim.analytic.memory.transient_bytes``).

* ``per-tensor-sync`` (DeepSpeed ZeRO-3 as of 2021, v0.3.x
  ``deepspeed/runtime/zero/partition_parameters.py``): one collective per parameter tensor
  (``_allgather_param``: ``torch.cuda.synchronize()`` and then ``torch.distributed.all_gather``
  into a list of dp * cp views; ``_reduce_scatter_gradient``: ``reduce_scatter`` from a list
  of dp * cp views), so nothing overlaps compute. With list arguments PyTorch's NCCL process
  group copies each of the n chunks separately (``ProcessGroupNCCL::allgather`` /
  ``reduce_scatter`` flatten and unflatten one tensor per rank): n small copy kernels per
  collective, each priced at the profile's ``kernel_launch_s``, together moving the tensor
  once through memory (read + write its bytes at the streaming bandwidth). DeepSpeed's own
  passes over the tensor, serial on their stream and in every configuration: each gather
  first allocates the gathered tensor with ``torch.zeros`` (a memset, one write), and
  ``stage3.py`` divides the unsharded gradients by the data-parallel size in place before
  reducing them (``average_tensor``'s ``div_``, or the ``div_`` / ``mul_`` around the
  all-reduce it falls back to: a read and a write); the bucket copies that depend on its
  configuration (``contiguous_gradients``) are not priced. Each all-gather also pays
  DeepSpeed's host work, which the ``torch.cuda.synchronize()`` leaves exposed:
  ``DEEPSPEED_2021_GATHER_HOST_S`` (measured on DeepSpeed 0.3.16, below; the memset's launch
  is inside it). Every term is serial:

      per gather = host + collective_time_s(bytes) + n * kernel_launch_s + 3 * bytes / streaming
      per reduce-scatter = collective_time_s(bytes) + n * kernel_launch_s + 4 * bytes / streaming

  which grows linearly with the data-parallel size through both the copies and NCCL's ring
  latency (``plansim.analytic.comm``): the mechanism behind the ZeRO-3 rows of Narayanan
  et al. SC21 Table 2 getting no faster from 768 to 1536 GPUs.

  The host term, measured (DeepSpeed issue #1069, 2021-06-21, a profiler trace of DeepSpeed
  0.3.16 / PyTorch 1.8 on 8 x A100): "all_gathers for one parameter takes about 0.5ms to
  finish", its Python before the call about 130 us and the call about 250 us, with a
  ``torch.cuda.synchronize()`` at the next gather. The same author's 5.1B BERT (64 layers,
  hidden 2560, FFN 10240; issue #1174, PR #1188) took about 470 ms per forward under ZeRO-3,
  60 ms under ZeRO-2: about 410 ms of gathers, which this mode prices (16 per layer) at 138
  ms without the host term and 486 ms with it (``tests/unit/test_zero3.py``). The
  reduce-scatter's host work (gradient hooks, buckets) was not measured and is not priced.

  Limit, known: DeepSpeed's ZeRO-3 code from its first version (``stage3.py``, 2021) does
  less than this. Parameters under 100000 elements (``persistence_threshold``: every bias
  and norm weight of a GPT-3-size layer) stay gathered and are never fetched per layer (yet
  the 0.3.16 run of issue #1069 did: "all_gather 320 elements for each partition", a 2560
  bias or norm over 8 ranks), and after a module is fetched the next one's are gathered on a
  side stream (``prefetch_next_sub_modules``). Without the small tensors' gathers alone the
  SC21 ZeRO-3 rows come out 28-41% too fast (-22..+5% here), more with the prefetch, so
  the measured runs paid a cost the code does not show (the SC21 authors' DeepSpeed
  configuration is not published). This mode gathers every tensor synchronously and stands
  in for that cost; it is not a faithful account of the released code. Where it still
  falls short: with compute as plansim prices it, the rest of each measured step fits
  a + b n over the data-parallel size n with a = 19 s, b = 22 ms per rank (175B, 384-1536
  GPUs) and a = 83 s, b = 27 ms (530B, 640-2240 GPUs); this mode at a flat ring rate gives
  a = 9.7 / 29 s and b = 30 / 33 ms. The per-rank term is about right; the term that scales
  with the bytes is 2-3x short (the runs moved their 3 x 2 B per parameter at 40-55 GB/s per
  GPU where NCCL's ring over 8 HDR NICs per node gives about 110), so at that rate the 530B
  rows, where bytes dominate, come out about 20% fast. Part of the lower rate is the ring's
  loss of bandwidth with the node count (N16; ``comm`` and the profile's
  ``inter_node_ring_fraction``: 0.72 of the line rate from 128 nodes on, held there), which
  on its own takes the 530B rows from about -20% to -14..-17%; the rest has no cited
  mechanism.

Parameter tensors of one layer follow Megatron-LM's modules: fused QKV weight (and bias),
attention output projection, first MLP matrix (up, or fused gate+up for SwiGLU) and second
MLP matrix, with biases when ``model.add_bias_linear``, and the two norms' weights (and
biases for LayerNorm). Column-parallel weights and biases are split over tp, row-parallel
weights too; row-parallel biases and norms are replicated (``memory.rank_parameters``).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.comm import Collective, collective_time_s, sharded_reduce_time_s
from plansim.analytic.params import NORMS_PER_LAYER, count_parameters, rank_parameters
from plansim.analytic.ranks import LayoutGroups, dp_cp_size
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Zero3ParamFetch

#: Host seconds DeepSpeed's 2021 ZeRO-3 spent on one per-tensor all-gather beyond what the
#: per-tensor term prices (module docstring): its Python before the call (about 130 us) and the
#: call (about 250 us), measured by profiler on DeepSpeed 0.3.16 / PyTorch 1.8 / 8 x A100
#: (DeepSpeed issue #1069, 2021-06-21), less the 8 chunk copies of that 8-rank call, which
#: the per-chunk term already prices at the GPU profiles' 5 us kernel launch: 380 - 40 us.
DEEPSPEED_2021_GATHER_HOST_S = 130e-6 + 250e-6 - 8 * 5e-6


def layer_param_tensors(model: ModelSpec, plan: ParallelPlan) -> tuple[float, ...]:
    """Elements of each parameter tensor of one transformer layer on one TP rank.

    Order: QKV weight, [QKV bias], projection weight, [projection bias], first MLP weight,
    [its bias], second MLP weight, [its bias], then per norm its weight [and bias]. The sum
    equals ``count_parameters`` per layer with linear weights split over tp.
    """
    h, kv, ffn = model.hidden_size, model.kv_size, model.ffn_hidden_size
    tp = plan.tp
    up = (model.activation.num_ffn_matrices - 1) * ffn
    bias = model.add_bias_linear
    tensors: list[float] = [(h + 2 * kv) * h / tp]
    tensors += [(h + 2 * kv) / tp] if bias else []
    tensors += [h * h / tp] + ([float(h)] if bias else [])
    tensors += [up * h / tp] + ([up / tp] if bias else [])
    tensors += [ffn * h / tp] + ([float(h)] if bias else [])
    per_norm = model.normalization.params_per_hidden
    tensors += [float(h)] * (NORMS_PER_LAYER * per_norm)
    return tuple(tensors)


def edge_param_tensors(
    model: ModelSpec, plan: ParallelPlan, *, first: bool, last: bool
) -> tuple[float, ...]:
    """Elements of the parameter tensors outside the layers on a first and/or last stage:
    word embedding (split over tp) and learned positions on the first; final norm and the
    output layer (or, with pp > 1 and tied embeddings, Megatron's copy of the embedding) on
    the last."""
    counts = count_parameters(model)
    tensors: list[float] = []
    if first:
        tensors.append(counts.embedding / plan.tp)
        if counts.position_embedding:
            tensors.append(float(counts.position_embedding))
    if last:
        per_norm = model.normalization.params_per_hidden
        tensors += [float(model.hidden_size)] * per_norm
        if counts.output_layer:
            tensors.append(counts.output_layer / plan.tp)
        elif plan.pp > 1 or not first:
            tensors.append(counts.embedding / plan.tp)
    return tuple(tensors)


def gathered_bytes(
    model: ModelSpec, plan: ParallelPlan, *, rank: int, param_bytes: float, grad_bytes: float
) -> float:
    """Bytes of gathered (unsharded) parameters, and gradients before their reduce-scatter, a
    ZeRO-3 pipeline rank holds at its peak, with ``param_bytes`` per 16-bit element.

    ``per-step``: all the rank's parameters and its gradients accumulating in the reduce
    dtype (``grad_bytes`` per element), unsharded for the whole step (module docstring).
    Without resharding after forward (``plan.reshard_after_forward`` False): all the rank's
    parameters, each unit gathered from its forward until its backward ends.

    Per layer (``layer-prefetch``, ``layer-sync``): one gathered layer and one prefetched
    layer. One tensor at a time (``per-tensor-sync``): the rank's largest tensor (a layer's
    or, on an edge rank, the embedding or output layer) gathered, and its unsharded gradient;
    nothing else is gathered while it is in use (DeepSpeed's own
    ``estimate_zero3_model_states_mem_needs`` keeps 4 Psi_L bytes on the GPU, Psi_L the
    largest module's parameters: reference memory.md §4.2).
    """
    if plan.zero3_param_fetch is Zero3ParamFetch.PER_STEP:
        return rank_parameters(model, plan, rank=rank) * (param_bytes + grad_bytes)
    if not plan.reshard_after_forward:
        return rank_parameters(model, plan, rank=rank) * param_bytes
    if plan.zero3_param_fetch is Zero3ParamFetch.PER_TENSOR_SYNC:
        first = plan.rank_holds_stage(rank, 0)
        last = plan.rank_holds_stage(rank, plan.num_stages - 1)
        edges = edge_param_tensors(model, plan, first=first, last=last)
        return 2 * max(layer_param_tensors(model, plan) + edges) * param_bytes
    return 2 * _layer_weights(model, plan) * param_bytes


def unsharded_grad_bytes(model: ModelSpec, plan: ParallelPlan, *, grad_bytes: float) -> float:
    """Bytes of unsharded gradients a ZeRO-2 rank holds at its peak, ``grad_bytes`` per
    element: the layer whose reduce-scatter is in flight and the next one backward is
    producing (per-layer reduce-scatters, module docstring). Zero unless ZeRO-2 with
    dp * cp > 1 (nothing to reduce-scatter otherwise)."""
    if plan.zero_stage != 2 or dp_cp_size(plan) == 1:
        return 0.0
    return 2 * _layer_weights(model, plan) * grad_bytes


def _layer_weights(model: ModelSpec, plan: ParallelPlan) -> float:
    """Attention and MLP parameters of one layer on one TP rank (the two-layer working set
    of :func:`gathered_bytes` and :func:`unsharded_grad_bytes` counts these)."""
    counts = count_parameters(model)
    return (counts.attention_per_layer + counts.mlp_per_layer) / plan.tp


@dataclass(frozen=True, slots=True, kw_only=True)
class Zero3Traffic:
    """ZeRO-3 communication of one unit of parameters (a layer, or a stage's edges).

    Attributes:
        gather_s: seconds of its parameter all-gather(s), as the framework issues them.
        scatter_s: seconds of its gradient reduce-scatter(s).
        gather_bytes: 16-bit parameter bytes gathered (all-gather output size).
        scatter_bytes: gradient bytes reduce-scattered (reduce-scatter input size).
    """

    gather_s: float
    scatter_s: float
    gather_bytes: float
    scatter_bytes: float


NO_TRAFFIC = Zero3Traffic(gather_s=0.0, scatter_s=0.0, gather_bytes=0.0, scatter_bytes=0.0)


def unit_traffic(
    tensors: tuple[float, ...],
    *,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    param_bytes: float,
    grad_bytes: float,
    source_grad_bytes: float | None = None,
) -> Zero3Traffic:
    """ZeRO-2 / ZeRO-3 traffic of one unit made of parameter ``tensors`` (elements per TP
    rank), per micro-batch; gradients are reduced in ``grad_bytes`` per element, from
    unsharded gradients of ``source_grad_bytes`` (default ``grad_bytes``; a 16-bit backward's
    gradients cast to an fp32 reduce dtype on the copy into the flat buffer).

    ``layer-prefetch`` and ``layer-sync``: one collective of the whole unit each way, plus
    its flat-buffer copies at the streaming bandwidth (:func:`flat_copy_bytes`).
    ``per-tensor-sync``: one
    collective per tensor plus dp * cp chunk copies each, and DeepSpeed's host work per
    gather (``DEEPSPEED_2021_GATHER_HOST_S``; module docstring). ZeRO-2: the gradient
    reduce-scatter alone (its 16-bit parameters are replicated, nothing is gathered), one
    collective of the whole unit whatever ``plan.zero3_param_fetch`` says (DeepSpeed's
    stage 2 reduces gradient buckets, never single tensors; module docstring). Zero with
    ZeRO < 2, no data parallelism or no tensors. With hybrid sharding (``plan.dp_shard``)
    the collectives run over the shard group (``groups.shard``) and each reduced gradient
    shard is then all-reduced over the replicas (``groups.replicate``), as FSDP's
    ``HYBRID_SHARD`` does after every reduce-scatter (PyTorch FSDP docs, ``ShardingStrategy``).
    """
    if plan.zero_stage < 2 or dp_cp_size(plan) == 1 or not tensors:
        return NO_TRAFFIC
    span = groups.shard
    total = sum(tensors)
    stream = profile.streaming_bytes_per_s()
    grads_only = plan.zero_stage == 2
    per_tensor = not grads_only and plan.zero3_param_fetch is Zero3ParamFetch.PER_TENSOR_SYNC
    units: tuple[float, ...] = tensors if per_tensor else (total,)
    gather = scatter = 0.0
    for numel in units:
        if per_tensor:  # dp * cp chunk copies out of / into the flat NCCL buffer
            launches_s = span.size * profile.kernel_launch_s
            gather_copy_s = (  # zeroed buffer (one write), then the chunk copies (2)
                DEEPSPEED_2021_GATHER_HOST_S + launches_s + 3.0 * numel * param_bytes / stream
            )
            # chunk copies (2), and DeepSpeed's in-place division by the dp size (2)
            scatter_copy_s = launches_s + 4.0 * numel * grad_bytes / stream
        else:
            gather_bytes, scatter_bytes = flat_copy_bytes(
                numel,
                shards=span.size,
                param_bytes=param_bytes,
                grad_bytes=grad_bytes,
                source_grad_bytes=source_grad_bytes,
            )
            gather_copy_s, scatter_copy_s = gather_bytes / stream, scatter_bytes / stream
        if not grads_only:
            gather += gather_copy_s + collective_time_s(
                profile,
                collective=Collective.ALL_GATHER,
                message_bytes=numel * param_bytes,
                span=span,
            )
        scatter += scatter_copy_s + sharded_reduce_time_s(
            profile, message_bytes=numel * grad_bytes, shard=span, replicate=groups.replicate
        )
    return Zero3Traffic(
        gather_s=gather,
        scatter_s=scatter,
        gather_bytes=0.0 if grads_only else total * param_bytes,
        scatter_bytes=total * grad_bytes,
    )


def flat_copy_bytes(
    numel: float,
    *,
    shards: int,
    param_bytes: float,
    grad_bytes: float,
    source_grad_bytes: float | None = None,
) -> tuple[float, float]:
    """Memory traffic (bytes) of the flat-buffer copies around one unit's collectives:
    (all-gather, reduce-scatter).

    All-gather: the rank's shard is copied into the flat send buffer (read + write numel /
    shards) and the gathered buffer out into the unit's parameters (read + write numel).
    Reduce-scatter: the unsharded gradients (``source_grad_bytes`` per element, default
    ``grad_bytes``) are copied into the flat send buffer of the reduce dtype (``grad_bytes``:
    read numel of the one, write numel of the other, casting on the way) and the reduced
    shard is divided by the group size in place (read + write numel / shards). As PyTorch
    FSDP2 does them (``torch.distributed.fsdp`` fully_shard: ``all_gather_copy_in``,
    ``split_with_sizes_copy`` copy-out, ``chunk_cat`` into a ``reduce_dtype`` buffer,
    ``div_``; seen as ``fsdp::all_gather_copy_in``, ``aten::copy_``, ``aten::cat`` and
    ``aten::div_`` in torch.profiler on a dp2 ZeRO-3 run)."""
    source = grad_bytes if source_grad_bytes is None else source_grad_bytes
    gather = param_bytes * 2.0 * (numel / shards + numel)
    scatter = (source + grad_bytes) * numel + grad_bytes * 2.0 * numel / shards
    return gather, scatter


def overlapped_excess_s(comm_s: float, compute_s: float, slowdown: float) -> float:
    """Seconds a layer's compute ``compute_s`` with ``comm_s`` of communication beside it
    takes beyond ``compute_s``, when compute runs ``1 + slowdown`` times slower while the
    communication is in flight (the profile's ``overlap_compute_slowdown_fraction``) and the
    communication keeps its own time: max(0, g - c, g * s / (1 + s)).

    If the slowed compute fits inside the communication (c (1 + s) <= g) the layer takes g;
    otherwise the compute done during g is g / (1 + s), the rest runs at full speed, and the
    layer takes c + g s / (1 + s). With s = 0: max(0, g - c).
    """
    if comm_s <= 0:
        return 0.0
    return max(0.0, comm_s - compute_s, comm_s * slowdown / (1.0 + slowdown))


def exposed_gather_s(
    num_layers: int, *, gather_s: float, compute_s: float, slowdown: float = 0.0
) -> float:
    """Exposed all-gather seconds of ``num_layers`` layers whose gathers are prefetched one
    layer ahead of compute: g + (n - 1) x (:func:`overlapped_excess_s`), which is
    g + (n - 1) max(0, g - c) without slowdown (module docstring)."""
    if num_layers <= 0 or gather_s <= 0:
        return 0.0
    return gather_s + (num_layers - 1) * overlapped_excess_s(gather_s, compute_s, slowdown)


def exposed_backward_s(
    num_layers: int, *, gather_s: float, scatter_s: float, compute_s: float, slowdown: float = 0.0
) -> float:
    """Exposed communication of ``num_layers`` layers' backward with the next layer's gather
    prefetched and each layer's reduce-scatter overlapped with the next layer's backward:
    g + (n - 1) x (:func:`overlapped_excess_s` of g + r) + r, which is
    g + (n - 1) max(0, g + r - c) + r without slowdown (module docstring)."""
    if num_layers <= 0 or gather_s + scatter_s <= 0:
        return 0.0
    overlap = overlapped_excess_s(gather_s + scatter_s, compute_s, slowdown)
    return gather_s + (num_layers - 1) * overlap + scatter_s
