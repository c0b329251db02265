"""Readers of the whole-run input files: ramp, failures, facility and prices (YAML).

Each file is one mapping, read with the strict safe loader (``plansim.io.strict_yaml``);
unknown keys, missing keys and bad values are one :class:`InputFileError` naming the file,
the key and what is allowed. Units are in the key names (``_min``, ``_gb_per_s``, ``_w``).

Ramp file (``--ramp``)::

    phases:                      # Llama 3 405B, Dubey et al. 2024 §3.4.1
      - {until_tokens: 252.0e6, global_batch_size: 1024, seq_length: 4096}
      - {until_tokens: 2.87e12, global_batch_size: 1024}
      - {global_batch_size: 2048}          # the last phase runs to --tokens
    data_loading_s_per_step: 0   # optional
    eval_interval_tokens: 1.0e11 # optional, with eval_s
    eval_s: 300

or Megatron-LM's gradual ramp (``--rampup-batch-size <start> <increment> <samples>``)::

    rampup_batch_size: [3072, 1536, 114440000]
    global_batch_size: 15360

Failures file (``--failures``): ``interruptions_per_gpu_hour``, ``restart_min``,
``checkpoint_write_gb_per_s``, optional ``checkpoint_interval_min`` and ``source``.
Facility file (``--facility``): ``pue``, ``host_power_w_per_node``,
``network_power_w_per_gpu``, ``source``. Prices file (``--prices``): ``usd_per_gpu_hour``
(a mapping of hardware profile name to dollars), optional ``usd_per_kwh`` and ``source``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from plansim.errors import InputFileError, PlansimError
from plansim.io.strict_yaml import strict_load
from plansim.specs.facility import Facility, PriceTable
from plansim.specs.failure_model import FailureModel
from plansim.specs.training_run import RampPhase, TrainingRun, rampup_phases
from plansim.units import gb_per_s_to_bytes_per_s

#: A number YAML 1.1 reads as text ("252e6" has no dot): accepted where a number is due.
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
SECONDS_PER_MINUTE = 60.0


def _load(path: Path, what: str) -> Mapping[str, Any]:
    try:
        data = strict_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read the {what} file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise InputFileError(f"{path}: a {what} file is one mapping of keys to values")
    return data


def _keys(
    path: Path, data: Mapping[str, Any], *, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    unknown = sorted(str(k) for k in data if k not in required + optional)
    if unknown:
        allowed = ", ".join(required + optional)
        raise InputFileError(f"{path}: unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    missing = [k for k in required if k not in data]
    if missing:
        raise InputFileError(f"{path}: missing key(s): {', '.join(missing)}")


def _number(path: Path, key: str, value: object) -> float:
    if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputFileError(f"{path}: {key}: expected a finite number, got {value!r}")
    return float(value)


def _integer(path: Path, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputFileError(f"{path}: {key}: expected an integer, got {value!r}")
    return value


def _text(path: Path, key: str, value: object) -> str:
    if not isinstance(value, str):
        raise InputFileError(f"{path}: {key}: expected text, got {value!r}")
    return value


def _build(path: Path, build: Any, **kwargs: Any) -> Any:
    """``build(**kwargs)``, its SpecError reported against ``path``."""
    try:
        return build(**kwargs)
    except PlansimError as exc:
        raise InputFileError(f"{path}: {exc}") from None


_PHASE_KEYS = ("global_batch_size", "until_tokens", "seq_length")
_RAMP_OPTIONAL = (
    "phases",
    "rampup_batch_size",
    "global_batch_size",
    "seq_length",
    "data_loading_s_per_step",
    "eval_interval_tokens",
    "eval_s",
)


def read_ramp(path: Path, *, tokens: float, seq_length: int) -> TrainingRun:
    """The :class:`TrainingRun` of a ramp file for a run of ``tokens`` tokens; ``seq_length``
    is the model's (a phase without one uses it).

    Raises:
        InputFileError: the file is unreadable, not YAML, has unknown or missing keys, bad
            values, or a ramp that does not reach ``tokens`` (names the key).
    """
    data = _load(path, "ramp")
    _keys(path, data, required=(), optional=_RAMP_OPTIONAL)
    if ("phases" in data) == ("rampup_batch_size" in data):
        raise InputFileError(
            f"{path}: give either phases (a list) or rampup_batch_size with "
            "global_batch_size (Megatron-LM's --rampup-batch-size), not both or neither"
        )
    phases = _listed_phases(path, data) if "phases" in data else _rampup(path, data, seq_length)
    extras = {
        key: _number(path, key, data[key])
        for key in ("data_loading_s_per_step", "eval_interval_tokens", "eval_s")
        if key in data
    }
    run: TrainingRun = _build(path, TrainingRun, tokens=tokens, phases=phases, **extras)
    return run


def _listed_phases(path: Path, data: Mapping[str, Any]) -> tuple[RampPhase, ...]:
    for key in ("global_batch_size", "seq_length"):
        if key in data:
            raise InputFileError(f"{path}: {key}: goes inside each of phases, not beside it")
    listed = data["phases"]
    if not isinstance(listed, list) or not listed:
        raise InputFileError(f"{path}: phases: expected a non-empty list of phases")
    out = []
    for i, item in enumerate(listed):
        where = f"phases[{i}]"
        if not isinstance(item, Mapping):
            raise InputFileError(f"{path}: {where}: expected a mapping, got {item!r}")
        _keys(path, item, required=("global_batch_size",), optional=_PHASE_KEYS[1:])
        kwargs: dict[str, Any] = {
            "global_batch_size": _integer(
                path, f"{where}.global_batch_size", item["global_batch_size"]
            )
        }
        if "until_tokens" in item:
            kwargs["until_tokens"] = _number(path, f"{where}.until_tokens", item["until_tokens"])
        if "seq_length" in item:
            kwargs["seq_length"] = _integer(path, f"{where}.seq_length", item["seq_length"])
        out.append(_build(path, RampPhase, **kwargs))
    return tuple(out)


def _rampup(path: Path, data: Mapping[str, Any], seq_length: int) -> tuple[RampPhase, ...]:
    triple = data["rampup_batch_size"]
    if not isinstance(triple, list) or len(triple) != 3:
        raise InputFileError(
            f"{path}: rampup_batch_size: expected [start, increment, ramp-up samples] "
            f"(Megatron-LM --rampup-batch-size), got {triple!r}"
        )
    if "global_batch_size" not in data:
        raise InputFileError(f"{path}: rampup_batch_size needs global_batch_size (the final one)")
    start, increment, samples = (
        _integer(path, f"rampup_batch_size[{i}]", v) for i, v in enumerate(triple)
    )
    final = _integer(path, "global_batch_size", data["global_batch_size"])
    seq = _integer(path, "seq_length", data["seq_length"]) if "seq_length" in data else seq_length
    ramp: tuple[RampPhase, ...] = _build(
        path,
        rampup_phases,
        start_global_batch_size=start,
        batch_size_increment=increment,
        rampup_samples=samples,
        global_batch_size=final,
        seq_length=seq,
    )
    return (*ramp, _build(path, RampPhase, global_batch_size=final, seq_length=seq))


def read_failures(path: Path) -> FailureModel:
    """The :class:`FailureModel` of a failures file.

    Raises:
        InputFileError: unreadable, not YAML, unknown/missing keys or bad values.
    """
    data = _load(path, "failures")
    _keys(
        path,
        data,
        required=("interruptions_per_gpu_hour", "restart_min", "checkpoint_write_gb_per_s"),
        optional=("checkpoint_interval_min", "source"),
    )
    interval = data.get("checkpoint_interval_min")
    model: FailureModel = _build(
        path,
        FailureModel,
        interruptions_per_gpu_hour=_number(
            path, "interruptions_per_gpu_hour", data["interruptions_per_gpu_hour"]
        ),
        restart_s=_number(path, "restart_min", data["restart_min"]) * SECONDS_PER_MINUTE,
        checkpoint_write_bytes_per_s=gb_per_s_to_bytes_per_s(
            _number(path, "checkpoint_write_gb_per_s", data["checkpoint_write_gb_per_s"])
        ),
        checkpoint_interval_s=None
        if interval is None
        else _number(path, "checkpoint_interval_min", interval) * SECONDS_PER_MINUTE,
        source=_text(path, "source", data.get("source", "")),
    )
    return model


def read_facility(path: Path) -> Facility:
    """The :class:`Facility` of a facility file.

    Raises:
        InputFileError: unreadable, not YAML, unknown/missing keys or bad values.
    """
    data = _load(path, "facility")
    keys = ("pue", "host_power_w_per_node", "network_power_w_per_gpu")
    _keys(path, data, required=keys, optional=("source",))
    facility: Facility = _build(
        path,
        Facility,
        source=_text(path, "source", data.get("source", "")),
        **{key: _number(path, key, data[key]) for key in keys},
    )
    return facility


def read_prices(path: Path) -> PriceTable:
    """The :class:`PriceTable` of a prices file.

    Raises:
        InputFileError: unreadable, not YAML, unknown/missing keys or bad values.
    """
    data = _load(path, "prices")
    _keys(path, data, required=("usd_per_gpu_hour",), optional=("usd_per_kwh", "source"))
    table = data["usd_per_gpu_hour"]
    if not isinstance(table, Mapping):
        raise InputFileError(
            f"{path}: usd_per_gpu_hour: expected a mapping of hardware profile name to dollars"
        )
    prices = {
        str(name): _number(path, f"usd_per_gpu_hour.{name}", value) for name, value in table.items()
    }
    kwh = data.get("usd_per_kwh")
    result: PriceTable = _build(
        path,
        PriceTable,
        usd_per_gpu_hour=prices,
        usd_per_kwh=None if kwh is None else _number(path, "usd_per_kwh", kwh),
        source=_text(path, "source", data.get("source", "")),
    )
    return result
