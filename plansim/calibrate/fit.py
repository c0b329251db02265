"""Fitting measurements into profile curves. Pure (numpy): no torch, no I/O.

Two models, both stated in ``hardware_profiles/README.md``:

* **Collectives** (nccl-tests busbw definition, ``plansim.specs.curves.CollectiveCurve``):
  ``t(S) = alpha + S * f(n) / busbw(S)``. :func:`fit_alpha_beta` fits the straight line
  ``t = alpha + beta * S`` by least squares on *relative* residuals (every size counts the
  same, from 8 B to GiB). :func:`fit_collective` keeps that alpha as the latency and stores,
  at every measured size where the bandwidth term is a visible share of the time, the busbw
  of the bandwidth term alone, ``busbw(S) = S f / (t(S) - alpha)``, so the profile gives back
  the measured time at every such size and interpolates in log-log between them.
* **Rates** (GEMM FLOP/s, bytes/s): :func:`fit_efficiency` bins measurements by work in
  octaves, takes the median rate per bin and divides by a peak (the best bin unless a peak is
  given): ``fraction_of_peak`` over ``work`` for ``plansim.specs.curves.Curve``.
* **Fused attention** (:func:`fit_attention`): per measured size, the forward's rate and
  the backward's (forward + backward time less the forward's, for twice the forward FLOPs),
  each over the GEMM peak: ``plansim.specs.compute_terms.AttentionEfficiency``.
* **Host per-op overhead** (:func:`fit_host_ops`): the seconds per op of a forward through a
  chain of tiny ops, and of its backward (forward + backward less forward).

Every fit records the measured range (first and last size or work) so lookups outside it can
be flagged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plansim.errors import PlansimError, SpecError
from plansim.specs.compute_terms import AttentionEfficiency
from plansim.specs.curves import CollectiveCurve, Curve, bus_factor

Array = npt.NDArray[np.float64]


class FitError(PlansimError):
    """Measurements that cannot be fitted (too few, not increasing with size, not positive)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AlphaBeta:
    """``time_s(S) = alpha_s + beta_s_per_byte * S`` fitted to measured (S, t) points.

    Attributes:
        alpha_s: latency, seconds per call (>= 0).
        beta_s_per_byte: seconds per message byte (includes the bus factor).
        num_points: points in the fit.
        min_bytes, max_bytes: measured range of S.
        max_relative_error: largest |model - measured| / measured over the points.
    """

    alpha_s: float
    beta_s_per_byte: float
    num_points: int
    min_bytes: float
    max_bytes: float
    max_relative_error: float

    def time_s(self, message_bytes: float) -> float:
        """Model time for a message of ``message_bytes``."""
        return self.alpha_s + self.beta_s_per_byte * message_bytes

    def busbw_bytes_per_s(self, factor: float) -> float:
        """Asymptotic bus bandwidth: ``factor / beta`` (factor = nccl-tests bus factor)."""
        return factor / self.beta_s_per_byte


def _points(x: Sequence[float], y: Sequence[float], what: str) -> tuple[Array, Array]:
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise FitError(f"{what}: sizes and times differ in length ({xs.size} vs {ys.size})")
    if xs.size == 0:
        raise FitError(f"{what}: no measurements")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise FitError(f"{what}: measurements must be finite numbers")
    if np.any(xs <= 0) or np.any(ys <= 0):
        raise FitError(f"{what}: sizes and times must be positive")
    return xs, ys


