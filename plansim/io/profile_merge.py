"""Merging measured numbers into a hardware profile (pure): :class:`ProfileUpdate` holds what
a calibration, an nccl-tests import or a validator refit measured, with its provenance;
:func:`merge_profile` replaces those entries of a base profile and keeps every other entry
and its source. Re-exported by :mod:`plansim.io.profiles`, the profile reader/writer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plansim.errors import InputFileError, SpecError
from plansim.io.profile_schema import HOST_SCALARS, OPTIONAL_SCALARS, SCALARS, host_overhead_keys
from plansim.specs.compute_terms import AttentionEfficiency, HostOverhead
from plansim.specs.curves import COLLECTIVES, CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile, HostSpec

#: HardwareProfile scalar field -> its YAML key (the provenance key of that number).
SCALAR_KEYS = {s.field: s.key for s in SCALARS}
#: Optional HardwareProfile scalar field -> its YAML key (``overlap_compute_slowdown_fraction``).
OPTIONAL_SCALAR_KEYS = {s.field: s.key for s in OPTIONAL_SCALARS}
#: HostSpec field -> its dotted YAML key (the provenance key of that number).
HOST_KEYS = {s.field: f"host.{s.key}" for s in HOST_SCALARS}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileUpdate:
    """Measured numbers that replace a profile's entries (SI units), with their provenance.

    Attributes:
        name, description: replace the profile's when given.
        peak_flops_per_s, matmul_efficiency, intra_node: entries replaced per key (dtype or
            collective); the profile's other keys stay. ``intra_node`` may hold the optional
            ``all_to_all`` (``curves.OPTIONAL_COLLECTIVES``): added to a profile without one.
        scalars: HardwareProfile scalar fields (``hbm_bytes_per_s``, ``nic_latency_s``, ...;
            see :data:`SCALAR_KEYS`) and optional ones (:data:`OPTIONAL_SCALAR_KEYS`:
            ``overlap_compute_slowdown_fraction``) -> SI value.
        gpus_per_node: replaces the profile's when given.
        attention_efficiency: per dtype, replaces the profile's attention curves.
        host_overhead: replaces the profile's ``host_overhead`` section as a whole.
        inter_node_ring_fraction: replaces the profile's ``inter_node_ring_scaling`` curve.
        inter_node_message_fraction: replaces its ``inter_node_message_scaling`` curve.
        host: ``HostSpec`` fields (``memory_bytes``, ``adam_params_per_s``, ...; see
            :data:`HOST_KEYS`) -> SI value, replacing those of the profile's host section
            (created when the profile has none; its other fields stay).
        provenance: dotted YAML key (``peak_tflops.fp32``, ``intra_node.all_reduce``,
            ``intra_node.all_reduce.latency_us``, ``hbm_bandwidth_gb_per_s``) -> source; every
            replaced number needs one.
    """

    name: str | None = None
    description: str | None = None
    peak_flops_per_s: Mapping[str, float] = field(default_factory=dict)
    matmul_efficiency: Mapping[str, Curve] = field(default_factory=dict)
    intra_node: Mapping[str, CollectiveCurve] = field(default_factory=dict)
    scalars: Mapping[str, float] = field(default_factory=dict)
    gpus_per_node: int | None = None
    provenance: Mapping[str, str] = field(default_factory=dict)
    host: Mapping[str, float] = field(default_factory=dict)
    attention_efficiency: Mapping[str, AttentionEfficiency] = field(default_factory=dict)
    host_overhead: HostOverhead | None = None
    inter_node_ring_fraction: Curve | None = None
    inter_node_message_fraction: Curve | None = None

    def replaced_keys(self) -> list[str]:
        """Dotted keys of the numbers this update replaces."""
        keys = [f"peak_tflops.{d}" for d in self.peak_flops_per_s]
        keys += [f"matmul_efficiency.{d}" for d in self.matmul_efficiency]
        for name in self.intra_node:
            keys += [f"intra_node.{name}", f"intra_node.{name}.latency_us"]
        keys += [{**SCALAR_KEYS, **OPTIONAL_SCALAR_KEYS}[f] for f in self.scalars]
        keys += [HOST_KEYS[f] for f in self.host]
        keys += [f"attention_efficiency.{d}" for d in self.attention_efficiency]
        if self.host_overhead is not None:
            keys += [f"host_overhead.{k}" for k in host_overhead_keys(self.host_overhead)]
        if self.inter_node_ring_fraction is not None:
            keys.append("inter_node_ring_scaling")
        if self.inter_node_message_fraction is not None:
            keys.append("inter_node_message_scaling")
        return keys + (["gpus_per_node"] if self.gpus_per_node is not None else [])


def merge_profile(base: HardwareProfile | None, update: ProfileUpdate) -> HardwareProfile:
    """``base`` with the entries of ``update`` replaced and every other entry (and its
    provenance) kept; with no ``base``, ``update`` must hold every field.

    Raises:
        InputFileError: an updated number has no provenance, a field is missing with no base,
            or the result is not a valid profile.
    """
    _check_update(base, update)
    fields: dict[str, Any] = {}
    if base is not None:
        fields = {
            "name": base.name,
            "description": base.description,
            "gpus_per_node": base.gpus_per_node,
            **{f: getattr(base, f) for f in (*SCALAR_KEYS, *OPTIONAL_SCALAR_KEYS)},
        }
    fields.update(update.scalars)
    for key in ("name", "description", "gpus_per_node"):
        if getattr(update, key) is not None:
            fields[key] = getattr(update, key)
    fields.setdefault("description", fields["name"])
    try:
        return HardwareProfile(
            **fields,
            peak_flops_per_s={**(base.peak_flops_per_s if base else {}), **update.peak_flops_per_s},
            matmul_efficiency={
                **(base.matmul_efficiency if base else {}),
                **update.matmul_efficiency,
            },
            intra_node={**(base.intra_node if base else {}), **update.intra_node},
            provenance={**_kept_provenance(base, update), **update.provenance},
            host=_merge_host(base.host if base else None, update.host),
            attention_efficiency={
                **(base.attention_efficiency if base else {}),
                **update.attention_efficiency,
            },
            host_overhead=update.host_overhead or (base.host_overhead if base else None),
            inter_node_ring_fraction=update.inter_node_ring_fraction
            or (base.inter_node_ring_fraction if base else None),
            inter_node_message_fraction=update.inter_node_message_fraction
            or (base.inter_node_message_fraction if base else None),
        )
    except SpecError as exc:
        raise InputFileError(f"merged profile is invalid: {exc}") from None


def _check_update(base: HardwareProfile | None, update: ProfileUpdate) -> None:
    """Refuse an update with unknown fields, a number without a source, or (with no base)
    less than a whole profile.

    Raises:
        InputFileError: naming the fields.
    """
    unknown = sorted(set(update.scalars) - set(SCALAR_KEYS) - set(OPTIONAL_SCALAR_KEYS))
    unknown += sorted(f"host.{f}" for f in set(update.host) - set(HOST_KEYS))
    if unknown:
        raise InputFileError(f"update has unknown scalar fields: {', '.join(unknown)}")
    missing = sorted(k for k in update.replaced_keys() if k not in update.provenance)
    if missing:
        raise InputFileError(f"update gives no source for: {', '.join(missing)}")
    if base is None:
        absent = sorted(set(SCALAR_KEYS) - set(update.scalars))
        absent += [k for k in ("name", "gpus_per_node") if getattr(update, k) is None]
        absent += [f"intra_node.{c}" for c in COLLECTIVES if c not in update.intra_node]
        if absent or not update.peak_flops_per_s:
            raise InputFileError(
                "cannot create a profile from these measurements alone: missing "
                f"{', '.join(absent) or 'peaks'}; merge into an existing profile"
            )


def _kept_provenance(base: HardwareProfile | None, update: ProfileUpdate) -> dict[str, str]:
    """The base's provenance, less the ``host_overhead.*`` entries when the update replaces
    that section (a key the new section lacks must not keep a stray entry)."""
    if base is None:
        return {}
    if update.host_overhead is None:
        return dict(base.provenance)
    return {k: v for k, v in base.provenance.items() if not k.startswith("host_overhead.")}


def _merge_host(base: HostSpec | None, update: Mapping[str, float]) -> HostSpec | None:
    """``base`` with the fields in ``update`` replaced (a new section when ``base`` is None).

    Raises:
        SpecError: the merged section is invalid (e.g. no memory or Adam rate).
    """
    if not update:
        return base
    fields: dict[str, Any] = {}
    if base is not None:
        fields = {f: getattr(base, f) for f in HOST_KEYS}
    fields.update(update)
    missing = sorted(
        HOST_KEYS[f] for f in ("memory_bytes", "adam_params_per_s") if fields.get(f) is None
    )
    if missing:
        raise SpecError(f"host section lacks {', '.join(missing)}")
    return HostSpec(**fields)
