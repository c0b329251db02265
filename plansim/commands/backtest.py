"""plansim backtest: predict published runs and report the step-time error, and where rows
give them, the errors of one layer's forward and backward times and of the peak memory."""

from __future__ import annotations

import argparse
import statistics
import sys
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from plansim.commands.plan import add_search_args, resolve_jobs
from plansim.errors import InputFileError, require_positive_int
from plansim.io.outputs import check_writable
from plansim.io.runs import RunRow, read_runs, write_predictions
from plansim.planner.backtest import OVER_MEMORY, Prediction, predict_row
from plansim.planner.parallel import map_in_order
from plansim.planner.progress import progress_bar
from plansim.planner.run_checks import PER_LAYER, LayerCheck
from plansim.report.tables import render
from plansim.specs.profile_terms import TERM_NAMES


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim backtest``."""
    p = sub.add_parser(
        "backtest",
        help="predict published runs and report errors",
        description="Predict every run of a runs CSV (blank knobs are searched), print a "
        "per-row table and the error summary, optionally write predictions. Rows that "
        "cannot be modelled are skipped with the reason. Exit status 0; 1 when a row failed "
        "(a plansim bug, named in its note; after every other row is predicted) or no row "
        "could be predicted; 2 for bad input.",
    )
    p.add_argument("runs", help="runs CSV (schema: ../shared/reference/README.md)")
    p.add_argument(
        "--out",
        default=None,
        help="write the rows with prediction columns here: status, note, predicted step "
        "time, error, peak memory, the chosen plan, its MFU, bubble fraction and exposed "
        "communication by kind (seconds per pipeline rank, kind=seconds;...); where a row "
        "gives them, the errors of its measured peak memory and one layer's forward and "
        "backward times",
    )
    p.add_argument(
        "--simulate-top", type=int, default=8, help="candidates simulated per searched row"
    )
    add_search_args(p)  # --jobs (rows predicted at once) and --progress, as plan and sweep
    p.add_argument(
        "--sensitivity",
        action="store_true",
        help="also say what each prediction rests on: the chosen plan's elasticity to each "
        "profile term (as 'plansim simulate --sensitivity'; --out gets an elasticity_<term> "
        "column per term, elasticity_on_assumptions and the profile curves read outside "
        "their measured points) and a summary line",
    )
    p.add_argument(
        "--group-by",
        default=None,
        metavar="COLUMN",
        help="also print the error summary per value of this runs-CSV column (e.g. gpu_type, "
        "precision, framework)",
    )
    p.set_defaults(func=run)


def _fmt(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _fmt_kinds(seconds_by_kind: dict[str, float]) -> str:
    """``kind=seconds`` pairs joined by ``;`` in key order (``dp_comm=0.2400;tp_comm=3.9843``)."""
    return ";".join(f"{kind}={seconds:.4f}" for kind, seconds in sorted(seconds_by_kind.items()))


class ErrorStats(NamedTuple):
    """Summary of signed step-time errors (%): mean, median and max of |error|, mean signed."""

    mean_abs: float
    median_abs: float
    max_abs: float
    mean_signed: float


def error_stats(errors: list[float]) -> ErrorStats:
    """:class:`ErrorStats` of signed errors (%).

    Raises:
        statistics.StatisticsError: ``errors`` is empty.
    """
    sizes = [abs(e) for e in errors]
    return ErrorStats(
        statistics.fmean(sizes), statistics.median(sizes), max(sizes), statistics.fmean(errors)
    )


def _summary(errors: list[float], label: str) -> str:
    """'<label> mean |error| 5.8% (median 4.7%, max 21.9%, mean signed -5.4%)'."""
    stats = error_stats(errors)
    return (
        f"{label}mean |error| {stats.mean_abs:.1f}% (median {stats.median_abs:.1f}%, "
        f"max {stats.max_abs:.1f}%, mean signed {stats.mean_signed:+.1f}%)"
    )


def _layer_text(layer: LayerCheck) -> str:
    """'layer fwd 7.60 ms (-1.3%), bwd 12.61 ms (+6.0%)' (errors where measured)."""
    parts = []
    for name, ms, err in (
        ("fwd", layer.forward_ms, layer.forward_error_pct),
        ("bwd", layer.backward_ms, layer.backward_error_pct),
    ):
        parts.append(f"{name} {ms:.2f} ms" + ("" if err is None else f" ({err:+.1f}%)"))
    return "layer " + ", ".join(parts)


def _group_table(groups: dict[str, list[float]], column: str) -> str:
    """Per-value error summary: runs predicted, mean |error|, median |error|, mean signed
    error (%), values in sorted order; a blank cell is ``(blank)``."""
    records = []
    for value, errs in sorted(groups.items()):
        stats = error_stats(errs)
        records.append(
            {
                column: value,
                "runs": len(errs),
                "mean_abs_error_pct": f"{stats.mean_abs:.1f}",
                "median_abs_error_pct": f"{stats.median_abs:.1f}",
                "mean_signed_error_pct": f"{stats.mean_signed:+.1f}",
            }
        )
    return render(pd.DataFrame(records), "table")


#: Status of a row whose prediction raised an unexpected exception (a plansim bug).
FAILED = "failed"


def _predict_guarded(row: RunRow, simulate_top: int, sensitivity: bool) -> Prediction:
    """``predict_row``, except that an unexpected exception (a plansim bug, not a bad cell:
    those are skips) becomes status FAILED with the exception and where it was raised in the
    note, so one row cannot cost the predictions of the others; ``run`` then exits 1."""
    try:
        return predict_row(row, simulate_top=simulate_top, sensitivity=sensitivity)
    except Exception as exc:  # reported per row; the exit status says so
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        return Prediction(
            status=FAILED,
            note=f"plansim failed on this row ({type(exc).__name__}: {exc}, at {where}); "
            "please report it with the row",
        )


@dataclass
class _Tally:
    """What ``run`` collects over the predicted rows: signed step-time errors (%), by
    ``--group-by`` value too, the per-layer and peak-memory errors, and for the sensitivity
    line (signed error %, elasticity on assumptions, curves read outside their points)."""

    group_by: str | None
    errors: list[float] = field(default_factory=list)
    groups: dict[str, list[float]] = field(default_factory=dict)
    layer_errors: dict[str, list[float]] = field(
        default_factory=lambda: {"forward": [], "backward": []}
    )
    memory_errors: list[float] = field(default_factory=list)
    assumed: list[tuple[float, float, tuple[str, ...]]] = field(default_factory=list)

    def add(self, row: RunRow, pred: Prediction) -> None:
        """Count one row's prediction."""
        layer = pred.layer
        if layer is not None:
            if layer.forward_error_pct is not None:
                self.layer_errors["forward"].append(layer.forward_error_pct)
            if layer.backward_error_pct is not None:
                self.layer_errors["backward"].append(layer.backward_error_pct)
        if pred.peak_memory_error_pct is not None:
            self.memory_errors.append(pred.peak_memory_error_pct)
        error = pred.step_time_error_pct
        if error is None:
            return
        self.errors.append(error)
        if pred.elasticity_on_assumptions is not None:
            self.assumed.append((error, pred.elasticity_on_assumptions, pred.out_of_range))
        if self.group_by is not None:
            value = row.text(self.group_by) or "(blank)"
            self.groups.setdefault(value, []).append(error)


