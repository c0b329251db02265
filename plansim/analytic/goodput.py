"""Expected goodput of a long synchronous training run under failures, with periodic
checkpoints (pure: ``math`` and ``dataclasses`` only).

**Model** (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", Future Generation Computer Systems 22 (2006) 303-312, the "complete" model of §3).
Failures of the job (any of its ranks) arrive as a Poisson process of rate λ = 1/M, M the
job's mean time between failures ``mtbf_s``. The run needs ``work_s`` seconds of useful
compute, cut into n = ceil(work_s / interval_s) segments of ``interval_s`` of work (the last
one holds the remainder), each followed by a blocking checkpoint write of δ =
``checkpoint_s``. A failure during a segment (its work or its checkpoint) loses everything
since the last completed checkpoint; the job then pays R = ``restart_s`` (restart, reload of
the checkpoint, warm-up), during which a failure starts the restart again, and then redoes
the segment.

**One segment** of length L = work + δ. The restart phase alone is a segment of length R with
nothing to restart, so by the same argument as below its expected duration is
Y = (e^{λR} - 1)/λ. A segment attempt fails with probability 1 - e^{-λL}; the number of failed
attempts is geometric with mean e^{λL} - 1, each costing E[T | T < L] + Y, and
(e^{λL} - 1) E[T | T < L] = (e^{λL} - 1)/λ - L, so

    X = L + (e^{λL} - 1)(E[T | T < L] + Y) = (e^{λL} - 1)(1/λ + Y) = M e^{R/M} (e^{L/M} - 1),

Daly's Eq. (13) per segment. The expected wall time of the run is the sum of X over the n
segments (exact for the shorter last one: the segments are independent by memorylessness).
By Wald's identity the expected number of failures (restarts' included) is wall / M.

**Intervals.** Young's first-order optimum sqrt(2 δ M) (J. W. Young, "A first order
approximation to the optimum checkpoint interval", CACM 17(9), 1974, p. 530) and Daly's
higher-order estimate (2006, Eq. 37), within 0.05% of the numeric optimum up to δ/M = 0.1.
Neither depends on R: e^{R/M} is a constant factor of X.

Non-finite results: when (L + R)/M exceeds :data:`MAX_EXPONENT` the job essentially never
finishes; the wall time is ``math.inf`` and the goodput 0 (no ``OverflowError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.errors import SpecError

#: Above this exponent (L + R)/M a segment's expected wall time is reported as ``math.inf``
#: (e^700 ≈ 1e304; ``math.exp`` overflows past 709.78).
MAX_EXPONENT = 700.0

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_GOLDEN_ITERATIONS = 120


def _require_number(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{field} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(f"{field} must be finite, got {value!r}")
    return float(value)


def require_non_negative(field: str, value: object) -> float:
    """``value`` as a float. Raises SpecError unless it is a finite real number >= 0."""
    x = _require_number(field, value)
    if not x >= 0.0:
        raise SpecError(f"{field} must be >= 0, got {value!r}")
    return x


def require_positive(field: str, value: object) -> float:
    """``value`` as a float. Raises SpecError unless it is a finite real number > 0."""
    x = _require_number(field, value)
    if not x > 0.0:
        raise SpecError(f"{field} must be > 0, got {value!r}")
    return x


def validate_run(
    *, work_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float, interval_s: float
) -> None:
    """Check the fields of a run (seconds): work_s, checkpoint_s, restart_s >= 0; mtbf_s,
    interval_s > 0; all finite. Raises SpecError naming the first bad field."""
    require_non_negative("work_s", work_s)
    require_non_negative("checkpoint_s", checkpoint_s)
    require_non_negative("restart_s", restart_s)
    require_positive("mtbf_s", mtbf_s)
    require_positive("interval_s", interval_s)


def segments(*, work_s: float, interval_s: float) -> tuple[int, float]:
    """(n, last_work_s): the number of segments n = ceil(work_s / interval_s) and the work of
    the last one, in (0, interval_s] (seconds; (0, 0.0) for no work). A quotient that lands a
    rounding error above an integer counts as that integer. Raises SpecError for work_s < 0 or
    interval_s <= 0."""
    require_non_negative("work_s", work_s)
    require_positive("interval_s", interval_s)
    if work_s == 0.0:
        return 0, 0.0
    n = max(1, math.ceil(work_s / interval_s))
    if n > 1 and work_s - (n - 1) * interval_s <= 1e-9 * interval_s:
        n -= 1
    last = min(interval_s, max(work_s - (n - 1) * interval_s, 0.0))
    return n, last


def young_interval_s(*, checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval sqrt(2 δ M), seconds of work between checkpoints
    (Young, CACM 17(9) 1974). δ = checkpoint_s, M = mtbf_s (seconds).

    Raises SpecError for checkpoint_s < 0 or mtbf_s <= 0 (or non-finite)."""
    delta = require_non_negative("checkpoint_s", checkpoint_s)
    m = require_positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * delta * m)


