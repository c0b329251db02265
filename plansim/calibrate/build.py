"""Raw calibration measurements -> a profile update with provenance. Pure (pandas, no torch).

How each HardwareProfile number is obtained (``hardware_profiles/README.md`` "Calibrated
profiles" says the same for readers of the YAML):

======================  =====================================================================
peak_tflops.<dtype>     best octave-binned median GEMM rate measured (a base profile's
                        datasheet peak is kept when it is at least that: fractions then stay
                        relative to the datasheet)
matmul_efficiency       median rate per FLOPs octave / peak (:func:`.fit.fit_efficiency`)
kernel_launch_us        median time of a 1-element add (per-op dispatch overhead)
hbm_bandwidth_gb_per_s  best STREAM kernel rate (bytes read + written per second), largest size
hbm_efficiency_fraction the ``add`` kernel's rate / that best rate
hbm_capacity_gib        GPU: device memory; CPU: host memory / ranks (the ranks share it)
memory_reserve_gib      memory held after start-up (GPU: device memory in use; CPU: rank RSS
                        + the host memory already in use / ranks) + 5% of capacity for the
                        allocator (assumption, as the GPU profiles)
gpus_per_node           ranks launched (CPU: cores used, one thread each)
intra_node.<c>          collective fit at the largest group (:func:`.fit.fit_collective`);
                        ``all_to_all`` too where the raw rows have it (older runs: absent)
nic_gb_per_s, _latency  CPU: the send/recv fit (same host: loopback, not a NIC); GPU: kept
                        from the base profile, else an assumption equal to send/recv
pcie_gb_per_s           GPU: pinned host-to-device copy; CPU: a host memory copy
                        (bytes copied per second = half the STREAM copy rate)
host.adam_params_per_s  parameters / time of a host ``torch.optim.Adam`` step (fp32, foreach,
                        one thread per rank, ranks concurrent) on the largest size measured
host.memory_gib         the host's MemTotal (``/proc/meminfo``)
attention_efficiency    per dtype, causal SDPA forward and backward rates / that dtype's GEMM
                        peak over forward FLOPs per call (:func:`.fit.fit_attention`)
host_overhead           seconds per op of a forward through a chain of tiny ops, and of its
                        backward (:func:`.fit.fit_host_ops`); the DTensor extra from the same
                        chain tensor-parallel; ``serial`` true on a CPU device
overlap_compute_        median over ranks of (a GEMM loop's time beside a chain of async
slowdown_fraction       all_reduces / its time alone) - 1 (:func:`.build_terms.overlap_term`)
sustained_matmul_       GPU: median over ranks of a GEMM's burst / soaked seconds per call;
fraction, gpu_matmul_   with 4+ ranks also the spread of the soaked rates over ranks
spread_fraction         (:func:`.build_terms.sustained_term`)
max_power_w,            GPU with a power reading: median over ranks of the mean draw during
idle_power_w            the soak's kept windows and during the sleep before the burst
                        (:func:`.build_terms.power_term`)
======================  =====================================================================

Compute times are the median over ranks of each rank's median (the ranks run concurrently);
a collective's time is the slowest rank's median (the call ends when the last rank is done).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from plansim.calibrate.aggregate import aggregate, cache_note, contention
from plansim.calibrate.build_elementwise import elementwise_term
from plansim.calibrate.build_host import host_overhead_term
from plansim.calibrate.build_terms import (
    MIN_CURVE_SIZES,
    attention_terms,
    one_size_note,
    overlap_term,
    power_term,
    sustained_term,
)
from plansim.calibrate.fit import CollectiveFit, fit_collective, fit_efficiency
from plansim.calibrate.plan import CPU_SHARE_OK
from plansim.calibrate.run_info import RunInfo
from plansim.io.profiles import ProfileUpdate
from plansim.specs.compute_terms import AttentionEfficiency, HostOverhead
from plansim.specs.curves import KNOWN_COLLECTIVES, CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile

#: Allocator fragmentation share of capacity added to the reserve (README "Memory reserve").
FRAGMENTATION_FRACTION = 0.05
_GIB = 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    """The update, a short summary (label, value) for the terminal, and how many compute
    timings ran with less than :data:`CPU_SHARE_OK` of a core (``contended`` of ``timed``)."""

    update: ProfileUpdate
    summary: tuple[tuple[str, str], ...]
    collective_fits: Mapping[str, CollectiveFit]
    contended: int = 0
    timed: int = 0


def build_update(
    rows: pd.DataFrame,
    info: RunInfo,
    *,
    base: HardwareProfile | None,
    name: str,
    description: str | None = None,
) -> Built:
    """The profile update from a run's raw rows (all ranks)."""
    table = aggregate(rows)
    contended, timed = contention(rows)
    parts = _Parts()
    if timed:
        parts.compute_note = (
            f"; {contended} of {timed} compute timings had < {CPU_SHARE_OK:.0%} of a core "
            "(other work competed)"
            if contended
            else f"; every compute timing ({timed}) had >= {CPU_SHARE_OK:.0%} of a core"
        )
    parts.gemm_cache_note = cache_note(rows, "gemm")
    _compute(parts, table, info, base)
    _memory_bound(parts, table, info)
    _capacity(parts, rows, info)
    _host(parts, table, info)
    _compute_terms(parts, table, info, base, rows=rows)
    fits = _collectives(parts, table, info, base)
    default = (
        f"{info.env.get('device_name', info.device)}: {info.nproc} ranks x 1 "
        f"{'GPU' if info.device == 'cuda' else 'core'} ({info.backend}), plansim calibrate"
    )
    gpus_per_node = _gpus_per_node(info, base)
    node_source = (
        {} if gpus_per_node is None else {"gpus_per_node": f"{info.source()}; ranks launched"}
    )
    update = ProfileUpdate(
        name=name,
        description=description or (base.description if base else default),
        peak_flops_per_s=parts.peaks,
        matmul_efficiency=parts.curves,
        intra_node=parts.collectives,
        scalars=parts.scalars,
        gpus_per_node=gpus_per_node,
        provenance={**parts.provenance, **node_source},
        host=parts.host,
        attention_efficiency=parts.attention,
        host_overhead=parts.host_overhead,
    )
    return Built(
        update=update,
        summary=tuple(parts.summary),
        collective_fits=fits,
        contended=contended,
        timed=timed,
    )


