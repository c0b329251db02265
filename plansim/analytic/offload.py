"""ZeRO-Offload and ZeRO-Infinity: host memory and the offload traffic of a step (pure).

A plan's ``offload_optimizer`` / ``offload_param`` (DeepSpeed ``zero_optimization``
``offload_optimizer.device`` / ``offload_param.device``: ``none``, ``cpu``, ``nvme``) moves
model states off the GPU; ``plansim.analytic.memory.model_state_bytes`` removes them from
the GPU, this module says what the host then holds and what the step moves.

**Optimizer step** (ZeRO-Offload, Ren et al. USENIX ATC 2021 §4.1-4.2; one step, in order,
replacing the GPU's fused Adam): the gradients are reduced as without offload (ZeRO-1
reduce-scatter once per step, ZeRO-2/3 per micro-batch); the rank's reduced gradient shard is
cast to fp32 on the GPU and copied device -> host (``offload_d2h``,
:data:`BOUNDARY_GRAD_BYTES` = 4 bytes per parameter: DeepSpeed's
``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` in ``stage_1_and_2.py``, stage 3's
``_offload_grad_partition_at_boundary``; the paper's volume, §3, counts 2); the host CPU runs
Adam on the fp32 master weights (``cpu_adam``: local parameters / the profile's
``host.adam_params_per_s``); the updated 16-bit parameters come back host -> device
(``offload_h2d``, 2 bytes per parameter) and are all-gathered (ZeRO-1/2) as without offload.
With ``nvme`` (ZeRO-Infinity, Rajbhandari et al. SC21 §5) the fp32 master weights and Adam m,
v (12 bytes per parameter) live on NVMe: CPU Adam reads them first (``nvme_read``) and
writes them back after (``nvme_write``).

**Gradient accumulation through the host**
(``plansim.analytic.offload_microbatch.with_host_grad_accumulation``): with the optimizer
offloaded, DeepSpeed accumulates the gradient shard in host memory. Stage 3
(``partition_grads`` in ``stage3.py``: its gradient partitions are a pinned host buffer,
``self.device`` = cpu) copies each micro-batch's reduced shard there, or brings the buffer to
the GPU, adds and copies it back ("adding directly to cpu is very slow"), keeping a GPU copy:
one 16-bit copy each way per micro-batch. Stage 2 (``async_accumulate_grad_in_cpu_via_gpu``
in ``stage_1_and_2.py``) brings the buffer to the GPU for every micro-batch but the first and
copies the sum back for every one but the last: m - 1 copies each way per step, priced as
(m - 1) / m of one after each micro-batch's reduce-scatter. Stage 1 accumulates on the GPU.
The 16-bit host buffer is one of the pinned buffers :func:`host_bytes_per_gpu` leaves out.

**Parameter offload** (stage 3, ZeRO-Infinity §5): the 16-bit parameter shard of a stage
is copied host -> device (``offload_h2d``; from NVMe first with ``nvme``, ``nvme_read``)
before each of the stage's parameter all-gathers, in forward and in backward (with
recomputation too), every micro-batch; after the step the updated shard stays on the host
(CPU Adam writes it there) or, with the optimizer on the GPU, is copied back to it.

Streams and links: every offload segment runs on the rank's ``dp`` stream (a stream
beside compute, so the GPU's compute stream shows idle and the exposed-communication
report counts it by kind); host <-> device copies load the rank's PCIe link and its node's
host memory (``link="pcie"``, ``plansim.sim.links``), shared with concurrent PCIe traffic
of the other simulated ranks on the node. NVMe and the host CPU are per node: all the
node's GPUs run the same step at once (symmetry; the other replicas are not simulated), so
each gets ``1/gpus_on_node`` of the node's NVMe bandwidth inside the costed duration, and
``adam_params_per_s`` is already one GPU's share of the CPU.

Modelling limits (stated, not hidden): no overlap inside the step (DeepSpeed overlaps the
gradient copies of reduced buckets with backward and pipelines CPU Adam with the parameter
copy in tiles: plansim is pessimistic there); stage 2's m - 1 accumulation round trips are
spread evenly over the m micro-batches (the first micro-batch has no host -> device copy,
the last no device -> host one); stage 2 copies whole parameters that straddle its shard
(priced as the shard); parameter fetches block the action (no prefetch); pinned swap
buffers and DeepSpeed's ``max_in_cpu`` parameter cache are not counted. The one-step
delayed parameter update of ZeRO-Offload (DPU, §4.3) is out of scope.
"""

