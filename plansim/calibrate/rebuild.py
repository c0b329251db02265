"""Rebuild a calibrated profile from its raw CSV, offline (pure: pandas, no torch).

    python -m plansim.calibrate.rebuild PROFILE.yaml [--raw PROFILE.raw.csv] [--run RUN_ID]
                                        [--out OUT.yaml] [--dry-run]

Reads PROFILE.yaml and its raw measurements (``<stem>.raw.csv`` beside it unless ``--raw``),
fits the rows of one calibration run (the latest in the CSV unless ``--run``) with the same
code ``plansim calibrate`` uses (:func:`plansim.calibrate.build.build_update`), and merges the
result into PROFILE.yaml: every number that run measured is refitted (including terms added to
the fitting after the run, e.g. ``attention_efficiency`` from its SDPA rows); every other entry
and its provenance stays. Writes OUT.yaml (default: PROFILE.yaml in place, atomically).

The run's environment (device name, versions, load average) is not in the CSV; the
provenance text is the one the profile already holds for that run (``measured: ...; raw:
<file> run <id>``), so a rebuild cites the run exactly as the calibration did. Host memory
is not in the CSV either: capacity and reserve keep the profile's values.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from plansim.calibrate import CalibrationError
from plansim.calibrate.build import build_update
from plansim.calibrate.raw import raw_path, read_raw
from plansim.calibrate.run_info import RunInfo
from plansim.errors import PlansimError
from plansim.io.profiles import load_profile, merge_profile, profile_to_yaml, write_profile
from plansim.specs.hardware import HardwareProfile


@dataclass(frozen=True, slots=True, kw_only=True)
class Rebuilt:
    """The rebuilt profile and the run it came from."""

    profile: HardwareProfile
    run_id: str
    num_rows: int
    summary: tuple[tuple[str, str], ...]


def recorded_source(profile: HardwareProfile, run_id: str) -> str:
    """The ``measured: ...; raw: <file> run <id>`` text the profile cites ``run_id`` with.

    Raises:
        CalibrationError: no provenance entry of the profile cites that run.
    """
    marker = f" run {run_id}"
    for text in sorted(profile.provenance.values()):
        at = text.find(marker)
        if text.startswith("measured:") and at >= 0:
            return text[: at + len(marker)]
    raise CalibrationError(
        f"profile {profile.name} cites no calibration run {run_id}: its provenance has no "
        f"'measured: ...{marker}' entry to take the run's environment from"
    )


def run_info(
    rows: pd.DataFrame, profile: HardwareProfile, *, run_id: str, raw_file: str
) -> RunInfo:
    """A :class:`RunInfo` for ``run_id`` from its rows and the profile's provenance."""
    source = recorded_source(profile, run_id)
    memory = rows[rows["kind"] == "memory"]
    device = "cuda" if (memory["op"] == "device_total").any() else "cpu"
    return RunInfo(
        run_id=run_id,
        date=f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}",
        backend="nccl" if device == "cuda" and ", gloo," not in source else "gloo",
        device=device,
        nproc=int(rows["rank"].nunique()),
        quick="plansim calibrate --quick" in source,
        raw_file=raw_file,
        recorded_source=source,
    )


def rebuild(
    profile_file: Path, *, raw_file: Path | None = None, run_id: str | None = None
) -> Rebuilt:
    """The profile in ``profile_file`` with run ``run_id``'s numbers refitted from the raw CSV.

    Raises:
        CalibrationError: the CSV has no rows (of that run), or the profile does not cite it.
        InputFileError: the profile or CSV cannot be read, or the result is invalid.
    """
    base = load_profile(str(profile_file))
    raw = raw_file or raw_path(profile_file)
    table = read_raw(raw)
    if table.empty:
        raise CalibrationError(f"{raw}: no raw measurements")
    run = run_id or str(sorted(table["run_id"].unique())[-1])
    rows = table[table["run_id"] == run]
    if rows.empty:
        runs = ", ".join(sorted(table["run_id"].unique()))
        raise CalibrationError(f"{raw}: no rows of run {run}; runs there: {runs}")
    info = run_info(rows, base, run_id=run, raw_file=Path(raw).name)
    built = build_update(rows, info, base=base, name=base.name, description=base.description)
    profile = merge_profile(base, built.update)
    return Rebuilt(profile=profile, run_id=run, num_rows=len(rows), summary=built.summary)


def main(argv: list[str] | None = None) -> int:
    """``python -m plansim.calibrate.rebuild``: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m plansim.calibrate.rebuild",
        description="Refit a calibrated profile from its raw CSV (offline, no torch).",
    )
    parser.add_argument("profile", help="profile YAML to rebuild (name or path)")
    parser.add_argument("--raw", default=None, help="raw CSV (default: <stem>.raw.csv beside it)")
    parser.add_argument("--run", default=None, help="run id to fit (default: the latest)")
    parser.add_argument("--out", default=None, help="where to write (default: in place)")
    parser.add_argument("--dry-run", action="store_true", help="print the YAML, write nothing")
    args = parser.parse_args(argv)
    path = Path(args.profile)
    if not path.suffix:
        from plansim.io.profiles import profiles_dir

        path = profiles_dir() / f"{args.profile}.yaml"
    try:
        result = rebuild(path, raw_file=Path(args.raw) if args.raw else None, run_id=args.run)
        if args.dry_run:
            sys.stdout.write(profile_to_yaml(result.profile))
            return 0
        write_profile(result.profile, Path(args.out) if args.out else path)
    except PlansimError as exc:
        sys.stderr.write(f"plansim: error: {exc}\n")
        return 2
    for label, value in result.summary:
        sys.stderr.write(f"  {label}: {value}\n")
    target = args.out or path
    sys.stderr.write(
        f"plansim: rebuilt {target} from {result.num_rows} rows of run {result.run_id}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
