"""nccl-tests logs -> a profile update (``plansim profiles import-nccl-tests``). Pure.

Intra-node tier: every collective found becomes ``intra_node.<collective>`` (latency and busbw
curve from :func:`plansim.calibrate.fit.fit_collective`), ``alltoall_perf`` the optional
``intra_node.all_to_all``. When a collective appears in several runs, the run with the most
sizes is used and the others are reported.

Inter-node tier: the profile has one NIC figure, so one multi-node run is used (all_reduce,
else reduce_scatter, all_gather, sendrecv; of those, one over the fewest nodes) and the
inter-node model of ``plansim.analytic.comm`` is inverted (an all_to_all run across nodes is
noted and not used): a group spanning nodes has busbw
``min(intra busbw, ranks_per_node * nic)`` and alpha ``intra latency + nic_latency *
ceil(log2(nodes))``, so ``nic = busbw / ranks_per_node`` (bandwidth term at the largest size;
send/recv: ``nic = busbw``) and ``nic_latency = (alpha - intra latency) / ceil(log2(nodes))``.

Message-size shape: the same run's busbw curve (bandwidth term, alpha removed) over its value
at the largest size becomes the profile's ``inter_node_message_scaling`` (all_reduce,
reduce_scatter or all_gather runs; a send/recv run prices nothing but pipeline sends, which
use the NIC figure alone), so a collective across nodes reproduces the run's time at every
size instead of taking the intra-node curve's shape.

Ring fall-off: when reduce_scatter (else all_gather) was run across nodes at two or more node
counts, each count's busbw (bandwidth term at its largest size) over the smallest count's
becomes the profile's ``inter_node_ring_scaling`` (fractions above 1, a longer ring measured
faster than a shorter one, are read as 1 and noted).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from plansim.calibrate.fit import CollectiveFit, fit_collective
from plansim.calibrate.nccl_tests import NcclTestsLog, NcclTestsRun
from plansim.errors import InputFileError
from plansim.io.profiles import ProfileUpdate
from plansim.specs.curves import CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile

TIERS = ("intra-node", "inter-node")
_INTER_NODE_PREFERENCE = ("all_reduce", "reduce_scatter", "all_gather", "sendrecv")


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    """The update, one line per number set, and notes on runs not used."""

    update: ProfileUpdate
    lines: tuple[str, ...]
    notes: tuple[str, ...]
    fits: dict[str, CollectiveFit]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Source:
    log: NcclTestsLog
    run: NcclTestsRun

    @property
    def name(self) -> str:
        return Path(self.log.source).name

    def describe(self) -> str:
        run = self.run
        nodes = f"{run.num_nodes} node(s)" if run.num_nodes else "nodes not stated"
        ranks = f"{run.num_ranks} ranks" if run.num_ranks else "ranks not stated"
        extra = [f"nccl-tests {run.nccl_tests_version}"] if run.nccl_tests_version else []
        extra += [f"NCCL {run.nccl_version}"] if run.nccl_version else []
        extra += list(run.devices)
        lines = f"lines {run.rows[0].line}-{run.rows[-1].line}"
        truncated = "" if run.complete else ", truncated: complete rows only"
        return (
            f"nccl-tests: {self.name} {lines} ({run.binary}, {ranks} on {nodes}"
            f"{', ' + ', '.join(extra) if extra else ''}{truncated})"
        )


#: A GPU model in a device or profile name ("H100", "A100", "MI300X", "GB200").
_GPU_MODEL = re.compile(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b")


def gpu_models(text: str) -> set[str]:
    """The GPU model tokens of a name (``NVIDIA H100 80GB HBM3`` -> ``{"H100"}``)."""
    return set(_GPU_MODEL.findall(text.upper()))


def check_run_fits(log: NcclTestsLog, run: NcclTestsRun, base: HardwareProfile) -> None:
    """A run fits a profile when it ran on the profile's GPU (the GPU models its ``#  Rank``
    lines name appear in the profile's name, description or the device of a measured entry)
    and on no more GPUs a node than the profile's node has.

    Raises:
        InputFileError: names the log, the run, what it ran on and the profile, and
            ``--force`` to import anyway.
    """
    where = f"{Path(log.source).name}:{run.first_line}: {run.binary}"
    force = "; give --force to import it anyway"
    ranks, nodes = run.num_ranks, run.num_nodes or 1
    if ranks is not None and -(-ranks // nodes) > base.gpus_per_node:
        raise InputFileError(
            f"{where} ran {ranks} ranks on {nodes} node(s), more a node than the "
            f"{base.gpus_per_node} GPUs of {base.name}'s node{force}"
        )
    ran_on = set().union(*(gpu_models(device) for device in run.devices)) if run.devices else set()
    measured = [v.split(",")[0] for v in base.provenance.values() if v.startswith("measured:")]
    profile_text = " ".join([base.name, base.description, *measured])
    if ran_on and not ran_on & gpu_models(profile_text):
        raise InputFileError(
            f"{where} ran on {', '.join(run.devices)}; {base.name} describes "
            f"{base.description!r}{force}"
        )


def _runs(logs: Sequence[NcclTestsLog]) -> dict[str, list[_Source]]:
    found: dict[str, list[_Source]] = {}
    for log in logs:
        for run in log.runs:
            found.setdefault(run.collective, []).append(_Source(log=log, run=run))
    return found


def _pick(sources: list[_Source], notes: list[str]) -> _Source:
    """The run with the most sizes (the last of equals); the others are noted."""
    best = max(reversed(sources), key=lambda s: len(s.run.rows))
    for other in sources:
        if other is not best:
            notes.append(
                f"{other.name}:{other.run.first_line}: {other.run.collective} also measured "
                f"here; not used (one curve per collective; used {best.name}:"
                f"{best.run.first_line}, {len(best.run.rows)} sizes)"
            )
    return best


def _fit(source: _Source) -> CollectiveFit:
    run = source.run
    ranks = run.num_ranks or (2 if run.collective == "sendrecv" else None)
    if ranks is None:
        raise InputFileError(
            f"{source.name}:{run.first_line}: cannot tell how many ranks ran {run.binary} "
            "(no '#  Rank' lines and no algbw to infer it from)"
        )
    sizes = [float(r.size_bytes) for r in run.rows]
    times = [r.time_s for r in run.rows]
    return fit_collective(run.collective, sizes, times, num_ranks=ranks)


def update_from_nccl_tests(
    logs: Sequence[NcclTestsLog],
    *,
    tier: str,
    base: HardwareProfile,
    date: str,
    force: bool = False,
) -> Imported:
    """The update for ``base`` from parsed logs on ``tier`` (``intra-node``/``inter-node``).

    Unless ``force``, every run must fit ``base`` (:func:`check_run_fits`).

    Raises:
        InputFileError: a run spans the wrong number of nodes for ``tier``, its rank count is
            unknown, it ran on another GPU or on more GPUs a node than ``base`` has, or no
            usable run exists for ``tier``.
    """
    if tier not in TIERS:
        raise InputFileError(f"tier {tier!r} is not allowed; choose one of: {', '.join(TIERS)}")
    found = _runs(logs)
    if not force:
        for sources in found.values():
            for source in sources:
                check_run_fits(source.log, source.run, base)
    notes: list[str] = []
    if tier == "intra-node":
        return _intra_node(found, notes, date)
    return _inter_node(found, notes, base, date)


def _intra_node(found: dict[str, list[_Source]], notes: list[str], date: str) -> Imported:
    curves, provenance, lines, fits = {}, {}, [], {}
    for collective, sources in sorted(found.items()):
        source = _pick(sources, notes)
        if (source.run.num_nodes or 1) > 1:
            raise InputFileError(
                f"{source.name}:{source.run.first_line}: {source.run.binary} spans "
                f"{source.run.num_nodes} nodes; import it with --tier inter-node"
            )
        fit = _fit(source)
        fits[collective] = fit
        curves[collective] = fit.curve
        where = f"{source.describe()}; imported {date}"
        provenance[f"intra_node.{collective}"] = (
            f"{where}; smaller of the out-of-place and in-place time per size; {fit.describe()}"
        )
        provenance[f"intra_node.{collective}.latency_us"] = (
            f"{where}; alpha of the alpha-beta fit (capped at the smallest time)"
        )
        lines.append(f"intra_node.{collective} <- {source.name}: {fit.describe()}")
    update = ProfileUpdate(intra_node=curves, provenance=provenance)
    return Imported(update=update, lines=tuple(lines), notes=tuple(notes), fits=fits)


def _inter_node(
    found: dict[str, list[_Source]], notes: list[str], base: HardwareProfile, date: str
) -> Imported:
    multi = {c: [s for s in sources if (s.run.num_nodes or 0) >= 2] for c, sources in found.items()}
    order = [c for c in _INTER_NODE_PREFERENCE if multi.get(c)]
    unused = sorted(c for c, sources in multi.items() if sources and c not in order)
    notes += [
        f"{c}: a run across nodes, not used (the NIC figures come from "
        f"{', '.join(_INTER_NODE_PREFERENCE)})"
        for c in unused
    ]
    if not order:
        raise InputFileError(
            "--tier inter-node needs a run over at least 2 nodes (nodes are counted from the "
            "host names in the '#  Rank' lines); none found"
            + (
                f" of {', '.join(_INTER_NODE_PREFERENCE)} ({', '.join(unused)} runs across "
                "nodes are not used for it)"
                if unused
                else ""
            )
        )
    collective = order[0]
    # the NIC figure from the fewest nodes: longer rings lose bandwidth (``_ring_scaling``)
    fewest = min(s.run.num_nodes or 2 for s in multi[collective])
    source = _pick([s for s in multi[collective] if (s.run.num_nodes or 2) == fewest], notes)
    notes += [f"{c}: not used for the NIC figures ({collective} preferred)" for c in order[1:]]
    run, fit = source.run, _fit(source)
    nodes = run.num_nodes or 2
    per_node = 1 if collective == "sendrecv" else max(1, (run.num_ranks or nodes) // nodes)
    busbw = fit.curve.busbw_bytes_per_s.y[-1]
    intra = base.intra_node[collective].latency_s
    hops = math.ceil(math.log2(nodes))
    nic_latency = max(0.0, fit.curve.latency_s - intra) / hops
    where = f"{source.describe()}; imported {date}"
    provenance = {
        "nic_gb_per_s": (
            f"{where}; busbw of the bandwidth term at the largest size "
            f"{busbw / 1e9:.4g} GB/s / {per_node} ranks per node (plansim.analytic.comm: "
            f"busbw = ranks_per_node * nic across nodes); {fit.describe()}"
        ),
        "nic_latency_us": (
            f"{where}; (alpha {fit.curve.latency_s * 1e6:.4g} us - this profile's intra-node "
            f"{collective} latency {intra * 1e6:.4g} us) / ceil(log2({nodes} nodes))"
        ),
    }
    lines = [
        f"nic_gb_per_s = {busbw / per_node / 1e9:.4g}, nic_latency_us = {nic_latency * 1e6:.4g} "
        f"<- {source.name} ({collective}, {run.num_ranks} ranks on {nodes} nodes)",
    ]
    message = None if collective == "sendrecv" else _message_scaling(fit.curve, where)
    if message is not None:
        provenance["inter_node_message_scaling"] = message.source
        lines.append(f"inter_node_message_scaling <- {source.name} ({len(message.x)} sizes)")
    ring = _ring_scaling(multi, notes, date)
    if ring is not None:
        provenance["inter_node_ring_scaling"] = ring.source
        lines.append(f"inter_node_ring_scaling <- {ring.source}")
    update = ProfileUpdate(
        scalars={"nic_bytes_per_s": busbw / per_node, "nic_latency_s": nic_latency},
        provenance=provenance,
        inter_node_ring_fraction=ring,
        inter_node_message_fraction=message,
    )
    return Imported(update=update, lines=tuple(lines), notes=tuple(notes), fits={collective: fit})


def _message_scaling(curve: CollectiveCurve, where: str) -> Curve:
    """The fitted busbw curve of a run across nodes over its value at the largest size
    (module docstring); fractions above 1 (a mid size faster than the largest) read as 1."""
    busbw = curve.busbw_bytes_per_s
    top = busbw.y[-1]
    text = (
        f"{where}; busbw of the bandwidth term (alpha {curve.latency_s * 1e6:.4g} us removed) "
        f"at each size over the largest size's {top / 1e9:.4g} GB/s"
    )
    return Curve(x=busbw.x, y=tuple(min(1.0, y / top) for y in busbw.y), source=text)


def _ring_scaling(multi: dict[str, list[_Source]], notes: list[str], date: str) -> Curve | None:
    """The ring's busbw by node count over the smallest count's (module docstring), from
    reduce_scatter runs, else all_gather ones; None with fewer than two node counts."""
    for collective in ("reduce_scatter", "all_gather"):
        by_nodes: dict[int, list[_Source]] = {}
        for source in multi.get(collective, []):
            by_nodes.setdefault(source.run.num_nodes or 0, []).append(source)
        if len(by_nodes) < 2:
            continue
        counts = sorted(by_nodes)
        busbw = [_fit(_pick(by_nodes[n], [])).curve.busbw_bytes_per_s.y[-1] for n in counts]
        fractions = [min(1.0, b / busbw[0]) for b in busbw]
        faster = [f"{n} nodes" for n, b in zip(counts, busbw, strict=True) if b > busbw[0]]
        if faster:
            notes.append(
                f"{collective}: busbw on {', '.join(faster)} above that on {counts[0]}: read as "
                "no loss (fraction 1)"
            )
        measured = ", ".join(
            f"{b / 1e9:.4g} GB/s on {n}" for n, b in zip(counts, busbw, strict=True)
        )
        text = (
            f"nccl-tests {collective} across nodes, imported {date}: busbw (bandwidth term at "
            f"each run's largest size) {measured} nodes, each over the {counts[0]}-node figure"
        )
        return Curve(x=tuple(float(n) for n in counts), y=tuple(fractions), source=text)
    return None
