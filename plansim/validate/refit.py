"""Refit a hardware profile from one measured run (``plansim validate --update-profile``; pure).

Mechanistic: each profile term is scaled by the ratio of measured to simulated time of the
events that term prices; the step time is used only by the last step, for the time between
a pipeline's actions, which no event isolates. In order:

1. **Streaming bandwidth** (``hbm_efficiency_fraction``, or ``hbm_bandwidth_gb_per_s`` when
   the fraction would pass 1): the optimizer is a pure streaming kernel
   (``plansim.analytic.elementwise.adam_step_bytes`` / streaming bytes/s), so the bandwidth is
   divided by ``r_opt = measured optimizer s / simulated optimizer s``.
2. **Host per-op overhead** (``host_overhead``, when the profile has one): with tp > 1 and
   a DTensor figure, the forward and backward errors go into the DTensor extras (a TP-only
   term); otherwise the host figures are scaled only when the forward/backward split
   separates host from device time (below).
3. **GEMM efficiency and per-kernel latency** (``matmul_efficiency.<dtype>`` of the run's
   dtype and its ``attention_efficiency.<dtype>`` when present, ``peak_tflops.<dtype>`` only
   when a fraction would pass 1, and ``kernel_launch_us``):
   forward plus backward (F, B, I, W, recompute) compute time. The simulated side adds
   in-action communication the run could not observe separately (e.g. TP collectives
   inside a DTensor forward, which the measured forward includes). The efficiency curve is
   divided and the launch time multiplied by ``r = measured / simulated``; the streaming
   part of those passes (step 1) stays, so the ratio is re-measured on a new simulation and
   applied again until it is within 0.1% of 1 (at most 12 rounds).
4. **Pipeline transfers** (``intra_node.sendrecv``): a measured receive includes the wait
   for the sender, so the transfer time is read where the receiver was already waiting:
   from the end of the sender's compute to the end of the receive
   (:func:`waited_transfers_s`); ``r`` = median measured /
   median simulated of those.
5. **Collectives** (``intra_node.<collective>``: latency and bus bandwidth): per collective,
   ``r = measured / simulated`` total seconds of the observed communication kinds it prices.
   ``tp_comm`` prices ``all_reduce`` (``all_gather`` and ``reduce_scatter`` with SP);
   ``dp_comm`` ``all_reduce`` (ZeRO 0), ``all_reduce`` and ``sendrecv`` (ZeRO 1: the
   runner's flat all-reduce and ZeroRedundancyOptimizer's broadcasts, ``executed_dp``) or
   ``reduce_scatter`` and ``all_gather`` (ZeRO 2-3);
   ``embedding_grad_comm`` (tied embeddings, pp > 1) ``all_reduce``.
6. **Pipeline actions** (``host_overhead.pipeline_action_*``, pp > 1, when the profile has
   them): by then the run's passes, optimizer and communication match, and what a pipelined
   step still gets wrong is time between actions, the schedule's own work per action
   (posting and waiting for each send/recv, the runtime's bookkeeping;
   ``plansim.calibrate.bench_pipeline``). One factor f on both per-action figures, found by
   bisection, makes the simulated step time equal the measured one (the simulated step never
   shortens as f grows: every action's compute only lengthens); f is kept within
   [0, :data:`MAX_FACTOR`].

**Host term (step 2).** A measured forward or backward pass holds device work D, host per-op
work H (the profile's ``host_overhead``, ``plansim.analytic.op_overheads``) and the in-action
communication X the run cannot time apart (TP collectives inside a DTensor forward, ZeRO-3
gathers). Per pass::

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

For 4 and 5 the latency is multiplied and the bus bandwidth divided by r, which scales that
collective's time by r at every message size (one message size cannot separate alpha from
beta).

Every other entry of the profile and its provenance is kept (``plansim.io.profiles.merge_profile``);
replaced entries get a provenance line naming the run (:func:`profile_update`). The file is
written atomically (``plansim.io.profiles.write_profile``: temporary file + ``os.replace``,
checked to load back), so a failure leaves the previous file intact.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plansim.analytic.comm import Collective
from plansim.io.profile_schema import host_overhead_keys
from plansim.io.profiles import SCALAR_KEYS, ProfileUpdate, merge_profile, profiles_dir
from plansim.sim import timeline as tl
from plansim.specs.curves import CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile
from plansim.validate.compare import CATEGORY_KINDS, Comparison, compare, simulate_plan
from plansim.validate.executed_dp import executes_flat_all_reduce
from plansim.validate.result import MeasuredRun
from plansim.validate.simulated import PIPELINE_ACTION_KIND

#: Relative tolerance of the GEMM fixed-point iteration, and its round limit.
_TOLERANCE = 1e-3
_MAX_ROUNDS = 12
#: Compute kinds of pipeline work (F, B, I, W, recompute).
_PASS_KINDS = CATEGORY_KINDS["forward"] + CATEGORY_KINDS["backward"]
#: Communication kinds on the pp streams (never in-action).
_P2P_KINDS = tuple(
    k.value
    for k in (
        tl.TimelineKind.SEND_FORWARD,
        tl.TimelineKind.SEND_BACKWARD,
        tl.TimelineKind.RECV_FORWARD,
        tl.TimelineKind.RECV_BACKWARD,
    )
)
#: Least |sin| of the angle between the device and host columns for the 2 x 2 solve.
MIN_SEPARATION = 0.1
_FORWARD = CATEGORY_KINDS["forward"]
_BACKWARD = CATEGORY_KINDS["backward"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Refit:
    """A refitted profile and what changed.

    Attributes:
        profile: the refitted profile (every entry not listed in ``factors`` unchanged).
        factors: {profile term: time multiplier applied}, e.g. ``{"streaming": 1.4,
            "gemm_and_launch": 0.8, "intra_node.sendrecv": 1.1}`` (1.4: that term's simulated
            times were 1.4 x longer after the refit than before).
        before, after: the comparison on the original and on the refitted profile.
        notes: terms that could not be fitted, and why.
    """

    profile: HardwareProfile
    factors: dict[str, float]
    before: Comparison
    after: Comparison
    notes: tuple[str, ...] = field(default_factory=tuple)


def profile_path(name_or_path: str) -> Path:
    """The file of ``--profile``: a path as given, a name in ``hardware_profiles/``."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        return Path(name_or_path)
    return profiles_dir() / f"{name_or_path}.yaml"


