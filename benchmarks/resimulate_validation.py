"""Re-simulate saved ``plansim validate`` runs with the current model, without re-running them.

A GPU validation costs device time that most sessions do not have; its ``comparison.json``
keeps what was measured (step, forward and backward seconds) and the model and plan that ran.
This rebuilds both, simulates them as ``plansim validate`` does
(``plansim.validate.simulated.simulate_plan``) on the profile given, and prints the measured
figures beside the saved simulation and the current one.

With ``--terms-from OTHER`` it says instead which of the profile's terms make its error: the
step error on PROFILE, then with each group of OTHER's figures put into PROFILE alone (GEMM
curves, sustained rate, attention curves, memory rates, kernel launch, host), then with all
of them (e.g. PROFILE a datasheet profile, OTHER the measured profile of the same GPU).

Usage:
    python benchmarks/resimulate_validation.py --profile PROFILE DIR [DIR ...]
    python benchmarks/resimulate_validation.py --profile PROFILE --terms-from OTHER DIR [DIR ...]
(DIR: a ``plansim validate --out`` folder, e.g. benchmarks/gpu_runs/h100-2026-11-27/validate_full)
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import typing
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plansim.errors import PlansimError
from plansim.io.plan_file import plan_from_flat_dict
from plansim.io.profiles import load_profile
from plansim.sim import timeline as tl
from plansim.specs.model import ModelSpec
from plansim.validate.compare import CATEGORY_KINDS
from plansim.validate.simulated import simulate_plan


def _spec(cls: type, saved: dict[str, Any]) -> Any:
    """``cls`` (a frozen spec dataclass) from its ``spec_dict`` form: enum fields from their
    values, unknown keys (``label``) dropped."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in saved:
            continue
        value, kind = saved[field.name], hints[field.name]
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            value = kind(value)
        values[field.name] = value
    return cls(**values)


def resimulate(folder: Path, profile_name: str) -> dict[str, Any]:
    """Measured, saved-simulated and now-simulated seconds of one validate output folder."""
    doc = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
    model = _spec(ModelSpec, doc["run"]["model"])
    plan = plan_from_flat_dict(doc["run"]["plan"], ignore=("label",))
    profile = load_profile(profile_name)
    now = simulate_plan(model, plan, profile, dtype=plan.precision.value)
    timeline = now.result.timeline
    compute = timeline[timeline[tl.STREAM] == "compute"]
    seconds = (compute[tl.END_S] - compute[tl.START_S]).groupby(compute[tl.KIND]).sum()
    row: dict[str, Any] = {"run": folder.name, "plan": doc["run"]["plan"]["label"]}
    measured_step = doc["measured_step_time_s"]
    saved_step = doc["simulated_step_time_s"]
    row.update(
        {
            "step measured ms": 1e3 * measured_step,
            "step saved sim ms": 1e3 * saved_step,
            "step now sim ms": 1e3 * now.step_time_s,
            "step now error %": 100 * (now.step_time_s / measured_step - 1),
        }
    )
    measured_peak = doc["peak_memory_bytes"]["measured_per_rank"]
    simulated_peak = [b - now.memory.reserve_bytes for b in now.result.peak_memory_bytes]
    row["peak memory now error % (worst rank)"] = max(
        (100 * (s / m - 1) for m, s in zip(measured_peak, simulated_peak, strict=True)), key=abs
    )
    for category in ("forward", "backward"):
        measured = doc["categories_s"][category]["measured"]
        simulated = sum(float(seconds.get(kind, 0.0)) for kind in CATEGORY_KINDS[category])
        row[f"{category} measured ms"] = 1e3 * measured
        row[f"{category} now error %"] = 100 * (simulated / measured - 1)
    return row


#: Profile fields swapped together by ``--terms-from`` (HardwareProfile field names).
TERM_FIELDS: dict[str, tuple[str, ...]] = {
    "gemm": ("matmul_efficiency",),
    "sustained": ("sustained_matmul_fraction", "gpu_matmul_spread_fraction"),
    "attention": ("attention_efficiency",),
    "memory": (
        "hbm_bytes_per_s",
        "hbm_efficiency_fraction",
        "elementwise_forward_bytes_per_s",
        "elementwise_backward_bytes_per_s",
    ),
    "launch": ("kernel_launch_s",),
    "host": ("host_overhead",),
}


def term_errors(folder: Path, profile_name: str, other_name: str) -> dict[str, Any]:
    """Step error (%) of one validate folder on ``profile_name``, with each
    :data:`TERM_FIELDS` group of ``other_name`` put in alone, and with all of them."""
    doc = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
    model = _spec(ModelSpec, doc["run"]["model"])
    plan = plan_from_flat_dict(doc["run"]["plan"], ignore=("label",))
    base, other = load_profile(profile_name), load_profile(other_name)
    measured = doc["measured_step_time_s"]

    def error(groups: tuple[str, ...]) -> float:
        fields = {f: getattr(other, f) for g in groups for f in TERM_FIELDS[g]}
        priced = simulate_plan(
            model, plan, dataclasses.replace(base, **fields), dtype=plan.precision.value
        )
        return 100 * (priced.step_time_s / measured - 1)

    row: dict[str, Any] = {"run": folder.name, profile_name: error(())}
    row.update({f"+{group}": error((group,)) for group in TERM_FIELDS})
    row[f"all of {other_name}"] = error(tuple(TERM_FIELDS))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="profile name or YAML path")
    parser.add_argument(
        "--terms-from",
        default=None,
        metavar="OTHER",
        help="print the step error with each group of OTHER's figures put into PROFILE",
    )
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for folder in args.folders:
        try:
            if args.terms_from is not None:
                rows.append(term_errors(folder, args.profile, args.terms_from))
            else:
                rows.append(resimulate(folder, args.profile))
        except PlansimError as exc:  # e.g. an fp32 run on a profile without fp32 GEMM data
            print(f"{folder.name}: not re-simulated: {exc}", file=sys.stderr)
    if not rows:
        return 1
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(pd.DataFrame.from_records(rows).round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
