"""The terms of a hardware profile a step time rests on, each made faster on its own (pure).

A prediction is only as good as the figures it is priced from, and a profile mixes measured
curves with datasheet numbers and stated assumptions (its ``provenance``). To say which of
them a plan's step time depends on, each term below can be made faster by a factor
(:func:`faster`) and the plan simulated again (``plansim.planner.sensitivity``):

======================  ==================================================================
term                    what ``faster(profile, term, f)`` changes
======================  ==================================================================
``compute``             dense peaks of every dtype x f: every GEMM, fused-attention and
                        Ampere-attention rate (all fractions of a peak)
``memory``              HBM bandwidth and the measured elementwise rates x f: memory-bound
                        kernels and HBM-bound GEMMs
``scale_up``            the intra-node (NVLink) collective bus bandwidths x f
``scale_out``           the NIC bandwidth per GPU x f (collectives and sends across nodes)
``launch``              the fixed cost per kernel / f (launch and tail; also the per-chunk
                        copies of list collectives)
``latency``             collective latencies / f: each intra-node curve's alpha and the
                        NIC's (NCCL's own tuning latencies across nodes are code constants)
``host``                the host's per-op seconds / f and its CPU Adam rate x f
``pcie``                host <-> device bandwidth and NVMe bandwidth x f (offload)
======================  ==================================================================

Making every term faster by f at once divides every profile-priced second by f; a step
that holds no constant from code (NCCL's tuning latencies across nodes are such constants,
``plansim.analytic.comm``) then takes exactly 1/f of the time (``tests/unit/test_sensitivity.py``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from plansim.errors import choice_error, require_positive
from plansim.specs.compute_terms import EXTRA_PAIRS
from plansim.specs.curves import CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileTerm:
    """One term of a profile.

    Attributes:
        name: the term's id (``compute``, ``memory``, ...).
        label: what it is, for tables.
        provenance_keys: regular expressions over the profile's provenance keys that hold the
            term's sources (``{dtype}`` stands for the plan's matmul dtype).
    """

    name: str
    label: str
    provenance_keys: tuple[str, ...]


PROFILE_TERMS: tuple[ProfileTerm, ...] = (
    ProfileTerm(
        name="compute",
        label="GEMM and attention rate",
        provenance_keys=(
            r"peak_tflops\.{dtype}",
            r"matmul_efficiency\.{dtype}",
            r"attention_efficiency\.{dtype}",
            r"sustained_matmul_fraction",
            r"gpu_matmul_spread_fraction",
        ),
    ),
    ProfileTerm(
        name="memory",
        label="HBM bandwidth (memory-bound kernels)",
        provenance_keys=(
            r"hbm_bandwidth_gb_per_s",
            r"hbm_efficiency_fraction",
            r"elementwise_(forward|backward)_gb_per_s",
        ),
    ),
    ProfileTerm(
        name="scale_up",
        label="NVLink collective bandwidth",
        provenance_keys=(r"intra_node\.[a-z_]+",),
    ),
    ProfileTerm(
        name="scale_out",
        label="network bandwidth per GPU",
        provenance_keys=(r"nic_gb_per_s", r"inter_node_[a-z_]+"),
    ),
    ProfileTerm(
        name="launch",
        label="kernel launch overhead",
        provenance_keys=(r"kernel_launch_us",),
    ),
    ProfileTerm(
        name="latency",
        label="collective latency (alpha)",
        provenance_keys=(r"nic_latency_us", r"intra_node\.[a-z_]+\.latency_us"),
    ),
    ProfileTerm(
        name="host",
        label="host per-op time and CPU Adam",
        provenance_keys=(r"host_overhead\.[a-z_]+", r"host\.adam_params_per_s"),
    ),
    ProfileTerm(
        name="pcie",
        label="PCIe and NVMe bandwidth (offload)",
        provenance_keys=(r"pcie_gb_per_s", r"host\.nvme_[a-z_]+"),
    ),
)

TERM_NAMES = tuple(t.name for t in PROFILE_TERMS)

#: Provenance classes from the least to the most certain: the first word of a provenance
#: string (``hardware_profiles/README.md``: "measured", "datasheet", "derived",
#: "assumption"; an nccl-tests import counts as measured).
PROVENANCE_CLASSES = ("assumption", "derived", "datasheet", "measured")


def provenance_class(source: str) -> str:
    """The class of one provenance string: its leading word (``nccl-tests`` is
    ``measured``; anything else unrecognised is ``assumption``, the least certain)."""
    head = re.split(r"[^a-z-]", source.strip().lower(), maxsplit=1)[0]
    if head == "nccl-tests":
        return "measured"
    return head if head in PROVENANCE_CLASSES else "assumption"


def class_counts(classes: Iterable[str]) -> str:
    """How many of ``classes`` (provenance classes) are of each class, most certain first,
    e.g. ``measured 2, derived 1, assumption 1``; ``-`` for none."""
    seen = list(classes)
    return (
        ", ".join(f"{c} {seen.count(c)}" for c in reversed(PROVENANCE_CLASSES) if c in seen) or "-"
    )


def term_sources(profile: HardwareProfile, term: ProfileTerm, *, dtype: str) -> dict[str, str]:
    """The provenance entries (key -> class) behind ``term`` for a plan in ``dtype``,
    ordered by key."""
    patterns = [re.compile(p.replace("{dtype}", re.escape(dtype))) for p in term.provenance_keys]
    return {
        key: provenance_class(source)
        for key, source in sorted(profile.provenance.items())
        if any(p.fullmatch(key) for p in patterns)
    }


def _scaled_curve(curve: Curve, factor: float) -> Curve:
    return dataclasses.replace(curve, y=tuple(y * factor for y in curve.y))


def _collectives(
    curves: Mapping[str, CollectiveCurve], *, bandwidth: float, latency: float
) -> dict[str, CollectiveCurve]:
    return {
        name: dataclasses.replace(
            c,
            latency_s=c.latency_s * latency,
            busbw_bytes_per_s=_scaled_curve(c.busbw_bytes_per_s, bandwidth),
        )
        for name, c in curves.items()
    }


def _compute(p: HardwareProfile, f: float) -> HardwareProfile:
    return dataclasses.replace(
        p, peak_flops_per_s={k: v * f for k, v in p.peak_flops_per_s.items()}
    )


def _memory(p: HardwareProfile, f: float) -> HardwareProfile:
    return dataclasses.replace(
        p,
        hbm_bytes_per_s=p.hbm_bytes_per_s * f,
        elementwise_forward_bytes_per_s=p.elementwise_forward_bytes_per_s * f,
        elementwise_backward_bytes_per_s=p.elementwise_backward_bytes_per_s * f,
    )


def _scale_up(p: HardwareProfile, f: float) -> HardwareProfile:
    return dataclasses.replace(p, intra_node=_collectives(p.intra_node, bandwidth=f, latency=1.0))


def _scale_out(p: HardwareProfile, f: float) -> HardwareProfile:
    return dataclasses.replace(p, nic_bytes_per_s=p.nic_bytes_per_s * f)


def _launch(p: HardwareProfile, f: float) -> HardwareProfile:
    return dataclasses.replace(p, kernel_launch_s=p.kernel_launch_s / f)


def _latency(p: HardwareProfile, f: float) -> HardwareProfile:
    return dataclasses.replace(
        p,
        nic_latency_s=p.nic_latency_s / f,
        intra_node=_collectives(p.intra_node, bandwidth=1.0, latency=1.0 / f),
    )


def _host(p: HardwareProfile, f: float) -> HardwareProfile:
    host = p.host and dataclasses.replace(p.host, adam_params_per_s=p.host.adam_params_per_s * f)
    overhead = p.host_overhead
    if overhead is not None:
        names = ("forward_op_s", "backward_op_s", *(n for pair in EXTRA_PAIRS for n in pair))
        changes: dict[str, Any] = {}
        for n in names:
            value = getattr(overhead, n)
            changes[n] = None if value is None else value / f
        overhead = dataclasses.replace(overhead, **changes)
    return dataclasses.replace(p, host=host, host_overhead=overhead)


def _pcie(p: HardwareProfile, f: float) -> HardwareProfile:
    host = p.host
    if host is not None and host.nvme_read_bytes_per_s is not None:
        assert host.nvme_write_bytes_per_s is not None  # HostSpec: both or neither
        host = dataclasses.replace(
            host,
            nvme_read_bytes_per_s=host.nvme_read_bytes_per_s * f,
            nvme_write_bytes_per_s=host.nvme_write_bytes_per_s * f,
        )
    return dataclasses.replace(p, pcie_bytes_per_s=p.pcie_bytes_per_s * f, host=host)


_FASTER: dict[str, Callable[[HardwareProfile, float], HardwareProfile]] = {
    "compute": _compute,
    "memory": _memory,
    "scale_up": _scale_up,
    "scale_out": _scale_out,
    "launch": _launch,
    "latency": _latency,
    "host": _host,
    "pcie": _pcie,
}


def faster(profile: HardwareProfile, term: str, factor: float) -> HardwareProfile:
    """``profile`` with ``term`` (one of :data:`TERM_NAMES`) ``factor`` times faster: its
    rates x ``factor``, its seconds / ``factor`` (module docstring's table).

    Raises:
        SpecError: unknown ``term``, or ``factor`` not > 0.
    """
    if term not in _FASTER:
        raise choice_error("term", term, TERM_NAMES)
    require_positive("factor", factor)
    return _FASTER[term](profile, factor)