def daly_interval_s(*, checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum interval (seconds of work; Daly 2006, Eq. 37):
    sqrt(2δM) [1 + (1/3) sqrt(δ/(2M)) + (1/9) δ/(2M)] - δ for δ < 2M, else M.

    Raises SpecError for checkpoint_s < 0 or mtbf_s <= 0 (or non-finite)."""
    delta = require_non_negative("checkpoint_s", checkpoint_s)
    m = require_positive("mtbf_s", mtbf_s)
    if delta >= 2.0 * m:
        return m
    x = delta / (2.0 * m)
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def _segment_wall(length_s: float, restart_s: float, mtbf_s: float) -> float:
    if (length_s + restart_s) / mtbf_s > MAX_EXPONENT:
        return math.inf
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(length_s / mtbf_s)


def segment_wall_s(*, length_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall time (s) of one segment of length L = work + checkpoint (s) with restart
    R and job MTBF M (s): M e^{R/M} (e^{L/M} - 1) (Daly 2006, Eq. 13 for one segment; the
    module docstring derives it). ``math.inf`` when (L + R)/M > :data:`MAX_EXPONENT`.

    Raises SpecError for length_s < 0, restart_s < 0, mtbf_s <= 0 (or non-finite)."""
    length = require_non_negative("length_s", length_s)
    restart = require_non_negative("restart_s", restart_s)
    m = require_positive("mtbf_s", mtbf_s)
    return _segment_wall(length, restart, m)


def expected_wall_s(
    *, work_s: float, interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float
) -> float:
    """Expected wall time (s) of the whole run: the sum of :func:`segment_wall_s` over its n
    segments, n - 1 of interval_s + checkpoint_s and the last of its remaining work +
    checkpoint_s (module docstring; Daly 2006 §3). 0 for no work; ``math.inf`` when a
    segment's exponent overflows.

    Raises SpecError for a bad field (:func:`validate_run`)."""
    validate_run(
        work_s=work_s,
        checkpoint_s=checkpoint_s,
        restart_s=restart_s,
        mtbf_s=mtbf_s,
        interval_s=interval_s,
    )
    n, last = segments(work_s=work_s, interval_s=interval_s)
    if n == 0:
        return 0.0
    full = _segment_wall(interval_s + checkpoint_s, restart_s, mtbf_s)
    return (n - 1) * full + _segment_wall(last + checkpoint_s, restart_s, mtbf_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputEstimate:
    """Expected figures of one run under failures (seconds unless stated).

    ``lost_s`` is the expected wall time neither spent on useful work nor on the checkpoint
    writes of the completed segments: rework of failed attempts (their work and partial
    checkpoints) and restarts."""

    interval_s: float
    num_checkpoints: int
    work_s: float
    wall_s: float
    #: work_s / wall_s (1.0 for no work, 0.0 when the wall time is infinite)
    goodput_fraction: float
    #: expected number of failures, restarts' included: wall_s / mtbf_s
    expected_failures: float
    #: num_checkpoints * checkpoint_s
    checkpoint_s_total: float
    #: wall_s - work_s - checkpoint_s_total (rework + restarts)
    lost_s: float

    @property
    def overhead_s(self) -> float:
        """Expected wall time beyond the useful work: checkpoints + rework + restarts (s)."""
        return self.wall_s - self.work_s


def _default_interval_s(*, work_s: float, checkpoint_s: float, mtbf_s: float) -> float:
    interval = daly_interval_s(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    if work_s > 0.0:
        interval = min(interval, work_s)
        if interval <= 0.0:
            raise SpecError(
                f"checkpoint_s must be > 0 when interval_s is not given (Daly's interval is "
                f"0 for free checkpoints), got {checkpoint_s!r}"
            )
    return interval


def goodput(
    *,
    work_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    interval_s: float | None = None,
) -> GoodputEstimate:
    """Expected goodput of a run of work_s seconds of useful compute under failures of mean
    time between failures mtbf_s, with a blocking checkpoint of checkpoint_s after every
    interval_s of work and restart_s per restart (seconds; model and sources in the module
    docstring). interval_s None: :func:`daly_interval_s`, clamped to at most work_s.

    Raises SpecError for a bad field (:func:`validate_run`), or for checkpoint_s = 0 without
    an interval_s (Daly's interval is then 0)."""
    if interval_s is None:
        interval_s = _default_interval_s(work_s=work_s, checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
        if work_s == 0.0:  # nothing to run: any interval, no checkpoint
            return _estimate(work_s, interval_s, 0, 0.0, checkpoint_s, mtbf_s)
    wall = expected_wall_s(
        work_s=work_s,
        interval_s=interval_s,
        checkpoint_s=checkpoint_s,
        restart_s=restart_s,
        mtbf_s=mtbf_s,
    )
    n, _ = segments(work_s=work_s, interval_s=interval_s)
    return _estimate(work_s, interval_s, n, wall, checkpoint_s, mtbf_s)


def _estimate(
    work_s: float,
    interval_s: float,
    n: int,
    wall_s: float,
    checkpoint_s: float,
    mtbf_s: float,
) -> GoodputEstimate:
    checkpoints = n * checkpoint_s
    return GoodputEstimate(
        interval_s=interval_s,
        num_checkpoints=n,
        work_s=work_s,
        wall_s=wall_s,
        goodput_fraction=1.0 if wall_s == 0.0 else work_s / wall_s,
        expected_failures=wall_s / mtbf_s,
        checkpoint_s_total=checkpoints,
        lost_s=max(wall_s - work_s - checkpoints, 0.0),
    )


def _log_continuous_wall(tau: float, work_s: float, checkpoint_s: float, m: float) -> float:
    """ln of (W/τ) M e^{R/M} (e^{(τ+δ)/M} - 1) without the constant ln M + R/M: never
    overflows (ln(e^x - 1) = x + ln(1 - e^{-x}))."""
    x = (tau + checkpoint_s) / m
    log_expm1 = x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))
    return math.log(work_s / tau) + log_expm1


def best_interval_s(
    *, work_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float
) -> float:
    """The interval (s of work) minimising the expected wall time with the segment count taken
    as continuous, (W/τ) M e^{R/M} (e^{(τ+δ)/M} - 1): golden-section search on ln τ over
    [max(δ, 1e-9 M)/1000, W] (the function is unimodal in τ). A numeric reference for
    :func:`daly_interval_s`; independent of R.

    Raises SpecError for work_s <= 0, checkpoint_s < 0, restart_s < 0 or mtbf_s <= 0 (or
    non-finite)."""
    require_positive("work_s", work_s)
    require_non_negative("checkpoint_s", checkpoint_s)
    require_non_negative("restart_s", restart_s)
    require_positive("mtbf_s", mtbf_s)
    lo = math.log(min(work_s, max(checkpoint_s, 1e-9 * mtbf_s) / 1000.0))
    hi = math.log(work_s)

    def f(u: float) -> float:
        return _log_continuous_wall(math.exp(u), work_s, checkpoint_s, mtbf_s)

    c, d = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    for _ in range(_GOLDEN_ITERATIONS):
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - _GOLDEN * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + _GOLDEN * (hi - lo)
            fd = f(d)
    return math.exp(0.5 * (lo + hi))