def refit(run: MeasuredRun, profile: HardwareProfile, *, dtype: str, source: str) -> Refit:
    """Refit ``profile`` to ``run``, re-simulate and compare again (no I/O).

    Args:
        run: the measured run.
        profile: the profile it was simulated on.
        dtype: the run's matmul dtype (``fp32`` on CPU): the GEMM curve that is refitted.
        source: provenance of every replaced entry (see :func:`profile_update`).

    Raises:
        ValidateError: the plan cannot be simulated on the profile.
        plansim.errors.InputFileError: the merged profile is invalid.
    """
    before = compare(run, simulate_plan(run.model, run.plan, profile, dtype=dtype))
    fitted, factors, notes = refit_profile(run, profile, dtype=dtype)
    update = profile_update(profile, fitted, factors, dtype=dtype, source=source)
    merged = merge_profile(profile, update)
    after = compare(run, simulate_plan(run.model, run.plan, merged, dtype=dtype))
    return Refit(profile=merged, factors=factors, before=before, after=after, notes=notes)


def refit_profile(
    run: MeasuredRun, profile: HardwareProfile, *, dtype: str
) -> tuple[HardwareProfile, dict[str, float], tuple[str, ...]]:
    """Refit ``profile``'s streaming, GEMM/launch and collective terms to ``run`` (no I/O).

    Returns:
        (refitted profile, {term: time multiplier}, notes on terms left unchanged).
    """
    factors: dict[str, float] = {}
    notes: list[str] = []

    def comparison(p: HardwareProfile) -> Comparison:
        return compare(run, simulate_plan(run.model, run.plan, p, dtype=dtype))

    c = comparison(profile)
    r_opt = ratio(*kind_totals(c, ("optimizer",)))
    if r_opt is None:
        notes.append("streaming: no optimizer event measured and simulated; kept")
    else:
        profile, factors["streaming"] = _scale_streaming(profile, r_opt), r_opt
        c = comparison(profile)
    if profile.host_overhead is not None:
        profile = _refit_host(run, profile, dtype=dtype, factors=factors, notes=notes)
        c = comparison(profile)
    profile, c = _refit_gemm(profile, c, comparison, dtype=dtype, factors=factors, notes=notes)
    profile = refit_collectives(run, profile, c, dtype=dtype, factors=factors, notes=notes)
    if run.plan.pp > 1:
        profile = refit_pipeline(run, profile, dtype=dtype, factors=factors, notes=notes)
    return profile, factors, tuple(notes)


