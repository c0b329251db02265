"""The whole-run options of ``plansim plan`` and ``plansim simulate``: ``--tokens`` with the
optional ``--ramp``, ``--failures``, ``--facility`` and ``--prices`` files."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plansim.errors import SpecError
from plansim.io.run_files import read_facility, read_failures, read_prices, read_ramp
from plansim.planner.evaluate import Evaluation, Rejected
from plansim.planner.training_run import SECONDS_PER_DAY, Objective, RunEstimate, estimate_runs
from plansim.specs.facility import Facility, PriceTable
from plansim.specs.failure_model import FailureModel
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.training_run import RampPhase, TrainingRun

_FILE_FLAGS = ("ramp", "failures", "facility", "prices")
#: The argparse destinations of the group (kept with a plan file).
RUN_FLAGS = ("tokens", "deadline_days", *_FILE_FLAGS)


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """Add the whole-run group to ``parser``."""
    g = parser.add_argument_group(
        "whole run (time to train, goodput, energy, cost; needs --tokens)"
    )
    g.add_argument("--tokens", type=str, default=None, help="tokens to train, e.g. 15.6e12")
    g.add_argument(
        "--deadline-days",
        type=float,
        default=None,
        metavar="D",
        help="the run must finish within D days: plans that miss it rank last (column "
        "meets_deadline); with --gpus A:B, the fewest GPUs that make it",
    )
    g.add_argument(
        "--ramp",
        type=Path,
        metavar="FILE",
        help="batch-size ramp YAML (phases, or Megatron's rampup_batch_size); default: the "
        "--gbs batch throughout",
    )
    g.add_argument(
        "--failures",
        type=Path,
        metavar="FILE",
        help="failure model YAML (interruptions_per_gpu_hour, restart_min, "
        "checkpoint_write_gb_per_s): adds goodput and the checkpoint interval",
    )
    g.add_argument(
        "--facility",
        type=Path,
        metavar="FILE",
        help="facility YAML (pue, host_power_w_per_node, network_power_w_per_gpu); default: "
        "GPU energy only",
    )
    g.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="prices YAML (usd_per_gpu_hour per profile name, optional usd_per_kwh); no "
        "price is built in",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInputs:
    """The whole-run inputs the flags name."""

    run: TrainingRun
    failures: FailureModel | None
    facility: Facility | None
    prices: PriceTable | None

    def estimates(
        self, model: ModelSpec, evaluations: Sequence[Evaluation], profile: HardwareProfile
    ) -> list[RunEstimate | Rejected]:
        """The whole run of each evaluated plan's layout (``training_run.estimate_runs``)."""
        return estimate_runs(
            model,
            evaluations,
            profile,
            self.run,
            failures=self.failures,
            facility=self.facility,
            prices=self.prices,
        )


def add_objective_arg(parser: argparse.ArgumentParser, *, help_text: str) -> None:
    """``--objective`` (:class:`Objective`, default step-time)."""
    parser.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        default=Objective.STEP_TIME.value,
        help=help_text,
    )


def write_run_plot(
    path: Path, rows: Sequence[Mapping[str, object]], *, title: str, priced: bool
) -> None:
    """Days to train vs cost (GPU-hours without prices) of the rows that have a run (keys
    ``num_gpus``, ``plan``, ``days``, ``cost_usd``, ``gpu_hours``), noted on stderr."""
    from plansim.report.plots import RunPoint, plot_run_pareto  # matplotlib only here

    key = "cost_usd" if priced else "gpu_hours"
    points = [
        RunPoint(
            num_gpus=int(str(row["num_gpus"])),
            days=float(str(row["days"])),
            cost=float(str(row[key])),
            label=str(row["plan"]).split(" mbs")[0],
        )
        for row in rows
        if row.get("days") is not None
    ]
    plot_run_pareto(points, path, title=title, cost_label="cost (USD)" if priced else "GPU-hours")
    sys.stderr.write(f"plansim: wrote --plot {path}\n")


def check_run_flags(args: argparse.Namespace) -> None:
    """Refuse run files given without ``--tokens``.

    Raises:
        SpecError: names the files given and asks for --tokens.
    """
    if args.tokens is None:
        flags = (*_FILE_FLAGS, "deadline_days")
        given = [f"--{flag.replace('_', '-')}" for flag in flags if getattr(args, flag) is not None]
        if given:
            raise SpecError(f"{', '.join(given)} needs --tokens (the tokens to train)")


def _tokens(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(
            f"--tokens must be a number of tokens (e.g. 15.6e12), got {text!r}"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"--tokens must be a positive finite number of tokens, got {text!r}")
    return value


def run_inputs(
    args: argparse.Namespace, *, model: ModelSpec, global_batch_size: int
) -> RunInputs | None:
    """The whole-run inputs, or None without ``--tokens``.

    Raises:
        SpecError: a run file without ``--tokens``, or a bad ``--tokens``.
        InputFileError: a bad file (names the file and the key).
    """
    if args.tokens is None:
        check_run_flags(args)
        return None
    run = training_run(args, model=model, global_batch_size=global_batch_size)
    return RunInputs(run=run, **cost_inputs(args))


def training_run(
    args: argparse.Namespace, *, model: ModelSpec, global_batch_size: int
) -> TrainingRun:
    """The run ``--tokens``, ``--ramp`` and ``--deadline-days`` describe for ``model`` (a
    ramp's phases default to its sequence length) at ``global_batch_size`` without a ramp.

    Raises:
        SpecError: a bad ``--tokens`` or ``--deadline-days``.
        InputFileError: a bad ramp file.
    """
    tokens = _tokens(args.tokens)
    if args.ramp is not None:
        run = read_ramp(args.ramp, tokens=tokens, seq_length=model.seq_length)
    else:
        run = TrainingRun(tokens=tokens, phases=(RampPhase(global_batch_size=global_batch_size),))
    if args.deadline_days is not None:
        days = args.deadline_days
        if not math.isfinite(days) or days <= 0:
            raise SpecError(f"--deadline-days must be a positive number of days, got {days}")
        run = dataclasses.replace(run, deadline_s=days * SECONDS_PER_DAY)
    return run


def cost_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``failures``, ``facility`` and ``prices`` read once from their files (None each
    where not given).

    Raises:
        InputFileError: a bad file (names the file and the key).
    """
    return {
        "failures": None if args.failures is None else read_failures(args.failures),
        "facility": None if args.facility is None else read_facility(args.facility),
        "prices": None if args.prices is None else read_prices(args.prices),
    }
