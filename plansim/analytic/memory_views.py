"""Peak memory as users read it: allocated, reserved by the caching allocator, and what
``nvidia-smi`` shows (pure).

The simulator's peak is the bytes the model's tensors hold at once plus the profile's flat
``memory_reserve_bytes`` (CUDA context, NCCL buffers and fragmentation, one figure for every
plan; ``hardware_profiles/README.md``, "Memory reserve"). Published runs report one of three
readings, each larger than the one before:

* **allocated** (``torch.cuda.max_memory_allocated``): the tensors alone, the simulated peak
  without the profile's reserve.
* **reserved** (``torch.cuda.max_memory_reserved``): the caching allocator's segments, the
  allocated bytes plus what its block splitting leaves unused. The share of reserved memory
  left unallocated is taken from measurements: Guo et al., "GMLake", ASPLOS 2024
  (arXiv:2401.08156, abstract; HP05 in ``hardware_profiles/README.md``) find 15% on average
  over eight LLM training set-ups on A100-80GB that recompute, offload or shard with ZeRO-3,
  whose tensors of changing sizes fragment the cache; a step without those keeps its
  allocations in a fixed pattern, for which the one reading on record is 1.83 GiB reserved
  but unallocated beside 75.31 GiB allocated (HP06, 2.4% of the reserved bytes).
* **nvidia-smi** (the device's used memory): reserved plus the CUDA context with its loaded
  kernels and NCCL's buffers. Context: 1.78 GiB under torch 1.10 (kernels loaded eagerly),
  0.47 GiB under torch 2.1 with lazy module loading, its default (HP01, A100 80GB). NCCL:
  about 544 MB per two-rank communicator and 688 MB per larger one after its first
  collective (HP02, A100 NVLink; NCCL's memory grows with channels, HP03/HP04, so this is a
  floor).

Which communicators a rank holds follows the framework's process groups: the default (world)
group, a TP group with tp > 1, a DP group with dp x cp > 1 (and a CP group with cp > 1), an EP
group with ep > 1, and for a pipeline either one PP group (Megatron-LM, torch's pipelining)
plus the two-rank group of the tied embedding's first and last stages, or DeepSpeed's
pipeline engine's two-rank groups to each neighbouring stage (``deepspeed/runtime/pipe/p2p.py``
``init_process_groups``: a group per adjacent stage pair), two on an inner stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.specs.model import ModelSpec
from plansim.specs.plan import Framework, ParallelPlan, Recompute
from plansim.specs.sharding import OffloadDevice

GIB = 2**30

#: The readings a published peak may be (:meth:`MemoryViews.reading`).
READINGS = ("allocated", "reserved", "nvidia-smi")

#: Share of reserved memory left unallocated when the step recomputes, offloads or shards
#: parameters (ZeRO-3): GMLake's average over LLM training set-ups (HP05).
FRAGMENTATION_DYNAMIC = 0.15
#: The same share for a step that does none of these: HP06's 1.83 GiB of 77.14 GiB reserved.
FRAGMENTATION_STATIC = 1.83 / (75.31 + 1.83)
#: CUDA context and loaded kernels per process (HP01): torch 1.10 (eager module loading) and
#: torch 2.1 (lazy module loading, its default).
CUDA_CONTEXT_EAGER_BYTES = 1.78 * GIB
CUDA_CONTEXT_LAZY_BYTES = 0.47 * GIB
#: The first year whose runs are taken to load CUDA modules lazily: PyTorch sets
#: ``CUDA_MODULE_LOADING=LAZY`` when the user leaves it unset from release 1.13 (October 2022,
#: pytorch/pytorch PR #86509; lazy loading needs CUDA 11.7), so runs of 2022 and before are
#: taken to load every kernel at start.
LAZY_LOADING_YEAR = 2023
#: NCCL buffers per communicator after its first collective (HP02): two ranks, more ranks.
NCCL_PAIR_BYTES = 544e6
NCCL_GROUP_BYTES = 688e6


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryViews:
    """One rank's peak memory in the three readings (bytes; module docstring)."""

    allocated_bytes: float
    reserved_bytes: float
    nvidia_smi_bytes: float
    fragmentation_fraction: float
    cuda_context_bytes: float
    nccl_bytes: float
    num_communicators: int

    def reading(self, kind: str) -> float:
        """The view a published reading names (one of :data:`READINGS`).

        Raises:
            ValueError: another kind (the message lists the allowed ones).
        """
        if kind not in READINGS:
            raise ValueError(f"memory reading {kind!r} is not one of {', '.join(READINGS)}")
        views = (self.allocated_bytes, self.reserved_bytes, self.nvidia_smi_bytes)
        return views[READINGS.index(kind)]