@dataclass
class _Parts:
    peaks: dict[str, float] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    collectives: dict[str, CollectiveCurve] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    summary: list[tuple[str, str]] = field(default_factory=list)
    compute_note: str = ""
    gemm_cache_note: str = ""
    host: dict[str, float] = field(default_factory=dict)
    attention: dict[str, AttentionEfficiency] = field(default_factory=dict)
    host_overhead: HostOverhead | None = None


def _compute(
    parts: _Parts, table: pd.DataFrame, info: RunInfo, base: HardwareProfile | None
) -> None:
    """Peaks and matmul efficiency per dtype; attention rates go to the summary only."""
    source = info.source() + parts.compute_note
    for key, gemms in table[table["kind"] == "gemm"].groupby("dtype", sort=True):
        dtype = str(key)
        measured = fit_efficiency(gemms["work"].tolist(), gemms["time_s"].tolist())
        peak, peak_note = measured.best_per_s, "best octave-median GEMM rate measured"
        base_peak = base.peak_flops_per_s.get(dtype) if base else None
        base_source = base.provenance.get(f"peak_tflops.{dtype}", "") if base else ""
        if base_peak and base_peak >= peak and not base_source.startswith("measured"):
            peak, peak_note = base_peak, ""
        fitted = fit_efficiency(gemms["work"].tolist(), gemms["time_s"].tolist(), peak_per_s=peak)
        if len(fitted.curve.x) < MIN_CURVE_SIZES:
            parts.summary.append((f"GEMM {dtype}", one_size_note(len(fitted.curve.x))))
            continue
        if peak_note:
            parts.peaks[dtype] = peak
            parts.provenance[f"peak_tflops.{dtype}"] = f"{source}; {peak_note}"
        parts.curves[dtype] = fitted.curve
        parts.provenance[f"matmul_efficiency.{dtype}"] = (
            f"{source}; {len(gemms)} GEMMs (transformer QKV, attention-out, MLP up/down, "
            f"logits), {fitted.min_work:.3g}-{fitted.max_work:.3g} FLOPs; median rate per "
            f"FLOPs octave / peak {peak / 1e12:.4g} TFLOP/s; ranks concurrent, median over "
            f"ranks and {int(gemms['passes'].max())} passes; {parts.gemm_cache_note}"
        )
        parts.summary.append((f"GEMM {dtype} best", f"{measured.best_per_s / 1e9:.4g} GFLOP/s"))
    attention = table[table["kind"] == "attention"]
    for names, group in attention.groupby(["op", "dtype"], sort=True):
        rate = (group["work"] / group["time_s"]).max()
        label = " ".join(str(n) for n in names)
        parts.summary.append((f"attention {label} best", f"{rate / 1e9:.4g} GFLOP/s"))
    for _, row in table[table["kind"] == "adam"].iterrows():
        rate = row["work"] / row["time_s"]
        parts.summary.append(
            (f"host Adam step {row['shape']} params", f"{rate / 1e6:.4g} M params/s")
        )


