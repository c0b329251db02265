"""Raw calibration rows -> the optional compute terms of a profile. Pure (pandas, no torch).

* ``attention_efficiency.<dtype>``: per dtype, causal SDPA forward and backward rates over
  that dtype's GEMM peak, per forward FLOPs of one call (:func:`.fit.fit_attention`). The
  rows are ``kind == "attention"``, ``op`` ``sdpa_fwd`` (work = forward FLOPs) and
  ``sdpa_fwd_bwd`` (work = 3 x forward FLOPs), paired by shape.
* ``host_overhead``: :mod:`plansim.calibrate.build_host`.
* ``overlap_compute_slowdown_fraction``: how much longer a GEMM loop takes beside a chain of
  asynchronous all_reduces than alone (``kind == "overlap"``, ops ``gemm_alone`` and
  ``gemm_beside_all_reduce``, seconds per GEMM call; ``plansim.calibrate.bench_overlap``):
  per pass, the median over ranks of each rank's beside / alone - 1, then the median over
  passes, clipped to [0, :data:`MAX_OVERLAP_FRACTION`]. From the raw rows (per rank), not the
  aggregated table.

* ``sustained_matmul_fraction`` and ``gpu_matmul_spread_fraction``: a GEMM's rate at the end
  of a soak over its rate in a short burst after a pause (``kind == "sustained"``, ops
  ``gemm_burst`` and ``gemm_sustained``, seconds per call; every rank at once;
  ``plansim.calibrate.bench_sustained``): the median over ranks of burst / sustained seconds,
  clipped to at most 1; with :data:`MIN_SPREAD_RANKS` or more ranks also the sample standard
  deviation of the ranks' sustained rates over their median. :func:`sustained_term`.

``table`` is :func:`plansim.calibrate.aggregate.aggregate`'s: one row per item, ``time_s`` the
median over ranks (ranks run concurrently) and passes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from plansim.calibrate.fit import FitError, fit_attention
from plansim.specs.compute_terms import AttentionEfficiency, HostOverhead

#: The largest overlap slowdown written (a profile needs it below 1).
MAX_OVERLAP_FRACTION = 0.99
#: Ranks needed before their spread is written as ``gpu_matmul_spread_fraction`` (fewer give
#: a standard deviation too noisy to extrapolate to the slowest of thousands).
MIN_SPREAD_RANKS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Terms:
    """What one builder found: the terms, their provenance (dotted key -> source) and
    summary lines (label, value) for the terminal."""

    attention: dict[str, AttentionEfficiency] = field(default_factory=dict)
    host_overhead: HostOverhead | None = None
    overlap_compute_slowdown_fraction: float | None = None
    #: optional HardwareProfile scalars (SI) this builder measured.
    scalars: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    summary: list[tuple[str, str]] = field(default_factory=list)


#: Fewest distinct sizes (GEMM: FLOPs octaves; attention: calls) a measured efficiency curve
#: needs before it is written. A curve is read clamped beyond its ends, so a single size stands
#: for every size: seen on an H100, one launch-bound attention call (0.4% of peak) made the
#: profile price every attention call 100-800x too slow.
MIN_CURVE_SIZES = 2


def one_size_note(sizes: int) -> str:
    """The summary's line for a curve measured at fewer than :data:`MIN_CURVE_SIZES` sizes."""
    return (
        f"not written: measured at {sizes} size(s), fewer than {MIN_CURVE_SIZES} (the larger "
        "calls were skipped or failed; see the raw CSV's status column); the existing "
        "profile's value is kept"
    )


