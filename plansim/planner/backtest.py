"""Predict published runs: map a runs-CSV row to a model and a search space, pick the best.

Row -> ModelSpec: ``plansim.planner.run_model``. A row that cannot be read (a cell that is
not a number where one belongs, a shape whose heads do not divide the hidden size) is skipped
with the reason, and the other rows are still predicted.

Search space: ``plansim.planner.run_space`` (what a blank cell searches, what the run's
date and framework allow).

Memory: a published run did fit its GPUs. When no layout of a row fits plansim's memory model,
the row is still predicted, on the layouts that come closest (the smallest worst-rank need,
when within ``MEMORY_MODEL_SLACK`` of the GPU's memory), with status ``OVER_MEMORY`` and the
closest need in the note: the step-time question stays answerable and the memory model's
disagreement stays visible.

Finer checks (``plansim.planner.run_checks``): a row that gives one layer's forward and
backward milliseconds is also checked on them, under the predicted plan, or, without a step
time, under the layout it states (status ``per-layer``); a row that gives its measured peak
memory, on the predicted worst-rank peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from plansim.errors import PlansimError
from plansim.io.profile_names import AmbiguousProfileError, match_profile_name
from plansim.io.profiles import list_datasheet_profiles, list_profiles, load_profile
from plansim.io.runs import RunRow
from plansim.planner.evaluate import OUT_OF_MEMORY, Evaluation, Rejected
from plansim.planner.lookups import out_of_range_lookups
from plansim.planner.moe_backtest import is_moe_row, predict_moe_row
from plansim.planner.prediction import MEMORY_MODEL_SLACK as MEMORY_MODEL_SLACK
from plansim.planner.prediction import OVER_MEMORY as OVER_MEMORY
from plansim.planner.prediction import Prediction as Prediction
from plansim.planner.run_checks import (
    PER_LAYER,
    check_measurements,
    compared_peak_bytes,
    has_layer_times,
    layer_check,
    memory_error_pct,
    stated_layer_plan,
)
from plansim.planner.run_derive import precision_candidates, with_derived_cells
from plansim.planner.run_framework import is_hybrid_shard
from plansim.planner.run_model import Skip, row_model
from plansim.planner.run_space import row_space, run_year
from plansim.planner.search import SearchResult, search
from plansim.planner.sensitivity import sensitivity as plan_sensitivity
from plansim.planner.space import SearchSpace
from plansim.specs.cluster_network import with_node_nics
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec


def _closest_to_fitting(closest: Rejected | None, profile: HardwareProfile) -> Rejected | None:
    """``closest`` (the search's out-of-memory rejection with the smallest need) when that
    need is within ``MEMORY_MODEL_SLACK`` of the GPU's memory (None otherwise, or without
    one)."""
    limit = (1 + MEMORY_MODEL_SLACK) * profile.hbm_capacity_bytes
    return closest if closest is not None and closest.need_bytes <= limit else None


def _no_candidate(row: RunRow, num_gpus: int, gbs: int) -> str:
    """Why a search enumerated nothing: the stated layout cells cannot split the GPUs and the
    global batch (names the stated cells)."""
    stated = [
        f"{label} {row.integer(column)}"
        for label, column in (
            ("tp", "tp"),
            ("pp", "pp"),
            ("dp", "dp"),
            ("cp", "cp"),
            ("vpp", "virtual_pipeline_size"),
            ("mbs", "micro_batch_size_seqs"),
        )
        if row.integer(column) is not None
    ]
    cells = ", ".join(stated) if stated else "no stated layout cells"
    reason = (
        f"no layout with {cells} splits {num_gpus} GPUs, the model's heads and layers, and "
        f"a global batch of {gbs}"
    )
    if (row.integer("virtual_pipeline_size") or 1) > 1 and row.integer("pp") == 1:
        reason += " (a virtual pipeline size > 1 needs pp > 1)"
    return reason


def predict_row(row: RunRow, *, simulate_top: int = 8, sensitivity: bool = False) -> Prediction:
    """Predict one run; a Prediction with status 'skipped' and the reason when it cannot,
    ``OVER_MEMORY`` when only the layouts plansim thinks slightly too big could be predicted.

    Blank cells that other cells settle (num_gpus, the global batch) are derived first, and
    a blank precision is predicted for each 16-bit format, keeping the fastest
    (``plansim.planner.run_derive``).
    """
    if is_moe_row(row):  # the MoE schema: predicted at its stated layout
        return predict_moe_row(row)
    notes: list[str] = []
    try:
        row = with_derived_cells(row, notes)
    except PlansimError as exc:
        return Prediction(status="skipped", note=f"row not usable: {exc}")
    outcomes = [
        _predict(variant, simulate_top, [*notes, note] if note else list(notes))
        for variant, note in precision_candidates(row)
    ]
    timed = [o for o in outcomes if o[0].predicted_step_time_s is not None]
    prediction, chosen = (
        min(timed, key=lambda o: o[0].predicted_step_time_s or 0.0) if timed else outcomes[0]
    )
    if not sensitivity or chosen is None:
        return prediction
    model, best, priced = chosen.model, chosen.best, chosen.profile
    rests = plan_sensitivity(model, best.plan, priced, base=best)
    return replace(
        prediction,
        elasticity_by_term={t.term: t.elasticity for t in rests.terms},
        elasticity_on_assumptions=rests.elasticity_resting_on("assumption"),
        out_of_range=tuple(o.text() for o in out_of_range_lookups(model, best.plan, priced)),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Chosen:
    """The plan a row's prediction chose, with what priced it (kept in the worker)."""

    model: ModelSpec
    best: Evaluation
    profile: HardwareProfile