# ------------------------------------------------------------------------------------- 1. streaming
def _scale_streaming(profile: HardwareProfile, r: float) -> HardwareProfile:
    """Streaming bytes/s divided by ``r`` (times x r); the fraction capped at 1."""
    target = profile.streaming_bytes_per_s() / r
    if target <= profile.hbm_bytes_per_s:
        return dataclasses.replace(
            profile, hbm_efficiency_fraction=target / profile.hbm_bytes_per_s
        )
    return dataclasses.replace(profile, hbm_efficiency_fraction=1.0, hbm_bytes_per_s=target)


# -------------------------------------------------------------------------- 2. host per-op overhead
def _refit_host(
    run: MeasuredRun,
    profile: HardwareProfile,
    *,
    dtype: str,
    factors: dict[str, float],
    notes: list[str],
) -> HardwareProfile:
    """Step 2 of the module docstring; the profile unchanged without a
    host term or when the run does not determine it."""
    host = profile.host_overhead
    if host is None:
        return profile

    def totals(p: HardwareProfile) -> PassTotals:
        ev = simulate_plan(run.model, run.plan, p, dtype=dtype)
        return pass_totals(compare(run, ev), ev.result.timeline)

    if run.plan.tp > 1 and host.dtensor_forward_op_s is not None:
        total_f = total_b = 1.0
        for _ in range(_MAX_ROUNDS):
            fit = fit_dtensor(totals(profile), totals(without_host(profile, dtensor_only=True)))
            if fit is None:
                break
            profile = scale_host(profile, forward=fit[0], backward=fit[1], dtensor_only=True)
            total_f, total_b = total_f * fit[0], total_b * fit[1]
            if max(abs(fit[0] - 1.0), abs(fit[1] - 1.0)) < _TOLERANCE or 0.0 in fit:
                break
        if (total_f, total_b) != (1.0, 1.0):
            factors["host_overhead.dtensor_forward"] = total_f
            factors["host_overhead.dtensor_backward"] = total_b
            notes.append(
                f"host_overhead.dtensor_*: x{total_f:.3g} forward, x{total_b:.3g} backward; "
                "the run cannot time TP collectives apart from its forward/backward, so "
                "these factors also hold their error (a TP-only term either way)"
            )
        return profile
    scale = fit_host_scale(totals(profile), totals(without_host(profile)))
    if scale is None:
        notes.append(
            "host_overhead: the forward/backward errors do not separate host from device "
            "time in this run (alike backward/forward ratios); kept"
        )
        return profile
    factors["host_overhead"] = scale
    return scale_host(profile, forward=scale, backward=scale)


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
#: pipeline-action figures the time between actions (refitted by :func:`refit_pipeline`), so
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


