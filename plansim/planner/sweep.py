"""Sweep: the planner over a grid of models x GPU kinds x GPU counts x global batch sizes.

One row per cell (its best plan and metrics, or why nothing fits), for co-design studies.
Cells run on a pluggable executor: ``local`` (a process pool, or this process with one job),
``dask`` (a ``dask.distributed`` client: the configured scheduler, else a local cluster) or
``ray`` (``ray.init``: the configured cluster, else a local one). Dask and Ray are not
dependencies; naming one that is not installed is a clear error. Each cell's search runs
with one job, so cells, not plans, are what run in parallel; rows come back in grid order
whatever the executor, and each row is a pure function of its cell.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from plansim.catalog import resolve_model
from plansim.errors import PlansimError, choice_error
from plansim.io.profiles import load_profile
from plansim.io.result_cache import ResultCache
from plansim.planner.evaluate import Evaluation
from plansim.planner.parallel import map_in_order
from plansim.planner.search import search
from plansim.planner.space import SearchSpace
from plansim.planner.training_run import (
    Objective,
    RunEstimate,
    estimate_runs,
    order_by_objective,
    run_columns,
)
from plansim.specs.facility import Facility, PriceTable
from plansim.specs.failure_model import FailureModel
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import AttentionKernel, ExecutionSpec, Precision
from plansim.specs.training_run import TrainingRun
from plansim.units import bytes_to_gib

EXECUTORS = ("local", "dask", "ray")


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepCell:
    """One point of the grid: a model preset (or config.json), a profile, GPUs, batch."""

    model: str
    gpu: str
    num_gpus: int
    global_batch_size: int


#: Plans per cell whose whole runs ``--objective`` compares (the best by step time first).
OBJECTIVE_PLANS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSettings:
    """What every cell shares: sequence length override, precision, attention kernel, and
    for whole runs (``runs`` given) the run of each model and batch (keyed by the model
    name as the grid gives it and the global batch size), failures, facility, prices and
    the objective that picks a cell's plan among its :data:`OBJECTIVE_PLANS` fastest;
    ``cache``: the persistent result cache (``plansim.io.result_cache``) every cell searches
    through, or None (it pickles to the workers of every executor)."""

    seq_length: int | None = None
    precision: Precision = Precision.BF16
    attention: AttentionKernel = AttentionKernel.FLASH
    runs: Mapping[tuple[str, int], TrainingRun] | None = None
    failures: FailureModel | None = None
    facility: Facility | None = None
    prices: PriceTable | None = None
    objective: Objective = Objective.STEP_TIME
    cache: ResultCache | None = None


def sweep_grid(
    models: Sequence[str], gpus: Sequence[str], num_gpus: Sequence[int], gbs: Sequence[int]
) -> list[SweepCell]:
    """The cells of the grid, models outermost, batch sizes innermost."""
    return [
        SweepCell(model=m, gpu=g, num_gpus=n, global_batch_size=b)
        for m, g, n, b in itertools.product(models, gpus, num_gpus, gbs)
    ]


def check_names(cells: Sequence[SweepCell], settings: SweepSettings) -> None:
    """Resolve every model and profile once, so a bad name fails before any search.

    Raises:
        PlansimError: an unknown model or profile (the message lists the known ones).
    """
    for model in dict.fromkeys(c.model for c in cells):
        resolve_model(model, seq_length=settings.seq_length)
    for gpu in dict.fromkeys(c.gpu for c in cells):
        load_profile(gpu)


def run_cell(cell: SweepCell, settings: SweepSettings) -> dict[str, Any]:
    """Search one cell (exact best plan) and return its row (column -> value)."""
    model = resolve_model(cell.model, seq_length=settings.seq_length)
    profile = load_profile(cell.gpu)
    space = SearchSpace(
        precision=settings.precision, execution=ExecutionSpec(attention=settings.attention)
    )
    whole_run = settings.runs is not None
    result = search(
        model,
        profile,
        num_gpus=cell.num_gpus,
        global_batch_size=cell.global_batch_size,
        space=space,
        top_k=OBJECTIVE_PLANS if whole_run else 1,
        cache=settings.cache,
    )
    row: dict[str, Any] = {**asdict(cell), "status": "ok" if result.ranked else "no feasible plan"}
    best, est = _best(cell, settings, model, profile, result.ranked)
    plan = best.plan if best else None
    row.update(
        plan=plan.label() if plan else "",
        tp=plan.tp if plan else None,
        pp=plan.pp if plan else None,
        dp=plan.dp if plan else None,
        cp=plan.cp if plan else None,
        vpp=plan.vpp if plan else None,
        micro_batch_size=plan.micro_batch_size if plan else None,
        zero_stage=plan.zero_stage if plan else None,
        recompute=plan.recompute.value if plan else "",
        sequence_parallel=plan.sequence_parallel if plan else None,
        schedule=plan.schedule.value if plan else "",
        step_time_s=best.step_time_s if best else None,
        mfu=best.mfu if best else None,
        tokens_per_s=best.tokens_per_s if best else None,
        peak_memory_gib=bytes_to_gib(best.peak_memory_bytes) if best else None,
        num_candidates=result.num_candidates,
        num_feasible=result.num_feasible,
        num_simulated=result.num_simulated,
        rejections="; ".join(f"{n} {c}" for c, n in result.rejection_counts.items()),
    )
    if whole_run:
        row.update(_run_row(est))
    return row


def _best(
    cell: SweepCell,
    settings: SweepSettings,
    model: ModelSpec,
    profile: HardwareProfile,
    ranked: Sequence[Evaluation],
) -> tuple[Evaluation | None, RunEstimate | None]:
    """The cell's plan (the fastest, or the best of the fastest by the objective for whole
    runs) and its whole run (None without runs or when its layout cannot take the ramp)."""
    if not ranked:
        return None, None
    if settings.runs is None:
        return ranked[0], None
    outcomes = estimate_runs(
        model,
        ranked,
        profile,
        settings.runs[(cell.model, cell.global_batch_size)],
        failures=settings.failures,
        facility=settings.facility,
        prices=settings.prices,
    )
    best, outcome = order_by_objective(ranked, outcomes, settings.objective)[0]
    return best, outcome if isinstance(outcome, RunEstimate) else None


#: The whole-run columns of a sweep row (``training_run.run_columns``), empty without a run.
RUN_COLUMNS = (
    "meets_deadline",
    "days",
    "gpu_hours",
    "energy_mwh",
    "cost_usd",
    "goodput_pct",
    "checkpoint_interval_min",
)


def _run_row(est: RunEstimate | None) -> dict[str, Any]:
    if est is None:
        return dict.fromkeys(RUN_COLUMNS)
    return dict(run_columns(est))


def run_sweep(
    cells: Sequence[SweepCell],
    settings: SweepSettings,
    *,
    executor: str = "local",
    jobs: int = 1,
    on_row: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Rows of every cell, in grid order.

    Args:
        executor: one of :data:`EXECUTORS`.
        jobs: processes of the local executor (1: this process).
        on_row: called after each row arrives (progress).

    Raises:
        PlansimError: unknown executor, or dask/ray not installed.
    """
    if executor not in EXECUTORS:
        raise choice_error("--executor", executor, EXECUTORS)
    task = partial(run_cell, settings=settings)
    rows = []
    for row in _EXECUTE[executor](task, list(cells), jobs):
        rows.append(row)
        if on_row is not None:
            on_row()
    return rows


