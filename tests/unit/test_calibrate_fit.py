"""Fitting (plansim.calibrate.fit): alpha-beta lines, collective curves, efficiency curves.

Oracles are synthetic data from known parameters: the fit must give them back (exactly for
noise-free data, within 1% with +-0.5% noise).
"""

from __future__ import annotations

import numpy as np
import pytest

from plansim.calibrate.fit import FitError, fit_alpha_beta, fit_collective, fit_efficiency
from plansim.specs.curves import bus_factor

SIZES = [float(2**e) for e in range(3, 34)]  # 8 B .. 8 GiB


def _line(alpha_s: float, busbw: float, factor: float) -> list[float]:
    return [alpha_s + s * factor / busbw for s in SIZES]


@pytest.mark.parametrize(
    ("alpha_s", "busbw", "collective", "ranks"),
    [
        (13e-6, 480e9, "all_reduce", 8),  # NVLink-class
        (122e-6, 45e9, "all_gather", 16),  # across nodes
        (350e-6, 0.7e9, "sendrecv", 2),  # gloo on a CPU
    ],
)
def test_alpha_beta_recovers_known_parameters(
    alpha_s: float, busbw: float, collective: str, ranks: int
) -> None:
    factor = bus_factor(collective, ranks)
    exact = fit_alpha_beta(SIZES, _line(alpha_s, busbw, factor))
    assert exact.alpha_s == pytest.approx(alpha_s, rel=1e-9)
    assert exact.busbw_bytes_per_s(factor) == pytest.approx(busbw, rel=1e-9)
    assert exact.max_relative_error < 1e-9
    assert (exact.min_bytes, exact.max_bytes, exact.num_points) == (8, 2**33, len(SIZES))
    noise = 1 + np.random.default_rng(7).uniform(-0.005, 0.005, len(SIZES))
    noisy = fit_alpha_beta(SIZES, list(np.array(_line(alpha_s, busbw, factor)) * noise))
    assert noisy.alpha_s == pytest.approx(alpha_s, rel=0.01)
    assert noisy.busbw_bytes_per_s(factor) == pytest.approx(busbw, rel=0.01)


def test_alpha_beta_with_a_negative_intercept_fixes_alpha_at_zero() -> None:
    sizes = SIZES[7:]  # 1 KiB ..
    times = [s / 10e9 - 5e-8 for s in sizes]  # the best line has alpha = -50 ns
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha_s == 0.0
    ratio = np.array(sizes) / np.array(times)  # relative least squares of t = beta * S
    assert fit.beta_s_per_byte == pytest.approx(ratio.sum() / (ratio**2).sum(), rel=1e-9)
    assert 10e9 < 1 / fit.beta_s_per_byte < 20e9


@pytest.mark.parametrize(
    ("sizes", "times", "match"),
    [
        ([8.0], [1e-5], "two distinct"),
        ([8.0, 16.0], [1e-5], "differ in length"),
        ([], [], "no measurements"),
        ([8.0, -16.0], [1e-5, 2e-5], "positive"),
        ([8.0, 1e6], [1e-3, 1e-5], "does not grow"),
        ([8.0, float("nan")], [1e-5, 1e-5], "finite"),
    ],
)
def test_alpha_beta_rejects_unusable_data(
    sizes: list[float], times: list[float], match: str
) -> None:
    with pytest.raises(FitError, match=match):
        fit_alpha_beta(sizes, times)


def test_collective_curve_reproduces_measured_times_and_drops_latency_bound_sizes() -> None:
    # a knee: flat 13 us up to 64 KiB, then a bandwidth term growing to 470 GB/s
    sizes = SIZES
    times = [13e-6 + s * 1.75 / (470e9 * min(1.0, (s / 2**30) ** 0.1)) for s in sizes]
    fit = fit_collective("all_reduce", sizes, times, num_ranks=8)
    curve = fit.curve
    assert curve.collective == "all_reduce" and fit.num_ranks == 8
    assert curve.latency_s <= min(times)
    kept = curve.busbw_bytes_per_s.x
    assert set(kept) | set(fit.dropped_sizes) == set(sizes)
    for size, time_s in zip(sizes, times, strict=True):
        if size in kept:
            assert curve.time_s(size, 8) == pytest.approx(time_s, rel=1e-9)
            assert time_s - curve.latency_s >= 0.1 * time_s
    assert fit.dropped_sizes and max(fit.dropped_sizes) < min(kept)
    assert "8 ranks" in fit.describe() and "latency" in fit.describe()


def test_collective_duplicate_sizes_keep_the_smallest_time() -> None:
    sizes = [1e6, 1e6, 4e6, 16e6]
    times = [2e-3, 1e-3, 3e-3, 9e-3]
    fit = fit_collective("sendrecv", sizes, times, num_ranks=2)
    assert fit.curve.time_s(1e6, 2) == pytest.approx(1e-3)


def test_collective_needs_two_ranks() -> None:
    with pytest.raises(FitError, match="at least 2 ranks"):
        fit_collective("all_reduce", SIZES, _line(1e-5, 1e9, 1.0), num_ranks=1)


def test_efficiency_bins_by_octave_and_divides_by_the_best_bin() -> None:
    flops = [2**21 * 1.1, 2**21 * 1.8, 2**28 * 1.1, 2**28 * 1.4, 2**28 * 1.9, 2**34 * 1.2]
    rates = [20e9, 40e9, 100e9, 120e9, 110e9, 60e9]
    fit = fit_efficiency(flops, [f / r for f, r in zip(flops, rates, strict=True)])
    assert fit.best_per_s == pytest.approx(110e9) and fit.peak_per_s == fit.best_per_s
    assert len(fit.curve.x) == 3 and list(fit.curve.x) == sorted(fit.curve.x)
    assert fit.curve.y == pytest.approx((30 / 110, 1.0, 60 / 110))
    assert fit.rate_per_s(fit.curve.x[1]) == pytest.approx(110e9)
    assert (fit.min_work, fit.max_work, fit.num_points) == (flops[0], flops[-1], 6)
    datasheet = fit_efficiency(
        flops, [f / r for f, r in zip(flops, rates, strict=True)], peak_per_s=200e9
    )
    assert datasheet.curve.y == pytest.approx((30 / 200, 110 / 200, 60 / 200))
    with pytest.raises(FitError, match="peak"):
        fit_efficiency(flops, [1.0] * 6, peak_per_s=0.0)


def test_octaves_do_not_move_when_the_raw_csv_rounds_a_power_of_two() -> None:
    """2 * 8192 * 8192 * 32768 = 2^42 FLOPs is written to the raw CSV with 12 significant
    digits (4.3980465111e+12, just below 2^42); a rebuild from the CSV must bin it with the
    2^42 GEMMs, as the run that wrote the CSV did (an H100 profile rebuilt to other bins)."""
    exact = [2.0**41 * 1.5, 2.0**42, 2.0**42 * 1.5]
    rounded = [float(f"{x:.12g}") for x in exact]
    assert rounded[1] < 2.0**42
    times = [x / 7e14 for x in exact]
    fit_exact = fit_efficiency(exact, times, peak_per_s=1e15)
    fit_rounded = fit_efficiency(rounded, times, peak_per_s=1e15)
    assert len(fit_rounded.curve.x) == len(fit_exact.curve.x) == 2
    assert fit_rounded.curve.x == pytest.approx(fit_exact.curve.x, rel=1e-9)