# ------------------------------------------------------------- 3. GEMM efficiency and kernel launch
def _scale_gemm(profile: HardwareProfile, r: float, *, dtype: str) -> HardwareProfile:
    """GEMM (and fused-attention) times of ``dtype`` and the launch overhead x ``r``;
    GEMM fractions over 1 go to the peak (attention fractions are rescaled to it)."""
    curve = profile.matmul_efficiency[dtype]
    ys = [y / r for y in curve.y]
    peak = profile.peak_flops_per_s[dtype]
    top = max(ys)
    if top > 1.0:
        peak, ys = peak * top, [y / top for y in ys]
    attention = dict(profile.attention_efficiency)
    if dtype in attention:
        old = attention[dtype]
        ratio = profile.peak_flops_per_s[dtype] / peak / r

        def scaled(c: Curve) -> Curve:
            return Curve(x=c.x, y=tuple(y * ratio for y in c.y))

        attention[dtype] = dataclasses.replace(
            old, forward=scaled(old.forward), backward=scaled(old.backward)
        )
    return dataclasses.replace(
        profile,
        peak_flops_per_s={**profile.peak_flops_per_s, dtype: peak},
        matmul_efficiency={**profile.matmul_efficiency, dtype: Curve(x=curve.x, y=tuple(ys))},
        attention_efficiency=attention,
        kernel_launch_s=profile.kernel_launch_s * r,
    )


def _unobserved_in_action_s(c: Comparison) -> float:
    """Simulated seconds of in-action communication (rows tied to a micro-batch: TP, CP,
    ZeRO-3 gathers) of kinds the run did not record."""
    known = _PASS_KINDS + _P2P_KINDS + (PIPELINE_ACTION_KIND,)
    rows = c.kinds[~c.kinds.index.isin(known) & (c.kinds["measured_count"] == 0)]
    return float(rows["simulated_tied_total_s"].sum())


def _pass_ratio(c: Comparison) -> float | None:
    """Measured / simulated F+B compute (simulated: plus unobserved in-action comm)."""
    measured, simulated = kind_totals(c, _PASS_KINDS)
    return ratio(measured, simulated + _unobserved_in_action_s(c))


def _refit_gemm(
    profile: HardwareProfile,
    c: Comparison,
    comparison: Callable[[HardwareProfile], Comparison],
    *,
    dtype: str,
    factors: dict[str, float],
    notes: list[str],
) -> tuple[HardwareProfile, Comparison]:
    """Scale the GEMM curve and kernel launch until the forward/backward events agree (at
    most ``_MAX_ROUNDS`` times, to ``_TOLERANCE``); ``factors`` gets the product, ``notes``
    what it could not separate or left off."""
    gemm = 1.0
    for _ in range(_MAX_ROUNDS):
        r = _pass_ratio(c)
        if r is None or abs(r - 1.0) < _TOLERANCE:
            break
        profile, gemm = _scale_gemm(profile, r, dtype=dtype), gemm * r
        c = comparison(profile)
    if gemm != 1.0:
        factors["gemm_and_launch"] = gemm
    hidden = _unobserved_in_action_s(c)
    if gemm != 1.0 and hidden > 0:
        notes.append(
            f"gemm_and_launch: the run could not time {1e3 * hidden:.3g} ms of in-action "
            f"communication (TP/ZeRO-3) apart from F/B; its error went into this factor, "
            f"which therefore holds for this layout only"
        )
    r_left = _pass_ratio(c)
    if r_left is None:
        notes.append("gemm_and_launch: no forward/backward event measured; kept")
    elif abs(r_left - 1.0) >= 0.01:
        notes.append(f"gemm_and_launch: F/B still off by x{r_left:.3g} (streaming-bound passes)")
    return profile, c


# ---------------------------------------------------------- 4-5. pipeline transfers and collectives
def ratio(measured: float, simulated: float) -> float | None:
    """measured / simulated, or None unless both are positive."""
    return measured / simulated if measured > 0 and simulated > 0 else None


def kind_totals(c: Comparison, kinds: tuple[str, ...]) -> tuple[float, float]:
    """(measured, simulated) total seconds of ``kinds`` in the comparison."""
    rows = c.kinds[c.kinds.index.isin(kinds)]
    return float(rows["measured_total_s"].sum()), float(rows["simulated_total_s"].sum())