def _memory_bound(parts: _Parts, table: pd.DataFrame, info: RunInfo) -> None:
    """Streaming bandwidth and its efficiency, per-op overhead, and the host-copy rate."""
    source = info.source() + parts.compute_note
    stream = table[table["kind"] == "stream"]
    if not stream.empty:
        largest = stream[
            stream["work"] / stream["work"].groupby(stream["op"]).transform("max") == 1
        ]
        rates = (largest["work"] / largest["time_s"]).groupby(largest["op"]).max()
        best_op = str(rates.idxmax())
        best = float(rates.max())
        share = float(rates.get("add", best)) / best
        elements = largest["shape"].iloc[0]
        parts.scalars["hbm_bytes_per_s"] = best
        parts.provenance["hbm_bandwidth_gb_per_s"] = (
            f"{source}; best STREAM kernel ({best_op}) on {elements} fp32 elements per tensor, "
            "bytes read + written per second, ranks concurrent"
        )
        parts.scalars["hbm_efficiency_fraction"] = min(1.0, share)
        parts.provenance["hbm_efficiency_fraction"] = (
            f"{source}; STREAM add rate / the best kernel's rate (same size)"
        )
        parts.summary.append(("stream best", f"{best / 1e9:.4g} GB/s ({best_op})"))
        if info.device != "cuda" and "copy" in rates:
            parts.scalars["pcie_bytes_per_s"] = float(rates["copy"]) / 2
            parts.provenance["pcie_gb_per_s"] = (
                f"{source}; CPU: a host<->device copy is a host memory copy: bytes copied per "
                "second (half the STREAM copy rate, which counts read + write)"
            )
    launch = table[table["kind"] == "launch"]
    if not launch.empty:
        parts.scalars["kernel_launch_s"] = float(launch["time_s"].median())
        parts.provenance["kernel_launch_us"] = (
            f"{source}; median time of a 1-element add (per-op dispatch overhead)"
        )
    h2d = table[(table["kind"] == "copy") & (table["op"] == "h2d")]
    if not h2d.empty:
        top = h2d.sort_values("work").iloc[-1]
        parts.scalars["pcie_bytes_per_s"] = float(top["work"] / top["time_s"])
        parts.provenance["pcie_gb_per_s"] = (
            f"{source}; pinned host-to-device copy of {int(top['work'])} bytes"
        )


def _capacity(parts: _Parts, rows: pd.DataFrame, info: RunInfo) -> None:
    """Memory capacity per rank and the reserve the model cannot use."""
    memory = rows[(rows["kind"] == "memory") & (rows["status"] == "ok")]
    per_op = memory.groupby("op")["work"].median()
    source = info.source()
    if info.device == "cuda" and "device_total" in per_op:
        capacity = float(per_op["device_total"])
        held = float(per_op.get("device_used_after_init", 0.0))
        what = "device memory in use after start-up (CUDA context, NCCL buffers)"
        cap_note = "torch.cuda.mem_get_info total"
    elif info.host_memory_total_bytes > 0:
        capacity = info.host_memory_total_bytes / info.nproc
        in_use = info.host_memory_total_bytes - info.host_memory_available_bytes
        held = float(per_op.get("rss_after_init", 0.0)) + in_use / info.nproc
        what = "rank RSS after start-up (torch + process group) + host memory in use / ranks"
        cap_note = f"CPU: host memory / {info.nproc} ranks (the ranks share it)"
    else:
        return
    reserve = held + FRAGMENTATION_FRACTION * capacity
    parts.scalars["hbm_capacity_bytes"] = capacity
    parts.provenance["hbm_capacity_gib"] = f"{source}; {cap_note}"
    parts.scalars["memory_reserve_bytes"] = min(reserve, 0.9 * capacity)
    parts.provenance["memory_reserve_gib"] = (
        f"{source}; {what} = {held / _GIB:.3g} GiB, + {FRAGMENTATION_FRACTION:.0%} of capacity "
        "for allocator fragmentation (assumption, as the GPU profiles)"
    )
    parts.summary.append(
        ("memory per rank", f"{capacity / _GIB:.3g} GiB, reserve {reserve / _GIB:.3g} GiB")
    )


def _host(parts: _Parts, table: pd.DataFrame, info: RunInfo) -> None:
    """The profile's host section (ZeRO-Offload): host Adam rate and host memory.

    Written only when both are known (the section needs both). The Adam rate is that of
    the largest step measured (closest to a real shard: out of cache), with every rank
    stepping at once, so it is one rank's share of the host CPU as ``HostSpec`` wants it.
    """
    adam = table[table["kind"] == "adam"]
    if adam.empty or info.host_memory_total_bytes <= 0:
        return
    top = adam.sort_values("work").iloc[-1]
    parts.host["adam_params_per_s"] = float(top["work"] / top["time_s"])
    parts.provenance["host.adam_params_per_s"] = (
        f"{info.source()}{parts.compute_note}; host torch.optim.Adam(foreach=True) step on "
        f"{int(top['work'])} fp32 parameters, 1 thread per rank, ranks concurrent, median over "
        "ranks: parameters / time (DeepSpeed's vectorised multi-thread CPU Adam is faster)"
    )
    parts.host["memory_bytes"] = info.host_memory_total_bytes
    parts.provenance["host.memory_gib"] = f"{info.source()}; MemTotal of the host (/proc/meminfo)"


