"""What ``plansim calibrate`` measures: a fixed, ordered list of items. Pure (no torch).

Compute items run on every rank at the same time (a rank is one "device": one GPU, or one
CPU core with one thread), so the rates include the contention a data-parallel job sees.

* GEMMs: the five matmuls of a transformer layer and its logits for ``tokens`` x ``hidden``
  (Narayanan et al. SC21 Eq. 2: QKV (T,h)x(h,3h), attention output (T,h)x(h,h), MLP up
  (T,h)x(h,4h), MLP down (T,4h)x(4h,h), logits (T,h)x(h,V) with V = 8h), per dtype, in
  ascending FLOPs. Once one call of a dtype takes longer than ``max_call_s``, that dtype's
  larger GEMMs are skipped (so a slow dtype, e.g. fp16 on a CPU without fp16 units, costs
  seconds, not hours); the measured range is recorded.
* Attention: ``scaled_dot_product_attention`` (causal) forward, and forward + backward.
* Host per-op overhead: forward, and forward + backward, through a chain of
  :data:`CHAIN_OPS` tiny ops (pairs of an 8 x 8 ``nn.Linear`` and a GELU on a 2 x 8 input:
  a transformer's mix of linear and elementwise ops, so small that the time is the eager
  dispatch and autograd bookkeeping); the same chain with its linears tensor-parallel
  (DTensor ``ColwiseParallel``/``RowwiseParallel`` on a one-rank mesh: the DTensor
  dispatch without communication).
* Elementwise: the non-GEMM kernels of a GELU layer (two layer norms, two residual adds, the
  GELU; backward by autograd) forward, and forward + backward, at :data:`ELEMENTWISE_SHAPES`
  (``plansim.calibrate.bench_elementwise``); the profile's ``elementwise_*_gb_per_s``.
* Streaming kernels (STREAM copy/scale/add/triad) on tensors larger than a CPU's last-level
  cache, per-op overhead (a 1-element add), a host Adam step (``torch.optim.Adam``), and on a
  GPU pinned host<->device copies.
* Collectives: all_reduce, all_gather, reduce_scatter, send/recv and all_to_all (the
  profile's optional ``intra_node.all_to_all``: ``torch.distributed.all_to_all_single``) over
  message sizes and group sizes (ranks 0..g-1).
* Overlap slowdown: one GEMM (``gemm_beside_all_reduce``; :data:`OVERLAP_SHAPES`, fp32 on a
  CPU, bf16 on a GPU) looped for ~tens of ms on every rank, timed alone and while a chain of
  asynchronous all_reduces over all ranks is in flight (``plansim.calibrate.bench_overlap``);
  the profile's ``overlap_compute_slowdown_fraction`` is overlapped / alone - 1.
* Sustained rate (GPU plans only): a GEMM's burst, then its rate after a soak at the power
  limit, on every rank at once (``plansim.calibrate.bench_sustained``).

Message sizes are nccl-tests' size (``plansim.specs.hardware``): the all-reduce buffer, the
gathered output, the reduce-scatter input, the bytes each rank sends (send/recv), the whole
per-rank send buffer (all_to_all: 1/g of it to each member, its own share included).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from plansim.analytic.elementwise import gelu_layer_bytes
from plansim.calibrate.timing import FULL, QUICK, Timing
from plansim.specs.curves import KNOWN_COLLECTIVES


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One measurement.

    Attributes:
        kind: ``gemm``, ``attention``, ``stream``, ``launch``, ``host_op``, ``adam``,
            ``copy``, ``collective``, ``overlap`` or ``sustained``.
        op: what runs (``mlp_up``, ``sdpa_fwd``, ``add``, ``all_reduce``, ``h2d``,
            ``gemm_beside_all_reduce``, ...).
        dtype: element type (``fp32``, ``bf16``, ...); ``fp32`` for streams and Adam.
        shape: gemm (m, n, k); attention (batch, heads, seq, head_dim); stream (elements,);
            launch (1,); host_op (ops in the chain,), or for a pipeline chain (ops per
            stage, micro-batches); adam (parameters,); copy (bytes,);
            collective (message bytes,); overlap (m, n, k, all_reduce message bytes);
            sustained (m, n, k, soak milliseconds).
        group_size: ranks taking part (1 for compute: every rank runs its own copy; overlap:
            the ranks of the all_reduce; sustained: every rank, at once).
        work: per call: FLOPs (gemm, attention, overlap, sustained: one GEMM), bytes (stream, copy,
            collective), parameters (adam), 1 (launch), ops in the chain (host_op), actions
            on a GPipe pipeline's critical path, micro-batches + ranks - 1 (pipeline chain).
        work_unit: ``flop``, ``byte``, ``param``, ``call``, ``op`` or ``action``.
        sweep: which pass over the GEMMs and collectives (0, 1, ...); see :func:`build_plan`.
    """

    kind: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    group_size: int = 1
    work: float
    work_unit: str
    sweep: int = 0

    @property
    def shape_text(self) -> str:
        """``512x2048x512`` (the raw CSV's ``shape`` column)."""
        return "x".join(str(s) for s in self.shape)

    def raw_columns(self) -> dict[str, object]:
        """The item's columns of a raw timing row (``plansim.calibrate.raw``)."""
        names = ("kind", "op", "dtype", "group_size", "work", "work_unit", "sweep")
        return {**{n: getattr(self, n) for n in names}, "shape": self.shape_text}

    @property
    def label(self) -> str:
        """What the progress bar shows."""
        group = f" over {self.group_size} ranks" if self.kind in ("collective", "overlap") else ""
        sweep = f" (pass {self.sweep + 1})" if self.sweep else ""
        text = f"{self.kind} {self.op} {self.dtype} {self.shape_text}{group}{sweep}"
        return text.replace("  ", " ")

    @property
    def family(self) -> str:
        """Items skipped together once one call is too slow (one GEMM or attention dtype)."""
        return f"{self.kind}/{self.op if self.kind == 'attention' else ''}/{self.dtype}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The ordered items and their timing policy."""

    items: tuple[Item, ...]
    timing: Timing
    group_sizes: tuple[int, ...]
    quick: bool