def _table_row(row: RunRow, pred: Prediction) -> dict[str, str]:
    """One row of the printed table."""
    layer = pred.layer
    return {
        "row": row.row_id,
        "model": (row.text("model_name") or "")[:28],
        "gpus": row.text("num_gpus") or "",
        "measured_s": row.text("step_time_s") or "",
        "predicted_s": _fmt(pred.predicted_step_time_s, 2),
        "error_pct": _fmt(pred.step_time_error_pct, 1),
        "status": pred.status,
        "plan / reason": " | ".join(
            [pred.plan_label or pred.note] + ([_layer_text(layer)] if layer else [])
        ),
    }


def _counts_text(statuses: list[str]) -> str:
    """'5 per-layer only, 0 skipped, 1 failed (...), 2 over plansim's memory limit'."""
    text = f"{statuses.count('skipped')} skipped"
    if PER_LAYER in statuses:  # predicted from their per-layer timings alone
        text = f"{statuses.count(PER_LAYER)} per-layer only, " + text
    failed = statuses.count(FAILED)
    if failed:
        text += f", {failed} failed (a plansim bug: see the rows' notes)"
    over = statuses.count(OVER_MEMORY)
    if over:  # predicted although plansim's memory model fits none of their layouts
        text += f", {over} over plansim's memory limit"
    return text


def _summary_lines(num_rows: int, statuses: list[str], tally: _Tally) -> str:
    """The summary line, then the per-layer, peak-memory and sensitivity lines that apply."""
    if tally.errors:
        stats = error_stats(tally.errors)
        summary = (
            f"mean |error| {stats.mean_abs:.1f}%, "
            f"median {stats.median_abs:.1f}%, max {stats.max_abs:.1f}%, "
            f"mean signed {stats.mean_signed:+.1f}% (below 0: predicted too fast)"
        )
    else:
        summary = "no run predicted"
    lines = [f"backtest: {num_rows} runs, {_counts_text(statuses)}, {summary}\n"]
    for part, errs in tally.layer_errors.items():
        if errs:
            label = f"per-layer {part} times: {len(errs)} runs, "
            lines.append(f"backtest {_summary(errs, label)}\n")
    if tally.memory_errors:
        label = f"peak memory: {len(tally.memory_errors)} runs measured, "
        lines.append(f"backtest {_summary(tally.memory_errors, label)}\n")
    if tally.assumed:
        lines.append(_assumed_line(tally.assumed))
    return "".join(lines)


