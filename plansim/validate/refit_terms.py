"""Refit of a profile's host per-op overhead from one measured run (pure; used by ``refit``).

A measured forward or backward pass holds device work D, host per-op work H (the profile's
``host_overhead``, ``plansim.analytic.op_overheads``) and the in-action communication X the
run cannot time apart (TP collectives inside a DTensor forward, ZeRO-3 gathers). Per pass::

    measured_F = a * D_F + c * H_F + X_F        measured_B = a * D_B + c * H_B + X_B

D and H are read from two simulations, with and without the host term; X from the
simulated timeline (:func:`pass_totals`). Two cases determine a host term:

* **Tensor parallelism with a DTensor figure** (tp > 1, ``dtensor_*_op_s`` present): the
  DTensor extra is a TP-only term, so the run's forward and backward errors are put into the
  DTensor forward and backward figures (:func:`fit_dtensor`). Putting them into the GEMM
  curve instead would carry a TP-only cost into every other layout.
* **Otherwise**: (a, c) from the two equations (:func:`fit_host_scale`) when the two
  columns (D_F, D_B) and (H_F, H_B) are far enough from parallel (|sin| of their angle at
  least :data:`MIN_SEPARATION`) and both factors come out positive; else the run cannot
  tell host cost from device throughput (their backward/forward ratios are alike, ~2) and
  the host term is kept.

On a serial (CPU) device H = ops * (per_op - dispatch), so scaling H by c sets
per_op' = dispatch + c * (per_op - dispatch); on an asynchronous device per_op' = c * per_op
(exact while the host is the longer side of ``max``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from plansim.sim import timeline as tl
from plansim.specs.hardware import HardwareProfile
from plansim.validate.compare import CATEGORY_KINDS, Comparison
from plansim.validate.simulated import PIPELINE_ACTION_KIND

#: Least |sin| of the angle between the device and host columns for the 2 x 2 solve.
MIN_SEPARATION = 0.1
_FORWARD = CATEGORY_KINDS["forward"]
_BACKWARD = CATEGORY_KINDS["backward"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTotals:
    """Seconds per step summed over ranks: measured and simulated forward and backward
    compute, and the simulated in-action communication the run did not time apart, split by
    the pass it belongs to."""

    measured_forward_s: float
    measured_backward_s: float
    simulated_forward_s: float
    simulated_backward_s: float
    unobserved_forward_s: float
    unobserved_backward_s: float


def _total(c: Comparison, kinds: tuple[str, ...], column: str) -> float:
    return float(c.kinds.loc[c.kinds.index.isin(kinds), column].sum())


def unobserved_split(c: Comparison, sim: pd.DataFrame) -> tuple[float, float]:
    """Simulated in-action communication of kinds the run did not record (``measured_count``
    0), split into (forward, backward) seconds: each row goes to the compute row of the same
    rank, stage and micro-batch it touches (its start at that row's end, or its end at that
    row's start; the nearest wins)."""
    kinds = c.kinds
    hidden = set(
        kinds.index[(kinds["measured_count"] == 0) & (kinds["simulated_tied_total_s"] > 0)]
    )
    hidden -= {*_FORWARD, *_BACKWARD, PIPELINE_ACTION_KIND}  # between actions, not inside
    rows = sim[sim[tl.KIND].isin(hidden) & (sim[tl.MICROBATCH] >= 0)]
    compute = sim[(sim[tl.STREAM] == tl.COMPUTE) & sim[tl.KIND].isin(_FORWARD + _BACKWARD)]
    by_key = {key: group for key, group in compute.groupby([tl.RANK, tl.STAGE, tl.MICROBATCH])}
    forward = backward = 0.0
    for rank, stage, mb, start, end in zip(
        rows[tl.RANK],
        rows[tl.STAGE],
        rows[tl.MICROBATCH],
        rows[tl.START_S],
        rows[tl.END_S],
        strict=True,
    ):
        group = by_key.get((rank, stage, mb))
        if group is None:
            continue
        gap = pd.concat([(group[tl.END_S] - start).abs(), (group[tl.START_S] - end).abs()], axis=1)
        nearest = group.loc[gap.min(axis=1).idxmin(), tl.KIND]
        if nearest in _FORWARD:
            forward += end - start
        else:
            backward += end - start
    return forward, backward


def pass_totals(c: Comparison, sim: pd.DataFrame) -> PassTotals:
    """Forward and backward totals of ``c`` (simulated timeline ``sim``)."""
    hidden_f, hidden_b = unobserved_split(c, sim)
    return PassTotals(
        measured_forward_s=_total(c, _FORWARD, "measured_total_s"),
        measured_backward_s=_total(c, _BACKWARD, "measured_total_s"),
        simulated_forward_s=_total(c, _FORWARD, "simulated_total_s"),
        simulated_backward_s=_total(c, _BACKWARD, "simulated_total_s"),
        unobserved_forward_s=hidden_f,
        unobserved_backward_s=hidden_b,
    )


#: The HostOverhead extras a host factor scales: the DTensor per-linear pair and the per-op
#: selective-checkpoint pair, which lengthen the passes' compute. The DTensor all-reduce and
#: FSDP2 unit figures lengthen communication segments (the X of the module docstring) and the
#: pipeline-action figures the time between actions (refitted by ``refit_pipeline``), so
#: neither is in the passes' host time.
HOST_SCALED_EXTRAS = (
    ("dtensor_forward_op_s", "dtensor_backward_op_s"),
    ("sac_forward_op_s", "sac_backward_op_s"),
)


def scale_host(
    profile: HardwareProfile, *, forward: float, backward: float, dtensor_only: bool = False
) -> HardwareProfile:
    """``profile`` with its host seconds per pass scaled by ``forward`` / ``backward``.

    ``dtensor_only``: scale only the DTensor per-linear extras (everything else kept).
    Otherwise the plain figures are scaled over the bare dispatch (serial) or as a whole
    (asynchronous), and the DTensor per-linear and per-op selective-checkpoint extras by the
    same factors; the other extras are kept (:data:`HOST_SCALED_EXTRAS`).
    """
    host = profile.host_overhead
    if host is None:
        return profile
    dispatch = profile.kernel_launch_s if host.serial else 0.0

    def plain(value: float, factor: float) -> float:
        if dtensor_only:
            return value
        return max(0.0, dispatch + factor * (value - dispatch)) if value > dispatch else value

    changes: dict[str, Any] = {}
    for fwd, bwd in HOST_SCALED_EXTRAS[:1] if dtensor_only else HOST_SCALED_EXTRAS:
        for name, factor in ((fwd, forward), (bwd, backward)):
            value = getattr(host, name)
            changes[name] = None if value is None else max(0.0, value * factor)
    scaled = dataclasses.replace(
        host,
        forward_op_s=plain(host.forward_op_s, forward),
        backward_op_s=plain(host.backward_op_s, backward),
        **changes,
    )
    return dataclasses.replace(profile, host_overhead=scaled)


def without_host(profile: HardwareProfile, *, dtensor_only: bool = False) -> HardwareProfile:
    """``profile`` without the host time :func:`scale_host` scales: per-op figures down to
    the bare dispatch and zero DTensor per-linear and selective-checkpoint extras
    (``dtensor_only``: the DTensor extras alone), the other extras kept, so the difference of
    two simulations is the host term H of the module docstring and nothing else."""
    return scale_host(profile, forward=0.0, backward=0.0, dtensor_only=dtensor_only)


def fit_host_scale(with_host: PassTotals, device_only: PassTotals) -> float | None:
    """The host factor c of the module docstring's two equations, or None when the run does
    not determine it (columns near parallel, no host time, or a factor <= 0)."""
    d_f, d_b = device_only.simulated_forward_s, device_only.simulated_backward_s
    h_f = with_host.simulated_forward_s - d_f
    h_b = with_host.simulated_backward_s - d_b
    m_f = with_host.measured_forward_s - with_host.unobserved_forward_s
    m_b = with_host.measured_backward_s - with_host.unobserved_backward_s
    norm = math.hypot(d_f, d_b) * math.hypot(h_f, h_b)
    det = d_f * h_b - d_b * h_f
    if norm <= 0 or abs(det) / norm < MIN_SEPARATION:
        return None
    a = (m_f * h_b - m_b * h_f) / det
    c = (d_f * m_b - d_b * m_f) / det
    return c if a > 0 and c > 0 else None


def fit_dtensor(with_host: PassTotals, no_dtensor: PassTotals) -> tuple[float, float] | None:
    """(forward, backward) factors on the DTensor extras that make the simulated passes
    match the measured ones (each pass's whole error put into its DTensor host time), or None
    when the simulation has no DTensor time. Factors are clamped at 0."""
    h_f = with_host.simulated_forward_s - no_dtensor.simulated_forward_s
    h_b = with_host.simulated_backward_s - no_dtensor.simulated_backward_s
    if h_f <= 0 or h_b <= 0:
        return None
    rest_f = no_dtensor.simulated_forward_s + with_host.unobserved_forward_s
    rest_b = no_dtensor.simulated_backward_s + with_host.unobserved_backward_s
    return (
        max(0.0, (with_host.measured_forward_s - rest_f) / h_f),
        max(0.0, (with_host.measured_backward_s - rest_b) / h_b),
    )
