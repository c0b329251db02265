"""The only reader/writer of hardware profile YAML (``hardware_profiles/*.yaml``).

A profile file holds numbers in edge units named by their keys (``peak_tflops``,
``hbm_capacity_gib`` = 2**30 bytes, ``memory_reserve_gib`` = 2**30 bytes, ``latency_us``,
``busbw_gb_per_s``, ...) and a ``provenance`` mapping from the dotted key of every number to
its source. This module converts to SI (FLOP/s, bytes, bytes/s, seconds) and builds
:class:`plansim.specs.hardware.HardwareProfile`; ``profile_to_dict`` converts back.
The schema, the provenance rules and how each shipped number was derived are in
``hardware_profiles/README.md``.

Every problem with a file is an :class:`InputFileError` naming the file and the key path
(``hardware_profiles/x.yaml: intra_node.all_reduce.busbw_gb_per_s: expected a list of
numbers, got 'abc'``); there are no silent defaults for required keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from plansim.errors import InputFileError, UnknownNameError
from plansim.io.outputs import replace_file
from plansim.io.profile_merge import (
    HOST_KEYS,
    OPTIONAL_SCALAR_KEYS,
    SCALAR_KEYS,
    ProfileUpdate,
    merge_profile,
)
from plansim.io.profile_parse import profile_from_dict
from plansim.io.profile_schema import (
    FRACTION_CURVES,
    HEADER,
    HOST_OVERHEAD_SCALARS,
    HOST_SCALARS,
    OPTIONAL_SCALARS,
    SCALARS,
    SCHEMA_VERSION,
    TOP_LEVEL_KEYS,
)
from plansim.io.strict_yaml import strict_load
from plansim.specs.curves import KNOWN_COLLECTIVES
from plansim.specs.hardware import HardwareProfile
from plansim.units import (
    bytes_per_s_to_gb_per_s,
    flops_per_s_to_tflops,
    s_to_us,
)

__all__ = [
    "HOST_KEYS",
    "OPTIONAL_SCALAR_KEYS",
    "SCALAR_KEYS",
    "SCHEMA_VERSION",
    "ProfileUpdate",
    "list_profiles",
    "load_profile",
    "merge_profile",
    "profile_from_dict",
    "profile_to_dict",
    "profile_to_yaml",
    "profiles_dir",
    "write_profile",
]


# --------------------------------------------------------------------------- locating
def profiles_dir() -> Path:
    """The shipped ``hardware_profiles/`` folder (next to the ``plansim`` package)."""
    return Path(__file__).resolve().parents[2] / "hardware_profiles"


def list_profiles() -> list[str]:
    """Names (file stems) of the shipped profiles, sorted; empty if the folder is missing."""
    folder = profiles_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml"))


def list_datasheet_profiles() -> list[str]:
    """:func:`list_profiles` less the measured ones (a ``<name>.raw.csv`` of ``plansim
    calibrate`` beside the YAML): the GPU kinds a published run's GPU name can designate
    (``plansim.io.profile_names``). A measured profile, one machine's figures, is used by its
    exact name only."""
    folder = profiles_dir()
    return [n for n in list_profiles() if not (folder / f"{n}.raw.csv").is_file()]


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path or os.sep in name_or_path


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a shipped profile by name (``h100-sxm5-80gb``) or any profile file by path.

    Args:
        name_or_path: a name from :func:`list_profiles`, or a path ending in ``.yaml``/``.yml``
            (or containing a path separator).

    Raises:
        UnknownNameError: ``name_or_path`` is neither a path nor a shipped profile name.
        InputFileError: the file is missing, unreadable, malformed or invalid; for a name,
            also when the file's ``name`` differs from its stem.
    """
    if _looks_like_path(name_or_path):
        return _load_file(Path(name_or_path), source=name_or_path)
    known = list_profiles()
    if name_or_path not in known:
        raise UnknownNameError("hardware profile", name_or_path, known)
    source = f"{profiles_dir().name}/{name_or_path}.yaml"
    profile = _load_file(profiles_dir() / f"{name_or_path}.yaml", source=source)
    if profile.name != name_or_path:
        raise InputFileError(
            f"{source}: name: {profile.name!r} differs from the file name {name_or_path!r}"
        )
    return profile


def _load_file(path: Path, *, source: str) -> HardwareProfile:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{source}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{source}: cannot read: {exc}") from None
    try:
        data = strict_load(text)
    except yaml.YAMLError as exc:
        raise InputFileError(f"{source}: malformed YAML: {_yaml_problem(exc)}") from None
    return profile_from_dict(data, source=source)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line describing a YAML error, with its line and column when known."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(problem)