def fit_alpha_beta(message_bytes: Sequence[float], time_s: Sequence[float]) -> AlphaBeta:
    """Least-squares line through (S, t) minimising the sum of squared relative errors.

    Minimises ``sum(((alpha + beta S_i - t_i) / t_i)^2)``, linear in (alpha, beta). If the
    optimum has alpha < 0 (pure bandwidth data), alpha is fixed at 0 and beta refitted.
    Noise-free data on a line give the line back exactly.

    Raises:
        FitError: fewer than two distinct sizes, non-positive values, or time not growing
            with size (beta <= 0).
    """
    sizes, times = _points(message_bytes, time_s, "alpha-beta fit")
    if np.unique(sizes).size < 2:
        raise FitError("alpha-beta fit: needs at least two distinct message sizes")
    weights = 1.0 / times
    design = np.column_stack([weights, sizes * weights])
    solution, *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    alpha, beta = float(solution[0]), float(solution[1])
    if alpha < 0:
        ratio = sizes * weights
        alpha, beta = 0.0, float(np.sum(ratio) / np.sum(ratio * ratio))
    if not beta > 0:
        raise FitError(
            "alpha-beta fit: time does not grow with message size "
            f"(beta = {beta:.3g} s/byte over {sizes.size} sizes)"
        )
    model = alpha + beta * sizes
    return AlphaBeta(
        alpha_s=alpha,
        beta_s_per_byte=beta,
        num_points=int(sizes.size),
        min_bytes=float(sizes.min()),
        max_bytes=float(sizes.max()),
        max_relative_error=float(np.max(np.abs(model - times) / times)),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveFit:
    """A collective's profile curve and the alpha-beta line it came from.

    Attributes:
        curve: latency + measured busbw of the bandwidth term (``source`` left empty).
        alpha_beta: the straight-line fit over all points.
        num_ranks: group size of the measurement (for the bus factor).
        dropped_sizes: sizes whose time was latency-dominated (not in the busbw curve).
    """

    curve: CollectiveCurve
    alpha_beta: AlphaBeta
    num_ranks: int
    dropped_sizes: tuple[float, ...]

    def describe(self) -> str:
        """One line for provenance: latency, asymptotic busbw, measured range, ranks."""
        factor = bus_factor(self.curve.collective, self.num_ranks)
        line = self.alpha_beta
        x = self.curve.busbw_bytes_per_s.x
        return (
            f"latency {self.curve.latency_s * 1e6:.4g} us; busbw curve at {len(x)} sizes "
            f"{_size(x[0])}-{_size(x[-1])} (measured {_size(line.min_bytes)}-"
            f"{_size(line.max_bytes)}, {self.num_ranks} ranks); alpha-beta line alpha "
            f"{line.alpha_s * 1e6:.4g} us, busbw {line.busbw_bytes_per_s(factor) / 1e9:.4g} GB/s, "
            f"max deviation {line.max_relative_error:.0%}"
        )


def _size(num_bytes: float) -> str:
    """8 B, 64 KiB, 16 MiB, 8 GiB (binary prefixes, as nccl-tests sizes are powers of 2)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.4g} {unit}"
    return f"{num_bytes:.4g} B"


def fit_collective(
    collective: str,
    message_bytes: Sequence[float],
    time_s: Sequence[float],
    *,
    num_ranks: int,
    min_bandwidth_share: float = 0.1,
) -> CollectiveFit:
    """Latency and busbw curve of one collective measured over ``num_ranks`` ranks.

    latency = the alpha-beta alpha, capped at the smallest measured time. The busbw curve
    keeps the sizes whose bandwidth term ``t - latency`` is at least ``min_bandwidth_share``
    of ``t`` (below that the busbw is timer noise divided by a small number); duplicate sizes
    keep their smallest time. If no size qualifies, the line's asymptotic busbw is used at
    the largest size.

    Raises:
        FitError: see :func:`fit_alpha_beta`; also for num_ranks < 2 (except sendrecv).
    """
    if num_ranks < 2:
        raise FitError(f"{collective}: needs a group of at least 2 ranks, got {num_ranks}")
    sizes, times = _points(message_bytes, time_s, collective)
    unique = np.unique(sizes)
    best = np.array([times[sizes == s].min() for s in unique])
    line = fit_alpha_beta(unique.tolist(), best.tolist())
    factor = bus_factor(collective, num_ranks)
    latency = min(line.alpha_s, float(best.min()))
    term = best - latency
    keep = term >= min_bandwidth_share * best
    if np.any(keep):
        x = unique[keep]
        y = x * factor / term[keep]
    else:
        x = unique[-1:]
        y = np.array([line.busbw_bytes_per_s(factor)])
    curve = CollectiveCurve(
        collective=collective,
        latency_s=latency,
        busbw_bytes_per_s=Curve(x=tuple(float(v) for v in x), y=tuple(float(v) for v in y)),
    )
    dropped = tuple(float(s) for s in unique[~keep]) if np.any(keep) else ()
    return CollectiveFit(curve=curve, alpha_beta=line, num_ranks=num_ranks, dropped_sizes=dropped)


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyFit:
    """Achievable rate over work, as a fraction of a peak.

    Attributes:
        peak_per_s: the rate the fractions are relative to (work units per second).
        curve: fraction of ``peak_per_s`` over work (x: geometric mean work of each octave bin,
            y: median rate in the bin / peak, capped at 1).
        best_per_s: the best binned rate measured.
        min_work, max_work: measured range.
        num_points: measurements used.
    """

    peak_per_s: float
    curve: Curve
    best_per_s: float
    min_work: float
    max_work: float
    num_points: int

    def rate_per_s(self, work: float) -> float:
        """Predicted rate for an operation of ``work`` units."""
        return self.peak_per_s * self.curve(work)


#: log2 slack of the octave binning (:func:`fit_efficiency`).
OCTAVE_TOLERANCE = 1e-9


def fit_efficiency(
    work: Sequence[float], time_s: Sequence[float], *, peak_per_s: float | None = None
) -> EfficiencyFit:
    """Octave-binned median rate over work, relative to ``peak_per_s`` (default: best bin).

    Args:
        work: per measurement, the work done (FLOPs of a GEMM, bytes moved).
        time_s: per measurement, its (median) time.
        peak_per_s: the peak to divide by; fractions above 1 are capped at 1.

    Raises:
        FitError: no measurements or non-positive values, or a non-positive peak.
    """
    amounts, times = _points(work, time_s, "efficiency fit")
    rates = amounts / times
    # A GEMM's FLOPs are often a power of two (2 * 8192^3 = 2^40); read back from the raw
    # CSV's 12 significant digits such an amount can fall just below it and into the octave
    # beneath (4398046511104 -> 4.3980465111e+12), so a rebuild binned differently from the
    # run that wrote the CSV. OCTAVE_TOLERANCE is far above that rounding (1e-12) and far
    # below any two sizes the calibration plans.
    octave = np.floor(np.log2(amounts) + OCTAVE_TOLERANCE).astype(np.int64)
    xs: list[float] = []
    ys: list[float] = []
    for bin_id in np.unique(octave):
        members = octave == bin_id
        xs.append(float(np.exp(np.mean(np.log(amounts[members])))))
        ys.append(float(np.median(rates[members])))
    best = max(ys)
    peak = best if peak_per_s is None else peak_per_s
    if not (math.isfinite(peak) and peak > 0):
        raise FitError(f"efficiency fit: peak must be a positive number, got {peak}")
    fractions = tuple(min(1.0, y / peak) for y in ys)
    return EfficiencyFit(
        peak_per_s=peak,
        curve=Curve(x=tuple(xs), y=fractions),
        best_per_s=best,
        min_work=float(amounts.min()),
        max_work=float(amounts.max()),
        num_points=int(amounts.size),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionFit:
    """Fused-attention efficiency curves and the measured range.

    Attributes:
        efficiency: forward and backward fractions of ``peak_per_s`` over forward FLOPs per
            call (``source`` left empty).
        peak_per_s: the GEMM peak the fractions are relative to.
        min_flops, max_flops: measured range of forward FLOPs per call.
        num_points: sizes in the curves.
    """

    efficiency: AttentionEfficiency
    peak_per_s: float
    min_flops: float
    max_flops: float
    num_points: int


def fit_attention(
    forward_flops: Sequence[float],
    forward_s: Sequence[float],
    forward_backward_s: Sequence[float],
    *,
    peak_per_s: float,
) -> AttentionFit:
    """Fused attention's forward and backward fractions of ``peak_per_s`` per measured size.

    For a call of F forward FLOPs taking t_f forward and t_fb forward + backward:
    forward fraction = F / t_f / peak; backward fraction = 2F / (t_fb - t_f) / peak (the
    backward counted as twice the forward's FLOPs, ``AttentionEfficiency``). Sizes whose
    backward time is not positive (timer noise on a tiny call) are dropped; equal sizes keep
    their median times.

    Raises:
        FitError: no usable size, non-positive values or a non-positive peak.
    """
    flops, fwd = _points(forward_flops, forward_s, "attention fit")
    _, both = _points(forward_flops, forward_backward_s, "attention fit")
    if not (math.isfinite(peak_per_s) and peak_per_s > 0):
        raise FitError(f"attention fit: peak must be a positive number, got {peak_per_s}")
    xs: list[float] = []
    y_fwd: list[float] = []
    y_bwd: list[float] = []
    for size in np.unique(flops):
        members = flops == size
        t_f, t_fb = float(np.median(fwd[members])), float(np.median(both[members]))
        if t_fb <= t_f:
            continue
        xs.append(float(size))
        y_fwd.append(float(size) / t_f / peak_per_s)
        y_bwd.append(2.0 * float(size) / (t_fb - t_f) / peak_per_s)
    if not xs:
        raise FitError("attention fit: no size whose forward + backward outlasts its forward")
    try:
        efficiency = AttentionEfficiency(
            forward=Curve(x=tuple(xs), y=tuple(y_fwd)), backward=Curve(x=tuple(xs), y=tuple(y_bwd))
        )
    except SpecError as exc:
        raise FitError(f"attention fit: {exc}") from None
    return AttentionFit(
        efficiency=efficiency,
        peak_per_s=peak_per_s,
        min_flops=xs[0],
        max_flops=xs[-1],
        num_points=len(xs),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOpFit:
    """Host seconds per op, forward and backward, from chains of tiny ops."""

    forward_op_s: float
    backward_op_s: float


def fit_host_ops(num_ops: float, *, forward_s: float, forward_backward_s: float) -> HostOpFit:
    """Per-op host seconds of a chain of ``num_ops`` tiny ops: forward_s / n and
    (forward_backward_s - forward_s) / n (0 when the difference is negative: noise).

    Raises:
        FitError: a non-positive op count or time.
    """
    if not (num_ops > 0 and forward_s > 0 and forward_backward_s > 0):
        raise FitError(
            f"host-op fit: needs positive ops and times, got {num_ops}, {forward_s}, "
            f"{forward_backward_s}"
        )
    return HostOpFit(
        forward_op_s=forward_s / num_ops,
        backward_op_s=max(0.0, forward_backward_s - forward_s) / num_ops,
    )
