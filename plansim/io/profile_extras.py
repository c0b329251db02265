"""The optional sections of a profile YAML: ``attention_efficiency``, ``host_overhead``,
``inter_node_ring_scaling`` and ``inter_node_message_scaling`` (read for ``profile_parse``,
written for ``profiles``).

All are documented in ``hardware_profiles/README.md``; a file without them loads with
``HardwareProfile.attention_efficiency == {}``, ``host_overhead is None``,
``inter_node_ring_fraction is None`` and ``inter_node_message_fraction is None``, which leaves
every cost as it was. Provenance keys: ``attention_efficiency.<dtype>`` (one per curve),
``host_overhead.<key>`` (one per value, ``serial`` included), ``inter_node_ring_scaling`` and
``inter_node_message_scaling`` (one per curve).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plansim.errors import SpecError
from plansim.io.profile_parse import _Ctx, _curve, _mapping, _number, _numbers, _require
from plansim.io.profile_schema import ATTENTION_KEYS, FRACTION_CURVES, HOST_OVERHEAD_SCALARS
from plansim.specs.compute_terms import AttentionEfficiency, HostOverhead
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile

#: Keys of ``host_overhead:`` in file order; the first three are required in the section.
HOST_OVERHEAD_KEYS = ("serial", *(s.key for s in HOST_OVERHEAD_SCALARS))
_HOST_OVERHEAD_OPTIONAL = tuple(
    s.key for s in HOST_OVERHEAD_SCALARS if s.key not in ("forward_op_us", "backward_op_us")
)


def read_attention(
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


def read_host_overhead(ctx: _Ctx, top: Mapping[str, object]) -> HostOverhead | None:
    """``host_overhead: {serial, forward_op_us, backward_op_us[, dtensor_forward_op_us,
    dtensor_backward_op_us]}`` -> :class:`HostOverhead` in seconds (None if absent).

    Raises:
        InputFileError: a key is missing, unknown or ill-typed, or a value is negative.
    """
    if "host_overhead" not in top:
        return None
    section = _mapping(ctx, top["host_overhead"], "host_overhead")
    _require(ctx, section, "host_overhead", HOST_OVERHEAD_KEYS, _HOST_OVERHEAD_OPTIONAL)
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


def read_fraction_curve(
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


def extra_number_keys(top: Mapping[str, object]) -> set[str]:
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


def host_overhead_keys(host: HostOverhead) -> tuple[str, ...]:
    """YAML keys of ``host_overhead:`` that ``host`` has values for, in file order."""
    present = {"serial"} | {
        s.key for s in HOST_OVERHEAD_SCALARS if getattr(host, s.field) is not None
    }
    return tuple(k for k in HOST_OVERHEAD_KEYS if k in present)


def extras_to_dict(profile: HardwareProfile, tidy: Any) -> dict[str, Any]:
    """The optional sections of ``profile`` as YAML-ready entries in edge units ({} when it
    has neither); ``tidy`` rounds one number (``plansim.io.profiles._tidy``)."""
    data: dict[str, Any] = {}
    if profile.attention_efficiency:
        data["attention_efficiency"] = {
            dtype: {
                "attention_flops": [tidy(x) for x in curves.forward.x],
                "forward_fraction_of_peak": [tidy(y) for y in curves.forward.y],
                "backward_fraction_of_peak": [tidy(y) for y in curves.backward.y],
            }
            for dtype, curves in profile.attention_efficiency.items()
        }
    host = profile.host_overhead
    if host is not None:
        section: dict[str, Any] = {"serial": host.serial}
        for s in HOST_OVERHEAD_SCALARS:
            value = getattr(host, s.field)
            if value is not None:
                section[s.key] = tidy(s.from_si(value))
        data["host_overhead"] = section
    for path, (x_key, attr) in FRACTION_CURVES.items():
        curve = getattr(profile, attr)
        if curve is not None:
            data[path] = {
                x_key: [tidy(x) for x in curve.x],
                "busbw_fraction": [tidy(y) for y in curve.y],
            }
    return data


def extras_provenance(profile: HardwareProfile) -> dict[str, str]:
    """Provenance entries the curves carry themselves (used when the profile's mapping has
    none for them)."""
    entries = {
        f"attention_efficiency.{dtype}": curves.source
        for dtype, curves in profile.attention_efficiency.items()
        if curves.source
    }
    for path, (_, attr) in FRACTION_CURVES.items():
        curve = getattr(profile, attr)
        if curve is not None and curve.source:
            entries[path] = curve.source
    return entries
