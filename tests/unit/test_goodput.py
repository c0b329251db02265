"""Goodput under failures with periodic checkpoints: Young's and Daly's intervals, Daly's
closed form of the expected wall time, and the Monte Carlo that samples the same model."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from plansim.analytic.goodput import (
    best_interval_s,
    daly_interval_s,
    expected_wall_s,
    goodput,
    segment_wall_s,
    segments,
    young_interval_s,
)
from plansim.errors import SpecError
from plansim.sim.failures import monte_carlo_goodput

#: A synthetic run with many failures: M is comparable to a segment (L = 1,100 s: e^{1.1} - 1
#: = 2.0 failed attempts per segment), 10 full segments and a last one of 500 s of work.
#: Closed form: 10 x 1000 e^{0.3} (e^{1.1} - 1) + 1000 e^{0.3} (e^{0.6} - 1) = 28,163.2 s.
CASE = {
    "work_s": 10_500.0,
    "interval_s": 1_000.0,
    "checkpoint_s": 100.0,
    "restart_s": 300.0,
    "mtbf_s": 1_000.0,
}
CASE_WALL_S = 10 * 1000 * math.exp(0.3) * math.expm1(1.1) + 1000 * math.exp(0.3) * math.expm1(0.6)


def _wall(**overrides: float) -> float:
    return expected_wall_s(**{**CASE, **overrides})


@pytest.fixture(scope="module")
def case_mc() -> tuple[float, float]:
    """(mean wall, 95% CI half-width) of 20,000 simulated runs of CASE."""
    mc = monte_carlo_goodput(**CASE, num_trials=20_000, seed=1)
    return mc.mean_wall_s, mc.wall_s_ci95


# ----------------------------------------------------------------------------- intervals
def test_young_and_daly_on_a_worked_case() -> None:
    # δ = 60 s, M = 10,000 s. Young: sqrt(2 * 60 * 10,000) = sqrt(1.2e6) = 1095.445115 s.
    # Daly (Eq. 37), x = δ/(2M) = 0.003, sqrt(x) = 0.0547723:
    #   sqrt(2δM) * (1/3) sqrt(x) = δ/3 = 20 s, sqrt(2δM) * x/9 = (δ/9) sqrt(x) = 0.365148 s,
    #   so Daly = 1095.445115 + 20 + 0.365148 - 60 = 1055.810263 s.
    assert young_interval_s(checkpoint_s=60.0, mtbf_s=10_000.0) == pytest.approx(
        1095.445115, abs=1e-6
    )
    assert daly_interval_s(checkpoint_s=60.0, mtbf_s=10_000.0) == pytest.approx(
        1055.810263, abs=1e-6
    )
    # δ >= 2M: Daly's estimate is M
    assert daly_interval_s(checkpoint_s=300.0, mtbf_s=100.0) == 100.0


@pytest.mark.parametrize("ratio", [1e-4, 1e-3, 0.1])
def test_daly_interval_is_near_the_numeric_optimum(ratio: float) -> None:
    m = 10_000.0
    run = {"work_s": 200 * m, "checkpoint_s": ratio * m, "restart_s": 600.0, "mtbf_s": m}
    best = best_interval_s(**run)
    daly = daly_interval_s(checkpoint_s=ratio * m, mtbf_s=m)
    assert daly == pytest.approx(best, rel=0.01)
    wall_best = expected_wall_s(**run, interval_s=best)
    wall_daly = expected_wall_s(**run, interval_s=daly)
    assert wall_daly == pytest.approx(wall_best, rel=0.01)
    # sharper: the overhead beyond the work, also within 1%
    assert wall_daly - run["work_s"] == pytest.approx(wall_best - run["work_s"], rel=0.01)


def test_young_overhead_is_measurably_worse_at_large_ratio() -> None:
    # the comparison above can fail: at δ/M = 0.1 Young's overhead is ~1.2% above the optimum
    m = 10_000.0
    run = {"work_s": 200 * m, "checkpoint_s": 0.1 * m, "restart_s": 600.0, "mtbf_s": m}
    best = expected_wall_s(**run, interval_s=best_interval_s(**run)) - run["work_s"]
    young = expected_wall_s(**run, interval_s=young_interval_s(checkpoint_s=0.1 * m, mtbf_s=m))
    assert (young - run["work_s"]) / best - 1 > 0.005


def test_young_approaches_daly_as_checkpoint_over_mtbf_vanishes() -> None:
    m = 10_000.0
    ratios = (1e-1, 1e-2, 1e-3, 1e-4, 1e-6)
    young = [young_interval_s(checkpoint_s=r * m, mtbf_s=m) for r in ratios]
    daly = [daly_interval_s(checkpoint_s=r * m, mtbf_s=m) for r in ratios]
    gaps = [y / d - 1 for y, d in zip(young, daly, strict=True)]
    assert all(g > 0 for g in gaps)
    assert gaps == sorted(gaps, reverse=True)
    # the gap is about (2/3) sqrt(δ/(2M)): 4.7e-3 at δ/M = 1e-4, 4.7e-4 at 1e-6
    assert gaps[3] == pytest.approx(2 / 3 * math.sqrt(0.5e-4), rel=0.02)
    assert gaps[4] < 5e-4


# ----------------------------------------------------------------------------- closed form
def test_segment_wall_without_restart_and_without_failures() -> None:
    for length in (1.0, 500.0, 1000.0, 5000.0):
        got = segment_wall_s(length_s=length, restart_s=0.0, mtbf_s=1000.0)
        assert got == pytest.approx(1000.0 * math.expm1(length / 1000.0), rel=1e-12)
    assert segment_wall_s(length_s=1000.0, restart_s=0.0, mtbf_s=1000.0) == pytest.approx(
        1000.0 * (math.e - 1)
    )
    # as M -> infinity a segment takes its length, restart or not
    for m in (1e9, 1e12, 1e15):
        assert segment_wall_s(length_s=100.0, restart_s=600.0, mtbf_s=m) == pytest.approx(
            100.0, rel=1e-6
        )


def test_expected_wall_sums_the_segments_with_a_shorter_last_one() -> None:
    assert _wall() == pytest.approx(CASE_WALL_S, rel=1e-12)
    assert segments(work_s=10_500.0, interval_s=1_000.0) == (11, 500.0)
    # a quotient a rounding error off an integer: 0.3 / 0.1 = 2.9999999999999996
    n, last = segments(work_s=0.3, interval_s=0.1)
    assert n == 3 and last == pytest.approx(0.1)
    n, last = segments(work_s=3.0000000000000004, interval_s=1.0)
    assert n == 3 and last == pytest.approx(1.0)


def test_goodput_fields() -> None:
    est = goodput(**CASE)
    assert est.num_checkpoints == 11
    assert est.wall_s == pytest.approx(CASE_WALL_S, rel=1e-12)
    assert est.goodput_fraction == pytest.approx(10_500.0 / CASE_WALL_S)
    assert est.expected_failures == pytest.approx(CASE_WALL_S / 1_000.0)
    assert est.checkpoint_s_total == 1_100.0
    assert est.lost_s == pytest.approx(CASE_WALL_S - 10_500.0 - 1_100.0)
    assert est.overhead_s == pytest.approx(CASE_WALL_S - 10_500.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.wall_s = 0.0  # type: ignore[misc]


def test_goodput_defaults_to_daly_clamped_to_the_work() -> None:
    est = goodput(work_s=7e6, checkpoint_s=60.0, restart_s=600.0, mtbf_s=11_000.0)
    assert est.interval_s == daly_interval_s(checkpoint_s=60.0, mtbf_s=11_000.0)
    assert est.num_checkpoints == math.ceil(7e6 / est.interval_s)
    short = goodput(work_s=100.0, checkpoint_s=60.0, restart_s=600.0, mtbf_s=11_000.0)
    assert short.interval_s == 100.0 and short.num_checkpoints == 1


def test_no_work() -> None:
    est = goodput(work_s=0.0, checkpoint_s=60.0, restart_s=600.0, mtbf_s=11_000.0)
    assert (est.wall_s, est.goodput_fraction, est.num_checkpoints) == (0.0, 1.0, 0)
    assert est.lost_s == 0.0 and est.expected_failures == 0.0
    mc = monte_carlo_goodput(**{**CASE, "work_s": 0.0})
    assert (mc.mean_wall_s, mc.goodput_fraction, mc.mean_failures) == (0.0, 1.0, 0.0)


def test_a_job_that_never_finishes_is_infinite_not_an_overflow() -> None:
    run = {"work_s": 1e6, "checkpoint_s": 60.0, "restart_s": 600.0, "mtbf_s": 1.0}
    assert segment_wall_s(length_s=1060.0, restart_s=600.0, mtbf_s=1.0) == math.inf
    est = goodput(**run, interval_s=1_000.0)
    assert est.wall_s == math.inf and est.goodput_fraction == 0.0
    assert est.expected_failures == math.inf
    # the restart alone can overflow too
    assert segment_wall_s(length_s=1.0, restart_s=1e4, mtbf_s=1.0) == math.inf
    # the Monte Carlo refuses to draw that many failures
    with pytest.raises(SpecError, match="num_trials"):
        monte_carlo_goodput(**run, interval_s=1_000.0)


# ----------------------------------------------------------------------------- Monte Carlo
def test_monte_carlo_matches_the_closed_form(case_mc: tuple[float, float]) -> None:
    mean, ci = case_mc
    assert 0 < ci < 0.005 * mean  # ~90 s on ~28,000 s
    assert abs(mean - CASE_WALL_S) < 3 * ci


@pytest.mark.parametrize(
    "wrong",
    [
        # restarts twice as long
        _wall(restart_s=600.0),
        # failures cannot strike during the checkpoint write
        _wall(checkpoint_s=0.0) + 11 * 100.0,
        # failures cannot strike during the restart: X = (e^{L/M} - 1)(M + R)
        10 * math.expm1(1.1) * 1300.0 + math.expm1(0.6) * 1300.0,
        # the last segment is full length
        _wall(work_s=11_000.0),
        # no restart cost
        _wall(restart_s=0.0),
    ],
    ids=["restart_doubled", "checkpoint_safe", "restart_safe", "last_full", "no_restart"],
)
def test_monte_carlo_rejects_other_semantics(wrong: float, case_mc: tuple[float, float]) -> None:
    # each alternative model lies more than 10 half-widths off (the closest, restart_safe,
    # by ~11.7): the agreement above would catch it
    mean, ci = case_mc
    assert abs(wrong - CASE_WALL_S) > 10 * ci
    assert abs(mean - wrong) > 3 * ci


def _literal_wall_s(rng: random.Random, lengths: list[float], restart_s: float, m: float) -> float:
    """One run, attempt by attempt (the model as stated, without the block sampling)."""
    wall = 0.0
    for length in lengths:
        while (t := rng.expovariate(1.0 / m)) < length:
            wall += t  # the attempt fails: its time is lost, then the job restarts
            while (r := rng.expovariate(1.0 / m)) < restart_s:
                wall += r  # the restart fails and starts again
            wall += restart_s
        wall += length
    return wall


def test_an_attempt_by_attempt_simulation_matches_the_closed_form() -> None:
    rng = random.Random(7)
    lengths = [1_100.0] * 10 + [600.0]
    walls = [_literal_wall_s(rng, lengths, 300.0, 1_000.0) for _ in range(4_000)]
    mean = statistics.fmean(walls)
    ci = 1.96 * statistics.stdev(walls) / math.sqrt(len(walls))
    assert abs(mean - CASE_WALL_S) < 3 * ci
    mc = monte_carlo_goodput(**CASE, num_trials=4_000, seed=7)
    assert abs(mc.mean_wall_s - mean) < 3 * math.hypot(ci, mc.wall_s_ci95)
    # the two samplers' spreads agree too (std within 10%)
    assert mc.wall_s_ci95 == pytest.approx(ci, rel=0.1)


def test_monte_carlo_failures_and_lost_time() -> None:
    mc = monte_carlo_goodput(**CASE, num_trials=20_000, seed=1)
    # Wald: expected failures (restarts' included) = wall / M, 28.2 per run
    assert mc.mean_failures == pytest.approx(CASE_WALL_S / 1_000.0, rel=0.01)
    assert mc.lost_s_mean == pytest.approx(mc.mean_wall_s - 10_500.0 - 1_100.0)
    assert mc.goodput_fraction == pytest.approx(10_500.0 / mc.mean_wall_s)
    assert (mc.num_trials, mc.seed) == (20_000, 1)


def test_monte_carlo_realistic_run() -> None:
    # 81 days of work, M = 11,000 s, Daly's interval (~1,109 s: ~6,300 segments, ~750
    # failures a run), 2000 trials: a fraction of a second
    run = {"work_s": 7e6, "checkpoint_s": 60.0, "restart_s": 600.0, "mtbf_s": 11_000.0}
    interval = daly_interval_s(checkpoint_s=60.0, mtbf_s=11_000.0)
    mc = monte_carlo_goodput(**run, interval_s=interval)
    wall = expected_wall_s(**run, interval_s=interval)
    assert abs(mc.mean_wall_s - wall) < 3 * mc.wall_s_ci95
    assert mc.mean_failures == pytest.approx(wall / 11_000.0, rel=0.01)


def test_monte_carlo_is_deterministic() -> None:
    a = monte_carlo_goodput(**CASE, num_trials=500, seed=3)
    b = monte_carlo_goodput(**CASE, num_trials=500, seed=3)
    c = monte_carlo_goodput(**CASE, num_trials=500, seed=4)
    assert a == b
    assert a.mean_wall_s != c.mean_wall_s


def test_one_trial_has_an_unbounded_interval() -> None:
    mc = monte_carlo_goodput(**CASE, num_trials=1)
    assert mc.wall_s_ci95 == math.inf and mc.mean_wall_s > 10_500.0


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mtbf_s", 0.0),
        ("mtbf_s", math.inf),
        ("mtbf_s", math.nan),
        ("checkpoint_s", -1.0),
        ("restart_s", -1.0),
        ("work_s", -1.0),
        ("interval_s", 0.0),
    ],
)
def test_bad_fields_raise_spec_error_naming_them(field: str, value: float) -> None:
    run = {**CASE, field: value}
    with pytest.raises(SpecError, match=field):
        expected_wall_s(**run)
    with pytest.raises(SpecError, match=field):
        goodput(**run)
    with pytest.raises(SpecError, match=field):
        monte_carlo_goodput(**run)


def test_bad_field_messages() -> None:
    with pytest.raises(SpecError, match=r"^mtbf_s must be > 0, got 0$"):
        young_interval_s(checkpoint_s=60.0, mtbf_s=0)
    with pytest.raises(SpecError, match=r"^checkpoint_s must be >= 0, got -1.0$"):
        daly_interval_s(checkpoint_s=-1.0, mtbf_s=10.0)
    with pytest.raises(SpecError, match="num_trials"):
        monte_carlo_goodput(**CASE, num_trials=0)
    with pytest.raises(SpecError, match="seed"):
        monte_carlo_goodput(**CASE, seed=-1)
    with pytest.raises(SpecError, match="length_s"):
        segment_wall_s(length_s=-1.0, restart_s=0.0, mtbf_s=1.0)
    with pytest.raises(SpecError, match="work_s"):
        best_interval_s(work_s=0.0, checkpoint_s=60.0, restart_s=0.0, mtbf_s=1.0)
    # free checkpoints leave Daly's interval at 0: an interval must be given
    with pytest.raises(SpecError, match="checkpoint_s"):
        goodput(work_s=100.0, checkpoint_s=0.0, restart_s=0.0, mtbf_s=1.0)
