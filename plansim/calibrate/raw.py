"""The only reader/writer of raw calibration measurements (``<profile>.raw.csv``). Pure.

One row per measured item and rank (tidy), beside the profile it backs; provenance entries
name the file and the ``run_id`` their numbers came from. Columns:

==============  ==============================================================================
run_id          calibration run (UTC time stamp ``YYYYmmddTHHMMSS.mmmZ``)
kind, op        what ran (``gemm``/``mlp_up``, ``collective``/``all_reduce``, ``memory``/...)
dtype, shape    element type; ``m x n x k``, ``b x h x s x d``, elements, bytes, ...
group_size      ranks taking part (collectives), else 1
sweep           pass over the GEMMs and collectives (0, 1, ...; other items: 0)
rank            the rank that timed it
status          ``ok``, ``skipped`` or ``unsupported`` (with ``note``)
reps, inner     timed repetitions, calls per repetition
work, work_unit FLOPs / bytes / parameters / calls per call; bytes for ``memory`` rows;
                watts (``W``) for the power rows of the sustained item (``median_s``
                there: the seconds sampled)
median_s ...    seconds per call: median, min, max over the repetitions
cpu_share       compute on a CPU device: the rank's CPU time / wall time while timing
                (below 1: it waited for a core, other work competed); empty for
                collectives (they wait in the transport) and on GPUs
==============  ==============================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from plansim.errors import InputFileError
from plansim.io.outputs import replace_file

COLUMNS = (
    "run_id",
    "kind",
    "op",
    "dtype",
    "shape",
    "group_size",
    "sweep",
    "rank",
    "status",
    "reps",
    "inner",
    "work",
    "work_unit",
    "median_s",
    "min_s",
    "max_s",
    "cpu_share",
    "note",
)
#: Columns a file may lack (written by an earlier version): filled with NaN on reading.
_OPTIONAL = {"cpu_share": float("nan"), "sweep": 0}
_TEXT = ("run_id", "kind", "op", "dtype", "shape", "status", "work_unit", "note")


def raw_path(profile_path: str | Path) -> Path:
    """``X.yaml`` -> ``X.raw.csv`` in the same folder."""
    path = Path(profile_path)
    return path.with_name(f"{path.stem}.raw.csv")


def frame(rows: Iterable[dict[str, object]], *, run_id: str) -> pd.DataFrame:
    """Rows (dicts with the columns other than run_id) as a table in column order."""
    table = pd.DataFrame.from_records(list(rows))
    table.insert(0, "run_id", run_id)
    for column, default in _OPTIONAL.items():
        if column not in table.columns:
            table[column] = default
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"raw measurements lack columns: {', '.join(missing)}")
    return table.loc[:, list(COLUMNS)]


def read_raw(path: str | Path) -> pd.DataFrame:
    """The table in ``path``; an empty table when the file does not exist.

    Raises:
        InputFileError: the file exists but is not a raw-measurement CSV.
    """
    target = Path(path)
    if not target.exists():
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        table = pd.read_csv(target, dtype={c: str for c in _TEXT}, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise InputFileError(f"{target.name}: cannot read raw measurements: {exc}") from None
    for column, default in _OPTIONAL.items():
        if column not in table.columns:
            table[column] = default
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise InputFileError(f"{target.name}: not a raw-measurement CSV (lacks {missing})")
    for column in ("median_s", "min_s", "max_s", "work", "cpu_share"):
        table[column] = pd.to_numeric(table[column].replace("", "nan"), errors="coerce")
    return table.loc[:, list(COLUMNS)]


def merge_raw(old: pd.DataFrame, new: pd.DataFrame, *, keep_runs: Iterable[str]) -> pd.DataFrame:
    """``new`` plus the rows of ``old`` whose run is still cited (``keep_runs``)."""
    kept = old[old["run_id"].isin(set(keep_runs)) & ~old["run_id"].isin(set(new["run_id"]))]
    parts = [part for part in (kept, new) if not part.empty]
    return pd.concat(parts, ignore_index=True) if parts else new


def write_raw(table: pd.DataFrame, path: str | Path) -> None:
    """Write ``table`` to ``path`` atomically (temp file in the same folder, then replace)."""
    replace_file(path, table.to_csv(index=False, float_format="%.12g"))