def scale_collective(profile: HardwareProfile, collective: Collective, r: float) -> HardwareProfile:
    """One collective's time x ``r`` at every size: latency x r, bus bandwidth / r."""
    name = collective.value
    old = profile.intra_node[name]
    bw = old.busbw_bytes_per_s
    new = CollectiveCurve(
        collective=name,
        latency_s=old.latency_s * r,
        busbw_bytes_per_s=Curve(x=bw.x, y=tuple(y / r for y in bw.y)),
    )
    return dataclasses.replace(profile, intra_node={**profile.intra_node, name: new})


def collectives_by_kind(run: MeasuredRun) -> dict[Collective, tuple[str, ...]]:
    """Each collective -> the communication kinds it prices (see module doc), in the order
    of the collectives' names; a collective pricing several kinds is refitted once, from
    their totals together."""
    plan = run.plan
    all_reduce = (Collective.ALL_REDUCE,)
    tp = (
        (Collective.ALL_GATHER, Collective.REDUCE_SCATTER) if plan.sequence_parallel else all_reduce
    )
    dp: tuple[Collective, ...] = (Collective.REDUCE_SCATTER, Collective.ALL_GATHER)
    if executes_flat_all_reduce(plan):  # ZeroRedundancyOptimizer broadcasts: send/recv
        dp = all_reduce if plan.zero_stage == 0 else (*all_reduce, Collective.SENDRECV)
    kinds: dict[Collective, list[str]] = {}
    for kind, collectives in (
        ("tp_comm", tp),
        ("dp_comm", dp),
        ("embedding_grad_comm", all_reduce),
    ):
        for collective in collectives:
            kinds.setdefault(collective, []).append(kind)
    return {c: tuple(kinds[c]) for c in sorted(kinds, key=lambda c: c.value)}


def waited_transfers_s(df: pd.DataFrame) -> list[float]:
    """Pipeline transfer times read from a Timeline where the receiver was already waiting.

    For a receive of micro-batch j at stage s (``recv_forward``: sent after F(s-1, j);
    ``recv_backward``: after B or I(s+1, j)) that started no later than the sender's
    compute ended, the transfer took ``receive end - sender compute end``: the time from
    the data being ready to its arrival, with no waiting of the receiver in it. Receives
    that started later (the data was already there) say nothing about the transfer. Ranks
    on one machine share the clock (``time.perf_counter_ns``).
    """
    compute = df[(df[tl.STREAM] == tl.COMPUTE) & (df[tl.STAGE] >= 0) & (df[tl.MICROBATCH] >= 0)]
    done: dict[tuple[str, int, int], float] = {}
    for kind, stage, mb, end in zip(
        compute[tl.KIND], compute[tl.STAGE], compute[tl.MICROBATCH], compute[tl.END_S], strict=True
    ):
        side = "F" if kind == "forward" else "B" if kind in ("backward", "backward_input") else ""
        if side:
            done[(side, int(stage), int(mb))] = float(end)
    recv = df[df[tl.KIND].isin(("recv_forward", "recv_backward"))]
    out = []
    for kind, stage, mb, start, end in zip(
        recv[tl.KIND],
        recv[tl.STAGE],
        recv[tl.MICROBATCH],
        recv[tl.START_S],
        recv[tl.END_S],
        strict=True,
    ):
        key = (
            ("F", int(stage) - 1, int(mb))
            if kind == "recv_forward"
            else ("B", int(stage) + 1, int(mb))
        )
        ready = done.get(key)
        if ready is not None and start <= ready < end:
            out.append(float(end) - ready)
    return out


def transfer_ratio(run: MeasuredRun, simulated: pd.DataFrame) -> float | None:
    """Median measured over median simulated :func:`waited_transfers_s`, or None."""
    measured = [t for df in run.timelines for t in waited_transfers_s(df)]
    sim = waited_transfers_s(simulated)
    if not measured or not sim:
        return None
    return ratio(float(np.median(measured)), float(np.median(sim)))


