"""The only reader of nccl-tests logs (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``sendrecv_perf``, ``alltoall_perf``). Pure: no torch.

nccl-tests prints, per run, a preamble (version, ``# Collective test starting: X_perf``,
``# nThread ...``, one ``#  Rank  r Group g Pid p on HOST device d [bus] NAME`` line per rank),
a table header and one row per message size (shown here without the repeated spaces)::

    #  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong
    #   (B)  (elements)                (us)  (GB/s) (GB/s)         (us)  (GB/s) (GB/s)
    134217728  33554432  float  sum  -1  1211.2  110.81  110.81  0  1211.8  110.76  110.76  N/A
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 159.151

The first 4 columns after the leading ones are out-of-place, the next 4 in-place (nccl-tests
``src/util.cu``: ``%12li  %12li  %8s  %6s  %6s`` then ``  %7s  %6s  %6s  %6g`` twice; older
versions have no ``root`` column, older ``all_gather`` no ``redop``). The column layout is read
from each run's header, so any of these versions parse. Times are microseconds, bandwidths GB/s
(1e9 bytes/s); this module returns seconds and bytes/s. ``alltoall_perf`` prints the same
columns (``redop`` ``none``, ``root`` -1); its size is the whole per-rank send buffer (1/n of it
to each rank, the rank itself included), its busbw = algbw * (n-1)/n (nccl-tests
``src/alltoall.cu``, ``doc/PERFORMANCE.md``), and its count column is the elements sent to
each peer.

Also handled: ``srun --label`` (`` 0: ``) and OpenMPI ``--tag-output`` (``[1,0]<stdout>:``)
prefixes, interleaved ``NCCL INFO``/``WARN`` lines, zero-byte rows (all_gather with sizes
below one element per rank), several runs in one file, rows marked wrong (``#wrong`` > 0:
that half is dropped), a table whose ``# Out of bounds values : N FAILED`` verdict reports
errors (dropped whole: nccl-tests' own check says its data is wrong), and truncated files
(the incomplete last row is reported, every complete row is kept). Lines inside a results
table that are not result rows are reported with their line number in
:attr:`NcclTestsLog.problems`; nothing is guessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from plansim.errors import InputFileError

__all__ = [
    "BINARIES",
    "NcclTestsLog",
    "NcclTestsRow",
    "NcclTestsRun",
    "Problem",
    "Timing",
    "parse_nccl_tests",
    "read_nccl_tests_log",
]

#: nccl-tests binary -> plansim collective name (``plansim.specs.curves.KNOWN_COLLECTIVES``:
#: the four required ones and the optional ``all_to_all``).
BINARIES = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "sendrecv_perf": "sendrecv",
    "alltoall_perf": "all_to_all",
}

_BINARY_OF = {collective: binary for binary, collective in BINARIES.items()}
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:)\s?")
_BINARY = re.compile(r"\b([a-z_]+_perf)\b")
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)(?:.*?nccl-library=(\d+))?")
_NTHREAD = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+\d+")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
    r"\[[^\]]*\]\s*(.*?)\s*$"
)
_NCCL_VERSION = re.compile(r"\bNCCL version\s+(\d+\.\d+\.\d+)")
_END = re.compile(r"^#\s*(?:Out of bounds values|Avg bus bandwidth)")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\S*)")
_DEBUG = re.compile(r"\bNCCL (?:INFO|WARN|TRACE)\b")
_TIME_COLUMNS = ("time", "cputime")
_US = 1e-6
_GB = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One half (out-of-place or in-place) of a row, in SI units."""

    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRow:
    """One result row: message ``size_bytes`` (nccl-tests' size) and its two timings."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str
    out_of_place: Timing | None
    in_place: Timing | None

    @property
    def time_s(self) -> float:
        """The smaller of the two times (what a fit uses; it drops single outliers)."""
        return min(t.time_s for t in (self.out_of_place, self.in_place) if t is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRun:
    """One table: a collective over ``num_ranks`` ranks on ``num_nodes`` hosts.

    ``num_ranks`` comes from the ``#  Rank`` lines, else from busbw/algbw of the largest row
    (the bus factor); ``None`` when neither is available. ``complete`` is True when the table
    ended with nccl-tests' summary lines (a truncated log has False).
    """

    collective: str
    binary: str
    first_line: int
    num_ranks: int | None
    num_nodes: int | None
    devices: tuple[str, ...]
    nccl_tests_version: str | None
    nccl_version: str | None
    complete: bool
    rows: tuple[NcclTestsRow, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """A line that could not be used, with the reason (line numbers start at 1)."""

    line: int
    reason: str
    text: str

    def describe(self, source: str) -> str:
        """``source:line: reason: text`` (text shortened to 80 characters)."""
        text = self.text.strip()
        text = text if len(text) <= 80 else text[:77] + "..."
        return f"{source}:{self.line}: {self.reason}" + (f": {text!r}" if text else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsLog:
    """Everything usable in one log: runs of the supported collectives and the problems."""

    source: str
    runs: tuple[NcclTestsRun, ...]
    problems: tuple[Problem, ...]

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per result row (SI units; NaN for a missing half)."""
        records = []
        for index, run in enumerate(self.runs):
            for row in run.rows:
                record: dict[str, object] = {
                    "source": self.source,
                    "run": index,
                    "line": row.line,
                    "collective": run.collective,
                    "num_ranks": run.num_ranks,
                    "num_nodes": run.num_nodes,
                    "size_bytes": row.size_bytes,
                    "dtype": row.dtype,
                }
                for tag, timing in (("oop", row.out_of_place), ("ip", row.in_place)):
                    record[f"{tag}_time_s"] = timing.time_s if timing else math.nan
                    record[f"{tag}_algbw_bytes_per_s"] = (
                        timing.algbw_bytes_per_s if timing else math.nan
                    )
                    record[f"{tag}_busbw_bytes_per_s"] = (
                        timing.busbw_bytes_per_s if timing else math.nan
                    )
                records.append(record)
        return pd.DataFrame.from_records(records)