def _row_network(row: RunRow, profile: HardwareProfile, notes: list[str]) -> HardwareProfile:
    """``profile`` with the row's stated cluster NICs (``nics_per_node`` and ``nic_gbit_per_s``,
    the line rate of one NIC in Gb/s, e.g. 4 and 100 for Jean Zay's Omni-Path), through
    ``plansim.specs.cluster_network.with_node_nics``; unchanged when the row states neither.

    Raises:
        Skip: one of the two cells without the other, or a line rate that is not a positive
            number (names the columns).
    """
    nics = row.integer("nics_per_node")
    gbit = row.number("nic_gbit_per_s")
    if nics is None and gbit is None:
        return profile
    if nics is None or gbit is None:
        raise Skip(
            "nics_per_node and nic_gbit_per_s go together "
            f"(got {row.text('nics_per_node')!r} and {row.text('nic_gbit_per_s')!r})"
        )
    if not math.isfinite(gbit) or gbit <= 0:
        raise Skip(f"nic_gbit_per_s {gbit!r} is not a positive number of Gb/s")
    fabric = row.text("fabric")
    networked = with_node_nics(profile, nics_per_node=nics, nic_line_bits_per_s=gbit * 1e9)
    notes.append(
        f"cluster NICs {nics} x {gbit:g} Gb/s{' ' + fabric if fabric else ''} per "
        f"{profile.gpus_per_node} GPUs: {networked.nic_bytes_per_s / 1e9:.3g} GB/s per GPU "
        f"(profile {profile.nic_bytes_per_s / 1e9:.3g})"
    )
    return networked


def _row_profile(row: RunRow, notes: list[str]) -> HardwareProfile:
    """The profile of the row's ``gpu_type``: a profile file or a shipped profile's exact
    name, or the datasheet profile its text names (``plansim.io.profile_names``: "A100 SXM4
    80GB" is ``a100-sxm4-80gb``; a note says so when the text is not the name itself;
    measured profiles such as ``h100-sxm5-80gb-1gpu`` are never guessed)."""
    gpu = row.text("gpu_type") or ""
    try:
        if gpu.endswith((".yaml", ".yml")) or gpu in list_profiles():
            return load_profile(gpu)
        name = match_profile_name(gpu, list_datasheet_profiles())
        if name != gpu:
            notes.append(f"gpu_type {gpu!r} read as {name}")
        return load_profile(name)
    except AmbiguousProfileError as exc:
        raise Skip(
            f"unknown hardware profile {gpu!r} (ambiguous: {', '.join(exc.candidates)})"
        ) from None
    except PlansimError:
        raise Skip(f"unknown hardware profile {gpu!r}") from None


def _measured_step_s(row: RunRow) -> float | None:
    """The row's measured ``step_time_s`` (None: per-layer times only).

    Raises:
        Skip: neither a step time nor per-layer times, or a step time that is not a positive
            number of seconds."""
    measured = row.number("step_time_s")
    if measured is None and not has_layer_times(row):
        raise Skip("no measured step_time_s or per-layer times")
    if measured is not None and (not math.isfinite(measured) or measured <= 0):
        raise Skip(f"step_time_s {measured!r} is not a positive number of seconds")
    return measured


def _row_setup(row: RunRow, notes: list[str]) -> tuple[ModelSpec, HardwareProfile, SearchSpace]:
    """The row's model, profile and search space (HSDP rows: shard groups of one node)."""
    check_measurements(row)
    model = row_model(row, notes)
    profile = _row_network(row, _row_profile(row, notes), notes)
    space = row_space(row, notes)
    if is_hybrid_shard(row):  # HSDP: shard groups of one node (plansim.planner.hsdp)
        space = replace(space, hsdp_shard_gpus=profile.gpus_per_node, hsdp_only=True)
        notes.append(f"hybrid sharding: ZeRO-3 shard groups of {profile.gpus_per_node} GPUs")
    return model, profile, space


