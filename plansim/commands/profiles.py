"""``plansim profiles list`` and ``plansim profiles show NAME_OR_PATH``.

``list`` prints one row per shipped profile (``hardware_profiles/*.yaml``); ``show`` prints
every number of one profile in edge units (the units of its YAML keys) next to its
provenance, then each curve point by point. Reading and validation are in
:mod:`plansim.io.profiles`; errors reach the user through ``plansim.cli.main`` as one line.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.calibrate.importer import TIERS, update_from_nccl_tests
from plansim.calibrate.nccl_tests import read_nccl_tests_log
from plansim.errors import InputFileError
from plansim.io.profile_schema import FRACTION_CURVES
from plansim.io.profiles import (
    list_profiles,
    load_profile,
    merge_profile,
    profile_to_dict,
    profile_to_yaml,
    profiles_dir,
    write_profile,
)
from plansim.specs.hardware import HardwareProfile
from plansim.specs.profile_terms import class_counts, provenance_class
from plansim.units import (
    bytes_per_s_to_gb_per_s,
    bytes_to_gib,
    flops_per_s_to_tflops,
    s_to_us,
)

#: Top-level YAML keys that are shown as curves, not as scalar rows.
_CURVE_SECTIONS = (
    "matmul_efficiency",
    "attention_efficiency",
    "intra_node",
    *FRACTION_CURVES,
)
_TEXT_KEYS = ("schema_version", "name", "description", "provenance")


def add_parser(subparsers: Any) -> None:
    """Register ``profiles`` with its ``list`` and ``show`` actions (each sets ``func``)."""
    parser = subparsers.add_parser(
        "profiles",
        help="list or show hardware profiles",
        description="List the shipped hardware profiles or show one with its provenance.",
    )
    actions = parser.add_subparsers(dest="profiles_action", metavar="ACTION")
    actions.required = True
    list_parser = actions.add_parser("list", help="one row per shipped profile")
    list_parser.set_defaults(func=run_list)
    show_parser = actions.add_parser(
        "show", help="every number of one profile, in edge units, with its source"
    )
    show_parser.add_argument(
        "profile",
        metavar="NAME_OR_PATH",
        help="a name from 'plansim profiles list' or a .yaml path",
    )
    show_parser.set_defaults(func=run_show)
    import_parser = actions.add_parser(
        "import-nccl-tests",
        help="fit nccl-tests logs (alpha-beta per collective) into a profile",
        description=(
            "Parse nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
            "sendrecv_perf, alltoall_perf), fit latency + busbw per collective and merge the "
            "result into PROFILE, replacing only those entries. Unparseable lines are reported "
            "with their line number; complete rows of a truncated log are still used."
        ),
    )
    import_parser.add_argument("logs", nargs="+", metavar="LOG", help="nccl-tests output file")
    import_parser.add_argument(
        "--into",
        required=True,
        metavar="PROFILE",
        help="profile to merge into: a .yaml path or a name from 'plansim profiles list'",
    )
    import_parser.add_argument(
        "--tier",
        choices=TIERS,
        default="intra-node",
        help="intra-node: intra_node curves (default); inter-node: nic_gb_per_s, "
        "nic_latency_us, and inter_node_ring_scaling from reduce_scatter or all_gather runs "
        "at two or more node counts",
    )
    import_parser.add_argument(
        "--dry-run", action="store_true", help="print the merged profile, write nothing"
    )
    import_parser.add_argument(
        "--force",
        action="store_true",
        help="import runs on another GPU than the profile's, or on more GPUs a node than its "
        "node has (refused otherwise)",
    )
    import_parser.set_defaults(func=run_import)


def _sig(value: float) -> float:
    """``value`` to 4 significant digits (a CPU's 0.0777 TFLOP/s must not print as 0.0)."""
    return float(f"{value:.4g}")


def summary_row(profile: HardwareProfile) -> dict[str, Any]:
    """The ``profiles list`` row of one profile (edge units in the column names)."""
    return {
        "name": profile.name,
        "hbm_gib": round(bytes_to_gib(profile.hbm_capacity_bytes), 1),
        "usable_gib": round(bytes_to_gib(profile.usable_memory_bytes), 1),
        "bf16_tflops": _sig(flops_per_s_to_tflops(profile.peak_flops_per_s.get("bf16", 0.0))),
        "hbm_tb_per_s": _sig(bytes_per_s_to_gb_per_s(profile.hbm_bytes_per_s) / 1000),
        "gpus_per_node": profile.gpus_per_node,
        "nic_gb_per_s": _sig(bytes_per_s_to_gb_per_s(profile.nic_bytes_per_s)),
        "sources": source_counts(profile),
        "description": profile.description,
    }


def source_counts(profile: HardwareProfile) -> str:
    """How many of the profile's provenance entries are of each class, most certain first
    (``plansim.specs.profile_terms.provenance_class``), e.g. ``measured 9, datasheet 8,
    derived 12, assumption 4``."""
    return class_counts(provenance_class(source) for source in profile.provenance.values())


def run_list(args: argparse.Namespace) -> int:
    """Print the table of shipped profiles; returns 0."""
    rows = [summary_row(load_profile(name)) for name in list_profiles()]
    if not rows:
        print("no hardware profiles found")
        return 0
    table = pd.DataFrame(rows)
    width = int(table["description"].str.len().max())
    formatters = {"description": f"{{:<{width}}}".format}
    formatters |= {k: "{:g}".format for k in ("bf16_tflops", "hbm_tb_per_s", "nic_gb_per_s")}
    print(table.to_string(index=False, formatters=formatters))
    return 0


def _scalar_rows(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(dotted key, value, provenance) for every number outside the curves."""
    prov: dict[str, str] = data["provenance"]
    rows: list[tuple[str, str, str]] = []
    for key, value in data.items():
        if key in _TEXT_KEYS or key in _CURVE_SECTIONS:
            continue
        if isinstance(value, dict):
            rows += [(f"{key}.{k}", f"{v:g}", prov.get(f"{key}.{k}", "")) for k, v in value.items()]
        else:
            rows.append((key, f"{value:g}", prov.get(key, "")))
    return rows


def _print_rows(rows: list[tuple[str, str, str]]) -> None:
    key_w = max(len(r[0]) for r in rows)
    val_w = max(len(r[1]) for r in rows)
    for key, value, source in rows:
        print(f"  {key:<{key_w}}  {value:>{val_w}}  {source}")


def _matmul_tables(profile: HardwareProfile) -> None:
    for dtype, curve in sorted(profile.matmul_efficiency.items()):
        peak = profile.peak_flops_per_s[dtype]
        table = pd.DataFrame(
            {
                "gemm_flops": [int(x) for x in curve.x],
                "square_n": [round((x / 2) ** (1 / 3)) for x in curve.x],
                "fraction_of_peak": curve.y,
                "tflops": [_sig(flops_per_s_to_tflops(peak * y)) for y in curve.y],
            }
        )
        print(
            f"\nmatmul_efficiency.{dtype}: {profile.provenance.get(f'matmul_efficiency.{dtype}')}"
        )
        print(table.to_string(index=False, formatters={"fraction_of_peak": "{:g}".format}))


def _attention_tables(profile: HardwareProfile) -> None:
    for dtype, curves in sorted(profile.attention_efficiency.items()):
        peak = profile.peak_flops_per_s[dtype]
        forward, backward = curves.forward, curves.backward
        table = pd.DataFrame(
            {
                "attention_flops": [int(x) for x in forward.x],
                "forward_fraction_of_peak": forward.y,
                "backward_fraction_of_peak": [backward(x) for x in forward.x],
                "forward_tflops": [_sig(flops_per_s_to_tflops(peak * y)) for y in forward.y],
            }
        )
        print(f"\nattention_efficiency.{dtype}: {curves.source}")
        print(table.to_string(index=False, float_format="{:.4g}".format))


def _collective_tables(profile: HardwareProfile) -> None:
    ranks = profile.gpus_per_node
    for name, coll in profile.intra_node.items():
        curve = coll.busbw_bytes_per_s
        table = pd.DataFrame(
            {
                "message_bytes": [int(x) for x in curve.x],
                "busbw_gb_per_s": [bytes_per_s_to_gb_per_s(y) for y in curve.y],
                f"time_us_{ranks}_ranks": [
                    round(s_to_us(coll.time_s(x, ranks)), 2) for x in curve.x
                ],
            }
        )
        print(f"\nintra_node.{name}: {profile.provenance.get(f'intra_node.{name}')}")
        print(
            f"  latency_us {s_to_us(coll.latency_s):g}: "
            f"{profile.provenance.get(f'intra_node.{name}.latency_us')}"
        )
        print(table.to_string(index=False, formatters={"busbw_gb_per_s": "{:g}".format}))


def _fraction_tables(profile: HardwareProfile) -> None:
    """The inter-node fraction curves: by node count (ring) and by message size."""
    for key, (x_name, attr) in FRACTION_CURVES.items():
        curve = getattr(profile, attr)
        if curve is None:
            continue
        table = pd.DataFrame({x_name: [int(x) for x in curve.x], "busbw_fraction": curve.y})
        print(f"\n{key}: {profile.provenance.get(key)}")
        print(table.to_string(index=False, formatters={"busbw_fraction": "{:g}".format}))


def run_show(args: argparse.Namespace) -> int:
    """Print one profile: scalars with provenance, then every curve; returns 0."""
    profile = load_profile(args.profile)
    data = profile_to_dict(profile)
    print(f"{profile.name}: {profile.description}")
    print(f"  usable memory {bytes_to_gib(profile.usable_memory_bytes):.2f} GiB (HBM - reserve)\n")
    _print_rows(_scalar_rows(data))
    _matmul_tables(profile)
    _attention_tables(profile)
    _collective_tables(profile)
    _fraction_tables(profile)
    return 0


def _profile_file(name_or_path: str) -> Path:
    """The file behind ``--into``: a path as given, or a shipped profile's file by name."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
    else:
        load_profile(name_or_path)  # UnknownNameError listing the names
        path = profiles_dir() / f"{name_or_path}.yaml"
    if not path.exists():
        raise InputFileError(
            f"--into {name_or_path}: file not found; import-nccl-tests merges into an existing "
            "profile (write one with 'plansim calibrate' or start from a shipped one)"
        )
    return path


def run_import(args: argparse.Namespace) -> int:
    """Parse the logs, fit, merge into the profile (or print it with --dry-run); returns 0."""
    path = _profile_file(args.into)
    base = load_profile(str(path))
    logs = [read_nccl_tests_log(log) for log in args.logs]
    for log in logs:
        for problem in log.problems:
            print(f"warning: {problem.describe(log.source)}", file=sys.stderr)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    imported = update_from_nccl_tests(logs, tier=args.tier, base=base, date=date, force=args.force)
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    profile = merge_profile(base, imported.update)
    report = sys.stderr if args.dry_run else sys.stdout
    if args.dry_run:
        sys.stdout.write(profile_to_yaml(profile))
    else:
        write_profile(profile, path)
    verb = "would update" if args.dry_run else "updated"
    print(f"{verb} {path.name} ({args.tier}):", file=report)
    for line in imported.lines:
        print(f"  {line}", file=report)
    return 0