def refit_collectives(
    run: MeasuredRun,
    profile: HardwareProfile,
    c: Comparison,
    *,
    dtype: str,
    factors: dict[str, float],
    notes: list[str],
) -> HardwareProfile:
    """Scale the sendrecv curve by the pipeline transfers and each collective's curve by its
    observed events (measured over simulated seconds); ``factors`` and ``notes`` as above."""
    sim_tl = simulate_plan(run.model, run.plan, profile, dtype=dtype).result.timeline
    r_p2p = transfer_ratio(run, sim_tl)
    if r_p2p is not None:
        profile = scale_collective(profile, Collective.SENDRECV, r_p2p)
        factors["intra_node.sendrecv"] = r_p2p
    elif run.plan.pp > 1:
        notes.append("sendrecv: no pipeline receive waited for its data; kept")
    for collective, kinds in collectives_by_kind(run).items():
        counts = c.kinds["measured_count"].to_dict()
        observed = tuple(k for k in kinds if float(counts.get(k, 0.0)) > 0)
        r = ratio(*kind_totals(c, observed))
        if r is None:
            if kind_totals(c, kinds)[1] > 0:
                notes.append(f"{collective.value}: {'/'.join(kinds)} not observed; kept")
            continue
        profile = scale_collective(profile, collective, r)
        factors[f"intra_node.{collective.value}"] = r
    return profile


# ------------------------------------------------------------------------------ 6. pipeline actions
#: Largest factor tried: a per-action cost 20x the calibrated one means the residual is not
#: per-action work.
MAX_FACTOR = 20.0
#: The bisection of :func:`fit_pipeline_actions` stops when the simulated step is within this
#: fraction of the measured one.
PIPELINE_TOLERANCE = 0.002
_MAX_BISECTION_STEPS = 30


