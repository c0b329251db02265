"""Chrome / Perfetto trace export of a Timeline (open in ui.perfetto.dev or chrome://tracing).

Format: the Trace Event Format's JSON object form, ``{"traceEvents": [...], ...}``:

- one **process** per pipeline rank (``pid`` = rank), named ``"rank N (pp stage S)"`` (or
  ``"pp stages S1, S2"`` with interleaving), sorted by rank;
- one **thread** per stream with a fixed ``tid`` (:data:`STREAM_TIDS`: compute 1, tp 2,
  pp_send 3, pp_recv 4, dp 5; streams unknown to this module follow in name order);
- every Timeline row is a complete event (``"ph": "X"``) with ``ts`` and ``dur`` in
  **microseconds** (rounded to the nanosecond), ``cat`` = kind, ``name`` = ``"F mb3 s1"`` for
  forward / backward / input-grad / weight-grad / recompute (F, B, I, W, R), ``"<kind> mb3 s1"``
  for other events tied to a micro-batch, the kind otherwise; ``args`` = stage, microbatch,
  bytes;
- memory samples are counter events (``"ph": "C"``, name ``"memory"``, ``args = {"GiB": x}``)
  per rank.

Deterministic: the same inputs give the same document (metadata by pid, tid; X events in
Timeline order: start, rank, stream, end, kind, stage, micro-batch; counters by time, rank,
then sample order) and :func:`write_trace` writes it with sorted keys.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.io.outputs import write_json_atomic
from plansim.sim import timeline as tl
from plansim.units import bytes_to_gib, s_to_us

#: Fixed thread id per stream (plansim.specs.work.STREAMS order, starting at 1).
STREAM_TIDS = {"compute": 1, "tp": 2, "pp_send": 3, "pp_recv": 4, "dp": 5}
#: Short action letters of the torch.distributed.pipelining alphabet (R: recompute).
KIND_LETTERS = {
    "forward": "F",
    "backward": "B",
    "backward_input": "I",
    "backward_weight": "W",
    "recompute": "R",
}
#: Decimal places kept of a microsecond value (3: nanoseconds).
_US_DECIMALS = 3
_ORDER = [tl.START_S, tl.RANK, tl.STREAM, tl.END_S, tl.KIND, tl.STAGE, tl.MICROBATCH]


def event_name(kind: str, stage: int, microbatch: int) -> str:
    """Display name of one event: ``"F mb3 s1"``, ``"tp_comm mb3 s1"`` or the bare kind.

    Args:
        kind: Timeline kind.
        stage: pipeline stage, -1 when not tied to one.
        microbatch: micro-batch index, -1 when not tied to one.
    """
    parts = [KIND_LETTERS.get(kind, kind)]
    if microbatch != tl.NOT_TIED:
        parts.append(f"mb{microbatch}")
    if stage != tl.NOT_TIED:
        parts.append(f"s{stage}")
    return " ".join(parts) if len(parts) > 1 else kind


def stream_tids(streams: list[str]) -> dict[str, int]:
    """Thread id per stream: :data:`STREAM_TIDS`, then unknown streams in name order."""
    tids = dict(STREAM_TIDS)
    for name in sorted(set(streams) - set(tids)):
        tids[name] = max(tids.values()) + 1
    return tids


def chrome_trace(
    timeline: pd.DataFrame, *, memory: pd.DataFrame | None, title: str
) -> dict[str, Any]:
    """The Trace Event Format document of one simulated (or measured) step.

    Args:
        timeline: Timeline schema (``plansim.sim.timeline``), seconds.
        memory: samples ``rank, time_s, bytes`` (``SimResult.memory``) or None.
        title: shown in ``otherData.title``.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``; timestamps
        and durations in microseconds, memory counters in GiB.
    """
    rows = timeline.sort_values(_ORDER, kind="stable")
    ranks = sorted({int(r) for r in rows[tl.RANK]})
    if memory is not None:
        ranks = sorted(set(ranks) | {int(r) for r in memory["rank"]})
    tids = stream_tids([str(s) for s in rows[tl.STREAM].unique()])
    events = _metadata(rows, ranks=ranks, tids=tids)
    events += _complete_events(rows, tids=tids)
    if memory is not None:
        events += _memory_counters(memory)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "time_unit": "us", "memory_unit": "GiB"},
    }


def _us(seconds: float) -> float:
    return round(s_to_us(seconds), _US_DECIMALS)


def _metadata(
    rows: pd.DataFrame, *, ranks: list[int], tids: dict[str, int]
) -> list[dict[str, Any]]:
    """process_name / process_sort_index per rank; thread_name / thread_sort_index per stream."""
    tied = rows[rows[tl.STAGE] >= 0]
    stages = tied.groupby(tl.RANK)[tl.STAGE].unique()
    events: list[dict[str, Any]] = []
    for rank in ranks:
        own = sorted(int(s) for s in stages.get(rank, []))
        name = f"rank {rank}"
        if own:
            word = "stage" if len(own) == 1 else "stages"
            name += f" (pp {word} {', '.join(str(s) for s in own)})"
        events.append(_meta("process_name", rank, 0, {"name": name}))
        events.append(_meta("process_sort_index", rank, 0, {"sort_index": rank}))
        for stream, tid in sorted(tids.items(), key=lambda kv: kv[1]):
            events.append(_meta("thread_name", rank, tid, {"name": stream}))
            events.append(_meta("thread_sort_index", rank, tid, {"sort_index": tid}))
    return events


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _complete_events(rows: pd.DataFrame, *, tids: dict[str, int]) -> list[dict[str, Any]]:
    """One ``"X"`` event per Timeline row, in the order of ``rows``."""
    columns = [rows[c].tolist() for c in tl.COLUMNS]
    events = []
    for rank, stream, kind, stage, mb, start_s, end_s, num_bytes in zip(*columns, strict=True):
        ts = _us(start_s)
        events.append(
            {
                "ph": "X",
                "name": event_name(kind, stage, mb),
                "cat": kind,
                "pid": rank,
                "tid": tids[stream],
                "ts": ts,
                "dur": max(0.0, round(_us(end_s) - ts, _US_DECIMALS)),
                "args": {"stage": stage, "microbatch": mb, "bytes": num_bytes},
            }
        )
    return events


def _memory_counters(memory: pd.DataFrame) -> list[dict[str, Any]]:
    """One ``"C"`` event per memory sample, GiB, ordered by time then rank (stable)."""
    samples = memory.sort_values(["time_s", "rank"], kind="stable")
    events = []
    for rank, time_s, num_bytes in zip(
        samples["rank"].tolist(), samples["time_s"].tolist(), samples["bytes"].tolist(), strict=True
    ):
        events.append(
            {
                "ph": "C",
                "name": "memory",
                "pid": int(rank),
                "tid": 0,
                "ts": _us(time_s),
                "args": {"GiB": round(bytes_to_gib(num_bytes), 6)},
            }
        )
    return events


def write_trace(
    path: str | os.PathLike[str], trace: dict[str, Any], *, label: str = "trace"
) -> Path:
    """Write ``trace`` as compact JSON with sorted keys, atomically (temp file + os.replace).

    Args:
        path: destination ``.json`` file.
        trace: a :func:`chrome_trace` document.
        label: what the path came from (e.g. ``"--trace"``), named in errors.

    Raises:
        plansim.io.outputs.OutputFileError: the file cannot be written.
    """
    return write_json_atomic(path, trace, label=label)