@dataclass
class _Run:
    """A run being read: preamble facts, the table layout once its header is seen, rows."""

    start_line: int
    binary: str | None = None
    next_binary: str | None = None  # named by a command line after this run's table
    ranks: dict[int, tuple[str, str]] = field(default_factory=dict)
    nccl_tests_version: str | None = None
    nccl_version: str | None = None
    lead: int = 0  # columns before the first "time"
    starts: tuple[int, ...] = ()  # column of each timing group's "time" (out-of-place, in-place)
    has_redop: bool = False
    in_table: bool = False
    complete: bool = False
    out_of_bounds: int | None = None  # values of a FAILED "Out of bounds" verdict
    rows: list[NcclTestsRow] = field(default_factory=list)

    @property
    def has_header(self) -> bool:
        return bool(self.starts)


def read_nccl_tests_log(path: str | Path, *, collective: str | None = None) -> NcclTestsLog:
    """Read and parse one log file; see :func:`parse_nccl_tests`.

    Raises:
        InputFileError: the file cannot be read, or holds no usable nccl-tests results.
    """
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputFileError(f"{path}: file not found") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_nccl_tests(text, source=str(path), collective=collective)


def parse_nccl_tests(text: str, *, source: str, collective: str | None = None) -> NcclTestsLog:
    """Parse nccl-tests output.

    Args:
        text: the log (stdout of one or several nccl-tests binaries, possibly with other
            output around it).
        source: the log's name, for messages; a binary name in it (``all_gather_perf.log``)
            says which collective a run measured when the log itself does not.
        collective: force the collective of every run (one of :data:`BINARIES`' values).

    Returns:
        The runs of supported collectives with at least one usable row, and the problems.

    Raises:
        InputFileError: no result table of a supported collective was found (not nccl-tests
            output), or ``collective`` is not supported.
    """
    if collective is not None and collective not in BINARIES.values():
        raise InputFileError(
            f"collective {collective!r} is not supported; choose one of: "
            f"{', '.join(BINARIES.values())}"
        )
    problems: list[Problem] = []
    finished: list[_Run] = []
    run = _Run(start_line=1)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw, count=1).rstrip()
        if (run.has_header or run.rows) and (
            _starts_run(line) or (run.rows and _header(line) is not None)
        ):
            finished.append(run)
            run = _Run(start_line=number, binary=run.next_binary)
        _read_line(run, line, number, problems)
    finished.append(run)
    runs = [r for r in (_finish(r, source, collective, problems) for r in finished) if r]
    if not runs:
        raise InputFileError(_nothing_found(source, problems))
    return NcclTestsLog(source=source, runs=tuple(runs), problems=tuple(problems))


