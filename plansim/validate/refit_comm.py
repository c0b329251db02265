"""Refit of a profile's communication curves from one measured run (pure; used by
``plansim.validate.refit``): the point-to-point curve from the pipeline transfers whose
receiver was already waiting (:func:`waited_transfers_s`), and each collective's curve from
the measured over simulated seconds of the communication kinds it prices
(:func:`collectives_by_kind`); each scaled at every size (latency x r, bandwidth / r)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from plansim.sim import timeline as tl
from plansim.specs.curves import CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile
from plansim.validate.compare import Comparison, simulate_plan
from plansim.validate.executed_dp import executes_flat_all_reduce
from plansim.validate.result import MeasuredRun


def ratio(measured: float, simulated: float) -> float | None:
    """measured / simulated, or None unless both are positive."""
    return measured / simulated if measured > 0 and simulated > 0 else None


def kind_totals(c: Comparison, kinds: tuple[str, ...]) -> tuple[float, float]:
    """(measured, simulated) total seconds of ``kinds`` in the comparison."""
    rows = c.kinds[c.kinds.index.isin(kinds)]
    return float(rows["measured_total_s"].sum()), float(rows["simulated_total_s"].sum())


def scale_collective(profile: HardwareProfile, name: str, r: float) -> HardwareProfile:
    """One collective's time x ``r`` at every size: latency x r, bus bandwidth / r."""
    old = profile.intra_node[name]
    bw = old.busbw_bytes_per_s
    new = CollectiveCurve(
        collective=name,
        latency_s=old.latency_s * r,
        busbw_bytes_per_s=Curve(x=bw.x, y=tuple(y / r for y in bw.y)),
    )
    return dataclasses.replace(profile, intra_node={**profile.intra_node, name: new})


def collectives_by_kind(run: MeasuredRun) -> dict[str, tuple[str, ...]]:
    """Each collective -> the communication kinds it prices (see module doc); a collective
    pricing several kinds is refitted once, from their totals together."""
    plan = run.plan
    tp = ("all_gather", "reduce_scatter") if plan.sequence_parallel else ("all_reduce",)
    dp: tuple[str, ...] = ("reduce_scatter", "all_gather")
    if executes_flat_all_reduce(plan):  # ZeroRedundancyOptimizer broadcasts: send/recv
        dp = ("all_reduce",) if plan.zero_stage == 0 else ("all_reduce", "sendrecv")
    kinds: dict[str, list[str]] = {}
    for kind, names in (("tp_comm", tp), ("dp_comm", dp), ("embedding_grad_comm", ("all_reduce",))):
        for name in names:
            kinds.setdefault(name, []).append(kind)
    return {name: tuple(k) for name, k in sorted(kinds.items())}


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
        profile = scale_collective(profile, "sendrecv", r_p2p)
        factors["intra_node.sendrecv"] = r_p2p
    elif run.plan.pp > 1:
        notes.append("sendrecv: no pipeline receive waited for its data; kept")
    for name, kinds in collectives_by_kind(run).items():
        counts = c.kinds["measured_count"].to_dict()
        observed = tuple(k for k in kinds if float(counts.get(k, 0.0)) > 0)
        r = ratio(*kind_totals(c, observed))
        if r is None:
            if kind_totals(c, kinds)[1] > 0:
                notes.append(f"{name}: {'/'.join(kinds)} not observed; kept")
            continue
        profile = scale_collective(profile, name, r)
        factors[f"intra_node.{name}"] = r
    return profile
