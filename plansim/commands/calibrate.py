"""``plansim calibrate``: benchmark this machine and write (or merge into) a hardware profile.

    plansim calibrate --backend gloo|nccl --nproc N [--device cpu|cuda] [--quick]
                      --out PROFILE.yaml [--name NAME] [--dry-run] [--timeout S]

Launches N ranks (torch.multiprocessing, spawn; one thread per rank), measures compute,
memory and collectives (:mod:`plansim.calibrate.plan`), fits them and writes PROFILE.yaml and
its raw measurements ``PROFILE.raw.csv`` atomically. With an existing PROFILE.yaml only the
measured entries are replaced. torch is imported only when the command runs, never when the
CLI starts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plansim.errors import InputFileError, SpecError
from plansim.io.profiles import load_profile
from plansim.specs.hardware import HardwareProfile

if TYPE_CHECKING:  # the runner imports torch
    from plansim.calibrate.runner import Request, Result

#: Default bound on one launch, seconds (--timeout overrides).
DEFAULT_TIMEOUT_S = {"quick": 300.0, "full": 3600.0}


def add_parser(subparsers: Any) -> None:
    """Register ``calibrate``."""
    parser = subparsers.add_parser(
        "calibrate",
        help="benchmark this machine and write its hardware profile",
        description=(
            "Benchmark this machine (GEMMs, attention, memory bandwidth, collectives) with N "
            "ranks and write PROFILE.yaml and PROFILE.raw.csv, or merge into an existing "
            "PROFILE.yaml replacing only what was measured."
        ),
    )
    parser.add_argument("--backend", required=True, choices=("gloo", "nccl"))
    parser.add_argument("--nproc", required=True, type=int, help="ranks (CPU cores or GPUs)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="default: cpu (gloo), cuda (nccl)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer sizes and repetitions (under a minute on 2 CPU cores)",
    )
    parser.add_argument("--out", required=True, help="profile YAML to write or merge into")
    parser.add_argument("--name", default=None, help="profile name (default: the file stem)")
    parser.add_argument("--description", default=None, help="one line for 'profiles list'")
    parser.add_argument("--dry-run", action="store_true", help="print the profile, write nothing")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds before the ranks are killed"
    )
    parser.set_defaults(func=run)


def _device(args: argparse.Namespace) -> str:
    device: str = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    if args.backend == "nccl" and device != "cuda":
        raise SpecError("--backend nccl needs --device cuda (NCCL runs on GPUs only)")
    return device


def _check_nproc(nproc: int, device: str) -> None:
    if nproc < 1:
        raise SpecError(f"--nproc must be at least 1, got {nproc}")
    if device == "cpu":
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
        if nproc > cores:
            raise SpecError(
                f"--nproc {nproc} is larger than the {cores} CPU cores available "
                "(one rank per core, one thread each)"
            )


def _check_out(out: str) -> tuple[Path, HardwareProfile | None]:
    """The output path (writable folder, .yaml name) and the profile already there."""
    path = Path(out)
    if path.suffix not in (".yaml", ".yml"):
        raise InputFileError(f"--out {out}: a profile file name must end in .yaml")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputFileError(f"--out {out}: folder {folder} does not exist")
    if path.is_dir():
        raise InputFileError(f"--out {out}: is a folder")
    try:  # the profile is replaced by a temp file + rename: the folder must take new files
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".probe")
    except OSError as exc:
        raise InputFileError(f"--out {out}: cannot write in {folder}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)
    return path, load_profile(str(path)) if path.exists() else None


def run(args: argparse.Namespace) -> int:
    """Validate, calibrate, print a summary; returns 0."""
    device = _device(args)
    out, base = _checked_args(args, device)
    from plansim.calibrate.runner import Request, calibrate  # imports torch

    request = Request(
        backend=args.backend,
        device=device,
        nproc=args.nproc,
        quick=args.quick,
        out=out,
        name=args.name or out.stem,
        description=args.description,
        dry_run=args.dry_run,
        timeout_s=args.timeout or DEFAULT_TIMEOUT_S["quick" if args.quick else "full"],
    )
    result = calibrate(request, base=base)
    if args.dry_run:
        sys.stdout.write(result.yaml_text)
    _report(args, request, result, merged=base is not None)
    return 0


def _checked_args(args: argparse.Namespace, device: str) -> tuple[Path, HardwareProfile | None]:
    """Check the rank count, --out and --timeout; returns the output path and the profile
    already there (None: a new file).

    Raises:
        SpecError: --nproc 1 without an existing profile to merge into, a --timeout that is
            not a positive finite number (nan, inf, <= 0).
        InputFileError: --out cannot be written.
    """
    _check_nproc(args.nproc, device)
    out, base = _check_out(args.out)
    if args.nproc == 1 and base is None:
        raise SpecError(
            "--nproc 1 times no collectives (a group of one rank moves nothing), so it cannot "
            "make a new profile: merge it into an existing one (--out an existing PROFILE.yaml, "
            "e.g. a copy of hardware_profiles/h100-sxm5-80gb.yaml; its collectives and "
            "gpus_per_node are kept) or run 2 or more ranks"
        )
    if args.timeout is not None and not (0 < args.timeout < math.inf):
        raise SpecError(
            f"--timeout must be a positive, finite number of seconds, got {args.timeout}"
        )
    return out, base


def _report(args: argparse.Namespace, request: Request, result: Result, *, merged: bool) -> None:
    """The run's summary (stdout; stderr with --dry-run, whose stdout is the YAML) and
    notes on a busy machine (stderr)."""
    report = sys.stderr if args.dry_run else sys.stdout
    verb = "merged into" if merged else "wrote"
    target = "nothing written (--dry-run)" if args.dry_run else f"{verb} {request.out.name}"
    print(
        f"calibrated {request.name}: {args.nproc} ranks, {args.backend} on {request.device}"
        f"{', quick' if args.quick else ''}, {len(result.plan.items)} items in "
        f"{result.wall_s:.1f} s; {target}"
        + ("" if args.dry_run else f" and {request.out.stem}.raw.csv ({len(result.raw)} new rows)"),
        file=report,
    )
    if result.info.busy and result.info.load_average is not None:
        before, after = result.info.load_average
        print(
            f"note: the machine was busy (1-min load average {before:.2f} before, {after:.2f} "
            "after): other work competed for the CPUs and the timings include that",
            file=sys.stderr,
        )
    if result.built.contended:
        print(
            f"note: {result.built.contended} of {result.built.timed} compute timings had less "
            "than 90% of a core (other work competed); the profile's provenance says so",
            file=sys.stderr,
        )
    width = max(len(label) for label, _ in result.built.summary)
    for label, value in result.built.summary:
        print(f"  {label:<{width}}  {value}", file=report)
