"""Refit a hardware profile from one measured run (``plansim validate --update-profile``; pure).

Mechanistic: each profile term is scaled by the ratio of measured to simulated time of the
events that term prices; the step time is used only by the last step, for the time between
a pipeline's actions, which no event isolates. In order:

1. **Streaming bandwidth** (``hbm_efficiency_fraction``, or ``hbm_bandwidth_gb_per_s`` when
   the fraction would pass 1): the optimizer is a pure streaming kernel
   (``plansim.analytic.elementwise.adam_step_bytes`` / streaming bytes/s), so the bandwidth is
   divided by ``r_opt = measured optimizer s / simulated optimizer s``.
2. **Host per-op overhead** (``host_overhead``, when the profile has one;
   :mod:`plansim.validate.refit_terms`): with tp > 1 and a DTensor figure, the forward and
   backward errors go into the DTensor extras (a TP-only term); otherwise the host figures
   are scaled only when the forward/backward split separates host from device time.
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
   (:func:`plansim.validate.refit_comm.waited_transfers_s`); ``r`` = median measured /
   median simulated of those.
5. **Collectives** (``intra_node.<collective>``: latency and bus bandwidth): per collective,
   ``r = measured / simulated`` total seconds of the observed communication kinds it prices.
   ``tp_comm`` prices ``all_reduce`` (``all_gather`` and ``reduce_scatter`` with SP);
   ``dp_comm`` ``all_reduce`` (ZeRO 0), ``all_reduce`` and ``sendrecv`` (ZeRO 1: the
   runner's flat all-reduce and ZeroRedundancyOptimizer's broadcasts, ``executed_dp``) or
   ``reduce_scatter`` and ``all_gather`` (ZeRO 2-3);
   ``embedding_grad_comm`` (tied embeddings, pp > 1) ``all_reduce``.
6. **Pipeline actions** (``host_overhead.pipeline_action_*``, pp > 1, when the profile has
   them; :mod:`plansim.validate.refit_pipeline`): one factor on both per-action figures
   makes the simulated step time equal the measured one.

For 4 and 5 the latency is multiplied and the bus bandwidth divided by r, which scales that
collective's time by r at every message size (one message size cannot separate alpha from
beta).

Every other entry of the profile and its provenance is kept (``plansim.io.profiles.merge_profile``);
replaced entries get a provenance line naming the run. The file is written atomically
(``plansim.io.profiles.write_profile``: temporary file + ``os.replace``, checked to load
back), so a failure leaves the previous file intact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from plansim.io.profiles import merge_profile, profiles_dir
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile
from plansim.validate.compare import CATEGORY_KINDS, Comparison, compare, simulate_plan
from plansim.validate.refit_comm import kind_totals, ratio, refit_collectives
from plansim.validate.refit_pipeline import refit_pipeline
from plansim.validate.refit_terms import (
    PassTotals,
    fit_dtensor,
    fit_host_scale,
    pass_totals,
    scale_host,
    without_host,
)
from plansim.validate.refit_update import profile_update
from plansim.validate.result import MeasuredRun
from plansim.validate.simulated import PIPELINE_ACTION_KIND

#: Relative tolerance of the GEMM fixed-point iteration, and its round limit.
_TOLERANCE = 1e-3
_MAX_ROUNDS = 12
#: Compute kinds of pipeline work (F, B, I, W, recompute).
_PASS_KINDS = CATEGORY_KINDS["forward"] + CATEGORY_KINDS["backward"]
#: Communication kinds on the pp streams (never in-action).
_P2P_KINDS = ("send_forward", "send_backward", "recv_forward", "recv_backward")


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


def _scale_streaming(profile: HardwareProfile, r: float) -> HardwareProfile:
    """Streaming bytes/s divided by ``r`` (times x r); the fraction capped at 1."""
    target = profile.streaming_bytes_per_s() / r
    if target <= profile.hbm_bytes_per_s:
        return dataclasses.replace(
            profile, hbm_efficiency_fraction=target / profile.hbm_bytes_per_s
        )
    return dataclasses.replace(profile, hbm_efficiency_fraction=1.0, hbm_bytes_per_s=target)


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


def _refit_host(
    run: MeasuredRun,
    profile: HardwareProfile,
    *,
    dtype: str,
    factors: dict[str, float],
    notes: list[str],
) -> HardwareProfile:
    """Step 2 of the module docstring (``refit_terms``); the profile unchanged without a
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