# --------------------------------------------------------------------------- writing
def _tidy(value: float) -> float | int:
    """An edge-unit number for YAML: exact integers stay; other values are rounded to 12
    significant digits, which undoes the float noise of an SI -> edge conversion."""
    if float(value).is_integer() and abs(value) < 2**53:
        return int(value)
    rounded = float(f"{value:.12g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) < 1e15 else rounded


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """The profile as a YAML-ready dict in edge units (inverse of :func:`profile_from_dict`).

    Provenance is ``profile.provenance``; a curve without an entry there contributes its own
    ``source`` text when it has one.
    """
    provenance = dict(profile.provenance)
    matmul: dict[str, Any] = {}
    for dtype, curve in profile.matmul_efficiency.items():
        matmul[dtype] = {
            "gemm_flops": [_tidy(x) for x in curve.x],
            "fraction_of_peak": [_tidy(y) for y in curve.y],
        }
        if curve.source:
            provenance.setdefault(f"matmul_efficiency.{dtype}", curve.source)
    intra: dict[str, Any] = {}
    # required collectives first, then the optional ones present (all_to_all): file order
    for name in sorted(profile.intra_node, key=KNOWN_COLLECTIVES.index):
        coll = profile.intra_node[name]
        intra[name] = {
            "latency_us": _tidy(s_to_us(coll.latency_s)),
            "message_bytes": [_tidy(x) for x in coll.busbw_bytes_per_s.x],
            "busbw_gb_per_s": [_tidy(bytes_per_s_to_gb_per_s(y)) for y in coll.busbw_bytes_per_s.y],
        }
        if coll.source:
            provenance.setdefault(f"intra_node.{name}", coll.source)
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "name": profile.name,
        "description": profile.description,
        "peak_tflops": {
            d: _tidy(flops_per_s_to_tflops(v)) for d, v in profile.peak_flops_per_s.items()
        },
        "matmul_efficiency": matmul,
    }
    for s in SCALARS:
        data[s.key] = _tidy(s.from_si(getattr(profile, s.field)))
    for s in OPTIONAL_SCALARS:  # written when not the default, or when measured (with its source)
        default = HardwareProfile.__dataclass_fields__[s.field].default
        if getattr(profile, s.field) != default or s.key in provenance:
            data[s.key] = _tidy(s.from_si(getattr(profile, s.field)))
    data["gpus_per_node"] = profile.gpus_per_node
    data["intra_node"] = intra
    if profile.host is not None:
        data["host"] = {
            s.key: _tidy(s.from_si(value))
            for s in HOST_SCALARS
            if (value := getattr(profile.host, s.field)) is not None
        }
    data.update(_extras_to_dict(profile))
    data["provenance"] = {**_extras_provenance(profile), **provenance}
    return {key: data[key] for key in TOP_LEVEL_KEYS if key in data}


def _extras_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """The optional sections of ``profile`` (``attention_efficiency``, ``host_overhead``,
    ``inter_node_*_scaling``) as YAML-ready entries in edge units ({} when it has none)."""
    data: dict[str, Any] = {}
    if profile.attention_efficiency:
        data["attention_efficiency"] = {
            dtype: {
                "attention_flops": [_tidy(x) for x in curves.forward.x],
                "forward_fraction_of_peak": [_tidy(y) for y in curves.forward.y],
                "backward_fraction_of_peak": [_tidy(y) for y in curves.backward.y],
            }
            for dtype, curves in profile.attention_efficiency.items()
        }
    host = profile.host_overhead
    if host is not None:
        section: dict[str, Any] = {"serial": host.serial}
        for s in HOST_OVERHEAD_SCALARS:
            value = getattr(host, s.field)
            if value is not None:
                section[s.key] = _tidy(s.from_si(value))
        data["host_overhead"] = section
    for path, (x_key, attr) in FRACTION_CURVES.items():
        curve = getattr(profile, attr)
        if curve is not None:
            data[path] = {
                x_key: [_tidy(x) for x in curve.x],
                "busbw_fraction": [_tidy(y) for y in curve.y],
            }
    return data


def _extras_provenance(profile: HardwareProfile) -> dict[str, str]:
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


def _dump(data: Mapping[str, Any]) -> str:
    """YAML text: lists of numbers in flow style, provenance one entry per line."""
    parts = [HEADER]
    for key, value in data.items():
        # None: collections of scalars (lists, peak_tflops) in flow style; False: block style
        # for scalars (else the one-key document itself turns into a flow mapping) and
        # provenance (one entry per line)
        flow = None if isinstance(value, dict | list) and key != "provenance" else False
        parts.append(
            yaml.safe_dump(
                {key: value},
                sort_keys=False,
                default_flow_style=flow,
                width=100,
                allow_unicode=True,
            )
        )
    return "".join(parts)


def write_profile(profile: HardwareProfile, path: str | Path) -> None:
    """Write ``profile`` as YAML to ``path`` atomically (temp file in the same folder, then
    ``os.replace``): on any failure the previous file is left untouched.

    Raises:
        InputFileError: the profile would not load back (e.g. a number without provenance).
    """
    target = Path(path)
    data = profile_to_dict(profile)
    profile_from_dict(data, source=str(target))  # never write a file that cannot be read
    replace_file(target, _dump(data))


def profile_to_yaml(profile: HardwareProfile) -> str:
    """The YAML text :func:`write_profile` would write (for ``--dry-run`` output).

    Raises:
        InputFileError: the profile would not load back.
    """
    data = profile_to_dict(profile)
    profile_from_dict(data, source=profile.name)
    return _dump(data)
