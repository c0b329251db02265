"""Monte Carlo of a long training run under failures, with periodic checkpoints (numpy).

It samples exactly the model of :mod:`plansim.analytic.goodput` (Daly 2006, §3; read its
docstring): failures of the job arrive as a Poisson process of mean interval M = ``mtbf_s``;
the run's ``work_s`` is cut into n = ceil(work_s / interval_s) segments (the last holds the
remainder), each followed by a blocking checkpoint of δ = ``checkpoint_s``; a failure during
a segment's work or checkpoint loses the segment, the job pays R = ``restart_s`` (a failure
during it starts the restart again) and redoes the segment. It is the check of the closed form
:func:`plansim.analytic.goodput.expected_wall_s`.

**Sampling, per trial, in blocks rather than attempt by attempt** (exact in distribution).
By memorylessness the attempts of a segment of length L are independent: each fails with
probability 1 - e^{-L/M}, so the number of failed attempts of one segment is geometric and
that of c segments of the same length is negative binomial NB(c, e^{-L/M}) (numpy's
``negative_binomial``: failures before c successes); a failed attempt loses a time to failure
T ~ Exp(M) conditioned on T < L, drawn by inverting its CDF, T = -M ln(1 - U (1 - e^{-L/M})),
U uniform on [0, 1). Every failed attempt is followed by one restart phase; a restart phase
is itself a segment of length R, so the failed restarts of K phases are NB(K, e^{-R/M}), each
losing a truncated exponential on [0, R), and each phase ends with one full R. A trial's wall
time is then

    sum over segments of L  +  the lost times of its failed attempts  +  K R
    +  the lost times of its failed restarts,

its failures K plus the failed restarts. The n - 1 full segments are one negative binomial
draw per trial and the shorter last one another. The cost grows with the number of failures
drawn (about 1.4 million for 2000 trials of an 81-day run at M = 11,000 s: well under a
second); more than :data:`MAX_FAILURE_DRAWS` expected in all is refused.

Deterministic: the same inputs and ``seed`` (``numpy.random.default_rng``) give the same
floats on the same numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from plansim.analytic.goodput import expected_wall_s, segments, validate_run
from plansim.errors import SpecError, require_positive_int

#: The most failures (segment and restart ones, all trials together) a run may expect to draw.
MAX_FAILURE_DRAWS = 1e8
#: Truncated exponentials drawn per numpy call (bounds the memory: ~5 arrays of this size).
_BLOCK = 1 << 20

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, kw_only=True)
class MonteCarloGoodput:
    """Sample statistics of ``num_trials`` simulated runs (seconds unless stated)."""

    num_trials: int
    seed: int
    mean_wall_s: float
    #: half-width of the 95% confidence interval of the mean, 1.96 std / sqrt(num_trials)
    #: (sample std, ddof 1; ``math.inf`` for one trial)
    wall_s_ci95: float
    #: work_s / mean_wall_s (1.0 for no work)
    goodput_fraction: float
    #: mean number of failures per run, failed restarts included
    mean_failures: float
    #: mean_wall_s - work_s - n checkpoint_s: mean rework and restart time
    lost_s_mean: float


def _truncated_exponential_sums(
    rng: np.random.Generator, counts: IntArray, upper_s: float, mtbf_s: float
) -> FloatArray:
    """Per trial, the sum of counts[i] draws of T ~ Exp(mtbf_s) conditioned on T < upper_s."""
    sums = np.zeros(counts.shape[0], dtype=np.float64)
    total = int(counts.sum())
    if total == 0 or upper_s == 0.0:
        return sums
    ends = np.cumsum(counts)
    scale = -math.expm1(-upper_s / mtbf_s)  # P(T < upper_s)
    for start in range(0, total, _BLOCK):
        stop = min(start + _BLOCK, total)
        times = -mtbf_s * np.log1p(-scale * rng.random(stop - start))
        owner = np.searchsorted(ends, np.arange(start, stop), side="right")
        sums += np.bincount(owner, weights=times, minlength=counts.shape[0])
    return sums


def _failed_attempts(
    rng: np.random.Generator, attempts: IntArray | int, length_s: float, mtbf_s: float, size: int
) -> IntArray:
    """Per trial, the failed attempts before ``attempts`` successes of a phase of length_s
    (negative binomial; 0 where ``attempts`` is 0)."""
    p = math.exp(-length_s / mtbf_s)
    n = np.broadcast_to(np.asarray(attempts, dtype=np.int64), (size,))
    out = np.zeros(size, dtype=np.int64)
    live = n > 0
    if p < 1.0 and live.any():
        out[live] = rng.negative_binomial(n[live], p)
    return out


def _simulate(
    rng: np.random.Generator,
    groups: list[tuple[int, float]],
    restart_s: float,
    mtbf_s: float,
    num_trials: int,
) -> tuple[FloatArray, IntArray]:
    """Wall times and failure counts of num_trials runs of ``groups``: (segment count,
    segment length work + checkpoint in s) pairs."""
    wall = np.zeros(num_trials, dtype=np.float64)
    failed = np.zeros(num_trials, dtype=np.int64)
    for count, length in groups:
        k = _failed_attempts(rng, count, length, mtbf_s, num_trials)
        wall += count * length + _truncated_exponential_sums(rng, k, length, mtbf_s)
        failed += k
    failed_restarts = _failed_attempts(rng, failed, restart_s, mtbf_s, num_trials)
    wall += failed * restart_s
    wall += _truncated_exponential_sums(rng, failed_restarts, restart_s, mtbf_s)
    return wall, failed + failed_restarts


def _require_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(f"seed must be an integer >= 0, got {seed!r}")
    return seed


def _require_draws(expected_wall: float, mtbf_s: float, num_trials: int) -> None:
    per_trial = expected_wall / mtbf_s  # Wald: expected failures of one run
    if not num_trials * per_trial <= MAX_FAILURE_DRAWS:
        raise SpecError(
            f"num_trials * expected failures per run must be <= {MAX_FAILURE_DRAWS:.0e}, got "
            f"{num_trials} * {per_trial:.3g} (mtbf_s={mtbf_s!r}); lower num_trials or use "
            "plansim.analytic.goodput.expected_wall_s"
        )


def monte_carlo_goodput(
    *,
    work_s: float,
    interval_s: float,
    checkpoint_s: float,
    restart_s: float,
    mtbf_s: float,
    num_trials: int = 2000,
    seed: int = 0,
) -> MonteCarloGoodput:
    """Simulate ``num_trials`` runs of the failure model of :mod:`plansim.analytic.goodput`
    (seconds; the sampling is described in the module docstring) with
    ``numpy.random.default_rng(seed)``; deterministic for given inputs and seed.

    Raises SpecError for a bad field (``plansim.analytic.goodput.validate_run``), num_trials
    < 1, seed < 0, or more than :data:`MAX_FAILURE_DRAWS` failures expected in all."""
    validate_run(
        work_s=work_s,
        checkpoint_s=checkpoint_s,
        restart_s=restart_s,
        mtbf_s=mtbf_s,
        interval_s=interval_s,
    )
    require_positive_int("num_trials", num_trials)
    _require_seed(seed)
    n, last = segments(work_s=work_s, interval_s=interval_s)
    if n == 0:
        return MonteCarloGoodput(
            num_trials=num_trials,
            seed=seed,
            mean_wall_s=0.0,
            wall_s_ci95=0.0,
            goodput_fraction=1.0,
            mean_failures=0.0,
            lost_s_mean=0.0,
        )
    expected = expected_wall_s(
        work_s=work_s,
        interval_s=interval_s,
        checkpoint_s=checkpoint_s,
        restart_s=restart_s,
        mtbf_s=mtbf_s,
    )
    _require_draws(expected, mtbf_s, num_trials)
    groups = [(n - 1, interval_s + checkpoint_s), (1, last + checkpoint_s)]
    wall, failures = _simulate(
        np.random.default_rng(seed), groups, float(restart_s), float(mtbf_s), num_trials
    )
    return _summary(wall, failures, work_s, n * checkpoint_s, num_trials, seed)


def _summary(
    wall: FloatArray,
    failures: IntArray,
    work_s: float,
    checkpoint_s_total: float,
    num_trials: int,
    seed: int,
) -> MonteCarloGoodput:
    mean = float(wall.mean())
    ci = 1.96 * float(wall.std(ddof=1)) / math.sqrt(num_trials) if num_trials > 1 else math.inf
    return MonteCarloGoodput(
        num_trials=num_trials,
        seed=seed,
        mean_wall_s=mean,
        wall_s_ci95=ci,
        goodput_fraction=work_s / mean,
        mean_failures=float(failures.mean()),
        lost_s_mean=mean - work_s - checkpoint_s_total,
    )
