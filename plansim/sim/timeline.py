"""The Timeline schema shared by the simulator and the validator, and what is read from it.

A Timeline is a pandas DataFrame with one row per event and exactly the columns
:data:`COLUMNS`:

========== ======= =================================================================
column     dtype   meaning
========== ======= =================================================================
rank       int64   pipeline rank (0 .. pp-1) of the representative replica
stream     str     a :class:`Stream`'s value (compute, tp, pp_send, ...)
kind       str     a :class:`TimelineKind`'s value in every row plansim writes
                   (``forward``, ``tp_comm``, ``send_forward``, ...); readers accept any
stage      int64   pipeline stage of the action, -1 for events not tied to one
microbatch int64   micro-batch index, -1 for events not tied to one
start_s    float64 seconds from the start of the step
end_s      float64 seconds from the start of the step, >= start_s
bytes      float64 bytes moved (communication) or 0
========== ======= =================================================================

Rows are sorted by start_s, then rank, then stream (then end_s, kind, stage, microbatch,
so the order is total). **Pipeline work** rows are those on the ``compute`` or ``tp``
stream with ``stage >= 0``: the segments of F/B/I/W actions (TP collectives block compute).
Rows of one (rank, stream) do not overlap, except on ``pp_recv``, where a rank may receive
from both neighbours at once, on ``dp``, where a blocking in-action ``dp`` segment
(ZeRO-3 gather) could meet a queued gradient bucket, and on ``tp`` inside DualPipe's
overlapped F&B pairs, where both halves' collectives (all-to-alls) may run at once; their
compute rows never overlap (the halves take the GPU in turns). Gradient-bucket rows on ``dp`` carry
their stage with micro-batch -1. A communication row spans the transfer as it ran: when it
shared a link with other transfers (``plansim.sim.links``) it lasts longer than its costed
``duration_s``; ``bytes`` stays what it moved.

**Exposed communication** (:func:`exposed_comm_s`): per rank, the time its compute stream
is idle while communication runs on the rank, by kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from plansim.errors import PlansimError
from plansim.specs.choice_enum import ChoiceEnum


class Stream(ChoiceEnum):
    """A rank's streams: the Timeline's ``stream`` values (``plansim.specs.work.STREAMS``, in
    that order). Compute segments and blocking TP collectives run on ``compute``/``tp`` one
    after another; ``pp_send``/``pp_recv`` and ``dp`` run beside compute."""

    COMPUTE = "compute"
    TP = "tp"
    PP_SEND = "pp_send"
    PP_RECV = "pp_recv"
    DP = "dp"


class TimelineKind(ChoiceEnum):
    """What a Timeline row is: its ``kind`` value.

    Pipeline actions (``forward``, ``backward``, ``backward_input``, ``backward_weight``) and
    their ``recompute``; the pipeline transfers (``send_*`` on ``pp_send``, ``recv_*`` on
    ``pp_recv``); the collectives of TP, CP and DP/ZeRO (``tp_comm``, ``cp_comm``,
    ``dp_comm``), the expert-parallel token dispatch and combine all-to-alls of MoE layers
    (``ep_comm``) and the tied-embedding gradient all-reduce; the optimizer; ZeRO-Offload /
    ZeRO-Infinity's host copies, NVMe transfers and CPU Adam (``plansim.analytic.offload``);
    a parameter server's push, update and pull (``plansim.analytic.param_server``); and the
    validator's per-action pipeline-schedule cost (``plansim.validate.simulated``).
    """

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"
    BACKWARD_WEIGHT = "backward_weight"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"
    SEND_FORWARD = "send_forward"
    RECV_FORWARD = "recv_forward"
    SEND_BACKWARD = "send_backward"
    RECV_BACKWARD = "recv_backward"
    TP_COMM = "tp_comm"
    CP_COMM = "cp_comm"
    EP_COMM = "ep_comm"
    DP_COMM = "dp_comm"
    EMBEDDING_GRAD_COMM = "embedding_grad_comm"
    OFFLOAD_D2H = "offload_d2h"
    OFFLOAD_H2D = "offload_h2d"
    NVME_READ = "nvme_read"
    NVME_WRITE = "nvme_write"
    CPU_ADAM = "cpu_adam"
    PS_PUSH = "ps_push"
    PS_UPDATE = "ps_update"
    PS_PULL = "ps_pull"
    PIPELINE_ACTION = "pipeline_action"


#: The values of :class:`Stream` and :class:`TimelineKind`, in definition order.
STREAMS = tuple(s.value for s in Stream)
KINDS = tuple(k.value for k in TimelineKind)

RANK = "rank"
STREAM = "stream"
KIND = "kind"
STAGE = "stage"
MICROBATCH = "microbatch"
START_S = "start_s"
END_S = "end_s"
BYTES = "bytes"
COLUMNS = (RANK, STREAM, KIND, STAGE, MICROBATCH, START_S, END_S, BYTES)

#: stage / microbatch of an event not tied to one (grad sync, optimizer).
NOT_TIED = -1
#: Streams whose stage-tied rows are pipeline work (the compute stream is busy).
COMPUTE_STREAMS = (Stream.COMPUTE.value, Stream.TP.value)

#: The stream of compute kernels; every other stream carries communication.
COMPUTE = Stream.COMPUTE.value
#: When several kinds of communication run during the same idle compute time, the time
#: goes to the first of them in this order; kinds not listed follow in alphabetical order.
#: TP collectives block the compute stream, so they come first; then the pipeline transfers a
#: rank waits for (receives) or is held by (synchronous sends); DP traffic last, as it is
#: what runs beside the others when overlapped.
EXPOSED_PRIORITY = tuple(
    k.value
    for k in (
        TimelineKind.TP_COMM,
        TimelineKind.RECV_FORWARD,
        TimelineKind.RECV_BACKWARD,
        TimelineKind.SEND_FORWARD,
        TimelineKind.SEND_BACKWARD,
        TimelineKind.DP_COMM,
        TimelineKind.EMBEDDING_GRAD_COMM,
    )
)

#: (rank, stream, kind, stage, microbatch, start_s, end_s, bytes)
TimelineRow = tuple[int, str, str, int, int, float, float, float]

_INT_COLUMNS = (RANK, STAGE, MICROBATCH)
_FLOAT_COLUMNS = (START_S, END_S, BYTES)
_DTYPES = {name: "int64" for name in _INT_COLUMNS} | {name: "float64" for name in _FLOAT_COLUMNS}
#: Row order: start_s, rank, stream, then end_s, kind, stage, microbatch (a total order).
_ORDER = (START_S, RANK, STREAM, END_S, KIND, STAGE, MICROBATCH)
#: One row as a NumPy record (strings as objects).
_ROW_DTYPE = np.dtype([(name, _DTYPES.get(name, object)) for name in COLUMNS])


class TimelineError(PlansimError):
    """A DataFrame does not follow the Timeline schema; the message names the column."""


def make_timeline(rows: Iterable[TimelineRow]) -> pd.DataFrame:
    """Build a Timeline from row tuples in one go (no per-row DataFrame appends).

    Args:
        rows: ``(rank, stream, kind, stage, microbatch, start_s, end_s, bytes)`` tuples.

    Returns:
        The sorted Timeline with a fresh RangeIndex.
    """
    rows = rows if isinstance(rows, list) else list(rows)
    # one structured array in C, not a Python transpose of the rows (about 4x faster)
    records = np.array(rows, dtype=_ROW_DTYPE) if rows else np.empty(0, dtype=_ROW_DTYPE)
    arrays = {name: records[name] for name in COLUMNS}
    keys = [arrays[name] for name in reversed(_ORDER)]
    for i, name in enumerate(reversed(_ORDER)):
        if name in (STREAM, KIND):  # lexsort needs numbers: sorted codes keep string order
            keys[i] = pd.factorize(arrays[name], sort=True)[0]
    order = np.lexsort(keys)
    return pd.DataFrame({name: array[order] for name, array in arrays.items()})


def validate_timeline(df: pd.DataFrame) -> None:
    """Check that ``df`` follows the Timeline schema.

    Raises:
        TimelineError: wrong columns or dtypes, an unknown stream, a negative or reversed
            interval, a stage/microbatch below -1, negative bytes, or rows out of order.
    """
    if tuple(df.columns) != COLUMNS:
        raise TimelineError(f"timeline columns are {list(df.columns)}; expected {list(COLUMNS)}")
    for name in _INT_COLUMNS:
        if not pd.api.types.is_integer_dtype(df[name]):
            raise TimelineError(f"timeline column {name!r} must be integer, got {df[name].dtype}")
    for name in _FLOAT_COLUMNS:
        if not pd.api.types.is_float_dtype(df[name]) or df[name].isna().any():
            raise TimelineError(f"timeline column {name!r} must be float without NaN")
    unknown = sorted(set(df[STREAM]) - set(STREAMS))
    if unknown:
        raise TimelineError(f"timeline streams {unknown} unknown; choose from {list(STREAMS)}")
    problems = {
        "start_s < 0": df[START_S] < 0,
        "end_s < start_s": df[END_S] < df[START_S],
        "rank < 0": df[RANK] < 0,
        "stage < -1": df[STAGE] < NOT_TIED,
        "microbatch < -1": df[MICROBATCH] < NOT_TIED,
        "bytes < 0": df[BYTES] < 0,
    }
    for what, mask in problems.items():
        if mask.any():
            row = int(np.flatnonzero(mask.to_numpy())[0])
            raise TimelineError(f"timeline row {row}: {what}: {df.iloc[row].to_dict()}")
    keys = df[[START_S, RANK, STREAM]]
    if not keys.equals(keys.sort_values([START_S, RANK, STREAM], kind="stable")):
        raise TimelineError("timeline rows are not sorted by start_s, rank, stream")


def pipeline_work(df: pd.DataFrame) -> pd.DataFrame:
    """The pipeline-work rows: compute/tp stream segments of F/B/I/W actions (stage >= 0)."""
    return df[df[STREAM].isin(COMPUTE_STREAMS) & (df[STAGE] >= 0)]


def busy_s(df: pd.DataFrame, *, num_ranks: int, until_s: float) -> tuple[float, ...]:
    """Seconds each rank's compute stream does pipeline work within ``[0, until_s]``.

    Overlapping rows of one rank count once (the union of their intervals).
    """
    work = pipeline_work(df)
    ranks = work[RANK].to_numpy()
    starts = np.clip(work[START_S].to_numpy(dtype=np.float64), 0.0, until_s)
    ends = np.clip(work[END_S].to_numpy(dtype=np.float64), 0.0, until_s)
    return tuple(_union_length(starts[ranks == r], ends[ranks == r]) for r in range(num_ranks))


def _union_length(starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> float:
    """Total length of the union of intervals [starts[i], ends[i]]."""
    order = np.argsort(starts, kind="stable")
    total = 0.0
    cur_start = cur_end = -np.inf
    for start, end in zip(starts[order].tolist(), ends[order].tolist(), strict=True):
        if start > cur_end:
            if cur_end > cur_start:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end > cur_start:
        total += cur_end - cur_start
    return total


def bubble_fractions(
    df: pd.DataFrame, *, num_ranks: int, pipeline_time_s: float
) -> tuple[float, ...]:
    """Per rank, compute-stream idle time within ``[0, pipeline_time_s]`` / pipeline_time_s.

    Read from the events (pipeline-work rows), never from a closed form; with uniform costs
    it reproduces (p-1)/(m+p-1) for GPipe and 1F1B (Narayanan et al. SC21 §2.2).
    Returns zeros when ``pipeline_time_s`` is 0.
    """
    if pipeline_time_s <= 0:
        return (0.0,) * num_ranks
    busy = busy_s(df, num_ranks=num_ranks, until_s=pipeline_time_s)
    return tuple((pipeline_time_s - b) / pipeline_time_s for b in busy)


@dataclass(frozen=True, slots=True, kw_only=True)
class Exposure:
    """Compute and exposed communication read from a Timeline (:func:`exposure`).

    Attributes:
        exposed_s_by_kind: {communication kind: seconds}, summed over ranks, keys sorted.
        compute_busy_s: per rank, seconds its ``compute`` stream runs.
    """

    exposed_s_by_kind: dict[str, float]
    compute_busy_s: tuple[float, ...]


def exposure(df: pd.DataFrame, *, num_ranks: int) -> Exposure:
    """Communication not hidden behind compute, by kind, and compute busy time per rank.

    For rank r, an instant counts for kind k when no ``compute``-stream row of r runs, a row
    of kind k on another stream of r does, and no kind earlier in :data:`EXPOSED_PRIORITY`
    does (each idle instant is counted once). A blocking TP collective (stream ``tp``, the
    compute stream held) therefore counts whole as ``tp_comm``; a DP bucket reduced while
    the rank still computes counts nothing. The measure is per rank: a rank that finished
    its pipeline work early and waits for its gradient reduction has that reduction exposed
    even when another rank sets the step time. Compute busy time is the union of the rank's
    ``compute`` rows (F/B/I/W compute segments, recompute, optimizer; TP is not compute).
    Read from the events only.

    Returns:
        Exposed seconds for every communication kind in ``df`` (0.0 when fully hidden) and
        busy seconds for every rank in ``range(num_ranks)``.
    """
    is_comm = (df[STREAM] != COMPUTE).to_numpy()
    comm_kinds = df[KIND].to_numpy()[is_comm].tolist()
    kinds = _by_priority(set(comm_kinds))
    code = {kind: i + 1 for i, kind in enumerate(kinds)}
    category = np.zeros(len(df), dtype=np.int64)  # 0: compute
    category[is_comm] = [code[kind] for kind in comm_kinds]
    starts = df[START_S].to_numpy(dtype=np.float64)
    ends = df[END_S].to_numpy(dtype=np.float64)
    ranks = df[RANK].to_numpy()
    keep = np.flatnonzero((ends > starts) & (ranks >= 0) & (ranks < num_ranks))
    keep = keep[np.argsort(ranks[keep], kind="stable")]
    bounds = np.searchsorted(ranks[keep], np.arange(num_ranks + 1), side="left")
    totals = np.zeros(len(kinds) + 1)
    busy = []
    for r in range(num_ranks):
        mine = keep[bounds[r] : bounds[r + 1]]
        per_category = _idle_by_category(
            category[mine], starts[mine], ends[mine], num_categories=len(kinds) + 1
        )
        busy.append(float(per_category[0]))
        totals[1:] += per_category[1:]
    return Exposure(
        exposed_s_by_kind={kind: float(totals[code[kind]]) for kind in sorted(kinds)},
        compute_busy_s=tuple(busy),
    )


def exposed_comm_s(df: pd.DataFrame, *, num_ranks: int) -> dict[str, float]:
    """{communication kind: exposed seconds summed over ranks} (:func:`exposure`)."""
    return exposure(df, num_ranks=num_ranks).exposed_s_by_kind


def compute_busy_s(df: pd.DataFrame, *, num_ranks: int) -> tuple[float, ...]:
    """Seconds each rank's ``compute`` stream runs (:func:`exposure`)."""
    return exposure(df, num_ranks=num_ranks).compute_busy_s


