"""HardwareProfile: what one GPU kind and its node/network can do, with provenance.

Profiles are data (``hardware_profiles/*.yaml``, read by ``plansim.io.profiles``); no hardware
figure lives in code. Every lookup interpolates measured or datasheet-derived points and can
say whether the query was inside the measured range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from plansim.errors import SpecError, require_positive, require_positive_int
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.compute_terms import AttentionEfficiency, HostOverhead
from plansim.specs.curves import COLLECTIVES, KNOWN_COLLECTIVES, CollectiveCurve, Curve


class LinkTier(ChoiceEnum):
    """Network tier a collective group spans (the slowest one it crosses)."""

    INTRA_NODE = "intra_node"  # NVLink/NVSwitch (one scale-up domain)
    INTER_NODE = "inter_node"  # NIC per GPU (InfiniBand / RoCE / EFA)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    """The host side of one node, for ZeRO-Offload / ZeRO-Infinity (optional in a profile).

    Attributes:
        memory_bytes: host DRAM per node (all of it; what the OS and the framework keep is
            not subtracted).
        adam_params_per_s: parameters per second a CPU Adam step updates with one GPU's
            share of the host CPU (fp32 Adam with fp32 master weights; the node's GPUs all
            run their step at once, so each gets its share): measured (``plansim calibrate``
            times ``torch.optim.Adam`` on the host with one core per rank).
        nvme_read_bytes_per_s, nvme_write_bytes_per_s: NVMe bandwidth per node (all its
            drives together), or None when the profile has no NVMe figure (ZeRO-Infinity NVMe
            offload then needs one).

    Raises:
        SpecError: a number is not positive, or only one NVMe direction is given.
    """

    memory_bytes: float
    adam_params_per_s: float
    nvme_read_bytes_per_s: float | None = None
    nvme_write_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        require_positive("host.memory_bytes", self.memory_bytes)
        require_positive("host.adam_params_per_s", self.adam_params_per_s)
        nvme = (self.nvme_read_bytes_per_s, self.nvme_write_bytes_per_s)
        if (nvme[0] is None) != (nvme[1] is None):
            raise SpecError(
                "host.nvme_read_bytes_per_s and host.nvme_write_bytes_per_s go together "
                f"(got {nvme[0]!r} and {nvme[1]!r})"
            )
        for name, value in zip(("read", "write"), nvme, strict=True):
            if value is not None:
                require_positive(f"host.nvme_{name}_bytes_per_s", value)

    @property
    def has_nvme(self) -> bool:
        """True when both NVMe bandwidths are known."""
        return self.nvme_read_bytes_per_s is not None


#: Largest per-GPU rate spread a profile may state: the slowest of 10^6 GPUs (4.9 standard
#: deviations below the median) must still run at a positive rate.
MAX_SPREAD_FRACTION = 0.2

#: Fractions a profile must keep in range: (field, allowed interval, test); None is allowed.
_FRACTIONS: tuple[tuple[str, str, Callable[[float], bool]], ...] = (
    ("hbm_efficiency_fraction", "(0, 1]", lambda v: 0 < v <= 1),
    ("overlap_compute_slowdown_fraction", "[0, 1)", lambda v: 0 <= v < 1),
    ("sustained_matmul_fraction", "(0, 1]", lambda v: 0 < v <= 1),
    (
        "gpu_matmul_spread_fraction",
        f"[0, {MAX_SPREAD_FRACTION})",
        lambda v: 0 <= v < MAX_SPREAD_FRACTION,
    ),
    ("ampere_attention_fraction_of_peak", "(0, 1]", lambda v: 0 < v <= 1),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareProfile:
    """A GPU kind in its node and network.

    Attributes:
        name: profile id (file stem), e.g. ``a100-sxm4-80gb``.
        description: one line for ``plansim profiles list``.
        peak_flops_per_s: dense peak by dtype key (``bf16``, ``fp16``, ``fp8``, ``fp32``, ``tf32``).
        matmul_efficiency: per dtype, achievable fraction of peak over GEMM FLOPs (2*m*n*k).
        hbm_capacity_bytes: device memory.
        hbm_bytes_per_s: datasheet HBM bandwidth.
        hbm_efficiency_fraction: achievable fraction of it for streaming elementwise kernels.
        memory_reserve_bytes: memory not available to the model (CUDA context, NCCL buffers,
            allocator fragmentation).
        gpus_per_node: GPUs in one scale-up (NVLink) domain.
        intra_node: collective curves inside the scale-up domain, keyed by collective: each
            of ``curves.COLLECTIVES`` (required), and ``all_to_all`` where it was measured
            (``curves.OPTIONAL_COLLECTIVES``; ``intra_node.get("all_to_all")`` is None
            without it).
        nic_bytes_per_s: inter-node bandwidth per GPU (one NIC rail), unidirectional.
        nic_latency_s: inter-node per-message latency (alpha).
        pcie_bytes_per_s: host<->device bandwidth per GPU, unidirectional.
        kernel_launch_s: fixed overhead per kernel (launch + tail).
        provenance: dotted key -> source of that number.
        host: the node's host memory, CPU Adam rate and NVMe (:class:`HostSpec`), or None
            when the profile has no host section (offload plans then cannot be costed).
        attention_efficiency: per dtype, fused attention's rate over the FLOPs of one call
            (:class:`AttentionEfficiency`); a dtype without one prices attention's QK^T and
            PV with its GEMM curve.
        host_overhead: host seconds per eager op in training (:class:`HostOverhead`), or
            None (no host term).
        overlap_compute_slowdown_fraction: how much longer compute takes while a collective
            runs beside it on the same GPU (the communication kernels take SMs and HBM
            bandwidth): 0.189 = 18.9% longer. 0 (the default, and a profile without the key):
            overlapped compute runs at full speed.
        elementwise_forward_bytes_per_s, elementwise_backward_bytes_per_s: measured rate at
            which a layer's memory-bound kernels (layer norms, residual adds, GELU) move the
            bytes ``plansim.analytic.elementwise`` counts for them, forward and backward
            (``plansim calibrate``: a CPU's GELU is compute-bound, so it runs well below
            the streaming bandwidth). 0 (the default, a profile without the keys): the
            streaming bandwidth (:meth:`streaming_bytes_per_s`).
        sustained_matmul_fraction: the GEMM rate a GPU holds at its power limit with
            training-like (random) operands, over the burst rate the ``matmul_efficiency``
            ceiling was measured at (MAMF: a short loop after warm-up). 1 (the default, a
            profile without the key): no difference measured. Applied by
            ``plansim.analytic.sustained``.
        gpu_matmul_spread_fraction: standard deviation of the sustained GEMM rate across GPUs
            of this kind, over its median (silicon lottery, cooling): a synchronous job
            waits for its slowest GPU, so a job of N GPUs runs at the expected slowest of N
            (``plansim.analytic.sustained``). 0 (the default): every GPU alike.
        inter_node_ring_fraction: fraction of the inter-node bus bandwidth an all-gather or
            reduce-scatter ring keeps over this many nodes (x: nodes, y: fraction in (0, 1];
            clamped outside the measured node counts): a ring's every step waits for its
            slowest link, so longer rings lose bandwidth (``plansim.analytic.comm``). None
            (the default, a profile without the section): no loss with node count.
        inter_node_message_fraction: fraction of the NIC line rate (``gpus x nic``) a
            collective across nodes reaches at each message size (x: bytes, y: fraction in
            (0, 1]; the end values outside the measured sizes), from an nccl-tests run over
            several nodes with the alpha of ``plansim.analytic.comm`` taken out: a network
            transfer needs larger messages than NVLink to reach its line rate (NCCL uses
            fewer channels and chunks for smaller messages). None (the default, a profile
            without the section): the intra-node curve's shape, capped at the line rate.
        ampere_attention_fraction_of_peak: the most an attention kernel written for the
            Ampere generation's tensor-core instructions (``mma.sync``: FlashAttention-2, the
            Triton FlashAttention of 2022) reaches on this GPU, as a fraction of its dense
            16-bit peak: on Hopper such kernels cannot use its warpgroup instructions
            (FlashAttention-2 reaches 35% of an H100's, Shah et al. 2024, arXiv:2407.08608).
            Caps ``AttentionKernel.FLASH_TRITON`` calls (``plansim.analytic.op_overheads``).
            None (the default, a profile without the key): no cap.
        max_power_w: the GPU's board power limit, watts (datasheet TDP, or measured): its
            draw while kernels run (GEMM-bound training runs at the power limit: see
            ``sustained_matmul_fraction``). None: the profile has no power figure.
        communication_power_w, idle_power_w: measured draw while the GPU only communicates
            and while it waits, watts; None: not measured (energy then prices those
            activities at ``max_power_w``, an upper bound).
    """

    name: str
    description: str
    peak_flops_per_s: Mapping[str, float]
    matmul_efficiency: Mapping[str, Curve]
    hbm_capacity_bytes: float
    hbm_bytes_per_s: float
    hbm_efficiency_fraction: float
    memory_reserve_bytes: float
    gpus_per_node: int
    intra_node: Mapping[str, CollectiveCurve]
    nic_bytes_per_s: float
    nic_latency_s: float
    pcie_bytes_per_s: float
    kernel_launch_s: float
    provenance: Mapping[str, str] = field(default_factory=dict)
    host: HostSpec | None = None
    attention_efficiency: Mapping[str, AttentionEfficiency] = field(default_factory=dict)
    host_overhead: HostOverhead | None = None
    overlap_compute_slowdown_fraction: float = 0.0
    elementwise_forward_bytes_per_s: float = 0.0
    elementwise_backward_bytes_per_s: float = 0.0
    sustained_matmul_fraction: float = 1.0
    gpu_matmul_spread_fraction: float = 0.0
    inter_node_ring_fraction: Curve | None = None
    ampere_attention_fraction_of_peak: float | None = None
    inter_node_message_fraction: Curve | None = None
    max_power_w: float | None = None
    communication_power_w: float | None = None
    idle_power_w: float | None = None

    def __post_init__(self) -> None:
        require_positive_int(f"{self.name}.gpus_per_node", self.gpus_per_node)
        for key in (
            "hbm_capacity_bytes",
            "hbm_bytes_per_s",
            "hbm_efficiency_fraction",
            "nic_bytes_per_s",
            "pcie_bytes_per_s",
        ):
            require_positive(f"{self.name}.{key}", getattr(self, key))
        for key in ("max_power_w", "communication_power_w", "idle_power_w"):
            if getattr(self, key) is not None:
                require_positive(f"{self.name}.{key}", getattr(self, key))
        if self.max_power_w is None and (self.communication_power_w or self.idle_power_w):
            raise SpecError(f"{self.name}: communication_power_w and idle_power_w need max_power_w")
        for key, interval, inside in _FRACTIONS:
            value = getattr(self, key)
            if value is not None and not inside(value):
                raise SpecError(f"{self.name}.{key} must be in {interval}, got {value}")
        self._check_curves_and_dtypes()

    def _check_curves_and_dtypes(self) -> None:
        """Network fractions in (0, 1], elementwise rates >= 0, the reserve inside the
        capacity, every collective's curve, and a peak for each dtype with a curve."""
        for key in ("inter_node_ring_fraction", "inter_node_message_fraction"):
            curve = getattr(self, key)
            if curve is not None and any(not 0 < y <= 1 for y in curve.y):
                raise SpecError(f"{self.name}.{key} values must be in (0, 1], got {curve.y}")
        for key in ("elementwise_forward_bytes_per_s", "elementwise_backward_bytes_per_s"):
            if not getattr(self, key) >= 0:
                raise SpecError(f"{self.name}.{key} must be >= 0, got {getattr(self, key)}")
        if self.memory_reserve_bytes < 0 or self.memory_reserve_bytes >= self.hbm_capacity_bytes:
            raise SpecError(
                f"{self.name}.memory_reserve_bytes({self.memory_reserve_bytes}) must be in "
                f"[0, hbm_capacity_bytes({self.hbm_capacity_bytes}))"
            )
        missing = [c for c in COLLECTIVES if c not in self.intra_node]
        if missing:
            raise SpecError(f"{self.name}.intra_node lacks collectives: {', '.join(missing)}")
        unknown = [c for c in self.intra_node if c not in KNOWN_COLLECTIVES]
        if unknown:
            raise SpecError(
                f"{self.name}.intra_node has unknown collectives: {', '.join(unknown)}; "
                f"allowed: {', '.join(KNOWN_COLLECTIVES)}"
            )
        for dtype in self.matmul_efficiency:
            if dtype not in self.peak_flops_per_s:
                raise SpecError(f"{self.name}.matmul_efficiency[{dtype}] has no peak_flops_per_s")
        for dtype in self.attention_efficiency:
            if dtype not in self.peak_flops_per_s:
                raise SpecError(
                    f"{self.name}.attention_efficiency[{dtype}] has no peak_flops_per_s"
                )

    @property
    def serial_host(self) -> bool:
        """True when host and device are one processor (``host_overhead.serial``: a CPU
        device), so nothing runs ahead of the thread that computes."""
        return self.host_overhead is not None and self.host_overhead.serial

    @property
    def usable_memory_bytes(self) -> float:
        """HBM capacity less the reserve: what the model's tensors may use."""
        return self.hbm_capacity_bytes - self.memory_reserve_bytes

    def dtypes(self) -> tuple[str, ...]:
        """Dtypes with both a peak and an efficiency curve."""
        return tuple(sorted(self.matmul_efficiency))

    def matmul_flops_per_s(self, dtype: str, gemm_flops: float) -> float:
        """Achievable FLOP/s for one GEMM of ``gemm_flops`` FLOPs in ``dtype``.

        Raises:
            SpecError: the profile has no curve for ``dtype``.
        """
        if dtype not in self.matmul_efficiency:
            raise SpecError(
                f"profile {self.name} has no matmul data for dtype {dtype!r}; "
                f"has: {', '.join(self.dtypes())}"
            )
        return self.peak_flops_per_s[dtype] * self.matmul_efficiency[dtype](gemm_flops)

    def attention_flops_per_s(self, dtype: str, call_flops: float, *, backward: bool) -> float:
        """Achievable FLOP/s of a fused attention call of ``call_flops`` forward FLOPs
        (causal, :class:`AttentionEfficiency`), forward or backward, in ``dtype``.

        Raises:
            SpecError: the profile has no attention curve for ``dtype``.
        """
        curves = self.attention_efficiency.get(dtype)
        if curves is None:
            raise SpecError(
                f"profile {self.name} has no attention_efficiency for dtype {dtype!r}; "
                f"has: {', '.join(sorted(self.attention_efficiency)) or 'none'}"
            )
        curve = curves.backward if backward else curves.forward
        return self.peak_flops_per_s[dtype] * curve(call_flops)

    def ring_busbw_fraction(self, num_nodes: int) -> float:
        """Fraction of the inter-node bus bandwidth an all-gather / reduce-scatter ring over
        ``num_nodes`` nodes keeps (:attr:`inter_node_ring_fraction`; 1 without it, and for
        one node)."""
        if self.inter_node_ring_fraction is None or num_nodes <= 1:
            return 1.0
        return self.inter_node_ring_fraction(num_nodes)

    def message_busbw_fraction(self, message_bytes: float) -> float:
        """Fraction of the NIC line rate a collective across nodes reaches with a message of
        ``message_bytes`` (:attr:`inter_node_message_fraction`; 1 without it)."""
        if self.inter_node_message_fraction is None:
            return 1.0
        return self.inter_node_message_fraction(message_bytes)

    def streaming_bytes_per_s(self) -> float:
        """Achievable HBM bandwidth for memory-bound elementwise kernels."""
        return self.hbm_bytes_per_s * self.hbm_efficiency_fraction

    def elementwise_bytes_per_s(self, *, backward: bool) -> float:
        """Rate of a layer's memory-bound kernels, forward or ``backward``: the measured one
        (``elementwise_*_bytes_per_s``), else :meth:`streaming_bytes_per_s`."""
        measured = (
            self.elementwise_backward_bytes_per_s
            if backward
            else self.elementwise_forward_bytes_per_s
        )
        return measured or self.streaming_bytes_per_s()