def _compute_terms(
    parts: _Parts,
    table: pd.DataFrame,
    info: RunInfo,
    base: HardwareProfile | None,
    *,
    rows: pd.DataFrame,
) -> None:
    """Fused-attention curves, host per-op overhead, the overlap slowdown and the sustained
    GEMM rate (the last two from the raw ``rows``: per rank) (:mod:`.build_terms`)."""
    source = info.source() + parts.compute_note
    peaks = {**(base.peak_flops_per_s if base else {}), **parts.peaks}
    attention = attention_terms(
        table, source=f"{source}; {cache_note(rows, 'attention')}", peaks=peaks
    )
    host = host_overhead_term(table, source=source, serial=info.device != "cuda")
    overlap = overlap_term(rows, source=source)
    stream = parts.scalars.get("hbm_bytes_per_s", 0.0) * parts.scalars.get(
        "hbm_efficiency_fraction", 1.0
    )
    elementwise = elementwise_term(table, source=source, streaming_bytes_per_s=stream)
    sustained = sustained_term(rows, source=source)
    power = power_term(rows, source=source)
    for terms in (attention, host, overlap, elementwise, sustained, power):
        parts.provenance.update(terms.provenance)
        parts.summary.extend(terms.summary)
        parts.scalars.update(terms.scalars)
    if overlap.overlap_compute_slowdown_fraction is not None:
        parts.scalars["overlap_compute_slowdown_fraction"] = (
            overlap.overlap_compute_slowdown_fraction
        )
    parts.attention = attention.attention
    parts.host_overhead = host.host_overhead


def _gpus_per_node(info: RunInfo, base: HardwareProfile | None) -> int | None:
    """Ranks launched, the GPUs (or cores) of the node; None (the base profile's kept) when
    one rank merges into a base: a single-GPU run says nothing of the node it stands for
    (one GPU of an 8-GPU node calibrated on a one-GPU machine)."""
    return None if info.nproc == 1 and base is not None else info.nproc


def _collectives(
    parts: _Parts, table: pd.DataFrame, info: RunInfo, base: HardwareProfile | None
) -> dict[str, CollectiveFit]:
    """Latency + busbw curve per collective at the largest group; NIC from send/recv."""
    source = info.source()
    fits: dict[str, CollectiveFit] = {}
    comm = table[table["kind"] == "collective"]
    for name in KNOWN_COLLECTIVES:  # all_to_all only where the run measured it
        rows = comm[comm["op"] == name]
        if rows.empty:
            continue
        group = int(rows["group_size"].max())
        rows = rows[rows["group_size"] == group]
        fit = fit_collective(
            name, rows["work"].tolist(), rows["time_s"].tolist(), num_ranks=max(group, 2)
        )
        fits[name] = fit
        parts.collectives[name] = fit.curve
        parts.provenance[f"intra_node.{name}"] = (
            f"{source}; {info.backend} {name}, time = slowest rank's median, median over "
            f"{int(rows['passes'].max())} passes; {fit.describe()}"
        )
        parts.provenance[f"intra_node.{name}.latency_us"] = (
            f"{source}; alpha of the alpha-beta fit (capped at the smallest time)"
        )
        large = fit.curve.busbw_bytes_per_s.y[-1]
        parts.summary.append(
            (
                f"{name} ({group} ranks)",
                f"latency {fit.curve.latency_s * 1e6:.4g} us, "
                f"busbw {large / 1e9:.4g} GB/s at the largest size",
            )
        )
    if "sendrecv" in fits and (info.device != "cuda" or base is None):
        curve = fits["sendrecv"].curve
        parts.scalars["nic_bytes_per_s"] = curve.busbw_bytes_per_s.y[-1]
        parts.scalars["nic_latency_s"] = curve.latency_s
        how = (
            f"{source}; NOT a NIC: {info.backend} send/recv between ranks on this host "
            "(loopback), bandwidth term at the largest size; a multi-node CPU job would use "
            "the real network"
            if info.device != "cuda"
            else "assumption: equal to the intra-node send/recv measured here (no multi-node "
            "measurement; replace with plansim profiles import-nccl-tests --tier inter-node); "
            f"{source}"
        )
        parts.provenance["nic_gb_per_s"] = how
        parts.provenance["nic_latency_us"] = how
    return fits