def _by_priority(kinds: set[str]) -> list[str]:
    """``kinds`` in EXPOSED_PRIORITY order, unlisted ones after it alphabetically."""
    listed = [k for k in EXPOSED_PRIORITY if k in kinds]
    return listed + sorted(kinds - set(EXPOSED_PRIORITY))


def _idle_by_category(
    category: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
    *,
    num_categories: int,
) -> np.ndarray[Any, Any]:
    """One rank: [compute busy seconds, then exposed seconds of each category 1..].

    Cuts time at every row boundary; on each piece, a category is active when one of its
    rows covers it (count of starts <= t minus ends <= t, t the piece's left end); the piece
    goes to the first active category, compute (0) first.
    """
    out = np.zeros(num_categories)
    points = np.unique(np.concatenate([starts, ends]))
    if len(points) < 2:
        return out
    left, length = points[:-1], np.diff(points)
    taken = np.zeros(len(left), dtype=bool)
    for c in range(num_categories):
        mask = category == c
        if not mask.any():
            continue
        covering = np.searchsorted(np.sort(starts[mask]), left, side="right") - np.searchsorted(
            np.sort(ends[mask]), left, side="right"
        )
        active = (covering > 0) & ~taken
        out[c] = float(length[active].sum())
        taken |= active
    return out