from __future__ import annotations

from plansim.analytic.memory import plan_state_bytes, rank_parameters
from plansim.analytic.ranks import dp_cp_size
from plansim.errors import SpecError
from plansim.specs.hardware import HardwareProfile, HostSpec
from plansim.specs.model import ModelSpec
from plansim.specs.plan import OffloadDevice, ParallelPlan
from plansim.specs.work import Segment
from plansim.units import bytes_to_gib

#: Host bytes per offloaded parameter: fp32 master 4 + Adam m 4 + v 4 (ZeRO paper K = 12)
#: + the fp32 gradient CPU Adam reads 4 (DeepSpeed's estimators: 16 * Psi / nodes with the
#: optimizer offloaded, reference memory.md §4.2).
HOST_OPTIMIZER_BYTES_PER_PARAM = 16.0
#: Of those, what ZeRO-Infinity keeps on NVMe (fp32 master, m, v); the fp32 gradients the
#: step reads stay in host memory.
NVME_OPTIMIZER_BYTES_PER_PARAM = 12.0
#: Bytes per parameter of the gradient shard copied to the host at the accumulation boundary:
#: fp32 (module docstring).
BOUNDARY_GRAD_BYTES = 4.0
#: Timeline kinds of the offload segments, in the order a step runs them.
OFFLOAD_KINDS = ("offload_d2h", "nvme_read", "cpu_adam", "nvme_write", "offload_h2d")
#: The stream offload segments run on (beside compute; see the module docstring).
STREAM = "dp"


def offloads(plan: ParallelPlan) -> bool:
    """True when the plan offloads anything."""
    none = OffloadDevice.NONE
    return plan.offload_optimizer is not none or plan.offload_param is not none


def require_host(plan: ParallelPlan, profile: HardwareProfile) -> HostSpec:
    """The profile's host section for an offloading ``plan``.

    Raises:
        SpecError: the profile has no host section, or ``nvme`` is asked for and the host
            section has no NVMe bandwidth.
    """
    pairs = (("offload_optimizer", plan.offload_optimizer), ("offload_param", plan.offload_param))
    fields = [(f, d) for f, d in pairs if d is not OffloadDevice.NONE]
    what = ", ".join(f"{f}={d.value}" for f, d in fields) or "offload"
    if profile.host is None:
        raise SpecError(
            f"{what} needs a host section in profile {profile.name} (host Adam rate, host "
            f"memory); see hardware_profiles/README.md"
        )
    if any(d is OffloadDevice.NVME for _, d in fields) and not profile.host.has_nvme:
        raise SpecError(
            f"{what} needs host.nvme_read_gb_per_s and host.nvme_write_gb_per_s in profile "
            f"{profile.name}; see hardware_profiles/README.md"
        )
    return profile.host


def offload_choices(profile: HardwareProfile) -> tuple[tuple[OffloadDevice, OffloadDevice], ...]:
    """(offload_optimizer, offload_param) pairs a planner tries on ``profile``: none alone
    without a host section; with one, also ZeRO-Offload (optimizer on the host) and ZeRO-3
    Offload (optimizer and parameters on the host); with NVMe figures, the ZeRO-Infinity
    pairs (optimizer, and optimizer and parameters, on NVMe). Parameter-only offload (Adam
    on the GPU) is left to ``plansim simulate``."""
    none, cpu, nvme = OffloadDevice.NONE, OffloadDevice.CPU, OffloadDevice.NVME
    if profile.host is None:
        return ((none, none),)
    pairs = [(none, none), (cpu, none), (cpu, cpu)]
    if profile.host.has_nvme:
        pairs += [(nvme, none), (nvme, nvme)]
    return tuple(pairs)