def fragmentation_fraction(plan: ParallelPlan) -> float:
    """Share of the reserved bytes the caching allocator leaves unallocated under ``plan``:
    :data:`FRAGMENTATION_DYNAMIC` with recompute, offload or ZeRO-3, else
    :data:`FRAGMENTATION_STATIC` (module docstring)."""
    dynamic = (
        plan.recompute is not Recompute.NONE
        or plan.zero_stage == 3
        or plan.offload_optimizer is not OffloadDevice.NONE
        or plan.offload_param is not OffloadDevice.NONE
    )
    return FRAGMENTATION_DYNAMIC if dynamic else FRAGMENTATION_STATIC


def communicator_sizes(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> tuple[int, ...]:
    """Ranks in each NCCL communicator pipeline rank ``rank`` holds (module docstring):
    world, TP, DP (over dp x cp), CP, EP, and the pipeline's groups."""
    world = plan.tp * plan.cp * plan.pp * plan.dp
    sizes = [world]
    sizes += [plan.tp] if plan.tp > 1 else []
    sizes += [plan.dp * plan.cp] if plan.dp * plan.cp > 1 else []
    sizes += [plan.cp] if plan.cp > 1 else []
    sizes += [plan.ep] if plan.ep > 1 else []
    if plan.pp > 1:
        if plan.framework in (Framework.DEEPSPEED, Framework.MEGATRON_DEEPSPEED):
            neighbours = 1 if rank in (0, plan.pp - 1) else 2
            sizes += [2] * neighbours
        else:
            sizes.append(plan.pp)
            if model.tied_embeddings and rank in (0, plan.pp - 1):
                sizes.append(2)
    return tuple(sizes)


def nccl_buffer_bytes(sizes: tuple[int, ...]) -> float:
    """NCCL's buffers for communicators of ``sizes`` ranks (HP02; one-rank groups hold
    none)."""
    return sum(NCCL_PAIR_BYTES if n == 2 else NCCL_GROUP_BYTES for n in sizes if n > 1)


def cuda_context_bytes(year: int | None) -> float:
    """CUDA context and loaded kernels for a run of ``year`` (None: today's lazy loading)."""
    if year is not None and year < LAZY_LOADING_YEAR:
        return CUDA_CONTEXT_EAGER_BYTES
    return CUDA_CONTEXT_LAZY_BYTES


def memory_views(
    model: ModelSpec,
    plan: ParallelPlan,
    *,
    allocated_bytes: float,
    rank: int = 0,
    year: int | None = None,
) -> MemoryViews:
    """The three readings of pipeline rank ``rank``'s peak from its ``allocated_bytes`` (the
    simulated peak without the profile's reserve); ``year``: when the run was made (sets the
    CUDA context, :func:`cuda_context_bytes`).

    reserved = allocated / (1 - f), f = :func:`fragmentation_fraction`;
    nvidia-smi = reserved + context + NCCL buffers (:func:`nccl_buffer_bytes` of
    :func:`communicator_sizes`).

    Raises:
        ValueError: ``allocated_bytes`` negative.
    """
    if allocated_bytes < 0:
        raise ValueError(f"allocated_bytes must be >= 0, got {allocated_bytes}")
    fraction = fragmentation_fraction(plan)
    reserved = allocated_bytes / (1.0 - fraction)
    context = cuda_context_bytes(year)
    sizes = communicator_sizes(model, plan, rank=rank)
    nccl = nccl_buffer_bytes(sizes)
    return MemoryViews(
        allocated_bytes=allocated_bytes,
        reserved_bytes=reserved,
        nvidia_smi_bytes=reserved + context + nccl,
        fragmentation_fraction=fraction,
        cuda_context_bytes=context,
        nccl_bytes=nccl,
        num_communicators=sum(n > 1 for n in sizes),
    )