def scale_pipeline_actions(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """``profile`` with both ``pipeline_action_*`` figures x ``factor`` (unchanged without
    them)."""
    host = profile.host_overhead
    if host is None or host.pipeline_action_forward_s is None:
        return profile
    scaled = dataclasses.replace(
        host,
        pipeline_action_forward_s=host.pipeline_action_forward_s * factor,
        pipeline_action_backward_s=(host.pipeline_action_backward_s or 0.0) * factor,
    )
    return dataclasses.replace(profile, host_overhead=scaled)


def fit_pipeline_actions(
    profile: HardwareProfile,
    *,
    measured_step_s: float,
    simulated_step_s: Callable[[HardwareProfile], float],
) -> float | None:
    """The factor on ``profile``'s per-action figures that makes ``simulated_step_s`` equal
    ``measured_step_s`` (module docstring), or None when the profile has no such figures or
    the measured step is not positive. Clipped to 0 when even no per-action cost simulates
    too long a step, to :data:`MAX_FACTOR` when the largest does not reach it."""
    host = profile.host_overhead
    if host is None or host.pipeline_action_forward_s is None or not measured_step_s > 0:
        return None

    def error(factor: float) -> float:
        return simulated_step_s(scale_pipeline_actions(profile, factor)) / measured_step_s - 1

    if error(0.0) >= 0:
        return 0.0
    if error(MAX_FACTOR) <= 0:
        return MAX_FACTOR
    low, high = 0.0, MAX_FACTOR
    mid = 1.0
    for _ in range(_MAX_BISECTION_STEPS):
        e = error(mid)
        if abs(e) < PIPELINE_TOLERANCE:
            break
        low, high = (mid, high) if e < 0 else (low, mid)
        mid = (low + high) / 2
    return mid


def refit_pipeline(
    run: MeasuredRun,
    profile: HardwareProfile,
    *,
    dtype: str,
    factors: dict[str, float],
    notes: list[str],
) -> HardwareProfile:
    """``profile`` with its per-action figures refitted to ``run`` (:func:`fit_pipeline_actions`
    on the run's median step), the factor in ``factors["host_overhead.pipeline_action"]``
    and a line in ``notes`` when the profile has no figures or the factor was clipped."""
    factor = fit_pipeline_actions(
        profile,
        measured_step_s=run.median_step_time_s,
        simulated_step_s=lambda p: simulate_plan(run.model, run.plan, p, dtype=dtype).step_time_s,
    )
    if factor is None:
        notes.append("pipeline_action: the profile has no per-action figures; kept")
        return profile
    factors["host_overhead.pipeline_action"] = factor
    if factor in (0.0, MAX_FACTOR):
        notes.append(
            f"pipeline_action: clipped at x{factor:g}; the step's error is not per-action work"
        )
    return scale_pipeline_actions(profile, factor)


# ------------------------------------------------------------------------------- the profile update
#: Factor names (``Refit.factors``) behind each host_overhead key (:func:`profile_update`).
_HOST_FACTORS = {
    "forward_op_us": "host_overhead",
    "backward_op_us": "host_overhead",
    "dtensor_forward_op_us": "host_overhead.dtensor_forward",
    "dtensor_backward_op_us": "host_overhead.dtensor_backward",
    "pipeline_action_forward_us": "host_overhead.pipeline_action",
    "pipeline_action_backward_us": "host_overhead.pipeline_action",
    "sac_forward_op_us": "host_overhead",
    "sac_backward_op_us": "host_overhead",
}


def profile_update(
    base: HardwareProfile,
    fitted: HardwareProfile,
    factors: dict[str, float],
    *,
    dtype: str,
    source: str,
) -> ProfileUpdate:
    """The entries of ``fitted`` that differ from ``base``, each with provenance ``source``.

    Args:
        source: e.g. ``"refit by plansim validate, 2026-01-31: tp1 pp2 dp1 ... (gloo, 2
            ranks, model tiny)"``; the time multiplier of each term is appended.
    """
    scalars: dict[str, float] = {}
    provenance: dict[str, str] = {}
    for name in ("hbm_efficiency_fraction", "hbm_bytes_per_s", "kernel_launch_s"):
        if getattr(fitted, name) != getattr(base, name):
            scalars[name] = getattr(fitted, name)
    term = {
        "hbm_efficiency_fraction": "streaming",
        "hbm_bytes_per_s": "streaming",
        "kernel_launch_s": "gemm_and_launch",
    }
    for name in scalars:
        provenance[SCALAR_KEYS[name]] = _note(source, factors.get(term[name]))
    peaks = {}
    curves = {}
    if fitted.matmul_efficiency[dtype] != base.matmul_efficiency[dtype]:
        curves[dtype] = fitted.matmul_efficiency[dtype]
        provenance[f"matmul_efficiency.{dtype}"] = _note(source, factors.get("gemm_and_launch"))
    if fitted.peak_flops_per_s[dtype] != base.peak_flops_per_s[dtype]:
        peaks[dtype] = fitted.peak_flops_per_s[dtype]
        provenance[f"peak_tflops.{dtype}"] = _note(source, factors.get("gemm_and_launch"))
    intra = {}
    for name, coll in fitted.intra_node.items():
        if coll != base.intra_node[name]:
            intra[name] = coll
            note = _note(source, factors.get(f"intra_node.{name}"))
            provenance[f"intra_node.{name}"] = provenance[f"intra_node.{name}.latency_us"] = note
    attention = {}
    if dtype in fitted.attention_efficiency and (
        fitted.attention_efficiency[dtype] != base.attention_efficiency.get(dtype)
    ):
        attention[dtype] = fitted.attention_efficiency[dtype]
        provenance[f"attention_efficiency.{dtype}"] = _note(source, factors.get("gemm_and_launch"))
    host = None
    if fitted.host_overhead is not None and fitted.host_overhead != base.host_overhead:
        host = fitted.host_overhead
        for key in host_overhead_keys(host):
            old = base.provenance.get(f"host_overhead.{key}", source)
            factor = factors.get(_HOST_FACTORS.get(key, ""))
            changed = factor is not None and factor != 1.0
            provenance[f"host_overhead.{key}"] = _note(source, factor) if changed else old
    return ProfileUpdate(
        peak_flops_per_s=peaks,
        matmul_efficiency=curves,
        intra_node=intra,
        scalars=scalars,
        provenance=provenance,
        attention_efficiency=attention,
        host_overhead=host,
    )


def _note(source: str, factor: float | None) -> str:
    return source if factor is None else f"{source}; times x{factor:.4g} of the previous value"