def attention_terms(table: pd.DataFrame, *, source: str, peaks: Mapping[str, float]) -> Terms:
    """Fused-attention curves per dtype that has a GEMM peak in ``peaks`` (FLOP/s).

    Args:
        table: aggregated rows.
        source: provenance prefix (``RunInfo.source()`` and the contention note).
        peaks: dtype -> the GEMM peak the fractions are relative to.
    """
    out = Terms()
    rows = table[table["kind"] == "attention"]
    for key, group in rows.groupby("dtype", sort=True):
        dtype = str(key)
        fwd = medians(group[group["op"] == "sdpa_fwd"], "shape")
        both = medians(group[group["op"] == "sdpa_fwd_bwd"], "shape")
        shapes = sorted(set(fwd) & set(both), key=lambda s: fwd[s][0])
        peak = peaks.get(dtype)
        if not peak or not shapes:
            continue
        try:
            fit = fit_attention(
                [fwd[s][0] for s in shapes],
                [fwd[s][1] for s in shapes],
                [both[s][1] for s in shapes],
                peak_per_s=peak,
            )
        except FitError as exc:
            out.summary.append((f"attention {dtype}", f"not fitted: {exc}"))
            continue
        text = (
            f"{source}; causal scaled_dot_product_attention at {fit.num_points} sizes, "
            f"{fit.min_flops:.3g}-{fit.max_flops:.3g} forward FLOPs per call: forward, and "
            "backward (forward + backward less forward, for 2x the FLOPs), rate / GEMM peak "
            f"{peak / 1e12:.4g} TFLOP/s; ranks concurrent, median over ranks"
        )
        if fit.num_points < MIN_CURVE_SIZES:
            out.summary.append((f"attention {dtype}", one_size_note(fit.num_points)))
            continue
        out.attention[dtype] = dataclasses.replace(fit.efficiency, source=text)
        out.provenance[f"attention_efficiency.{dtype}"] = text
    return out


def medians(rows: pd.DataFrame, key: str) -> dict[str, tuple[float, float]]:
    """``key`` value -> (median work, median time_s) of ``rows``."""
    out: dict[str, tuple[float, float]] = {}
    for value, group in rows.groupby(key, sort=True):
        out[str(value)] = (float(group["work"].median()), float(group["time_s"].median()))
    return out


def overlap_term(rows: pd.DataFrame, *, source: str) -> Terms:
    """``overlap_compute_slowdown_fraction`` from a run's raw rows (every rank), or no term
    when the overlap rows are missing or failed.

    Each rank's ``gemm_beside_all_reduce`` median is paired with its own ``gemm_alone``
    median of the same pass (both seconds per GEMM call); the fraction is the median over
    passes of the median over ranks of beside / alone - 1 (e.g. alone 10 ms, beside 12.5 ms
    on every rank: 0.25), clipped to [0, :data:`MAX_OVERLAP_FRACTION`].

    Args:
        rows: raw rows (``plansim.calibrate.raw`` columns) of one run.
        source: provenance prefix.
    """
    ok = rows[(rows["kind"] == "overlap") & (rows["status"] == "ok")]
    keys = ["dtype", "shape", "group_size", "sweep", "rank"]
    alone = ok[ok["op"] == "gemm_alone"].groupby(keys)["median_s"].median()
    beside = ok[ok["op"] == "gemm_beside_all_reduce"].groupby(keys)["median_s"].median()
    ratio = (beside / alone).dropna()
    ratio = ratio[ratio > 0]
    if ratio.empty:
        return Terms()
    per_pass = (ratio - 1.0).groupby(level="sweep").median()
    measured = float(per_pass.median())
    fraction = min(max(measured, 0.0), MAX_OVERLAP_FRACTION)
    dtype, shape, group, _, _ = ratio.index[0]
    m, n, k, message_bytes = str(shape).split("x")
    clipped = "" if fraction == measured else f" (measured {measured:.4g}, clipped)"
    text = (
        f"{source}; {dtype} GEMM {m}x{n}x{k} looped on every rank, timed alone and beside a "
        f"chain of async all_reduce of {message_bytes} bytes over {group} ranks (repetitions kept "
        "only while the chain was still running as the loop ended): median over "
        f"{ratio.index.get_level_values('rank').nunique()} ranks and {len(per_pass)} passes "
        f"of beside / alone - 1 = {fraction:.4g}{clipped}"
    )
    return Terms(
        overlap_compute_slowdown_fraction=fraction,
        provenance={"overlap_compute_slowdown_fraction": text},
        summary=[("overlap slowdown", f"compute +{100 * fraction:.3g}% beside all_reduce")],
    )


