"""Reader/writer of the published-runs CSV (schema in ../shared/reference/README.md).

A blank cell means "the source did not say": it is kept as None, never filled with a silent
default. Malformed values raise InputFileError naming the file, row id and column.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from plansim.errors import InputFileError

REQUIRED_COLUMNS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_len_tokens",
    "gpu_type",
    "num_gpus",
    "global_batch_size_seqs",
    "precision",
    "step_time_s",
)

#: Integer columns where 0 is a value (ZeRO stage 0: no sharding); every other integer column
#: counts something and must be at least 1.
ZERO_ALLOWED_COLUMNS = frozenset({"zero_stage"})

OUTPUT_COLUMNS = (
    "status",
    "note",
    "predicted_step_time_s",
    "step_time_error_pct",
    "predicted_peak_memory_gib",
    "predicted_plan",
    "predicted_mfu_pct",
    "predicted_bubble_fraction",
    "predicted_exposed_comm_s",
    "peak_memory_error_pct",
    "predicted_layer_forward_ms",
    "predicted_layer_backward_ms",
    "layer_forward_error_pct",
    "layer_backward_error_pct",
)


@dataclass(frozen=True, slots=True)
class RunRow:
    """One published run: the raw cells plus typed accessors that keep blanks as None."""

    path: str
    line: int
    cells: dict[str, str]

    @property
    def row_id(self) -> str:
        """The row's id (``row_id`` column) or its line number."""
        return self.cells.get("row_id") or f"line {self.line}"

    def text(self, column: str) -> str | None:
        """Stripped cell text, None when blank or absent."""
        value = (self.cells.get(column) or "").strip()
        return value or None

    def choice(self, column: str) -> str | None:
        """An enumerated cell (gpu_type, precision, recompute, ffn_activation): stripped and
        lower-cased, as the schema's values are ("BF16" is bf16); None when blank."""
        value = self.text(column)
        return value.lower() if value is not None else None

    def integer(self, column: str) -> int | None:
        """Cell as an int (None when blank). Every integer column of the schema counts
        something (GPUs, layers, ranks, sequences) and must be >= 1, except ``zero_stage``
        (0-3), which may be 0.

        Raises:
            InputFileError: not a whole number, or below the column's minimum (names the row,
                column and value).
        """
        value = self.text(column)
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            raise self._error(column, value, "an integer") from None
        minimum = 0 if column in ZERO_ALLOWED_COLUMNS else 1
        if not math.isfinite(number) or number != int(number) or number < minimum:
            expected = "a non-negative integer" if minimum == 0 else "a positive integer"
            raise self._error(column, value, expected)
        return int(number)

    def number(self, column: str) -> float | None:
        """Cell as a float (None when blank); InputFileError when not a number."""
        value = self.text(column)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            raise self._error(column, value, "a number") from None

    def flag(self, column: str) -> bool | None:
        """yes/no cell as a bool (None when blank)."""
        value = self.text(column)
        if value is None:
            return None
        if value.lower() in ("yes", "true", "1"):
            return True
        if value.lower() in ("no", "false", "0"):
            return False
        raise self._error(column, value, "yes or no")

    def _error(self, column: str, value: str, expected: str) -> InputFileError:
        return InputFileError(
            f"{self.path}: row {self.row_id} (line {self.line}): column {column}: "
            f"expected {expected}, got {value!r}"
        )


def read_runs(path: str | Path) -> tuple[list[str], list[RunRow]]:
    """Header and rows of a runs CSV.

    Raises:
        InputFileError: unreadable file, not a CSV, a column named twice in the header, or a
            required column missing.
    """
    shown = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            named = [c for c in header if c]
            repeated = sorted({c for c in named if named.count(c) > 1})
            if repeated:
                raise InputFileError(
                    f"{shown}: column(s) {', '.join(repeated)} appear more than once in the "
                    "header (a row would keep only the last one's value)"
                )
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise InputFileError(f"{shown}: missing columns: {', '.join(missing)}")
            rows = [
                RunRow(shown, i + 2, {k: v or "" for k, v in r.items() if k is not None})
                for i, r in enumerate(reader)
            ]
    except OSError as exc:
        raise InputFileError(f"{shown}: cannot read: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InputFileError(f"{shown}: not a readable CSV: {exc}") from None
    return header, rows


def write_predictions(
    path: str | Path,
    header: Sequence[str],
    rows: Sequence[dict[str, str]],
    *,
    extra_columns: Sequence[str] = (),
) -> None:
    """Write the input columns plus OUTPUT_COLUMNS (then ``extra_columns``) atomically
    (temp file + rename).

    Raises:
        InputFileError: the destination cannot be written.
    """
    target = Path(path)
    added = [*OUTPUT_COLUMNS, *extra_columns]
    columns = list(header) + [c for c in added if c not in header]
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent or Path("."), suffix=".tmp")
    except OSError as exc:
        raise InputFileError(f"{target}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            for row in rows:
                writer.writerow({c: row.get(c, "") for c in columns})
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputFileError(f"{target}: cannot write: {exc.strerror}") from None