def _starts_run(line: str) -> bool:
    return bool(_VERSION.match(line) or _START.match(line) or _NTHREAD.match(line))


def _read_line(run: _Run, line: str, number: int, problems: list[Problem]) -> None:
    """Update ``run`` with one (prefix-stripped) line."""
    stripped = line.strip()
    if not stripped:
        return
    if stripped.startswith("#"):
        _read_comment(run, stripped)
        return
    version = _NCCL_VERSION.search(stripped)
    if version:  # "NCCL version 2.26.6+cuda12.8", also inside NCCL INFO lines
        run.nccl_version = version.group(1)
        return
    if _DEBUG.search(stripped):
        return
    if not run.in_table:
        binary = _BINARY.search(stripped)  # a command line naming the binary
        if binary and run.has_header:
            run.next_binary = binary.group(1)
        elif binary and run.binary is None:
            run.binary = binary.group(1)
        return
    row = _parse_row(run, stripped, number, problems)
    if row is not None:
        run.rows.append(row)


def _read_comment(run: _Run, line: str) -> None:
    """Preamble facts, the table header and the end-of-table lines."""
    if (match := _START.match(line)) is not None:
        run.binary = match.group(1)
    elif (match := _VERSION.match(line)) is not None:
        run.nccl_tests_version = match.group(1)
        if match.group(2):
            run.nccl_version = _nccl_version_from_code(int(match.group(2)))
    elif (match := _RANK.match(line)) is not None:
        run.ranks[int(match.group(1))] = (match.group(2), match.group(3))
    elif _END.match(line):
        if run.in_table:
            run.complete = True
        run.in_table = False
        verdict = _OUT_OF_BOUNDS.match(line)
        if verdict is not None and (int(verdict.group(1)) > 0 or verdict.group(2) == "FAILED"):
            run.out_of_bounds = int(verdict.group(1))
    elif (tokens := _header(line)) is not None:
        run.starts = tuple(i for i, t in enumerate(tokens) if t in _TIME_COLUMNS)[:2]
        run.lead = run.starts[0]
        run.has_redop = "redop" in tokens[: run.lead] or "op" in tokens[: run.lead]
        run.in_table = True


def _header(line: str) -> list[str] | None:
    """The column names of a table header line (``#  size  count ... busbw ...``), else None."""
    stripped = line.strip()
    if not stripped.startswith("#"):
        return None
    tokens = stripped.lstrip("#").split()
    timed = any(t in _TIME_COLUMNS for t in tokens)
    if tokens and tokens[0] in ("size", "bytes") and "busbw" in tokens and timed:
        return tokens
    return None


def _nccl_version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE -> "2.25.1" (major*10000 + minor*100 + patch since 2.9)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _parse_row(run: _Run, line: str, number: int, problems: list[Problem]) -> NcclTestsRow | None:
    """One result row, or None (with a problem recorded unless it is a zero-byte row)."""
    tokens = line.split()
    if not tokens[0].isdigit() or len(tokens) < 2 or not tokens[1].isdigit():
        problems.append(Problem(line=number, reason="not a result row", text=line))
        return None
    size = int(tokens[0])
    expected = run.starts[-1] + 4
    if len(tokens) < expected:
        problems.append(
            Problem(
                line=number,
                reason=f"incomplete row ({len(tokens)} of {expected} columns; truncated?)",
                text=line,
            )
        )
        return None
    if size == 0:
        return None  # nccl-tests prints 0-byte rows for sizes below one element per rank
    timings: list[Timing | None] = []
    for group, start in enumerate(run.starts):
        cells = tokens[start : start + 4]
        timing, reason = _timing(cells)
        if reason:
            half = "out-of-place" if group == 0 else "in-place"
            problems.append(Problem(line=number, reason=f"{half} {reason}", text=line))
        timings.append(timing)
    while len(timings) < 2:
        timings.append(None)
    if timings[0] is None and timings[1] is None:
        return None
    return NcclTestsRow(
        line=number,
        size_bytes=size,
        count=int(tokens[1]),
        dtype=tokens[2] if run.lead > 2 else "",
        redop=tokens[3] if run.has_redop and run.lead > 3 else "",
        out_of_place=timings[0],
        in_place=timings[1],
    )


