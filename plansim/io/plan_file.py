"""Plan files: one parallel plan with what it was planned for, as YAML (the only reader and
writer of the format).

A plan file names the model, the hardware profile and the GPU count, and holds every field of
the plan by group, each under the name :mod:`plansim.specs.plan` gives it (Megatron-LM's
argument names where one exists), enums as their values::

    plansim_plan: 1
    model: gpt3-175b
    gpu: a100-sxm4-80gb
    num_gpus: 1024
    seq_length: null
    plan:
      dims: {dp: 32, tp: 4, pp: 8, cp: 1, vpp: 6, sequence_parallel: true, ep: 1, etp: null}
      batch: {micro_batch_size: 1, global_batch_size: 1536}
      sharding: {zero_stage: 1, ...}
      recomputation: {recompute: none, ...}
      pipeline: {schedule: interleaved-1f1b, ...}
      overlap: {overlap_p2p_comm: true, ...}
      mixed_precision: {precision: bf16, ...}
      execution: {framework: megatron-core, ...}
    prediction: {step_time_s: 16.897, ...}   # optional, written by `plansim plan`, not read

Every field is written, so a file says the whole plan and two files diff field by field; a
field left out of a file read takes its group's default. Files are read with PyYAML's safe
loader (duplicate keys and aliases refused, ``plansim.io.strict_yaml``) and written
atomically; every error names the file, the key and the allowed values.
"""

from __future__ import annotations

import enum
import os
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from plansim.errors import InputFileError, SpecError
from plansim.io.outputs import write_text_atomic
from plansim.io.strict_yaml import strict_load
from plansim.specs.choice_enum import parse_enum
from plansim.specs.plan import FIELD_GROUP, GROUPS, PLAN_FIELDS, ParallelPlan, plan_from_fields