#: dtypes measured for GEMMs and attention; fp8 only where the device has it.
GEMM_DTYPES = ("fp32", "bf16", "fp16")
#: Element size in bytes per dtype.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
#: Bytes a STREAM kernel moves per element of fp32 (reads + writes).
STREAM_ACCESSES = {"copy": 2, "scale": 2, "add": 3, "triad": 3}
GEMM_OPS = ("qkv", "attn_out", "mlp_up", "mlp_down", "logits")
#: Ops in a host-overhead chain (CHAIN_OPS / 2 pairs of a tiny linear and a GELU).
CHAIN_OPS = 64
#: Host-overhead chain items: plain, tensor-parallel (DTensor) and under torchtitan's per-op
#: selective activation checkpointing (``sac_``), forward and forward+backward.
HOST_OP_OPS = (
    "chain_fwd",
    "chain_fwd_bwd",
    "dtensor_chain_fwd",
    "dtensor_chain_fwd_bwd",
    "sac_chain_fwd",
    "sac_chain_fwd_bwd",
)
#: Host-overhead chains over every rank (nproc > 1): DTensor TP on the world mesh, FSDP2 units.
WORLD_HOST_OP_OPS = (
    "dtensor_world_chain_fwd",
    "dtensor_world_chain_fwd_bwd",
    "fsdp_chain_fwd",
    "fsdp_chain_fwd_bwd",
)
#: Pipeline chains over every rank (nproc > 1): the tiny-op chain as one pipeline stage of
#: PIPELINE_STAGE_OPS ops per rank under torch.distributed.pipelining, PIPELINE_MICROBATCHES
#: micro-batches, forward only and forward + backward (``plansim.calibrate.bench_pipeline``).
PIPELINE_OPS = ("pipeline_chain_fwd", "pipeline_chain_fwd_bwd")
PIPELINE_STAGE_OPS = 8
PIPELINE_MICROBATCHES = 8
#: Elementwise items: a GELU layer's non-GEMM kernels, forward and forward + backward.
ELEMENTWISE_OPS = ("layer_fwd", "layer_fwd_bwd")
#: Their (tokens, hidden) shapes and dtype per device: training's activation dtype. ``--quick``
#: times the first only. On a GPU the host dispatches each eager op in about 20 us (the H100
#: profile's ``host_overhead.forward_op_us``: 18.6-24.7) while the device runs ahead, so an
#: item whose kernels take less than their ops' dispatch times the host, not HBM: at
#: 2048 x 2048 the forward's 5 kernels moved 159 MB in 0.13 ms on an H100 (1.2 TB/s, its
#: ~0.12 ms of dispatch), where the same kernels at the validate run's 4096 x 2048 ran at
#: 2-3.5 TB/s (benchmarks/gpu_runs/h100-2026-11-27-bf16). Every GPU shape here moves at least
#: 2.5 GB forward: 0.3 ms even at B200's 8 TB/s.
ELEMENTWISE_SHAPES = {
    "cpu": (((256, 256), (512, 512), (1024, 1024)), "fp32"),
    "cuda": (((16384, 4096), (16384, 8192), (32768, 8192)), "bf16"),
}
#: Overlap item per device: (GEMM (m, n, k), dtype, all_reduce message bytes). CPU: a 512^3
#: fp32 GEMM (~3 ms at 100 GFLOP/s on one core) and 4 MiB (~4 ms at gloo's ~1 GB/s on one
#: host); GPU: an 8192^3 bf16 GEMM (~1.5 ms at 750 TFLOP/s) and 256 MiB (~1 ms at NVLink's
#: ~300 GB/s). The bench loops the GEMM for ~tens of ms and chains as many all_reduces as
#: outlast the loop.
OVERLAP_SHAPES = {
    "cpu": ((512, 512, 512), "fp32", 1 << 22),
    "cuda": ((8192, 8192, 8192), "bf16", 1 << 28),
}
#: A CPU rank whose CPU time is below this share of the wall time while timing compute waited
#: for a core: other work competed (collectives are exempt: they wait in the transport).
CPU_SHARE_OK = 0.9


