"""Measured against simulated: step time, per-kind and per-event errors, bubble, memory (pure).

Inputs are a :class:`plansim.validate.result.MeasuredRun` (what the runner measured) and the
:class:`plansim.planner.evaluate.Evaluation` of the same model and plan on a hardware
profile (:func:`simulate_plan`). Every error is signed, simulated against measured::

    error_pct = 100 * (simulated - measured) / measured

(positive: the simulator predicts more time or memory than measured; ``None`` when the
measured value is 0). The measured step time is the median over the measured steps
(``MeasuredRun.median_step_time_s``), robust to a step slowed by other work on the machine;
totals per kind and per category are those of the **representative step**, the one whose
time is the median (:func:`median_step_index`), so that they add up to its step time; mean
event durations, bubble fractions and event matches use every measured step.

Quantities (all per optimizer step, seconds unless named otherwise):

* **kinds**: per Timeline kind, events per step, mean event duration and total duration
  summed over the pipeline ranks (``SimResult.busy_s_by_kind``'s definition; measured: in
  the representative step).
* **categories**: ``forward`` (F), ``backward`` (B, I, W and recompute), ``optimizer``,
  ``communication`` (every row on a stream other than ``compute``), ``exposed_communication``
  (``plansim.sim.timeline.exposure``), ``bubble`` (mean over ranks of the idle compute time
  within the pipeline time, :func:`plansim.sim.timeline.bubble_fractions` times that time).
* **bubble fraction** per pipeline rank, read from the events on both sides.
* **memory**: peak bytes per pipeline rank (measured: CUDA max allocated or live CPU tensor
  bytes; simulated: the engine's memory samples less the profile's reserve for the CUDA
  context and allocator, which neither measurement counts).
* **events**: every (rank, stream, kind, stage, micro-batch) tied to a micro-batch, matched
  one to one; its duration (summed when a key has several rows in a step) and start, the
  measured ones the median over the steps.

The simulated side comes from :func:`plansim.validate.simulated.simulate_plan` (the run as
torch executes it, in the run's own precision: an fp32 CPU run is simulated as an fp32 plan,
with 4-byte weights, activations and messages and fp32 AdamW; the profile's attention curve
and host per-op overhead when it has them).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from plansim.planner.evaluate import Evaluation
from plansim.sim import timeline as tl
from plansim.specs.plan import PLAN_FIELDS, Framework, ParallelPlan
from plansim.validate.result import MeasuredRun, ValidateError
from plansim.validate.simulated import simulate_plan, simulation_profile

#: Timeline kinds per category of compute work.
CATEGORY_KINDS = {
    category: tuple(k.value for k in kinds)
    for category, kinds in (
        ("forward", (tl.TimelineKind.FORWARD,)),
        (
            "backward",
            (
                tl.TimelineKind.BACKWARD,
                tl.TimelineKind.BACKWARD_INPUT,
                tl.TimelineKind.BACKWARD_WEIGHT,
                tl.TimelineKind.RECOMPUTE,
            ),
        ),
        ("optimizer", (tl.TimelineKind.OPTIMIZER,)),
    )
}
#: Keys of one matched event.
EVENT_KEY = [tl.RANK, tl.STREAM, tl.KIND, tl.STAGE, tl.MICROBATCH]
#: Significant digits kept of every float in comparison.json (same input, same bytes).
_DIGITS = 9


def error_pct(simulated: float, measured: float) -> float | None:
    """Signed ``100 * (simulated - measured) / measured``, to 1e-9 percent (float noise of
    averaging gone); None when ``measured`` is 0."""
    if measured == 0:
        return None
    return round(100.0 * (simulated - measured) / measured, 9) + 0.0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Comparison:
    """Measured vs simulated of one plan (see the module docstring for each quantity).

    Attributes:
        measured_step_time_s, simulated_step_time_s: median measured, simulated, seconds.
        kinds: DataFrame indexed by kind, columns ``measured_count``, ``simulated_count``
            (events per step), ``measured_mean_s``, ``simulated_mean_s``, ``measured_total_s``,
            ``simulated_total_s`` (summed over ranks), ``simulated_tied_total_s`` (of it,
            the rows tied to a micro-batch: in-action TP/CP/ZeRO-3 communication).
        categories: {category: (measured_s, simulated_s)}.
        measured_bubble, simulated_bubble: bubble fraction per pipeline rank.
        measured_memory_bytes, simulated_memory_bytes: peak memory per pipeline rank.
        events: matched events, columns EVENT_KEY + ``measured_start_s``,
            ``simulated_start_s``, ``measured_duration_s``, ``simulated_duration_s``.
        num_measured_only, num_simulated_only: event keys found on one side only.
        run: what was run (model, plan, backend, device, processes, steps, versions, losses).
    """

    measured_step_time_s: float
    simulated_step_time_s: float
    kinds: pd.DataFrame
    categories: dict[str, tuple[float, float]]
    measured_bubble: tuple[float, ...]
    simulated_bubble: tuple[float, ...]
    measured_memory_bytes: tuple[float, ...]
    simulated_memory_bytes: tuple[float, ...]
    events: pd.DataFrame
    num_measured_only: int
    num_simulated_only: int
    run: dict[str, Any]

    @property
    def step_time_error_pct(self) -> float:
        """Signed step-time error, simulated vs measured, percent."""
        err = error_pct(self.simulated_step_time_s, self.measured_step_time_s)
        return 0.0 if err is None else err

    def to_dict(self) -> dict[str, Any]:
        """comparison.json content (SI units, floats to 9 significant digits)."""
        doc: dict[str, Any] = rounded_json(_comparison_dict(self))
        return doc


def compare(measured: MeasuredRun, simulated: Evaluation) -> Comparison:
    """Compare a measured run with the simulation of the same model and plan.

    Raises:
        ValidateError: the measured timelines do not follow the Timeline schema, or their
            ranks exceed the plan's pipeline ranks.
    """
    num_ranks = measured.plan.pp
    steps = _checked_steps(measured.timelines, num_ranks=num_ranks)
    sim = simulated.result.timeline
    rep = steps[median_step_index(measured)]
    kinds = _kind_table(steps, sim, rep=rep)
    return Comparison(
        measured_step_time_s=measured.median_step_time_s,
        simulated_step_time_s=simulated.step_time_s,
        kinds=kinds,
        categories=_categories(rep, sim, num_ranks=num_ranks),
        measured_bubble=_mean_bubble(steps, num_ranks=num_ranks),
        simulated_bubble=_mean_bubble([sim], num_ranks=num_ranks),
        measured_memory_bytes=tuple(float(b) for b in measured.peak_memory_bytes),
        simulated_memory_bytes=tuple(
            float(b) - simulated.memory.reserve_bytes for b in simulated.result.peak_memory_bytes
        ),
        **_match_events(steps, sim),
        run=run_description(measured),
    )


def median_step_index(measured: MeasuredRun) -> int:
    """Index of the representative measured step: the one whose time is the median (the
    faster of the two middle ones for an even count; ties by step order)."""
    times = measured.step_times_s
    order = sorted(range(len(times)), key=lambda i: (times[i], i))
    return order[(len(order) - 1) // 2]


def _checked_steps(timelines: tuple[pd.DataFrame, ...], *, num_ranks: int) -> list[pd.DataFrame]:
    for i, df in enumerate(timelines):
        try:
            tl.validate_timeline(df)
        except tl.TimelineError as exc:
            raise ValidateError(f"measured timeline of step {i}: {exc}") from None
        if len(df) and int(df[tl.RANK].max()) >= num_ranks:
            raise ValidateError(
                f"measured timeline of step {i} has rank {int(df[tl.RANK].max())}; "
                f"the plan has {num_ranks} pipeline ranks"
            )
    return [carved_blocking(df) for df in timelines]


#: The stream of collectives that block the compute stream (``plansim.specs.work.STREAMS``).
_BLOCKING = "tp"


def carved_blocking(df: pd.DataFrame) -> pd.DataFrame:
    """A measured timeline whose compute rows leave out the blocking collectives they
    enclose, as the simulation lays them out (its ``tp``-stream segments hold the compute
    stream between compute segments: ``plansim.specs.work``).

    The runner times a pipeline action as one compute interval, the expert-parallel
    all-to-alls inside it as ``tp``-stream rows (``plansim.validate.expert_parallel``);
    each compute row is cut into the pieces between the ``tp`` rows of its rank that lie
    within it. Unchanged when there is no ``tp`` row (dense runs)."""
    blocking = df[df[tl.STREAM] == _BLOCKING]
    if blocking.empty:
        return df
    rows: list[dict[str, Any]] = []
    holes = {
        rank: sorted(zip(g[tl.START_S], g[tl.END_S], strict=True))
        for rank, g in blocking.groupby(tl.RANK)
    }
    records: list[dict[str, Any]] = [
        {str(k): v for k, v in r.items()} for r in df.to_dict("records")
    ]
    for row in records:
        inside = [
            (a, b)
            for a, b in holes.get(row[tl.RANK], [])
            if row[tl.STREAM] == tl.COMPUTE and a >= row[tl.START_S] and b <= row[tl.END_S]
        ]
        start = row[tl.START_S]
        for a, b in inside:
            if a > start:
                rows.append({**row, tl.START_S: start, tl.END_S: a})
            start = max(start, b)
        if not inside or row[tl.END_S] > start:
            rows.append({**row, tl.START_S: start})
    return pd.DataFrame(rows, columns=df.columns)


def _durations(df: pd.DataFrame) -> pd.Series:
    return df[tl.END_S] - df[tl.START_S]


def _kind_table(steps: list[pd.DataFrame], sim: pd.DataFrame, *, rep: pd.DataFrame) -> pd.DataFrame:
    """Per kind: events per step, mean duration, total duration per step (sum over ranks;
    measured: of the representative step ``rep``)."""
    meas = pd.concat(steps, ignore_index=True)
    n = len(steps)
    kinds = sorted(set(meas[tl.KIND]) | set(sim[tl.KIND]))
    tied = sim[tl.MICROBATCH] >= 0
    rows = []
    for kind in kinds:
        m = _durations(meas[meas[tl.KIND] == kind])
        s = _durations(sim[sim[tl.KIND] == kind])
        rows.append(
            {
                "kind": kind,
                "measured_count": len(m) / n,
                "simulated_count": float(len(s)),
                "measured_mean_s": float(m.mean()) if len(m) else 0.0,
                "simulated_mean_s": float(s.mean()) if len(s) else 0.0,
                "measured_total_s": float(_durations(rep[rep[tl.KIND] == kind]).sum()),
                "simulated_total_s": float(s.sum()),
                "simulated_tied_total_s": float(
                    _durations(sim[tied & (sim[tl.KIND] == kind)]).sum()
                ),
            }
        )
    columns = ["kind", "measured_count", "simulated_count", "measured_mean_s"]
    columns += ["simulated_mean_s", "measured_total_s", "simulated_total_s"]
    columns += ["simulated_tied_total_s"]
    return pd.DataFrame(rows, columns=columns).set_index("kind")


def _pipeline_time_s(df: pd.DataFrame) -> float:
    work = tl.pipeline_work(df)
    return float(work[tl.END_S].max()) if len(work) else 0.0


def _mean_bubble(steps: list[pd.DataFrame], *, num_ranks: int) -> tuple[float, ...]:
    """Per rank, the bubble fraction of each step (read from its events), mean over steps."""
    per_step = [
        tl.bubble_fractions(df, num_ranks=num_ranks, pipeline_time_s=_pipeline_time_s(df))
        for df in steps
    ]
    return tuple(float(x) for x in np.mean(np.array(per_step), axis=0))


def _step_categories(df: pd.DataFrame, *, num_ranks: int) -> dict[str, float]:
    out = {
        name: float(_durations(df[df[tl.KIND].isin(kinds)]).sum())
        for name, kinds in CATEGORY_KINDS.items()
    }
    out["communication"] = float(_durations(df[df[tl.STREAM] != tl.COMPUTE]).sum())
    exposed = tl.exposure(df, num_ranks=num_ranks).exposed_s_by_kind
    out["exposed_communication"] = float(sum(exposed.values()))
    pipeline_s = _pipeline_time_s(df)
    bubble = tl.bubble_fractions(df, num_ranks=num_ranks, pipeline_time_s=pipeline_s)
    out["bubble"] = float(np.mean(bubble)) * pipeline_s
    return out


def _categories(
    rep: pd.DataFrame, sim: pd.DataFrame, *, num_ranks: int
) -> dict[str, tuple[float, float]]:
    """{category: (measured seconds in the representative step ``rep``, simulated seconds)}."""
    measured = _step_categories(rep, num_ranks=num_ranks)
    simulated = _step_categories(sim, num_ranks=num_ranks)
    return {name: (measured[name], simulated[name]) for name in simulated}


def _per_key(df: pd.DataFrame) -> pd.DataFrame:
    """Events tied to a micro-batch, one row per key: first start, summed duration."""
    tied = df[(df[tl.STAGE] >= 0) & (df[tl.MICROBATCH] >= 0)]
    tied = tied.assign(duration_s=_durations(tied))
    return tied.groupby(EVENT_KEY, sort=True).agg(
        start_s=(tl.START_S, "min"), duration_s=("duration_s", "sum")
    )


def _match_events(steps: list[pd.DataFrame], sim: pd.DataFrame) -> dict[str, Any]:
    """Matched events (measured: median over steps of each key's start and duration)."""
    meas = pd.concat([_per_key(df) for df in steps]).groupby(level=EVENT_KEY, sort=True).median()
    simulated = _per_key(sim)
    joined = meas.merge(
        simulated, how="inner", left_index=True, right_index=True, suffixes=("_m", "_s")
    ).reset_index()
    events = pd.DataFrame(
        {
            **{key: joined[key] for key in EVENT_KEY},
            "measured_start_s": joined["start_s_m"],
            "simulated_start_s": joined["start_s_s"],
            "measured_duration_s": joined["duration_s_m"],
            "simulated_duration_s": joined["duration_s_s"],
        }
    )
    return {
        "events": events,
        "num_measured_only": len(meas.index.difference(simulated.index)),
        "num_simulated_only": len(simulated.index.difference(meas.index)),
    }


def _plain(value: Any) -> Any:
    """Enums to their values, nested dataclass dicts kept plain (for JSON)."""
    if isinstance(value, enum.Enum):
        return value.value
    return value


#: Plan fields a comparison writes only where they differ from their defaults, so that runs
#: of dense plans keep the comparison.json they had before these fields existed.
_OPTIONAL_PLAN_FIELDS = {
    "ep": 1,
    "etp": None,
    "framework": Framework.MEGATRON_CORE,
    "framework_version": None,
}


#: ModelSpec fields a comparison writes only where set (not None), so that dense models keep
#: the comparison.json they had before these fields existed.
_OPTIONAL_MODEL_FIELDS = frozenset(("kv_channels", "moe", "mla", "mtp_num_layers"))


def spec_dict(spec: Any) -> dict[str, Any]:
    """A frozen spec dataclass (ModelSpec) as a plain dict, fields in order
    (:data:`_OPTIONAL_MODEL_FIELDS` only where set; nested specs as dicts); a ParallelPlan
    by its flat fields (``PLAN_FIELDS``; :data:`_OPTIONAL_PLAN_FIELDS` only where set)."""
    if isinstance(spec, ParallelPlan):
        return {
            name: _plain(getattr(spec, name))
            for name in PLAN_FIELDS
            if _OPTIONAL_PLAN_FIELDS.get(name, _UNSET) != getattr(spec, name)
        }
    out: dict[str, Any] = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if value is None and f.name in _OPTIONAL_MODEL_FIELDS:
            continue
        is_spec = dataclasses.is_dataclass(value) and not isinstance(value, type)
        out[f.name] = spec_dict(value) if is_spec else _plain(value)
    return out


_UNSET = object()


def run_description(measured: MeasuredRun) -> dict[str, Any]:
    """What was actually run: model, plan, backend, device, processes, steps, versions."""
    return {
        "model": spec_dict(measured.model),
        "plan": {**spec_dict(measured.plan), "label": measured.plan.label()},
        "backend": measured.backend,
        "device": measured.device,
        "num_processes": measured.num_processes,
        "num_warmup_steps": measured.num_warmup_steps,
        "num_measured_steps": len(measured.step_times_s),
        "representative_step": median_step_index(measured),
        "step_times_s": list(measured.step_times_s),
        "losses": list(measured.losses),
        "versions": dict(sorted(measured.versions.items())),
    }


def _pair(measured: float, simulated: float) -> dict[str, Any]:
    return {
        "measured": measured,
        "simulated": simulated,
        "error_pct": error_pct(simulated, measured),
    }


def _event_stats(events: pd.DataFrame, c: Comparison) -> dict[str, Any]:
    """Per-event duration errors (percent, signed) and start offsets (seconds)."""
    meas = events["measured_duration_s"].to_numpy(dtype=np.float64)
    sim = events["simulated_duration_s"].to_numpy(dtype=np.float64)
    ok = meas > 0
    err = 100.0 * (sim[ok] - meas[ok]) / meas[ok]
    start = np.abs(
        events["simulated_start_s"].to_numpy(dtype=np.float64)
        - events["measured_start_s"].to_numpy(dtype=np.float64)
    )
    stats: dict[str, Any] = {
        "num_matched": len(events),
        "num_measured_only": c.num_measured_only,
        "num_simulated_only": c.num_simulated_only,
    }
    if len(err):
        stats |= {
            "duration_error_pct_mean": float(err.mean()),
            "duration_error_pct_median": float(np.median(err)),
            "duration_abs_error_pct_p90": float(np.percentile(np.abs(err), 90)),
            "duration_abs_error_pct_max": float(np.abs(err).max()),
            "start_abs_error_s_mean": float(start.mean()),
            "start_abs_error_s_max": float(start.max()),
        }
    return stats


def _comparison_dict(c: Comparison) -> dict[str, Any]:
    kinds = {
        kind: {
            **{k: float(v) for k, v in row.items()},
            "mean_error_pct": error_pct(row["simulated_mean_s"], row["measured_mean_s"]),
            "total_error_pct": error_pct(row["simulated_total_s"], row["measured_total_s"]),
        }
        for kind, row in c.kinds.iterrows()
    }
    bubble_m, bubble_s = float(np.mean(c.measured_bubble)), float(np.mean(c.simulated_bubble))
    return {
        "measured_step_time_s": c.measured_step_time_s,
        "simulated_step_time_s": c.simulated_step_time_s,
        "step_time_error_pct": c.step_time_error_pct,
        "model": c.run["model"],
        "run": c.run,
        "categories_s": {name: _pair(m, s) for name, (m, s) in c.categories.items()},
        "kinds": kinds,
        "bubble_fraction": {
            "measured": bubble_m,
            "simulated": bubble_s,
            "difference": bubble_s - bubble_m,
            "measured_per_rank": list(c.measured_bubble),
            "simulated_per_rank": list(c.simulated_bubble),
        },
        "peak_memory_bytes": {
            "measured_per_rank": list(c.measured_memory_bytes),
            "simulated_per_rank": list(c.simulated_memory_bytes),
            "error_pct_per_rank": [
                error_pct(s, m)
                for m, s in zip(c.measured_memory_bytes, c.simulated_memory_bytes, strict=True)
            ],
        },
        "events": _event_stats(c.events, c),
    }


def rounded_json(value: Any) -> Any:
    """``value`` with every float rounded to ``_DIGITS`` significant digits, recursively
    (numpy scalars to Python numbers, tuples to lists): deterministic JSON text."""
    if isinstance(value, float):
        return float(f"{value:.{_DIGITS}g}")
    if isinstance(value, dict):
        return {str(k): rounded_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded_json(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return rounded_json(float(value))
    return value


__all__ = [
    "CATEGORY_KINDS",
    "Comparison",
    "compare",
    "error_pct",
    "median_step_index",
    "rounded_json",
    "run_description",
    "simulate_plan",
    "simulation_profile",
    "spec_dict",
]