def gpus_on_node(plan: ParallelPlan, profile: HardwareProfile) -> int:
    """GPUs of the job on one node (they share its host memory, CPU and NVMe)."""
    return min(plan.num_gpus, profile.gpus_per_node)


def host_bytes_per_gpu(model: ModelSpec, plan: ParallelPlan, *, rank: int) -> float:
    """Host bytes one GPU of pipeline rank ``rank`` keeps for offloaded states.

    Per parameter of its shard (``rank_parameters / (dp * cp)``): 16 with
    ``offload_optimizer=cpu`` (:data:`HOST_OPTIMIZER_BYTES_PER_PARAM`), 4 with ``nvme``
    (fp32 gradients; the rest is on NVMe), plus the 16-bit parameter (2) with
    ``offload_param=cpu``. Steady state: DeepSpeed's start-up copies and pinned buffers
    (the estimators' 1.5 buffer factor; among them the 16-bit gradient accumulation buffer
    of :func:`accumulates_on_host`, 2 bytes per parameter) are not counted, as in DeepSpeed's
    own estimators.
    """
    local = rank_parameters(model, plan, rank=rank) / dp_cp_size(plan)
    per_param = 0.0
    if plan.offload_optimizer is OffloadDevice.CPU:
        per_param += HOST_OPTIMIZER_BYTES_PER_PARAM
    elif plan.offload_optimizer is OffloadDevice.NVME:
        per_param += HOST_OPTIMIZER_BYTES_PER_PARAM - NVME_OPTIMIZER_BYTES_PER_PARAM
    if plan.offload_param is OffloadDevice.CPU:
        per_param += plan_state_bytes(plan).param
    return local * per_param