def gemm_shapes(tokens: int, hidden: int) -> dict[str, tuple[int, int, int]]:
    """(m, n, k) of each transformer GEMM for ``tokens`` rows and ``hidden`` size."""
    return {
        "qkv": (tokens, 3 * hidden, hidden),
        "attn_out": (tokens, hidden, hidden),
        "mlp_up": (tokens, 4 * hidden, hidden),
        "mlp_down": (tokens, hidden, 4 * hidden),
        "logits": (tokens, 8 * hidden, hidden),
    }


def _gemm_items(dtypes: tuple[str, ...], configs: tuple[tuple[int, int], ...]) -> list[Item]:
    items: list[Item] = []
    for dtype in dtypes:
        seen: set[tuple[int, int, int]] = set()
        family: list[Item] = []
        for tokens, hidden in configs:
            for op, (m, n, k) in gemm_shapes(tokens, hidden).items():
                if (m, n, k) in seen:
                    continue
                seen.add((m, n, k))
                family.append(
                    Item(
                        kind="gemm",
                        op=op,
                        dtype=dtype,
                        shape=(m, n, k),
                        work=2.0 * m * n * k,
                        work_unit="flop",
                    )
                )
        items += sorted(family, key=lambda i: (i.work, i.op))
    return items


#: Causal attention calls per device, (quick, full): (sequence lengths, heads, head dim). On a
#: GPU the calls are training's: 16 heads of 128 (GPT-3 175B and Llama 3 70B at tp 8, MPT-7B
#: at tp 2), 1k-16k tokens. (Before, a GPU timed the CPU's 4 heads of 64 at 256 and 1024
#: tokens: microseconds of work, a launch-bound 0.4% of peak that the profile then applied to
#: every larger call; seen on an H100, predicted attention 100-800x too slow.)
ATTENTION_SHAPES = {
    "cuda": (((1024, 2048, 4096, 8192), 16, 128), ((1024, 2048, 4096, 8192, 16384), 16, 128)),
    "cpu": (((256, 1024), 4, 64), ((256, 512, 1024, 2048), 8, 64)),
}


def _attention_items(
    dtypes: tuple[str, ...], seqs: tuple[int, ...], heads: int, head_dim: int
) -> list[Item]:
    """Causal SDPA; model FLOPs: forward 4*b*h*s^2*d / 2, backward twice the forward."""
    items: list[Item] = []
    for op, factor in (("sdpa_fwd", 1.0), ("sdpa_fwd_bwd", 3.0)):
        for dtype in dtypes:
            for seq in seqs:
                fwd = 4.0 * heads * seq * seq * head_dim / 2
                items.append(
                    Item(
                        kind="attention",
                        op=op,
                        dtype=dtype,
                        shape=(1, heads, seq, head_dim),
                        work=fwd * factor,
                        work_unit="flop",
                    )
                )
    return items


