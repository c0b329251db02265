"""Measured curves of a hardware profile: log-log interpolation and the alpha-beta collective
model (pure).

``plansim.specs.hardware.HardwareProfile`` holds these; ``plansim.io.profiles`` reads them
from YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.errors import SpecError, require_positive, require_positive_int

#: Collectives every profile holds (``HardwareProfile.intra_node`` requires each).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")
#: Collectives a profile may hold beside :data:`COLLECTIVES` (absent: not measured).
OPTIONAL_COLLECTIVES = ("all_to_all",)
#: Every collective a :class:`CollectiveCurve` may be, required ones first (file order).
KNOWN_COLLECTIVES = COLLECTIVES + OPTIONAL_COLLECTIVES


def bus_factor(collective: str, num_ranks: int) -> float:
    """nccl-tests' busbw/algbw factor: bytes each rank moves per byte of message.

    all_reduce 2(n-1)/n; all_gather and reduce_scatter (n-1)/n; sendrecv 1; all_to_all
    (n-1)/n (nccl-tests ``doc/PERFORMANCE.md``; ring algorithm volumes; for all_to_all the
    message is the whole per-rank send buffer, of which the 1/n addressed to the rank itself
    stays local).

    Raises:
        SpecError: unknown collective or num_ranks < 1.
    """
    require_positive_int("num_ranks", num_ranks)
    if collective == "all_reduce":
        return 2.0 * (num_ranks - 1) / num_ranks
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (num_ranks - 1) / num_ranks
    if collective == "sendrecv":
        return 1.0
    raise SpecError(f"collective={collective!r} is not allowed; choose one of: {KNOWN_COLLECTIVES}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Curve:
    """Piecewise log-log interpolation of y(x) through measured points, clamped at the ends.

    Attributes:
        x: strictly increasing positive abscissae (e.g. message bytes, GEMM FLOPs).
        y: positive ordinates (e.g. busbw bytes/s, efficiency fraction).
        source: provenance of the points.
    """

    x: tuple[float, ...]
    y: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or not self.x:
            raise SpecError(
                f"curve needs equal, non-empty x and y (got {len(self.x)}, {len(self.y)})"
            )
        for i, (xi, yi) in enumerate(zip(self.x, self.y, strict=True)):
            require_positive(f"curve.x[{i}]", xi)
            require_positive(f"curve.y[{i}]", yi)
        if any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise SpecError(f"curve.x must be strictly increasing, got {self.x}")

    def __call__(self, x: float) -> float:
        """y at x: log-log linear between neighbours; the end value outside the range."""
        xs, ys = self.x, self.y
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        lo, hi = 0, len(xs) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if xs[mid] <= x:
                lo = mid
            else:
                hi = mid
        t = (math.log(x) - math.log(xs[lo])) / (math.log(xs[hi]) - math.log(xs[lo]))
        return math.exp(math.log(ys[lo]) + t * (math.log(ys[hi]) - math.log(ys[lo])))

    def in_range(self, x: float) -> bool:
        """True when x lies within the measured points."""
        return self.x[0] <= x <= self.x[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCurve:
    """One collective on one tier: alpha-beta with a measured bus-bandwidth curve.

    time(S, n) = latency_s + S * bus_factor(collective, n) / busbw(S)
    where busbw(S) is the measured bus bandwidth at message size S (nccl-tests definition).

    Attributes:
        collective: one of KNOWN_COLLECTIVES (the required COLLECTIVES or the optional
            ``all_to_all``, whose message is the whole per-rank send buffer).
        latency_s: alpha, seconds per call.
        busbw_bytes_per_s: busbw over message size in bytes.
        source: provenance.
    """

    collective: str
    latency_s: float
    busbw_bytes_per_s: Curve
    source: str = ""

    def __post_init__(self) -> None:
        if self.collective not in KNOWN_COLLECTIVES:
            raise SpecError(
                f"collective={self.collective!r} is not allowed; choose one of: {KNOWN_COLLECTIVES}"
            )
        if self.latency_s < 0:
            raise SpecError(f"{self.collective}.latency_s must be >= 0, got {self.latency_s}")

    def time_s(self, message_bytes: float, num_ranks: int) -> float:
        """Seconds for one call with a message of ``message_bytes`` over ``num_ranks`` ranks."""
        if num_ranks <= 1 and self.collective != "sendrecv":
            return 0.0
        factor = bus_factor(self.collective, num_ranks)
        return self.latency_s + message_bytes * factor / self.busbw_bytes_per_s(message_bytes)