Task = Callable[[SweepCell], dict[str, Any]]


def _require(package: str, executor: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise PlansimError(
            f"--executor {executor} needs the '{package}' package, which is not installed "
            f"(pip install '{package}'); or use --executor local"
        )


def _dask(task: Task, cells: list[SweepCell], jobs: int) -> Iterator[dict[str, Any]]:
    _require("dask", "dask")
    _require("distributed", "dask")
    # optional packages, imported by name: typed as Any whether or not they are installed
    client_type: Any = importlib.import_module("dask.distributed").Client

    with client_type() as client:  # the configured scheduler (dask config), else a local cluster
        futures = client.map(task, cells, pure=True)
        yield from client.gather(futures)


def _ray(task: Task, cells: list[SweepCell], jobs: int) -> Iterator[dict[str, Any]]:
    _require("ray", "ray")
    ray: Any = importlib.import_module("ray")

    ray.init(ignore_reinit_error=True)  # RAY_ADDRESS when configured, else a local cluster
    remote = ray.remote(_call)  # ray.remote takes a function or class, not a partial
    yield from ray.get([remote.remote(task, cell) for cell in cells])


def _call(task: Task, cell: SweepCell) -> dict[str, Any]:
    """``task(cell)``: the module-level function a Ray worker runs."""
    return task(cell)


_EXECUTE: dict[str, Callable[[Task, list[SweepCell], int], Iterator[dict[str, Any]]]] = {
    "local": map_in_order,
    "dask": _dask,
    "ray": _ray,
}