def _memory_items(
    stream_ops: tuple[str, ...], elements: tuple[int, ...], adam_params: tuple[int, ...]
) -> list[Item]:
    items = [
        Item(kind="launch", op="tiny_add", dtype="fp32", shape=(1,), work=1.0, work_unit="call")
    ]
    for n in elements:
        for op in stream_ops:
            work = float(STREAM_ACCESSES[op] * 4 * n)
            items.append(
                Item(kind="stream", op=op, dtype="fp32", shape=(n,), work=work, work_unit="byte")
            )
    for p in adam_params:
        items.append(
            Item(kind="adam", op="adam", dtype="fp32", shape=(p,), work=float(p), work_unit="param")
        )
    return items


def _host_op_items(nproc: int) -> list[Item]:
    """The host-overhead chains (:data:`HOST_OP_OPS`, and :data:`WORLD_HOST_OP_OPS` over
    ``nproc`` > 1 ranks), :data:`CHAIN_OPS` ops each, and over ``nproc`` > 1 ranks the
    pipeline chains (:data:`PIPELINE_OPS`)."""
    ops = HOST_OP_OPS + (WORLD_HOST_OP_OPS if nproc > 1 else ())
    pipeline = [
        Item(
            kind="host_op",
            op=op,
            dtype="fp32",
            shape=(PIPELINE_STAGE_OPS, PIPELINE_MICROBATCHES),
            group_size=nproc,
            work=float(PIPELINE_MICROBATCHES + nproc - 1),
            work_unit="action",
        )
        for op in (PIPELINE_OPS if nproc > 1 else ())
    ]
    return [
        Item(
            kind="host_op",
            op=op,
            dtype="fp32",
            shape=(CHAIN_OPS,),
            group_size=nproc if op in WORLD_HOST_OP_OPS else 1,
            work=float(CHAIN_OPS),
            work_unit="op",
        )
        for op in ops
    ] + pipeline


def _elementwise_items(dtype: str, configs: tuple[tuple[int, int], ...]) -> list[Item]:
    """A GELU layer's non-GEMM kernels (``layer_fwd``, ``layer_fwd_bwd``) per (tokens,
    hidden), FFN 4h; work = the bytes ``analytic.elementwise.gelu_layer_bytes`` counts."""
    items: list[Item] = []
    for op in ELEMENTWISE_OPS:
        for tokens, hidden in configs:
            fwd, bwd = gelu_layer_bytes(
                tokens=tokens, hidden=hidden, ffn=4 * hidden, element_bytes=DTYPE_BYTES[dtype]
            )
            items.append(
                Item(
                    kind="elementwise",
                    op=op,
                    dtype=dtype,
                    shape=(tokens, hidden),
                    work=fwd if op == "layer_fwd" else fwd + bwd,
                    work_unit="byte",
                )
            )
    return items


def _copy_items(sizes: tuple[int, ...]) -> list[Item]:
    return [
        Item(kind="copy", op=op, dtype="", shape=(s,), work=float(s), work_unit="byte")
        for op in ("h2d", "d2h")
        for s in sizes
    ]


def overlap_item(device: str, *, nproc: int) -> Item:
    """The ``overlap`` item (:data:`OVERLAP_SHAPES`) for ``device`` and ``nproc`` ranks."""
    (m, n, k), dtype, message = OVERLAP_SHAPES["cuda" if device == "cuda" else "cpu"]
    return Item(
        kind="overlap",
        op="gemm_beside_all_reduce",
        dtype=dtype,
        shape=(m, n, k, message_size(message, nproc)),
        group_size=nproc,
        work=2.0 * m * n * k,
        work_unit="flop",
    )


#: Sustained item: GEMM (m, n, k) and dtype per device (the CPU one serves tests), and the
#: soak seconds (quick, full): long enough for a GPU to reach its power limit and settle.
SUSTAINED_SHAPES = {"cuda": ((8192, 8192, 8192), "bf16"), "cpu": ((256, 256, 256), "fp32")}
SUSTAINED_SOAK_S = (15.0, 60.0)


def sustained_item(device: str, *, nproc: int, soak_s: float) -> Item:
    """The ``sustained`` item (:data:`SUSTAINED_SHAPES`) for ``device``, ``nproc`` ranks and
    a soak of ``soak_s`` seconds (shape (m, n, k, soak milliseconds))."""
    (m, n, k), dtype = SUSTAINED_SHAPES["cuda" if device == "cuda" else "cpu"]
    return Item(
        kind="sustained",
        op="gemm_sustained",
        dtype=dtype,
        shape=(m, n, k, round(soak_s * 1000)),
        group_size=nproc,
        work=2.0 * m * n * k,
        work_unit="flop",
    )