def host_bytes_per_node(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> tuple[int, float]:
    """(node, bytes) of the node whose GPUs keep the most host bytes (ties: lowest node).

    Global rank q sits on node q // gpus_per_node and is pipeline rank q // (tp * cp * dp)
    (rank order tp -> cp -> dp -> pp); a node's bytes are the sum of its GPUs'
    :func:`host_bytes_per_gpu`.
    """
    stride = plan.tp * plan.cp * plan.dp
    g = profile.gpus_per_node
    per_rank: dict[int, float] = {}
    best = (0, 0.0)
    for node in range(-(-plan.num_gpus // g)):
        lo, hi = node * g, min((node + 1) * g, plan.num_gpus)
        total = 0.0
        for r in range(lo // stride, (hi - 1) // stride + 1):
            if r not in per_rank:
                per_rank[r] = host_bytes_per_gpu(model, plan, rank=r)
            total += per_rank[r] * (min(hi, (r + 1) * stride) - max(lo, r * stride))
        if total > best[1]:
            best = (node, total)
    return best


def host_memory_rejection(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> str | None:
    """Why the plan's offloaded states do not fit the host memory, or None when they do
    (or when it offloads nothing).

    Raises:
        SpecError: the plan offloads and the profile has no (suitable) host section.
    """
    if not offloads(plan):
        return None
    host = require_host(plan, profile)
    node, need = host_bytes_per_node(model, plan, profile)
    if need <= host.memory_bytes:
        return None
    return (
        f"host needs {bytes_to_gib(need):.1f} GiB per node, has "
        f"{bytes_to_gib(host.memory_bytes):.1f} GiB (node {node}: offloaded states of "
        f"{gpus_on_node(plan, profile)} GPUs, {plan.label()})"
    )


def host_copy(kind: str, num_bytes: float, profile: HardwareProfile) -> Segment:
    """A host <-> device copy over the rank's PCIe link (one direction's rate)."""
    return Segment(
        kind=kind,
        stream=STREAM,
        duration_s=num_bytes / profile.pcie_bytes_per_s,
        num_bytes=num_bytes,
        link="pcie",
    )


def nvme_transfer(
    kind: str, num_bytes: float, plan: ParallelPlan, profile: HardwareProfile
) -> Segment:
    """NVMe read or write of ``num_bytes`` at this GPU's share of the node's bandwidth."""
    host = require_host(plan, profile)
    rate = host.nvme_read_bytes_per_s if kind == "nvme_read" else host.nvme_write_bytes_per_s
    assert rate is not None  # require_host checked it
    share = rate / gpus_on_node(plan, profile)
    return Segment(kind=kind, stream=STREAM, duration_s=num_bytes / share, num_bytes=num_bytes)


def host_step_segments(
    plan: ParallelPlan, profile: HardwareProfile, *, local_params: float
) -> tuple[Segment, ...]:
    """The offloaded optimizer step of one rank: gradient copy, (NVMe read), CPU Adam, (NVMe
    write), parameter copy back (see the module docstring; empty when the optimizer is not
    offloaded).

    Args:
        local_params: parameters of the rank's optimizer shard (its parameters / (dp * cp)).

    Raises:
        SpecError: the profile lacks the host section (or NVMe figures) the plan needs.
    """
    if plan.offload_optimizer is OffloadDevice.NONE:
        return ()
    host = require_host(plan, profile)
    half = plan_state_bytes(plan).param * local_params  # 16-bit shard
    nvme = plan.offload_optimizer is OffloadDevice.NVME
    segs = [host_copy("offload_d2h", BOUNDARY_GRAD_BYTES * local_params, profile)]
    if nvme:
        segs.append(
            nvme_transfer("nvme_read", NVME_OPTIMIZER_BYTES_PER_PARAM * local_params, plan, profile)
        )
    segs.append(
        Segment(kind="cpu_adam", stream=STREAM, duration_s=local_params / host.adam_params_per_s)
    )
    written = NVME_OPTIMIZER_BYTES_PER_PARAM * local_params if nvme else 0.0
    if plan.offload_param is OffloadDevice.NVME:
        written += half  # the updated 16-bit shard goes back to NVMe, not to the GPU
    if written:
        segs.append(nvme_transfer("nvme_write", written, plan, profile))
    if plan.offload_param is OffloadDevice.NONE:
        segs.append(host_copy("offload_h2d", half, profile))
    return tuple(segs)


def with_offload(
    optimizer: tuple[Segment, ...],
    *,
    plan: ParallelPlan,
    profile: HardwareProfile,
    local_params: float,
) -> tuple[Segment, ...]:
    """A rank's optimizer segments with offload applied (unchanged without offload).

    ``optimizer`` is costing's GPU step (kind ``optimizer``) followed by what comes after it
    (the ZeRO-1/2 parameter all-gather). With ``offload_optimizer`` the GPU step is replaced
    by :func:`host_step_segments`; with only ``offload_param`` the GPU step stays and its
    updated 16-bit shard is copied to the host (or written to NVMe).

    Raises:
        SpecError: the profile lacks the host section (or NVMe figures) the plan needs.
    """
    if not offloads(plan):
        return optimizer
    step = tuple(s for s in optimizer if s.kind == "optimizer")
    rest = tuple(s for s in optimizer if s.kind != "optimizer")
    if plan.offload_optimizer is not OffloadDevice.NONE:
        return host_step_segments(plan, profile, local_params=local_params) + rest
    half = plan_state_bytes(plan).param * local_params
    back = host_copy("offload_d2h", half, profile)
    if plan.offload_param is OffloadDevice.NVME:
        return (*step, back, nvme_transfer("nvme_write", half, plan, profile), *rest)
    return (*step, back, *rest)