def run(args: argparse.Namespace) -> int:
    """Predict each row, print the table, the per-group table (``--group-by``) and the
    summary line.

    Raises:
        InputFileError: ``--group-by`` names no column of the runs file.
        SpecError: ``--simulate-top`` or ``--jobs`` is not a positive integer.
        OutputFileError: ``--out`` cannot be written (checked before predicting).
    """
    require_positive_int("--simulate-top", args.simulate_top)
    jobs = resolve_jobs(args.jobs)
    if args.out:  # before any row is predicted, not after minutes of work
        check_writable(args.out, label="--out")
    header, rows = read_runs(args.runs)
    if args.group_by is not None and args.group_by not in header:
        raise InputFileError(
            f"--group-by {args.group_by!r} is not a column of {args.runs}; columns: "
            + ", ".join(header)
        )
    tally = _Tally(group_by=args.group_by)
    out_rows: list[dict[str, str]] = []
    table: list[dict[str, str]] = []
    predict = partial(
        _predict_guarded, simulate_top=args.simulate_top, sensitivity=args.sensitivity
    )
    bar = progress_bar(forced=args.progress)
    if bar is not None:
        bar.start("backtest", len(rows))
    for row, pred in zip(rows, map_in_order(predict, rows, jobs), strict=True):
        if bar is not None:
            bar.update(1)
        out_rows.append(_prediction_cells(row, pred))
        tally.add(row, pred)
        table.append(_table_row(row, pred))
    if bar is not None:
        bar.close()
    if args.out:
        extra = SENSITIVITY_COLUMNS if args.sensitivity else ()
        write_predictions(args.out, header, out_rows, extra_columns=extra)
    if table:  # an empty runs file prints only the summary line
        sys.stdout.write(render(pd.DataFrame(table), "table"))
    if tally.groups:
        sys.stdout.write("\n" + _group_table(tally.groups, args.group_by))
    statuses = [cells["status"] for cells in out_rows]
    sys.stdout.write(_summary_lines(len(rows), statuses, tally))
    predicted = [s for s in statuses if s != "skipped"]
    return 1 if FAILED in statuses or (rows and not predicted) else 0


#: ``--sensitivity``'s columns in ``--out``: one elasticity per profile term, then the sum
#: over the terms resting on an assumed figure.
SENSITIVITY_COLUMNS = (
    *(f"elasticity_{name}" for name in TERM_NAMES),
    "elasticity_on_assumptions",
    "out_of_range_lookups",
)


def _prediction_cells(row: RunRow, pred: Prediction) -> dict[str, str]:
    """The row's cells with its prediction columns (``--out``)."""
    cells = dict(row.cells)
    cells.update(
        status=pred.status,
        note=pred.note,
        predicted_step_time_s=_fmt(pred.predicted_step_time_s, 4),
        step_time_error_pct=_fmt(pred.step_time_error_pct, 2),
        predicted_peak_memory_gib=_fmt(pred.predicted_peak_memory_gib, 2),
        predicted_plan=pred.plan_label,
        predicted_mfu_pct=_fmt(pred.mfu_pct, 2),
        predicted_bubble_fraction=_fmt(pred.bubble_fraction, 4),
        predicted_exposed_comm_s=_fmt_kinds(pred.exposed_comm_s_by_kind),
        peak_memory_error_pct=_fmt(pred.peak_memory_error_pct, 2),
    )
    layer = pred.layer
    if layer is not None:
        cells.update(
            predicted_layer_forward_ms=_fmt(layer.forward_ms, 3),
            predicted_layer_backward_ms=_fmt(layer.backward_ms, 3),
            layer_forward_error_pct=_fmt(layer.forward_error_pct, 2),
            layer_backward_error_pct=_fmt(layer.backward_error_pct, 2),
        )
    for name, value in pred.elasticity_by_term.items():
        cells[f"elasticity_{name}"] = _fmt(value, 4)
    cells["elasticity_on_assumptions"] = _fmt(pred.elasticity_on_assumptions, 4)
    cells["out_of_range_lookups"] = "; ".join(pred.out_of_range)
    return cells


def _assumed_line(assumed: list[tuple[float, float, tuple[str, ...]]]) -> str:
    """'backtest sensitivity: ...': how much of the predictions rests on assumed profile
    figures, over all predicted rows and over those with |error| > 10%, and how many rows
    read a profile curve outside its measured points."""
    shares = [share for _, share, _ in assumed]
    worst = [share for err, share, _ in assumed if abs(err) > 10.0]
    outside = sum(1 for _, _, keys in assumed if keys)
    text = (
        f"backtest sensitivity: the predicted step times rest on assumed profile figures "
        f"by a median elasticity of {statistics.median(shares):.2f} "
        f"(range {min(shares):.2f}-{max(shares):.2f})"
    )
    if worst:
        text += f"; rows with |error| > 10%: median {statistics.median(worst):.2f}"
    text += f"; {outside} of {len(assumed)} read a profile curve outside its measured points"
    return text + "\n"
