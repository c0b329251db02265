"""Raw calibration rows -> the optional compute terms of a profile. Pure (pandas, no torch).

* ``attention_efficiency.<dtype>``: per dtype, causal SDPA forward and backward rates over
  that dtype's GEMM peak, per forward FLOPs of one call (:func:`.fit.fit_attention`). The
  rows are ``kind == "attention"``, ``op`` ``sdpa_fwd`` (work = forward FLOPs) and
  ``sdpa_fwd_bwd`` (work = 3 x forward FLOPs), paired by shape.
* ``host_overhead``: seconds per op of the forward and of the backward through a chain of
  tiny ops (``kind == "host_op"``, ``chain_fwd`` / ``chain_fwd_bwd``, work = ops; see
  ``plansim.calibrate.plan``), and when its tensor-parallel twin was measured
  (``dtensor_chain_*``) the extra per DTensor linear: (DTensor chain - plain chain) / linears,
  the linears being half the chain's ops. ``serial`` is true on a CPU device. With more
  than one rank also the chains over every rank: per DTensor all-reduce, per FSDP2 unit
  (:func:`_world_chain_terms`) and per pipeline action (:func:`_pipeline_terms`).
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

from plansim.calibrate.fit import FitError, HostOpFit, fit_attention, fit_host_ops
from plansim.calibrate.plan import PIPELINE_OPS
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
        fwd = _medians(group[group["op"] == "sdpa_fwd"], "shape")
        both = _medians(group[group["op"] == "sdpa_fwd_bwd"], "shape")
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


def _medians(rows: pd.DataFrame, key: str) -> dict[str, tuple[float, float]]:
    """``key`` value -> (median work, median time_s) of ``rows``."""
    out: dict[str, tuple[float, float]] = {}
    for value, group in rows.groupby(key, sort=True):
        out[str(value)] = (float(group["work"].median()), float(group["time_s"].median()))
    return out


def host_overhead_term(table: pd.DataFrame, *, source: str, serial: bool) -> Terms:
    """The ``host_overhead`` section from the chain rows, or no term when they are missing.

    Args:
        table: aggregated rows.
        source: provenance prefix.
        serial: the host is the device (CPU).
    """
    rows = _medians(table[table["kind"] == "host_op"], "op")
    if not {"chain_fwd", "chain_fwd_bwd"} <= set(rows):
        return Terms()
    ops = rows["chain_fwd"][0]
    plain = fit_host_ops(
        ops, forward_s=rows["chain_fwd"][1], forward_backward_s=rows["chain_fwd_bwd"][1]
    )
    chain = f"a chain of {int(ops)} tiny ops (nn.Linear(8, 8) and GELU pairs, 2 x 8 input)"
    provenance = {
        "host_overhead.forward_op_us": f"{source}; forward of {chain}, seconds / ops",
        "host_overhead.backward_op_us": (
            f"{source}; forward + backward of {chain} less its forward, seconds / ops"
        ),
        "host_overhead.serial": source
        + (
            "; CPU: the host is the device, host and compute seconds add"
            if serial
            else "; GPU: the host issues kernels ahead of the device"
        ),
    }
    extra: dict[str, float] = {}
    if {"dtensor_chain_fwd", "dtensor_chain_fwd_bwd"} <= set(rows):
        dt = fit_host_ops(
            ops,
            forward_s=rows["dtensor_chain_fwd"][1],
            forward_backward_s=rows["dtensor_chain_fwd_bwd"][1],
        )
        # (DTensor chain - plain chain) per op, times 2: over the ops / 2 linears
        extra["dtensor_forward_op_s"] = max(0.0, 2 * (dt.forward_op_s - plain.forward_op_s))
        extra["dtensor_backward_op_s"] = max(0.0, 2 * (dt.backward_op_s - plain.backward_op_s))
        what = "ColwiseParallel/RowwiseParallel linears on a one-rank mesh, less the plain chain"
        provenance["host_overhead.dtensor_forward_op_us"] = (
            f"{source}; forward of {chain} with DTensor {what}, per linear"
        )
        provenance["host_overhead.dtensor_backward_op_us"] = (
            f"{source}; backward of {chain} with DTensor {what}, per linear"
        )
    if {"sac_chain_fwd", "sac_chain_fwd_bwd"} <= set(rows):
        sac = fit_host_ops(
            ops, forward_s=rows["sac_chain_fwd"][1], forward_backward_s=rows["sac_chain_fwd_bwd"][1]
        )
        extra["sac_forward_op_s"] = max(0.0, sac.forward_op_s - plain.forward_op_s)
        extra["sac_backward_op_s"] = max(0.0, sac.backward_op_s - plain.backward_op_s)
        region = "as one region checkpointed with the per-op selective policy, less the plain chain"
        provenance["host_overhead.sac_forward_op_us"] = f"{source}; forward of {chain} {region}"
        provenance["host_overhead.sac_backward_op_us"] = (
            f"{source}; backward (with its recompute) of {chain} {region}"
        )
    world = _world_chain_terms(rows, ops=ops, chain=chain, source=source)
    extra.update(world.values)
    provenance.update(world.provenance)
    pipeline = _pipeline_terms(table, plain=plain, source=source)
    extra.update(pipeline.values)
    provenance.update(pipeline.provenance)
    host = HostOverhead(
        serial=serial,
        forward_op_s=plain.forward_op_s,
        backward_op_s=plain.backward_op_s,
        **extra,
    )
    fwd_us, bwd_us = 1e6 * plain.forward_op_s, 1e6 * plain.backward_op_s
    summary = [("host per op", f"forward {fwd_us:.3g} us, backward {bwd_us:.3g} us")]
    for label, key in (
        ("DTensor linear extra", "dtensor_{}_op_s"),
        ("DTensor TP all-reduce", "dtensor_all_reduce_{}_s"),
        ("FSDP2 unit", "fsdp_unit_{}_s"),
        ("pipeline action", "pipeline_action_{}_s"),
        ("per-op selective checkpoint extra", "sac_{}_op_s"),
    ):
        if key.format("forward") in extra:
            f_us = 1e6 * extra[key.format("forward")]
            b_us = 1e6 * extra[key.format("backward")]
            summary.append((label, f"forward {f_us:.4g} us, backward {b_us:.4g} us"))
    return Terms(host_overhead=host, provenance=provenance, summary=summary)


@dataclass(frozen=True, slots=True, kw_only=True)
class _World:
    values: dict[str, float]
    provenance: dict[str, str]


def _world_chain_terms(
    rows: Mapping[str, tuple[float, float]], *, ops: float, chain: str, source: str
) -> _World:
    """DTensor all-reduce and FSDP2 unit seconds from the chains run over every rank.

    With the chain's ``ops`` / 4 column/row-parallel linear pairs, each adding one
    all-reduce in forward and one in backward: per all-reduce, (world-mesh chain - one-rank
    DTensor chain) / pairs, forward and backward (forward + backward less forward). With its
    ``ops`` / 2 FSDP2 units: per unit, (FSDP2 chain - plain chain) / units, likewise.
    Negative differences (noise) are clipped to 0; absent rows give no value.
    """
    out = _World(values={}, provenance={})

    def per(name: str, base: str, count: float) -> tuple[float, float] | None:
        keys = (f"{name}_fwd", f"{name}_fwd_bwd", f"{base}_fwd", f"{base}_fwd_bwd")
        if not set(keys) <= set(rows):
            return None
        fwd, both, base_fwd, base_both = (rows[k][1] for k in keys)
        return (
            max(0.0, (fwd - base_fwd) / count),
            max(0.0, ((both - fwd) - (base_both - base_fwd)) / count),
        )

    pairs, units = ops / 4, ops / 2
    measured = (
        (
            "dtensor_all_reduce",
            per("dtensor_world_chain", "dtensor_chain", pairs),
            f"{source}; {chain} with its linears column/row-parallel over every rank, less "
            f"the same on a one-rank mesh, per all-reduce ({pairs:.0f} pairs of linears: one "
            "all-reduce each in forward, one in backward)",
        ),
        (
            "fsdp_unit",
            per("fsdp_chain", "chain", units),
            f"{source}; {chain} with each Linear + GELU pair an FSDP2 fully_shard unit over "
            f"every rank (resharded after forward; forward timed without grad), less the plain "
            f"chain, per unit ({units:.0f} units)",
        ),
    )
    for name, seconds, text in measured:
        if seconds is None:
            continue
        for side, value in zip(("forward", "backward"), seconds, strict=True):
            out.values[f"{name}_{side}_s"] = value
            out.provenance[f"host_overhead.{name}_{side}_us"] = f"{text}, {side}"
    return out


def _pipeline_terms(table: pd.DataFrame, *, plain: HostOpFit, source: str) -> _World:
    """Seconds per pipeline action beyond its stage's ops, from the pipeline chains
    (``plansim.calibrate.bench_pipeline``; shape ``<ops per stage>x<micro-batches>``, work =
    the m + p - 1 actions of a GPipe pass's critical path):
    forward = forward step / actions - ops x ``forward_op_s``; backward = (forward +
    backward step - forward step) / actions - ops x ``backward_op_s``, each at least 0.
    No values when the rows are missing."""
    out = _World(values={}, provenance={})
    rows = table[(table["kind"] == "host_op") & table["op"].isin(PIPELINE_OPS)]
    found = {str(op): group.iloc[0] for op, group in rows.groupby("op", sort=True)}
    if set(found) != set(PIPELINE_OPS):
        return out
    fwd, both = (found[op] for op in PIPELINE_OPS)
    ops, microbatches = (int(v) for v in str(fwd["shape"]).split("x"))
    actions = float(fwd["work"])
    forward_s = float(fwd["time_s"]) / actions
    backward_s = (float(both["time_s"]) - float(fwd["time_s"])) / actions
    values = (
        max(0.0, forward_s - ops * plain.forward_op_s),
        max(0.0, backward_s - ops * plain.backward_op_s),
    )
    text = (
        f"{source}; torch.distributed.pipelining over every rank, one stage of {ops} tiny ops "
        f"(nn.Linear(8, 8) and GELU pairs) per rank, {microbatches} micro-batches of 2 x 8, "
        f"GPipe order (forward: ScheduleGPipe without a loss; forward + backward: "
        f"_PipelineScheduleRuntime on plansim's action lists): step seconds / {actions:.0f} "
        "actions on the critical path, less the stage's ops at the plain chain's per-op "
        "seconds"
    )
    for side, value in zip(("forward", "backward"), values, strict=True):
        out.values[f"pipeline_action_{side}_s"] = value
        out.provenance[f"host_overhead.pipeline_action_{side}_us"] = f"{text}, {side}"
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
