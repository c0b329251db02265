"""Which of a profile's curves a plan's pricing reads outside their measured points.

Every curve of a profile (GEMM and fused-attention efficiency by FLOPs, collective bus
bandwidth by message size, the inter-node ring and message fractions) interpolates between
measured or derived points and holds its end value beyond them (``plansim.specs.curves.Curve``).
A lookup outside the points is an extrapolation the profile cannot vouch for: a GEMM larger
than any calibrated, a collective message smaller than the smallest nccl-tests size, a ring
over more nodes than were measured. docs/architecture.md asks that such lookups say so;
:func:`out_of_range_lookups` finds them by pricing the plan once more on a copy of the
profile whose curves record every abscissa they are asked for (the values returned are the
same, so the simulation is unchanged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from plansim.planner.evaluate import evaluate
from plansim.specs.compute_terms import AttentionEfficiency
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class _RecordingCurve(Curve):
    """A :class:`Curve` that appends ``(key, x)`` to ``log`` on every lookup."""

    key: str = ""
    log: list[tuple[str, float]] = field(
        default_factory=list, compare=False, hash=False, repr=False
    )

    def __call__(self, x: float) -> float:
        self.log.append((self.key, float(x)))
        return Curve.__call__(self, x)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutOfRange:
    """One curve read beyond its points.

    Attributes:
        key: the profile's key for the curve (``matmul_efficiency.bf16``,
            ``intra_node.all_reduce``, ``inter_node_ring_scaling``, ...).
        unit: what its abscissa counts (``FLOPs``, ``bytes``, ``nodes``).
        measured_low, measured_high: the curve's first and last points.
        queried_low, queried_high: the smallest and largest abscissa the plan asked for.
        num_lookups: lookups outside the points (of all the curve's lookups).
    """

    key: str
    unit: str
    measured_low: float
    measured_high: float
    queried_low: float
    queried_high: float
    num_lookups: int

    def text(self) -> str:
        """One line: what was asked, what was measured, and that the end value is used."""
        sides = []
        if self.queried_low < self.measured_low:
            sides.append(f"down to {self.queried_low:.3g}")
        if self.queried_high > self.measured_high:
            sides.append(f"up to {self.queried_high:.3g}")
        return (
            f"{self.key}: read {' and '.join(sides)} {self.unit}, outside the profile's "
            f"{self.measured_low:.3g}-{self.measured_high:.3g} ({self.num_lookups} lookups; "
            "the nearest end value is used)"
        )


def _recording(curve: Curve, key: str, log: list[tuple[str, float]]) -> Curve:
    return _RecordingCurve(x=curve.x, y=curve.y, source=curve.source, key=key, log=log)


def _attention(
    curves: Mapping[str, AttentionEfficiency], log: list[tuple[str, float]]
) -> dict[str, AttentionEfficiency]:
    return {
        dtype: dataclasses.replace(
            a,
            forward=_recording(a.forward, f"attention_efficiency.{dtype}.forward", log),
            backward=_recording(a.backward, f"attention_efficiency.{dtype}.backward", log),
        )
        for dtype, a in curves.items()
    }


def recording_profile(
    profile: HardwareProfile,
) -> tuple[HardwareProfile, list[tuple[str, float]]]:
    """A copy of ``profile`` whose curves log each lookup as ``(key, x)``, and the log."""
    log: list[tuple[str, float]] = []
    ring, message = profile.inter_node_ring_fraction, profile.inter_node_message_fraction
    copy = dataclasses.replace(
        profile,
        matmul_efficiency={
            d: _recording(c, f"matmul_efficiency.{d}", log)
            for d, c in profile.matmul_efficiency.items()
        },
        attention_efficiency=_attention(profile.attention_efficiency, log),
        intra_node={
            name: dataclasses.replace(
                c, busbw_bytes_per_s=_recording(c.busbw_bytes_per_s, f"intra_node.{name}", log)
            )
            for name, c in profile.intra_node.items()
        },
        inter_node_ring_fraction=ring and _recording(ring, "inter_node_ring_scaling", log),
        inter_node_message_fraction=message
        and _recording(message, "inter_node_message_scaling", log),
    )
    return copy, log


def _curves(profile: HardwareProfile) -> dict[str, tuple[Curve, str]]:
    """Every curve of ``profile`` by key, with the unit of its abscissa."""
    curves: dict[str, tuple[Curve, str]] = {
        f"matmul_efficiency.{d}": (c, "FLOPs") for d, c in profile.matmul_efficiency.items()
    }
    for d, a in profile.attention_efficiency.items():
        curves[f"attention_efficiency.{d}.forward"] = (a.forward, "FLOPs")
        curves[f"attention_efficiency.{d}.backward"] = (a.backward, "FLOPs")
    for name, c in profile.intra_node.items():
        curves[f"intra_node.{name}"] = (c.busbw_bytes_per_s, "bytes")
    if profile.inter_node_ring_fraction is not None:
        curves["inter_node_ring_scaling"] = (profile.inter_node_ring_fraction, "nodes")
    if profile.inter_node_message_fraction is not None:
        curves["inter_node_message_scaling"] = (profile.inter_node_message_fraction, "bytes")
    return curves


def out_of_range(profile: HardwareProfile, log: list[tuple[str, float]]) -> tuple[OutOfRange, ...]:
    """The lookups of ``log`` (from :func:`recording_profile` of ``profile``) outside their
    curve's points, one :class:`OutOfRange` per curve, in key order."""
    curves = _curves(profile)
    outside: dict[str, list[float]] = {}
    for key, x in log:
        if not curves[key][0].in_range(x):
            outside.setdefault(key, []).append(x)
    return tuple(
        OutOfRange(
            key=key,
            unit=curves[key][1],
            measured_low=curves[key][0].x[0],
            measured_high=curves[key][0].x[-1],
            queried_low=min(xs),
            queried_high=max(xs),
            num_lookups=len(xs),
        )
        for key, xs in sorted(outside.items())
    )


def out_of_range_lookups(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> tuple[OutOfRange, ...]:
    """The curves of ``profile`` that pricing ``plan`` reads outside their points
    (:func:`out_of_range`); empty when every lookup is inside. The plan is evaluated once
    more (a rejected plan reports what its costing read).

    Raises:
        SpecError: as ``evaluate``.
    """
    copy, log = recording_profile(profile)
    evaluate(model, plan, copy)
    return out_of_range(profile, log)