def message_size(nominal: int, group_size: int) -> int:
    """``nominal`` rounded up to a multiple of 4 * group_size bytes (whole fp32 elements on
    every rank for all_gather / reduce_scatter, to every peer for all_to_all)."""
    unit = 4 * group_size
    return max(unit, -(-nominal // unit) * unit)


def _collective_items(group_sizes: tuple[int, ...], sizes: tuple[int, ...]) -> list[Item]:
    items: list[Item] = []
    for group in group_sizes:
        for collective in KNOWN_COLLECTIVES:
            for nominal in sizes:
                size = message_size(nominal, group)
                items.append(
                    Item(
                        kind="collective",
                        op=collective,
                        dtype="fp32",
                        shape=(size,),
                        group_size=group,
                        work=float(size),
                        work_unit="byte",
                    )
                )
    return items


def group_sizes_for(nproc: int, *, quick: bool) -> tuple[int, ...]:
    """Quick: the whole world only; full: powers of two from 2 up, and the world. None for
    one rank: a group of one moves nothing, so there is no collective to time."""
    if nproc < 2:
        return ()
    if quick:
        return (nproc,)
    sizes = {nproc}
    size = 2
    while size < nproc:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


def build_plan(*, nproc: int, device: str, quick: bool, fp8: bool = False) -> Plan:
    """The items for ``nproc`` ranks on ``device`` (``cpu`` or ``cuda``).

    GEMMs, collectives, the host-overhead chains and the overlap item are measured in
    ``passes`` sweeps (3 with ``quick``, else 5) spread over the run, so that a machine
    whose speed drifts (a VM's host, clocks) is sampled at several times; the profile takes
    the median over passes. (Timed once, the CPU profile's DTensor all-reduce figure moved
    by 80% and its overlap slowdown between 0.37 and 0.78 across three runs of one day.)
    """
    groups = group_sizes_for(nproc, quick=quick)
    dtypes = GEMM_DTYPES + (("fp8",) if fp8 else ())
    gpu = device == "cuda"
    configs: tuple[tuple[int, int], ...]
    messages: tuple[int, ...]
    ew_configs, ew_dtype = ELEMENTWISE_SHAPES["cuda" if gpu else "cpu"]
    seqs, heads, head_dim = ATTENTION_SHAPES["cuda" if gpu else "cpu"][0 if quick else 1]
    if quick:
        configs = ((64, 64), (128, 128), (256, 256), (512, 512), (1024, 1024))
        if gpu:
            configs = ((512, 512), (2048, 2048), (4096, 4096), (8192, 8192))
        others = _attention_items(("fp32", "bf16"), seqs, heads, head_dim)
        others += _memory_items(("copy", "add"), (1 << 24,), (1 << 20,))
        others += _elementwise_items(ew_dtype, ew_configs[:1])
        messages = (64, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 23, 1 << 24, 1 << 25)
    else:
        configs = ((64, 64), (128, 128), (256, 256), (512, 512), (1024, 1024), (2048, 2048))
        if gpu:
            configs = ((256, 256), (1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192))
            configs += ((16384, 8192),)
        others = _attention_items(dtypes, seqs, heads, head_dim)
        others += _memory_items(
            tuple(STREAM_ACCESSES), (1 << 22, 1 << 24, 1 << 26), (1 << 20, 1 << 23)
        )
        others += _elementwise_items(ew_dtype, ew_configs)
        messages = tuple(1 << e for e in range(6, 28, 1))
    if gpu:
        others += _copy_items(tuple(1 << e for e in (20, 24, 28, 30)))
        soak_s = SUSTAINED_SOAK_S[0 if quick else 1]
        others += [sustained_item(device, nproc=nproc, soak_s=soak_s)]
        messages = messages + ((1 << 28, 1 << 30) if not quick else ())
    gemms, collectives = _gemm_items(dtypes, configs), _collective_items(groups, messages)
    hosts = _host_op_items(nproc) + ([overlap_item(device, nproc=nproc)] if nproc > 1 else [])
    passes = 3 if quick else 5
    items: list[Item] = []
    for index in range(passes):
        items += [dataclasses.replace(i, sweep=index) for i in gemms]
        items += others if index == 0 else []
        items += [dataclasses.replace(i, sweep=index) for i in hosts]
        items += [dataclasses.replace(i, sweep=index) for i in collectives]
    return Plan(
        items=tuple(items), timing=QUICK if quick else FULL, group_sizes=groups, quick=quick
    )