#: The format version this module reads and writes (the file's ``plansim_plan`` key).
FORMAT_VERSION = 1
_TOP_KEYS = ("plansim_plan", "model", "gpu", "num_gpus", "seq_length", "plan", "prediction")
_REQUIRED_KEYS = ("plansim_plan", "model", "gpu", "num_gpus", "plan")
#: Each flat plan field's type (an enum class for enum fields).
_FIELD_TYPES: dict[str, Any] = {
    name: hint for _, cls in GROUPS for name, hint in typing.get_type_hints(cls).items()
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFile:
    """A plan and what it was planned for.

    Attributes:
        plan: the plan.
        model: model preset name or a config.json path, as ``--model`` takes it.
        gpu: hardware profile name or YAML path, as ``--gpu`` takes it.
        num_gpus: GPUs of the job (equals ``plan.num_gpus``).
        seq_length: the sequence length the plan was made for when it overrides the
            model's (``--seq-len``), else None.
        prediction: figures the planner predicted for it (step time, MFU, memory), for the
            reader; not read back into the plan.

    Raises:
        SpecError: num_gpus differs from the plan's dp * tp * pp * cp, or seq_length is
            neither None nor a positive integer.
    """

    plan: ParallelPlan
    model: str
    gpu: str
    num_gpus: int
    seq_length: int | None = None
    prediction: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.num_gpus != self.plan.num_gpus:
            raise SpecError(
                f"num_gpus({self.num_gpus}) != the plan's tp({self.plan.tp}) * pp"
                f"({self.plan.pp}) * dp({self.plan.dp}) * cp({self.plan.cp}) = "
                f"{self.plan.num_gpus}"
            )
        seq = self.seq_length
        if seq is not None and (type(seq) is not int or seq < 1):
            raise SpecError(f"seq_length must be a positive integer or null, got {seq!r}")


def plan_to_dict(plan: ParallelPlan) -> dict[str, dict[str, Any]]:
    """The plan's fields by group, enums as their values (YAML-ready, key order fixed)."""
    out: dict[str, dict[str, Any]] = {}
    for attr, _ in GROUPS:
        group = getattr(plan, attr)
        out[attr] = {f.name: _plain(getattr(group, f.name)) for f in fields(group)}
    return out


def plan_from_dict(data: object) -> ParallelPlan:
    """The plan a :func:`plan_to_dict` mapping describes; a group or field left out takes
    its default.

    Raises:
        SpecError: ``data`` is not a mapping of the known groups, a group holds an unknown
            field, or a value is invalid (each names ``plan.<group>.<field>`` or the plan
            field, and the allowed values).
    """
    if not isinstance(data, dict):
        raise SpecError(f"plan must be a mapping of groups, got {type(data).__name__}")
    known = dict(GROUPS)
    unknown = [key for key in data if key not in known]
    if unknown:
        raise SpecError(f"plan.{unknown[0]} is not a plan group; choose from: {', '.join(known)}")
    groups: dict[str, Any] = {}
    for attr, cls in GROUPS:
        if attr in data:
            groups[attr] = _group(attr, cls, data[attr])
    for attr in ("dims", "batch"):
        if attr not in groups:
            raise SpecError(f"plan.{attr} is required (a plan has no default {attr})")
    return ParallelPlan(**groups)


def plan_from_flat_dict(data: dict[str, Any], *, ignore: tuple[str, ...] = ()) -> ParallelPlan:
    """A plan from its flat fields (``plansim.specs.plan.PLAN_FIELDS``, enums as their
    values), as ``plansim validate``'s comparison.json and the JSON reports write it; keys in
    ``ignore`` (derived ones such as ``label``) are skipped, fields left out take defaults.

    Raises:
        SpecError: a key is neither a plan field nor ignored, or a value is invalid.
    """
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name in ignore:
            continue
        if name not in FIELD_GROUP:
            raise SpecError(f"{name!r} is not a plan field; choose from: {', '.join(PLAN_FIELDS)}")
        values[name] = _typed(_FIELD_TYPES[name], f"plan.{name}", value)
    return plan_from_fields(**values)


def _group(attr: str, cls: type, data: object) -> Any:
    """One group from its mapping, enum values parsed against their enums."""
    if not isinstance(data, dict):
        raise SpecError(f"plan.{attr} must be a mapping of fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    unknown = [key for key in data if key not in hints]
    if unknown:
        raise SpecError(
            f"plan.{attr}.{unknown[0]} is not a field of {attr}; choose from: {', '.join(hints)}"
        )
    values = {}
    for name, value in data.items():
        values[name] = _typed(hints[name], f"plan.{attr}.{name}", value)
    return cls(**values)


def _typed(hint: Any, field: str, value: object) -> object:
    """``value`` as its field's enum when the field's type ``hint`` is one (a file holds the
    enum's value), else as it is (the group checks it)."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return parse_enum(hint, field, value)
    return value


def _plain(value: object) -> object:
    """An enum as its value, anything else as it is."""
    return value.value if isinstance(value, enum.Enum) else value


def load_plan_text(text: str) -> object:
    """A plan file's (or a :func:`plan_to_dict` mapping's) YAML text as loaded by the safe
    loader, refusing duplicate keys and aliases (``plansim.io.strict_yaml``).

    Raises:
        yaml.YAMLError: the text is not YAML, or repeats a key or uses an alias.
    """
    return strict_load(text)


def plan_file_text(plan_file: PlanFile) -> str:
    """The YAML text of ``plan_file`` (deterministic: fixed key order)."""
    doc: dict[str, Any] = {
        "plansim_plan": FORMAT_VERSION,
        "model": plan_file.model,
        "gpu": plan_file.gpu,
        "num_gpus": plan_file.num_gpus,
        "seq_length": plan_file.seq_length,
        "plan": plan_to_dict(plan_file.plan),
    }
    if plan_file.prediction is not None:
        doc["prediction"] = dict(plan_file.prediction)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def write_plan_file(
    path: str | os.PathLike[str], plan_file: PlanFile, *, label: str = "--save-plan"
) -> Path:
    """Write ``plan_file`` to ``path`` atomically.

    Raises:
        OutputFileError: the path cannot be written (names ``label`` and the path).
    """
    return write_text_atomic(path, plan_file_text(plan_file), label=label)


def read_plan_file(path: str | os.PathLike[str]) -> PlanFile:
    """Read a plan file.

    Raises:
        InputFileError: the file cannot be read, is not YAML, is not a plan file of this
            version, or holds an invalid key or value (the message names the file, the key
            and what is allowed).
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputFileError(f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = load_plan_text(text)
    except yaml.YAMLError as exc:
        raise InputFileError(f"{where}: not YAML: {exc}") from None
    try:
        return _plan_file(doc)
    except SpecError as exc:
        raise InputFileError(f"{where}: {exc}") from None


def _plan_file(doc: object) -> PlanFile:
    """The :class:`PlanFile` of a loaded document."""
    if not isinstance(doc, dict):
        raise SpecError("a plan file is a mapping with keys " + ", ".join(_REQUIRED_KEYS))
    unknown = [key for key in doc if key not in _TOP_KEYS]
    if unknown:
        raise SpecError(
            f"{unknown[0]!r} is not a plan-file key; choose from: {', '.join(_TOP_KEYS)}"
        )
    missing = [key for key in _REQUIRED_KEYS if key not in doc]
    if missing:
        raise SpecError(f"missing key(s): {', '.join(missing)}")
    if doc["plansim_plan"] != FORMAT_VERSION:
        raise SpecError(
            f"plansim_plan={doc['plansim_plan']!r} is not allowed; choose one of: {FORMAT_VERSION}"
        )
    for key in ("model", "gpu"):
        if not isinstance(doc[key], str) or not doc[key].strip():
            raise SpecError(f"{key} must be a non-empty string, got {doc[key]!r}")
    num_gpus = doc["num_gpus"]
    if type(num_gpus) is not int or num_gpus < 1:
        raise SpecError(f"num_gpus must be a positive integer, got {num_gpus!r}")
    prediction = doc.get("prediction")
    if prediction is not None and not isinstance(prediction, dict):
        raise SpecError(f"prediction must be a mapping, got {prediction!r}")
    return PlanFile(
        plan=plan_from_dict(doc["plan"]),
        model=doc["model"],
        gpu=doc["gpu"],
        num_gpus=num_gpus,
        seq_length=doc.get("seq_length"),
        prediction=prediction,
    )