def _timing(cells: list[str]) -> tuple[Timing | None, str]:
    """(time, algbw, busbw, #wrong) cells -> Timing, or None and why."""
    try:
        time_us, algbw, busbw = (float(c) for c in cells[:3])
    except ValueError:
        return None, "has a value that is not a number"
    if not (math.isfinite(time_us) and time_us > 0 and math.isfinite(busbw) and busbw >= 0):
        return None, f"has an invalid time ({cells[0]}) or bandwidth ({cells[2]})"
    wrong = cells[3]
    if wrong != "N/A":
        try:
            num_wrong = float(wrong)
        except ValueError:
            return None, f"has an unreadable #wrong value ({wrong})"
        if num_wrong != 0:
            return None, f"reports {wrong} wrong elements; not used"
    timing = Timing(
        time_s=time_us * _US, algbw_bytes_per_s=algbw * _GB, busbw_bytes_per_s=busbw * _GB
    )
    return timing, ""


def _finish(
    run: _Run, source: str, forced: str | None, problems: list[Problem]
) -> NcclTestsRun | None:
    """The finished run, or None when it has no rows or measured an unsupported collective."""
    if not run.rows:
        return None
    if run.out_of_bounds is not None:
        reason = (
            f"nccl-tests checked the results and found {run.out_of_bounds} out-of-bounds "
            "values (FAILED): this table's data is wrong, none of it is imported"
        )
        problems.append(Problem(line=run.rows[0].line, reason=reason, text=""))
        return None
    binary = run.binary or _binary_from_name(source)
    if forced is not None:
        name = forced
    elif binary in BINARIES:
        name = BINARIES[binary]
    else:
        reason = (
            f"{binary} results are not used (plansim models {', '.join(BINARIES.values())})"
            if binary
            else "cannot tell which collective this table measured (no '# Collective test "
            "starting' line, command line or file name naming e.g. all_reduce_perf)"
        )
        problems.append(Problem(line=run.rows[0].line, reason=reason, text=""))
        return None
    hosts = {host for host, _ in run.ranks.values()}
    return NcclTestsRun(
        collective=name,
        binary=binary if binary in BINARIES else _BINARY_OF[name],
        first_line=run.start_line,
        num_ranks=max(run.ranks) + 1 if run.ranks else _ranks_from_bandwidth(name, run.rows),
        num_nodes=len(hosts) if hosts else None,
        devices=tuple(sorted({device for _, device in run.ranks.values() if device})),
        nccl_tests_version=run.nccl_tests_version,
        nccl_version=run.nccl_version,
        complete=run.complete,
        rows=tuple(run.rows),
    )


def _binary_from_name(source: str) -> str | None:
    match = _BINARY.search(Path(source).name)
    return match.group(1) if match else None


def _ranks_from_bandwidth(collective: str, rows: list[NcclTestsRow]) -> int | None:
    """Invert the bus factor busbw/algbw of the largest row (all_reduce 2(n-1)/n; all_gather,
    reduce_scatter and all_to_all (n-1)/n)."""
    if collective == "sendrecv":
        return None
    timing = rows[-1].out_of_place or rows[-1].in_place
    if timing is None or timing.algbw_bytes_per_s <= 0:
        return None
    ratio = timing.busbw_bytes_per_s / timing.algbw_bytes_per_s
    share = ratio / 2 if collective == "all_reduce" else ratio  # (n-1)/n
    if not 0 < share < 1:
        return None
    ranks = 1 / (1 - share)
    return round(ranks) if abs(ranks - round(ranks)) < 0.05 * ranks else None


def _nothing_found(source: str, problems: list[Problem]) -> str:
    """The error of a log with no usable run: the first problem when there is one (the real
    cause, e.g. every row marked wrong), else what a table looks like."""
    if problems:
        more = f" ({len(problems) - 1} more problem(s) above)" if len(problems) > 1 else ""
        return f"no usable nccl-tests results: {problems[0].describe(source)}{more}"
    return (
        f"{source}: no nccl-tests results of {', '.join(BINARIES)} found (expected a header "
        "line '#  size  count  type ... time  algbw  busbw ...' followed by result rows); "
        "is this nccl-tests output?"
    )
