"""Profile YAML (a parsed mapping) -> :class:`HardwareProfile`, with one clear error per problem.

Reads every section, the optional ones too: ``attention_efficiency``, ``host_overhead``,
``inter_node_ring_scaling`` and ``inter_node_message_scaling`` (all documented in
``hardware_profiles/README.md``). A file without them loads with
``HardwareProfile.attention_efficiency == {}``, ``host_overhead is None``,
``inter_node_ring_fraction is None`` and ``inter_node_message_fraction is None``, which leaves
every cost as it was. Their provenance keys: ``attention_efficiency.<dtype>`` (one per
curve), ``host_overhead.<key>`` (one per value, ``serial`` included),
``inter_node_ring_scaling`` and ``inter_node_message_scaling`` (one per curve).

Every problem is an :class:`InputFileError` naming the source and the key path
(``hardware_profiles/x.yaml: intra_node.all_reduce.busbw_gb_per_s: expected a list of
numbers, got 'abc'``); there are no silent defaults for required keys. Numbers are converted
from the edge units in the key names to SI (``plansim.io.profile_schema``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from plansim.errors import InputFileError, SpecError
from plansim.io.profile_schema import (
    ATTENTION_KEYS,
    COLLECTIVE_KEYS,
    FRACTION_CURVES,
    HOST_OVERHEAD_KEYS,
    HOST_OVERHEAD_OPTIONAL_KEYS,
    HOST_OVERHEAD_SCALARS,
    HOST_REQUIRED_KEYS,
    HOST_SCALARS,
    MATMUL_KEYS,
    OPTIONAL_SCALARS,
    OPTIONAL_TOP_LEVEL_KEYS,
    PLAUSIBLE,
    SCALARS,
    SCHEMA_VERSION,
    TOP,
    TOP_LEVEL_KEYS,
)
from plansim.specs.compute_terms import AttentionEfficiency, HostOverhead
from plansim.specs.curves import (
    COLLECTIVES,
    KNOWN_COLLECTIVES,
    OPTIONAL_COLLECTIVES,
    CollectiveCurve,
    Curve,
)
from plansim.specs.hardware import HardwareProfile, HostSpec
from plansim.units import gb_per_s_to_bytes_per_s, tflops_to_flops_per_s, us_to_s


# --------------------------------------------------------------------------- field access
@dataclass(frozen=True)
class _Ctx:
    """Where a value came from, for error messages: ``<source>: <key path>: <problem>``."""

    source: str

    def error(self, path: str, problem: str) -> InputFileError:
        return InputFileError(f"{self.source}: {path}: {problem}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _join(path: str, key: str) -> str:
    return key if path == TOP else f"{path}.{key}"


def _mapping(ctx: _Ctx, value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ctx.error(path, f"expected a mapping with text keys, got {_show(value)}")
    return value


def _require(
    ctx: _Ctx,
    mapping: Mapping[str, object],
    path: str,
    allowed: Sequence[str],
    optional: Sequence[str] = (),
) -> None:
    """Raise for any missing or unknown key of ``mapping`` (whose own path is ``path``);
    keys in ``optional`` may be missing."""
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        raise ctx.error(
            path, f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
        )
    for key in allowed:
        if key not in mapping and key not in optional:
            raise ctx.error(_join(path, key), "missing required key")


#: A number YAML 1.1 reads as text (``1e12`` has no dot): read as the number it spells.
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _number(ctx: _Ctx, value: object, path: str) -> float:
    if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ctx.error(path, f"expected a number, got {_show(value)}")
    key = path.rpartition(".")[2]
    bounds = PLAUSIBLE.get(key)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise ctx.error(
            path,
            f"{value:g} is outside the plausible range [{bounds[0]:g}, {bounds[1]:g}] for this "
            "key (hardware_profiles/README.md; a unit slip?)",
        )
    return float(value)


def _integer(ctx: _Ctx, value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.error(path, f"expected an integer, got {_show(value)}")
    return value


def _text(ctx: _Ctx, value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ctx.error(path, f"expected non-empty text, got {_show(value)}")
    return value


def _numbers(ctx: _Ctx, value: object, path: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise ctx.error(path, f"expected a list of numbers, got {_show(value)}")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise ctx.error(path, f"expected a list of numbers, element {i} is {_show(item)}")
    return tuple(float(v) for v in value)


def _curve(ctx: _Ctx, x: tuple[float, ...], y: tuple[float, ...], path: str, source: str) -> Curve:
    if len(x) != len(y):
        raise ctx.error(path, f"the two lists have different lengths ({len(x)} and {len(y)})")
    try:
        return Curve(x=x, y=y, source=source)
    except SpecError as exc:
        raise ctx.error(path, str(exc)) from None


# --------------------------------------------------------------------------- reading
def profile_from_dict(data: object, *, source: str) -> HardwareProfile:
    """Build a validated profile from parsed YAML (edge units) and convert to SI.

    Args:
        data: the document as ``yaml.safe_load`` returns it.
        source: how to name the origin in error messages (a file path).

    Raises:
        InputFileError: a key is missing, unknown or ill-typed, a number lacks provenance,
            or the dataclass validation fails (its message is prefixed with ``source``).
    """
    ctx = _Ctx(source)
    top = _mapping(ctx, data, TOP)
    _require(ctx, top, TOP, TOP_LEVEL_KEYS, OPTIONAL_TOP_LEVEL_KEYS)
    version = _integer(ctx, top["schema_version"], "schema_version")
    if version != SCHEMA_VERSION:
        raise ctx.error("schema_version", f"{version} is not supported; this plansim reads 1")
    provenance = _read_provenance(ctx, top)
    peaks = _read_peaks(ctx, top)
    scalars = {s.field: s.to_si(_number(ctx, top[s.key], s.key)) for s in SCALARS}
    scalars |= {
        s.field: s.to_si(_number(ctx, top[s.key], s.key)) for s in OPTIONAL_SCALARS if s.key in top
    }
    attention = _read_attention(ctx, top, provenance)
    host_overhead = _read_host_overhead(ctx, top)
    ring = _read_fraction_curve(ctx, top, provenance, "inter_node_ring_scaling")
    message = _read_fraction_curve(ctx, top, provenance, "inter_node_message_scaling")
    try:
        return HardwareProfile(
            name=_text(ctx, top["name"], "name"),
            description=_text(ctx, top["description"], "description"),
            peak_flops_per_s=peaks,
            matmul_efficiency=_read_matmul(ctx, top, provenance),
            gpus_per_node=_integer(ctx, top["gpus_per_node"], "gpus_per_node"),
            intra_node=_read_intra_node(ctx, top, provenance),
            provenance=provenance,
            host=_read_host(ctx, top),
            attention_efficiency=attention,
            host_overhead=host_overhead,
            inter_node_ring_fraction=ring,
            inter_node_message_fraction=message,
            **scalars,
        )
    except SpecError as exc:
        raise InputFileError(f"{source}: {exc}") from None


def _read_host(ctx: _Ctx, top: Mapping[str, object]) -> HostSpec | None:
    """The optional ``host:`` section -> :class:`HostSpec` in SI units (None when absent).

    ``memory_gib`` and ``adam_params_per_s`` are required in it; the NVMe pair
    (``nvme_read_gb_per_s``, ``nvme_write_gb_per_s``) is optional but goes together.
    """
    if "host" not in top:
        return None
    section = _mapping(ctx, top["host"], "host")
    keys = [s.key for s in HOST_SCALARS]
    optional = [k for k in keys if k not in HOST_REQUIRED_KEYS]
    _require(ctx, section, "host", keys, optional)
    values = {
        s.field: s.to_si(_number(ctx, section[s.key], f"host.{s.key}"))
        for s in HOST_SCALARS
        if s.key in section
    }
    try:
        return HostSpec(**values)
    except SpecError as exc:
        raise ctx.error("host", str(exc)) from None


def _read_peaks(ctx: _Ctx, top: Mapping[str, object]) -> dict[str, float]:
    """``peak_tflops: {dtype: TFLOP/s}`` -> FLOP/s by dtype."""
    peaks = _mapping(ctx, top["peak_tflops"], "peak_tflops")
    if not peaks:
        raise ctx.error("peak_tflops", "expected at least one dtype")
    return {
        dtype: tflops_to_flops_per_s(_number(ctx, value, f"peak_tflops.{dtype}"))
        for dtype, value in peaks.items()
    }


def _read_matmul(
    ctx: _Ctx, top: Mapping[str, object], provenance: Mapping[str, str]
) -> dict[str, Curve]:
    """``matmul_efficiency.<dtype>: {gemm_flops, fraction_of_peak}`` -> Curve per dtype."""
    section = _mapping(ctx, top["matmul_efficiency"], "matmul_efficiency")
    curves: dict[str, Curve] = {}
    for dtype, raw in section.items():
        path = f"matmul_efficiency.{dtype}"
        entry = _mapping(ctx, raw, path)
        _require(ctx, entry, path, MATMUL_KEYS)
        flops = _numbers(ctx, entry["gemm_flops"], f"{path}.gemm_flops")
        fraction = _numbers(ctx, entry["fraction_of_peak"], f"{path}.fraction_of_peak")
        if any(not 0 < f <= 1 for f in fraction):
            raise ctx.error(f"{path}.fraction_of_peak", f"values must be in (0, 1], got {fraction}")
        curves[dtype] = _curve(ctx, flops, fraction, path, provenance[path])
    return curves


def _read_intra_node(
    ctx: _Ctx, top: Mapping[str, object], provenance: Mapping[str, str]
) -> dict[str, CollectiveCurve]:
    """``intra_node.<collective>: {latency_us, message_bytes, busbw_gb_per_s}`` -> SI curves,
    in :data:`KNOWN_COLLECTIVES` order: the four of ``COLLECTIVES`` (required) and
    ``all_to_all`` when the file has it (``OPTIONAL_COLLECTIVES``)."""
    section = _mapping(ctx, top["intra_node"], "intra_node")
    _require(ctx, section, "intra_node", KNOWN_COLLECTIVES, OPTIONAL_COLLECTIVES)
    curves: dict[str, CollectiveCurve] = {}
    for name in (c for c in KNOWN_COLLECTIVES if c in section):
        path = f"intra_node.{name}"
        entry = _mapping(ctx, section[name], path)
        _require(ctx, entry, path, COLLECTIVE_KEYS)
        latency_us = _number(ctx, entry["latency_us"], f"{path}.latency_us")
        sizes = _numbers(ctx, entry["message_bytes"], f"{path}.message_bytes")
        busbw = _numbers(ctx, entry["busbw_gb_per_s"], f"{path}.busbw_gb_per_s")
        curve = _curve(
            ctx, sizes, tuple(gb_per_s_to_bytes_per_s(b) for b in busbw), path, provenance[path]
        )
        try:
            curves[name] = CollectiveCurve(
                collective=name,
                latency_s=us_to_s(latency_us),
                busbw_bytes_per_s=curve,
                source=provenance[path],
            )
        except SpecError as exc:
            raise ctx.error(path, str(exc)) from None
    return curves


def _read_attention(
    ctx: _Ctx, top: Mapping[str, object], provenance: Mapping[str, str]
) -> dict[str, AttentionEfficiency]:
    """``attention_efficiency.<dtype>: {attention_flops, forward_fraction_of_peak,
    backward_fraction_of_peak}`` -> :class:`AttentionEfficiency` per dtype ({} if absent).

    Raises:
        InputFileError: a key is missing, unknown or ill-typed, the lists differ in length,
            x is not increasing, or a fraction is outside (0, 1].
    """
    if "attention_efficiency" not in top:
        return {}
    section = _mapping(ctx, top["attention_efficiency"], "attention_efficiency")
    out: dict[str, AttentionEfficiency] = {}
    for dtype, raw in section.items():
        path = f"attention_efficiency.{dtype}"
        entry = _mapping(ctx, raw, path)
        _require(ctx, entry, path, ATTENTION_KEYS)
        x = _numbers(ctx, entry["attention_flops"], f"{path}.attention_flops")
        curves = []
        for side in ("forward", "backward"):
            key = f"{path}.{side}_fraction_of_peak"
            y = _numbers(ctx, entry[f"{side}_fraction_of_peak"], key)
            if any(not f > 0 for f in y):
                raise ctx.error(key, f"values must be positive, got {y}")
            curves.append(_curve(ctx, x, y, path, provenance[path]))
        try:
            out[dtype] = AttentionEfficiency(
                forward=curves[0], backward=curves[1], source=provenance[path]
            )
        except SpecError as exc:
            raise ctx.error(path, str(exc)) from None
    return out


def _read_host_overhead(ctx: _Ctx, top: Mapping[str, object]) -> HostOverhead | None:
    """``host_overhead: {serial, forward_op_us, backward_op_us[, dtensor_forward_op_us,
    dtensor_backward_op_us]}`` -> :class:`HostOverhead` in seconds (None if absent).

    Raises:
        InputFileError: a key is missing, unknown or ill-typed, or a value is negative.
    """
    if "host_overhead" not in top:
        return None
    section = _mapping(ctx, top["host_overhead"], "host_overhead")
    _require(ctx, section, "host_overhead", HOST_OVERHEAD_KEYS, HOST_OVERHEAD_OPTIONAL_KEYS)
    serial = section["serial"]
    if not isinstance(serial, bool):
        raise ctx.error("host_overhead.serial", f"expected true or false, got {serial!r}")
    values = {
        s.field: s.to_si(_number(ctx, section[s.key], f"host_overhead.{s.key}"))
        for s in HOST_OVERHEAD_SCALARS
        if s.key in section
    }
    try:
        return HostOverhead(serial=serial, **values)
    except SpecError as exc:
        raise ctx.error("host_overhead", str(exc)) from None


def _read_fraction_curve(
    ctx: _Ctx, top: Mapping[str, object], provenance: Mapping[str, str], path: str
) -> Curve | None:
    """``inter_node_ring_scaling: {num_nodes, busbw_fraction}`` (the curve of
    ``HardwareProfile.inter_node_ring_fraction``) or ``inter_node_message_scaling:
    {message_bytes, busbw_fraction}`` (``inter_node_message_fraction``), by ``path``; None if
    the section is absent.

    Raises:
        InputFileError: a key is missing, unknown or ill-typed, the lists differ in length,
            x does not increase, or a fraction is outside (0, 1].
    """
    if path not in top:
        return None
    x_key = FRACTION_CURVES[path][0]
    section = _mapping(ctx, top[path], path)
    _require(ctx, section, path, (x_key, "busbw_fraction"))
    x = _numbers(ctx, section[x_key], f"{path}.{x_key}")
    y = _numbers(ctx, section["busbw_fraction"], f"{path}.busbw_fraction")
    if any(not 0 < f <= 1 for f in y):
        raise ctx.error(f"{path}.busbw_fraction", f"values must be in (0, 1], got {y}")
    return _curve(ctx, x, y, path, provenance[path])


def _extra_number_keys(top: Mapping[str, object]) -> set[str]:
    """Provenance keys the optional sections of ``top`` need."""
    keys: set[str] = set()
    attention = top.get("attention_efficiency")
    if isinstance(attention, Mapping):
        keys |= {f"attention_efficiency.{d}" for d in attention}
    host = top.get("host_overhead")
    if isinstance(host, Mapping):
        keys |= {f"host_overhead.{k}" for k in HOST_OVERHEAD_KEYS if k in host}
    keys |= {path for path in FRACTION_CURVES if path in top}
    return keys


def _number_keys(top: Mapping[str, object]) -> set[str]:
    """Dotted keys that need a provenance entry (one per number or curve in the file)."""
    keys = {s.key for s in SCALARS} | {"gpus_per_node"}
    keys |= {s.key for s in OPTIONAL_SCALARS if s.key in top}
    peaks, matmul = top["peak_tflops"], top["matmul_efficiency"]
    if isinstance(peaks, Mapping):
        keys |= {f"peak_tflops.{d}" for d in peaks}
    if isinstance(matmul, Mapping):
        keys |= {f"matmul_efficiency.{d}" for d in matmul}
    intra = top["intra_node"]
    optional = [c for c in OPTIONAL_COLLECTIVES if isinstance(intra, Mapping) and c in intra]
    for name in (*COLLECTIVES, *optional):
        keys |= {f"intra_node.{name}", f"intra_node.{name}.latency_us"}
    host = top.get("host")
    if isinstance(host, Mapping):
        keys |= {f"host.{s.key}" for s in HOST_SCALARS if s.key in host}
    return keys | _extra_number_keys(top)


def _read_provenance(ctx: _Ctx, top: Mapping[str, object]) -> dict[str, str]:
    """``provenance: {dotted key: source}``; every number needs one, no stray entries."""
    raw = _mapping(ctx, top["provenance"], "provenance")
    provenance = {k: _text(ctx, v, f"provenance.{k}") for k, v in raw.items()}
    needed = _number_keys(top)
    missing = sorted(needed - provenance.keys())
    if missing:
        raise ctx.error("provenance", f"no source given for: {', '.join(missing)}")
    stray = sorted(provenance.keys() - needed)
    if stray:
        raise ctx.error(
            "provenance", f"entries for keys the file does not have: {', '.join(stray)}"
        )
    return provenance