def _layer_only(
    row: RunRow, model: ModelSpec, profile: HardwareProfile, space: SearchSpace, notes: list[str]
) -> Prediction:
    """A row with per-layer timings only: its stated layout's layer times against them."""
    plan = stated_layer_plan(row, space, notes)
    label = plan.label()
    notes.append(f"per-layer times of {label}")
    return Prediction(
        status=PER_LAYER,
        note="; ".join(notes),
        plan_label=label,
        plan=plan,
        layer=layer_check(row, model, plan, profile),
    )


def _relaxed(
    result: SearchResult,
    profile: HardwareProfile,
    run: Callable[[HardwareProfile], SearchResult],
    notes: list[str],
) -> tuple[SearchResult, str, HardwareProfile]:
    """(result, status, profile priced): ``result`` as it is, or where no layout fits
    plansim's memory model (yet the run did fit, so the model is pessimistic for it), the
    search again with the capacity of the layout closest to fitting (module docstring)."""
    closest = None if result.ranked else _closest_to_fitting(result.closest_miss, profile)
    if closest is None:
        return result, "ok", profile
    roomier = replace(profile, hbm_capacity_bytes=closest.need_bytes * (1 + 1e-9))
    relaxed = run(roomier)
    if not relaxed.ranked:  # the skip that follows keeps the real capacity's reasons
        return result, "ok", profile
    notes.append(f"no layout fits plansim's memory model; predicted the closest: {closest.reason}")
    return relaxed, OVER_MEMORY, roomier


def _no_layout_note(row: RunRow, result: SearchResult, num_gpus: int, gbs: int) -> str:
    """Why a search ranked nothing: the nearest miss on memory, else the first reason."""
    examples = result.rejection_examples
    first = examples.get(OUT_OF_MEMORY) or next(
        iter(examples.values()), _no_candidate(row, num_gpus, gbs)
    )
    if result.batch_indivisible_dps:
        dps = ", ".join(map(str, result.batch_indivisible_dps))
        first += f"; layouts with dp in ({dps}) not tried: gbs {gbs} is not divisible by dp"
    return f"no feasible layout: {first}"


def _best_prediction(
    row: RunRow,
    best: Evaluation,
    *,
    measured: float,
    status: str,
    model: ModelSpec,
    profile: HardwareProfile,
    notes: list[str],
) -> Prediction:
    """The prediction of the fastest plan ``best`` against the measured step seconds."""
    label = best.plan.label()
    notes.append(f"chosen: {label}")
    compared = compared_peak_bytes(
        row,
        model,
        best.plan,
        profile,
        peak_bytes=best.peak_memory_bytes,
        year=run_year(row),
        notes=notes,
    )
    return Prediction(
        status=status,
        note="; ".join(notes),
        predicted_step_time_s=best.step_time_s,
        step_time_error_pct=100.0 * (best.step_time_s - measured) / measured,
        predicted_peak_memory_gib=best.peak_memory_bytes / 2**30,
        plan_label=label,
        plan=best.plan,
        mfu_pct=100.0 * best.mfu,
        bubble_fraction=best.bubble_fraction,
        exposed_comm_s_by_kind={
            kind: seconds / best.plan.pp for kind, seconds in best.exposed_comm_s_by_kind.items()
        },
        layer=layer_check(row, model, best.plan, profile),
        peak_memory_error_pct=memory_error_pct(row, compared),
    )


def _predict(row: RunRow, simulate_top: int, notes: list[str]) -> tuple[Prediction, _Chosen | None]:
    """predict_row for one row as it stands, ``notes`` so far (appended to), with the
    chosen plan when there is one."""
    try:
        measured = _measured_step_s(row)
        model, profile, space = _row_setup(row, notes)
        if measured is None:  # per-layer timings only: the layout the row states
            return _layer_only(row, model, profile, space, notes), None
        num_gpus, gbs = row.integer("num_gpus"), row.integer("global_batch_size_seqs")
        if not num_gpus or not gbs:
            raise Skip("num_gpus or global_batch_size_seqs blank")
        run = partial(  # the row's heuristic search (simulate_top best estimates simulated)
            search,
            model,
            num_gpus=num_gpus,
            global_batch_size=gbs,
            space=space,
            simulate_top=simulate_top,
        )
        result = run(profile)
    except Skip as exc:
        return Prediction(status="skipped", note=str(exc)), None
    except PlansimError as exc:  # a malformed or inconsistent row: skip it, keep the others
        return Prediction(status="skipped", note=f"row not usable: {exc}"), None
    result, status, priced = _relaxed(result, profile, run, notes)
    if not result.ranked:
        return Prediction(status="skipped", note=_no_layout_note(row, result, num_gpus, gbs)), None
    best = result.ranked[0]
    prediction = _best_prediction(
        row, best, measured=measured, status=status, model=model, profile=profile, notes=notes
    )
    return prediction, _Chosen(model=model, best=best, profile=priced)