def sustained_term(rows: pd.DataFrame, *, source: str) -> Terms:
    """``sustained_matmul_fraction`` (and, with :data:`MIN_SPREAD_RANKS` ranks or more,
    ``gpu_matmul_spread_fraction``) from a run's raw rows, or no term when the sustained rows
    are missing or failed.

    Each rank's ``gemm_burst`` seconds per call over its ``gemm_sustained`` median is the
    rate it keeps at its power limit (e.g. 1.00 ms burst, 1.18 ms sustained: 0.847); the
    fraction is the median over ranks, at most 1 (a soak measured faster than its burst is
    noise, not a boost). The spread is the sample standard deviation of the ranks' sustained
    rates over their median (plansim.analytic.sustained: a job runs at its slowest GPU).

    Args:
        rows: raw rows (``plansim.calibrate.raw`` columns) of one run.
        source: provenance prefix.
    """
    ok = rows[(rows["kind"] == "sustained") & (rows["status"] == "ok")]
    burst = ok[ok["op"] == "gemm_burst"].groupby("rank")["median_s"].median()
    soak = ok[ok["op"] == "gemm_sustained"].groupby("rank")["median_s"].median()
    ratio = (burst / soak).dropna()
    ratio = ratio[ratio > 0]
    if ratio.empty:
        return Terms()
    measured = float(ratio.median())
    fraction = min(measured, 1.0)
    first = ok[ok["op"] == "gemm_sustained"].iloc[0]
    what = (
        f"{source}; {first['dtype']} GEMM {first['shape']} (m x n x k x soak ms) on "
        f"{len(ratio)} ranks at once, random operands: a burst after a pause, then a soak"
    )
    clipped = "" if fraction == measured else f" (measured {measured:.4g}, clipped)"
    scalars = {"sustained_matmul_fraction": fraction}
    provenance = {
        "sustained_matmul_fraction": (
            f"{what}; median over ranks of burst / sustained seconds per call = "
            f"{fraction:.4g}{clipped}"
        )
    }
    summary = [("sustained GEMM rate", f"{100 * fraction:.3g}% of the burst")]
    rates = 1.0 / soak.loc[ratio.index]
    if len(rates) >= MIN_SPREAD_RANKS:
        spread = float(rates.std(ddof=1) / rates.median())
        scalars["gpu_matmul_spread_fraction"] = spread
        provenance["gpu_matmul_spread_fraction"] = (
            f"{what}; sample standard deviation of the ranks' sustained rates over their "
            f"median = {spread:.4g}"
        )
        summary.append(("GEMM rate spread", f"{100 * spread:.3g}% (sigma over ranks)"))
    return Terms(scalars=scalars, provenance=provenance, summary=summary)


def power_term(rows: pd.DataFrame, *, source: str) -> Terms:
    """``max_power_w`` (the GPU's draw while GEMMs run at its power limit) and
    ``idle_power_w`` (while it waits) from the sustained item's power rows
    (``bench_sustained``: ops ``power_gemm`` and ``power_idle``, ``work`` the mean watts of
    each rank's readings), the median over ranks; no term without them (a CPU run, a GPU
    whose power cannot be read).

    Args:
        rows: raw rows (``plansim.calibrate.raw`` columns) of one run.
        source: provenance prefix.
    """
    ok = rows[(rows["kind"] == "sustained") & (rows["status"] == "ok") & (rows["work_unit"] == "W")]
    scalars: dict[str, float] = {}
    provenance: dict[str, str] = {}
    summary: list[tuple[str, str]] = []
    for op, key, what in (
        ("power_gemm", "max_power_w", "the last quarter of the GEMM soak, every rank at once"),
        ("power_idle", "idle_power_w", "the sleep before the burst"),
    ):
        per_rank = ok[ok["op"] == op].groupby("rank")["work"].median()
        if per_rank.empty:
            continue
        watts = float(per_rank.median())
        readings = int(ok[ok["op"] == op]["reps"].sum())
        scalars[key] = watts
        provenance[key] = (
            f"{source}; torch.cuda.power_draw (NVML) read every 50 ms during {what}: median "
            f"over {len(per_rank)} ranks of their mean = {watts:.4g} W ({readings} readings)"
        )
        summary.append((key.replace("_", " "), f"{watts:.0f} W"))
    return Terms(scalars=scalars, provenance=provenance, summary=summary)
