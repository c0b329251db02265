"""Back-test checks finer than the step time: per-layer timings and the measured peak memory.

A published run may give, besides (or instead of) its step time, the forward and backward
milliseconds of one transformer layer (``per_layer_fwd_ms``, ``per_layer_bwd_ms``:
Korthikanti et al. 2022, Table 4) and the peak memory of one GPU (``measured_peak_mem_gb``).
``plansim.planner.backtest`` compares them with plansim's:

* per-layer times: :func:`plansim.analytic.layer_timing.layer_wall_times` of the plan the row
  is predicted with: the searched best plan for a row with a step time, else the layout the
  row states (:func:`stated_layer_plan`; a knob a layer's time depends on must be stated);
* peak memory: the worst rank's predicted peak (``plansim.analytic.memory``: model states,
  activations, transients and the profile's reserve for context, collective buffers and
  fragmentation) against the measured figure, read in GB (1e9 bytes) as the column's name
  says.

Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.analytic.layer_timing import layer_wall_times
from plansim.analytic.memory_views import READINGS, memory_views
from plansim.io.runs import RunRow
from plansim.planner.run_model import Skip
from plansim.planner.space import SearchSpace
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, plan_from_fields

#: Status of a row predicted from its per-layer timings alone (no step time).
PER_LAYER = "per-layer"

#: Bytes in the GB of ``measured_peak_mem_gb``.
GB = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCheck:
    """Predicted forward and backward milliseconds of one layer and their signed errors (%)
    against the row's measured ones (None where the row gives none)."""

    forward_ms: float
    backward_ms: float
    forward_error_pct: float | None
    backward_error_pct: float | None


def has_layer_times(row: RunRow) -> bool:
    """Whether the row gives a per-layer forward or backward time."""
    return row.number("per_layer_fwd_ms") is not None or row.number("per_layer_bwd_ms") is not None


#: The measured cells a row may give besides ``step_time_s``, with their units.
MEASURED_UNITS = {
    "per_layer_fwd_ms": "milliseconds",
    "per_layer_bwd_ms": "milliseconds",
    "measured_peak_mem_gb": "GB",
}


def check_measurements(row: RunRow) -> None:
    """Check the row's measured cells (``MEASURED_UNITS``) and ``measured_peak_mem_kind``
    before any prediction.

    Raises:
        Skip: a measured cell is not a positive finite number (names the column), or the
            memory reading (``measured_peak_mem_kind``; blank: the simulated peak with the
            profile's flat reserve is compared) is not one of ``memory_views.READINGS``
            (lists them).
        InputFileError: a measured cell is not a number.
    """
    for column, unit in MEASURED_UNITS.items():
        value = row.number(column)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise Skip(f"{column} {value!r} is not a positive number of {unit}")
    kind = row.choice("measured_peak_mem_kind")
    if kind is not None and kind not in READINGS:
        raise Skip(f"measured_peak_mem_kind {kind!r} is not one of {', '.join(READINGS)}")


def compared_peak_bytes(
    row: RunRow,
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    peak_bytes: float,
    year: int | None,
    notes: list[str],
) -> float:
    """The predicted peak to set against the row's measured one: the simulated ``peak_bytes``
    (tensors plus the profile's flat reserve) for a row that does not say what it measured;
    for one that does (``measured_peak_mem_kind``), that reading of the rank's peak
    (``memory_views.memory_views`` of the tensors' bytes; pipeline rank 0, where 1F1B keeps
    the most micro-batches), with its parts in ``notes``."""
    kind = row.choice("measured_peak_mem_kind")
    if kind is None:
        return peak_bytes
    allocated = max(0.0, peak_bytes - profile.memory_reserve_bytes)
    views = memory_views(model, plan, allocated_bytes=allocated, rank=0, year=year)
    gib = 2**30
    notes.append(
        f"peak memory as {kind} reads it: allocated {allocated / gib:.1f} GiB, reserved "
        f"{views.reserved_bytes / gib:.1f} (fragmentation {views.fragmentation_fraction:.1%}), "
        f"CUDA context {views.cuda_context_bytes / gib:.2f}, NCCL {views.nccl_bytes / gib:.2f}"
    )
    return views.reading(kind)


