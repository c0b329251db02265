"""Keys, units and version of the hardware-profile YAML schema (read by ``profile_parse``,
written by ``profiles``); the schema itself is documented in ``hardware_profiles/README.md``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plansim.specs.compute_terms import HostOverhead
from plansim.units import (
    GB,
    bytes_per_s_to_gb_per_s,
    bytes_to_gib,
    gb_per_s_to_bytes_per_s,
    gib_to_bytes,
    s_to_us,
    us_to_s,
)

#: The schema version this module reads and writes.
SCHEMA_VERSION = 1

TOP = "(top level)"


def _bytes_to_gb(num_bytes: float) -> float:
    """Bytes -> GB (1e9 bytes, datasheet capacity), via the constant in ``plansim.units``."""
    return num_bytes / GB


def _identity(value: float) -> float:
    return value


@dataclass(frozen=True)
class _Scalar:
    """One top-level number: YAML key (edge unit) <-> HardwareProfile field (SI)."""

    key: str
    field: str
    to_si: Callable[[float], float]
    from_si: Callable[[float], float]


SCALARS = (
    _Scalar("kernel_launch_us", "kernel_launch_s", us_to_s, s_to_us),
    _Scalar("hbm_capacity_gib", "hbm_capacity_bytes", gib_to_bytes, bytes_to_gib),
    _Scalar(
        "hbm_bandwidth_gb_per_s",
        "hbm_bytes_per_s",
        gb_per_s_to_bytes_per_s,
        bytes_per_s_to_gb_per_s,
    ),
    _Scalar("hbm_efficiency_fraction", "hbm_efficiency_fraction", _identity, _identity),
    _Scalar("memory_reserve_gib", "memory_reserve_bytes", gib_to_bytes, bytes_to_gib),
    _Scalar("nic_gb_per_s", "nic_bytes_per_s", gb_per_s_to_bytes_per_s, bytes_per_s_to_gb_per_s),
    _Scalar("nic_latency_us", "nic_latency_s", us_to_s, s_to_us),
    _Scalar("pcie_gb_per_s", "pcie_bytes_per_s", gb_per_s_to_bytes_per_s, bytes_per_s_to_gb_per_s),
)

#: Top-level keys in file order.
TOP_LEVEL_KEYS = (
    "schema_version",
    "name",
    "description",
    "peak_tflops",
    "matmul_efficiency",
    "attention_efficiency",
    "kernel_launch_us",
    "host_overhead",
    "hbm_capacity_gib",
    "hbm_bandwidth_gb_per_s",
    "hbm_efficiency_fraction",
    "memory_reserve_gib",
    "gpus_per_node",
    "intra_node",
    "nic_gb_per_s",
    "nic_latency_us",
    "pcie_gb_per_s",
    "overlap_compute_slowdown_fraction",
    "elementwise_forward_gb_per_s",
    "elementwise_backward_gb_per_s",
    "sustained_matmul_fraction",
    "gpu_matmul_spread_fraction",
    "ampere_attention_fraction_of_peak",
    "max_power_w",
    "communication_power_w",
    "idle_power_w",
    "inter_node_ring_scaling",
    "inter_node_message_scaling",
    "host",
    "provenance",
)
#: Top-level keys a file may leave out (every other one is required).
OPTIONAL_TOP_LEVEL_KEYS = (
    "host",
    "attention_efficiency",
    "host_overhead",
    "overlap_compute_slowdown_fraction",
    "elementwise_forward_gb_per_s",
    "elementwise_backward_gb_per_s",
    "sustained_matmul_fraction",
    "gpu_matmul_spread_fraction",
    "ampere_attention_fraction_of_peak",
    "inter_node_ring_scaling",
    "inter_node_message_scaling",
    "max_power_w",
    "communication_power_w",
    "idle_power_w",
)
#: Optional top-level numbers (absent: the field's default).
OPTIONAL_SCALARS = (
    _Scalar(
        "overlap_compute_slowdown_fraction",
        "overlap_compute_slowdown_fraction",
        _identity,
        _identity,
    ),
    _Scalar(
        "elementwise_forward_gb_per_s",
        "elementwise_forward_bytes_per_s",
        gb_per_s_to_bytes_per_s,
        bytes_per_s_to_gb_per_s,
    ),
    _Scalar(
        "elementwise_backward_gb_per_s",
        "elementwise_backward_bytes_per_s",
        gb_per_s_to_bytes_per_s,
        bytes_per_s_to_gb_per_s,
    ),
    _Scalar("sustained_matmul_fraction", "sustained_matmul_fraction", _identity, _identity),
    _Scalar("gpu_matmul_spread_fraction", "gpu_matmul_spread_fraction", _identity, _identity),
    _Scalar(
        "ampere_attention_fraction_of_peak",
        "ampere_attention_fraction_of_peak",
        _identity,
        _identity,
    ),
    _Scalar("max_power_w", "max_power_w", _identity, _identity),
    _Scalar("communication_power_w", "communication_power_w", _identity, _identity),
    _Scalar("idle_power_w", "idle_power_w", _identity, _identity),
)
#: Plausible ranges of the top-level and ``host:`` numbers, in the file's units (inclusive).
#: Each spans at least 10x beyond the extremes of every device in
#: ../shared/reference/hardware.csv and of the shipped profiles (a 2-core CPU measured at
#: 11 GB/s and 0.9 GB/s between ranks; B300's 288 GB at 8 TB/s; 800 Gb/s NICs, 100 GB/s;
#: launch overhead 2-23 us, NIC latency 122-269 us; 400-1,200 W): a number outside is a typo
#: or a unit slip (bytes for GB), never a device. Fractions are checked by the profile itself.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "kernel_launch_us": (0.0, 10_000.0),
    "hbm_capacity_gib": (0.01, 100_000.0),
    "hbm_bandwidth_gb_per_s": (0.01, 1_000_000.0),
    "memory_reserve_gib": (0.0, 100_000.0),
    "nic_gb_per_s": (0.001, 100_000.0),
    "nic_latency_us": (0.0, 1_000_000.0),
    "latency_us": (0.0, 1_000_000.0),  # each intra_node collective's
    "pcie_gb_per_s": (0.001, 100_000.0),
    "elementwise_forward_gb_per_s": (0.01, 1_000_000.0),
    "elementwise_backward_gb_per_s": (0.01, 1_000_000.0),
    "max_power_w": (1.0, 100_000.0),
    "communication_power_w": (1.0, 100_000.0),
    "idle_power_w": (1.0, 100_000.0),
    "memory_gib": (0.01, 1_000_000.0),
    "adam_params_per_s": (1.0, 1e15),
    "nvme_read_gb_per_s": (0.001, 100_000.0),
    "nvme_write_gb_per_s": (0.001, 100_000.0),
}
#: The optional ``host:`` section (ZeRO-Offload / ZeRO-Infinity): YAML key <->
#: ``HostSpec`` field, in file order; provenance keys are ``host.<key>``.
HOST_SCALARS = (
    _Scalar("memory_gib", "memory_bytes", gib_to_bytes, bytes_to_gib),
    _Scalar("adam_params_per_s", "adam_params_per_s", _identity, _identity),
    _Scalar(
        "nvme_read_gb_per_s",
        "nvme_read_bytes_per_s",
        gb_per_s_to_bytes_per_s,
        bytes_per_s_to_gb_per_s,
    ),
    _Scalar(
        "nvme_write_gb_per_s",
        "nvme_write_bytes_per_s",
        gb_per_s_to_bytes_per_s,
        bytes_per_s_to_gb_per_s,
    ),
)
#: Keys of ``host:`` that must be there when the section is (the NVMe pair is optional).
HOST_REQUIRED_KEYS = ("memory_gib", "adam_params_per_s")
MATMUL_KEYS = ("gemm_flops", "fraction_of_peak")
#: Keys of one dtype of the optional ``attention_efficiency:`` section (``profile_parse``).
ATTENTION_KEYS = ("attention_flops", "forward_fraction_of_peak", "backward_fraction_of_peak")
#: The optional ``host_overhead:`` section (``profile_parse``): YAML key <-> ``HostOverhead``
#: field, in file order; ``serial`` (a bool) and the two ``dtensor_`` keys are not scalars
#: here (:data:`HOST_OVERHEAD_KEYS`); provenance keys are ``host_overhead.<key>``.
HOST_OVERHEAD_SCALARS = (
    _Scalar("forward_op_us", "forward_op_s", us_to_s, s_to_us),
    _Scalar("backward_op_us", "backward_op_s", us_to_s, s_to_us),
    _Scalar("dtensor_forward_op_us", "dtensor_forward_op_s", us_to_s, s_to_us),
    _Scalar("dtensor_backward_op_us", "dtensor_backward_op_s", us_to_s, s_to_us),
    _Scalar("dtensor_all_reduce_forward_us", "dtensor_all_reduce_forward_s", us_to_s, s_to_us),
    _Scalar("dtensor_all_reduce_backward_us", "dtensor_all_reduce_backward_s", us_to_s, s_to_us),
    _Scalar("fsdp_unit_forward_us", "fsdp_unit_forward_s", us_to_s, s_to_us),
    _Scalar("fsdp_unit_backward_us", "fsdp_unit_backward_s", us_to_s, s_to_us),
    _Scalar("pipeline_action_forward_us", "pipeline_action_forward_s", us_to_s, s_to_us),
    _Scalar("pipeline_action_backward_us", "pipeline_action_backward_s", us_to_s, s_to_us),
    _Scalar("sac_forward_op_us", "sac_forward_op_s", us_to_s, s_to_us),
    _Scalar("sac_backward_op_us", "sac_backward_op_s", us_to_s, s_to_us),
)
#: Keys of ``host_overhead:`` in file order; ``serial`` and the forward/backward pair are
#: required in the section, the others (:data:`HOST_OVERHEAD_OPTIONAL_KEYS`) optional.
HOST_OVERHEAD_KEYS = ("serial", *(s.key for s in HOST_OVERHEAD_SCALARS))
HOST_OVERHEAD_OPTIONAL_KEYS = tuple(
    s.key for s in HOST_OVERHEAD_SCALARS if s.key not in ("forward_op_us", "backward_op_us")
)


def host_overhead_keys(host: HostOverhead) -> tuple[str, ...]:
    """YAML keys of ``host_overhead:`` that ``host`` has values for, in file order."""
    present = {"serial"} | {
        s.key for s in HOST_OVERHEAD_SCALARS if getattr(host, s.field) is not None
    }
    return tuple(k for k in HOST_OVERHEAD_KEYS if k in present)


COLLECTIVE_KEYS = ("latency_us", "message_bytes", "busbw_gb_per_s")
#: The optional fraction-of-bandwidth sections (``profile_parse``): YAML section -> (its x
#: key, HardwareProfile field); each also has ``busbw_fraction``, the fraction at each x.
#: ``inter_node_ring_scaling``: node counts, the bus bandwidth a ring keeps;
#: ``inter_node_message_scaling``: message sizes, the NIC line rate a collective reaches.
FRACTION_CURVES = {
    "inter_node_ring_scaling": ("num_nodes", "inter_node_ring_fraction"),
    "inter_node_message_scaling": ("message_bytes", "inter_node_message_fraction"),
}

HEADER = (
    "# plansim hardware profile (schema_version 1), written by plansim.io.profiles.\n"
    "# Units are in the key names; every number's source is under `provenance`;\n"
    "# schema and provenance rules: hardware_profiles/README.md.\n"
)
