"""Raw calibration rows -> a profile's ``host_overhead`` section. Pure (pandas, no torch).

Seconds per op of the forward and of the backward through a chain of tiny ops
(``kind == "host_op"``, ``chain_fwd`` / ``chain_fwd_bwd``, work = ops; see
``plansim.calibrate.plan``). Where a twin of the chain was measured, its extra over the plain
chain (:func:`_twin_chain_terms`): per DTensor linear (``dtensor_chain_*``: (DTensor chain -
plain chain) / linears, the linears being half the chain's ops) and per op of a per-op
selective checkpoint region (``sac_chain_*``). ``serial`` is true on a CPU device. With more
than one rank also the chains over every rank: per DTensor all-reduce, per FSDP2 unit
(:func:`_world_chain_terms`) and per pipeline action (:func:`_pipeline_terms`).

``table`` is :func:`plansim.calibrate.aggregate.aggregate`'s, as in
``plansim.calibrate.build_terms``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from plansim.calibrate.build_terms import Terms, medians
from plansim.calibrate.fit import HostOpFit, fit_host_ops
from plansim.calibrate.plan import PIPELINE_OPS
from plansim.specs.compute_terms import HostOverhead

_DTENSOR = (
    "with DTensor ColwiseParallel/RowwiseParallel linears on a one-rank mesh, less the plain chain"
)
_SAC = "as one region checkpointed with the per-op selective policy, less the plain chain"
#: Twins of the plain chain: (row prefix, scale of the per-op difference, provenance of the
#: forward and of the backward figure). DTensor's extra is per linear, the linears being half
#: the chain's ops (x 2); the per-op selective checkpoint's is per op, its backward holding
#: the recompute.
_TWINS: tuple[tuple[str, float, str, str], ...] = (
    (
        "dtensor",
        2.0,
        f"forward of {{chain}} {_DTENSOR}, per linear",
        f"backward of {{chain}} {_DTENSOR}, per linear",
    ),
    (
        "sac",
        1.0,
        f"forward of {{chain}} {_SAC}",
        f"backward (with its recompute) of {{chain}} {_SAC}",
    ),
)


def host_overhead_term(table: pd.DataFrame, *, source: str, serial: bool) -> Terms:
    """The ``host_overhead`` section from the chain rows, or no term when they are missing.

    Args:
        table: aggregated rows.
        source: provenance prefix.
        serial: the host is the device (CPU).
    """
    rows = medians(table[table["kind"] == "host_op"], "op")
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
    twins = [
        _twin_chain_terms(
            rows,
            twin=twin,
            scale=scale,
            ops=ops,
            plain=plain,
            provenance=(
                f"{source}; {fwd.format(chain=chain)}",
                f"{source}; {bwd.format(chain=chain)}",
            ),
        )
        for twin, scale, fwd, bwd in _TWINS
    ]
    for part in (
        *twins,
        _world_chain_terms(rows, ops=ops, chain=chain, source=source),
        _pipeline_terms(table, plain=plain, source=source),
    ):
        extra.update(part.values)
        provenance.update(part.provenance)
    host = HostOverhead(
        serial=serial,
        forward_op_s=plain.forward_op_s,
        backward_op_s=plain.backward_op_s,
        **extra,
    )
    return Terms(host_overhead=host, provenance=provenance, summary=_host_summary(plain, extra))


def _twin_chain_terms(
    rows: Mapping[str, tuple[float, float]],
    *,
    twin: str,
    scale: float,
    ops: float,
    plain: HostOpFit,
    provenance: tuple[str, str],
) -> _World:
    """The extra host seconds of a twin of the plain chain (rows ``<twin>_chain_fwd`` and
    ``<twin>_chain_fwd_bwd``): (twin - plain) per op times ``scale``, forward and backward
    (``<twin>_forward_op_s``, ``<twin>_backward_op_s``), clipped at 0 (noise); none without
    the twin's rows. ``provenance``: the forward's and the backward's texts."""
    out = _World(values={}, provenance={})
    fwd, both = f"{twin}_chain_fwd", f"{twin}_chain_fwd_bwd"
    if not {fwd, both} <= set(rows):
        return out
    fit = fit_host_ops(ops, forward_s=rows[fwd][1], forward_backward_s=rows[both][1])
    out.values[f"{twin}_forward_op_s"] = max(0.0, scale * (fit.forward_op_s - plain.forward_op_s))
    out.values[f"{twin}_backward_op_s"] = max(
        0.0, scale * (fit.backward_op_s - plain.backward_op_s)
    )
    out.provenance[f"host_overhead.{twin}_forward_op_us"] = provenance[0]
    out.provenance[f"host_overhead.{twin}_backward_op_us"] = provenance[1]
    return out


def _host_summary(plain: HostOpFit, extra: Mapping[str, float]) -> list[tuple[str, str]]:
    """The calibration summary's host lines: per op, then each measured extra term."""
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
    return summary


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