def _error_pct(predicted: float, measured: float | None) -> float | None:
    return None if measured is None else 100.0 * (predicted - measured) / measured


def layer_check(
    row: RunRow, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> LayerCheck | None:
    """One layer's predicted times under ``plan`` against the row's (checked by
    :func:`check_measurements`), or None when the row gives no per-layer time."""
    if not has_layer_times(row):
        return None
    times = layer_wall_times(model, plan, profile)
    forward_ms, backward_ms = 1e3 * times.forward_s, 1e3 * times.backward_s
    return LayerCheck(
        forward_ms=forward_ms,
        backward_ms=backward_ms,
        forward_error_pct=_error_pct(forward_ms, row.number("per_layer_fwd_ms")),
        backward_error_pct=_error_pct(backward_ms, row.number("per_layer_bwd_ms")),
    )


def memory_error_pct(row: RunRow, predicted_bytes: float) -> float | None:
    """Signed error (%) of ``predicted_bytes`` against the row's ``measured_peak_mem_gb``
    (GB = 1e9 bytes; checked by :func:`check_measurements`), None when the row gives none."""
    measured = row.number("measured_peak_mem_gb")
    return None if measured is None else _error_pct(predicted_bytes, measured * GB)


def _one(values: tuple[int, ...] | None) -> int | None:
    """The value of a knob the row settles (one value to search), else None."""
    return values[0] if values is not None and len(values) == 1 else None


def stated_layer_plan(row: RunRow, space: SearchSpace, notes: list[str]) -> ParallelPlan:
    """The plan of a row that gives per-layer times but no step time, from what it states.

    A layer's time depends on tp, cp, the micro-batch size, recompute and sequence
    parallelism (with tp > 1): each must be stated (a single value in ``space``; a cell the
    run's date settles counts, e.g. no sequence parallelism before 2022). pp, when blank, is
    taken as 1 and said in ``notes``: it only sets dp = num_gpus / (tp x cp x pp), and through
    the GPU count the pace the job sustains, which is the row's either way.

    Raises:
        Skip: a knob is not stated, or num_gpus is blank or not a multiple of tp x cp x pp.
    """
    tp, cp, mbs = _one(space.tp), _one(space.cp), _one(space.micro_batch_size)
    recompute = space.recomputes[0] if len(space.recomputes) == 1 else None
    sps = (False,) if tp == 1 else space.sequence_parallel
    missing = [
        column
        for column, unknown in (
            ("tp", tp is None),
            ("cp", cp is None),
            ("micro_batch_size_seqs", mbs is None),
            ("recompute", recompute is None),
            ("sequence_parallel", len(sps) != 1),
        )
        if unknown
    ]
    if tp is None or cp is None or mbs is None or recompute is None or missing:
        raise Skip(f"per-layer times without a step time need a stated {', '.join(missing)}")
    pp = _one(space.pp)
    if pp is None:
        pp = 1
        notes.append("pp blank: 1 (a layer's time does not depend on it)")
    gpus = row.integer("num_gpus")
    if not gpus or gpus % (tp * cp * pp):
        raise Skip(f"num_gpus {gpus} is not a multiple of tp x cp x pp = {tp * cp * pp}")
    dp = gpus // (tp * cp * pp)
    return plan_from_fields(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        micro_batch_size=mbs,
        global_batch_size=mbs * dp,
        recompute=recompute,
        sequence_parallel=sps[0],
        precision=space.precision,
        attention=space.execution.attention,
        gradient_accumulation_fusion=space.execution.gradient_accumulation_fusion,
        fused_elementwise=space.execution.fused_elementwise,
        framework=space.execution.framework,
    )
