"""Predict published runs: map a runs-CSV row to a model and a search space, pick the best.

Row -> ModelSpec: ``plansim.planner.run_model``. A row that cannot be read (a cell that is
not a number where one belongs, a shape whose heads do not divide the hidden size) is skipped
with the reason, and the other rows are still predicted.

Knobs: a blank tp, pp, dp, micro-batch size, recompute, ZeRO stage, sequence-parallel or
virtual_pipeline_size cell is searched (the fastest feasible value is used) and the note lists
what was searched and chosen. A stated virtual_pipeline_size v > 1 is simulated with
interleaved 1F1B at vpp = v only; v = 1 with the non-interleaved schedules. A search only
offers what existed when the run was made: the row is dated by its ``framework`` column,
else by its ``source_locator`` (a conference tag such as SC21 or MLSys 2023, or an arXiv id
YYMM.NNNNN). Interleaved 1F1B entered Megatron-LM with Narayanan et al. (SC21,
arXiv:2104.04473, 2021), as did the scatter/gather split of pipeline tensors over the TP
ranks (§4.1; Megatron-LM's 2020 ``training.communicate`` sends the whole (seq, mbs, hidden)
tensor from every rank). Sequence parallelism and selective recompute entered Megatron-LM with
Korthikanti et al. (arXiv:2205.05198, 2022), as did gradient-accumulation fusion into the
weight-gradient GEMM (earlier runs add each micro-batch's gradients in a separate pass);
FlashAttention was published in 2022 (Dao et al.,
arXiv:2205.14135) and became Megatron-LM's default path in 2023, as did asynchronous
pipeline sends (``--overlap-p2p-communication``) and gradient reduction overlapped with
backward (``--overlap-grad-reduce``; Korthikanti et al. 2022 §6.3 state that their runs did
not overlap it). The zero-bubble schedule
ZB-H1 (split backward, Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
arXiv:2401.10241, January 2024) is offered to runs dated 2024 or later. When pp does not
divide the layers, the search splits them unevenly (embedding and loss counted as layers,
or lighter first and last ranks: ``plansim.specs.layer_split.uneven_split_fields``) for a
row that states such a pp, and for a searched pp only where the framework had uneven splits
(DeepSpeed; Megatron-LM from 2024). Rules that follow the framework rather than the date
(DeepSpeed's pipeline engine and ZeRO-3, the DeepSpeed-based forks of Megatron-LM, a ZeRO
stage named only in ``zero_stage_or_sharding``) are in ``plansim.planner.run_framework``.
An undated row is searched over everything.

Memory: a published run did fit its GPUs. When no layout of a row fits plansim's memory model,
the row is still predicted, on the layouts that come closest (the smallest worst-rank need,
when within ``MEMORY_MODEL_SLACK`` of the GPU's memory), with status ``OVER_MEMORY`` and the
closest need in the note: the step-time question stays answerable and the memory model's
disagreement stays visible.

Finer checks (``plansim.planner.run_checks``): a row that gives one layer's forward and
backward milliseconds is also checked on them, under the predicted plan, or, without a step
time, under the layout it states (status ``per-layer``); a row that gives its measured peak
memory, on the predicted worst-rank peak.

Context parallelism (cp; Megatron-LM, Llama 3 §3.3.2): a stated cp is modelled as given
(cp > 1 with FlashAttention whatever the date: Megatron-LM runs cp only through Transformer
Engine's fused attention). A blank cp is searched over 1 and the divisors of the GPU count up
to ``MAX_SEARCHED_CP`` only for sequences of at least ``LONG_CONTEXT_TOKENS`` tokens (where
activations, not weights, fill memory) and FlashAttention; otherwise cp = 1, and the note
says which.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from plansim.errors import PlansimError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.enumerate import SearchSpace
from plansim.planner.evaluate import OUT_OF_MEMORY, Rejected, closest_miss
from plansim.planner.run_checks import (
    PER_LAYER,
    LayerCheck,
    has_layer_times,
    layer_check,
    memory_error_pct,
    stated_layer_plan,
)
from plansim.planner.run_framework import (
    bf16_grad_modes,
    deepspeed_pipeline_engine,
    deepspeed_pp,
    is_megatron_fork,
    is_torch_fsdp,
    uneven_pipeline,
    zero3_fetch,
    zero_stage,
    zero_stages,
)
from plansim.planner.run_model import Skip, row_model
from plansim.planner.run_scripts import script_facts
from plansim.planner.search import SearchResult, search
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import AttentionKernel, Precision, Recompute, Schedule

FLASH_IN_MEGATRON_YEAR = 2023
SP_AND_SELECTIVE_YEAR = 2022
OVERLAP_P2P_YEAR = 2023
OVERLAP_GRAD_REDUCE_YEAR = 2023
GRAD_ACC_FUSION_YEAR = 2022
INTERLEAVED_YEAR = 2021
SCATTER_GATHER_P2P_YEAR = 2021
ZERO_BUBBLE_YEAR = 2024
#: A blank cp is searched only for sequences at least this long (long-context training).
LONG_CONTEXT_TOKENS = 16384
#: Largest cp tried for a blank cp cell (a ring inside one 8-GPU node with tp = 1).
MAX_SEARCHED_CP = 8


#: A run's layout needs no more than this fraction over the GPU's memory in plansim's model
#: to be predicted anyway (status ``OVER_MEMORY``); further out, the row more likely misstates
#: its layout than plansim its memory.
MEMORY_MODEL_SLACK = 0.25
#: Status of a row predicted although plansim's memory model fits none of its layouts.
OVER_MEMORY = "over-memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Outcome of one row: ``ok`` or ``OVER_MEMORY`` with a prediction, or ``skipped`` with
    the reason in ``note``.

    Besides the step time, a prediction says where the simulated step goes, so a row's error
    can be read against it: ``mfu_pct`` (model FLOPs over the step at the dense peak,
    Korthikanti et al. 2022 App. A, comparable with a row's ``mfu_pct``),
    ``bubble_fraction`` (the compute stream's idle share of the pipeline time,
    ``SimResult.bubble_fraction``: pipeline bubbles and waits on blocking communication)
    and ``exposed_comm_s_by_kind``, communication not hidden behind
    compute per kind, seconds per pipeline rank (the simulation's sum over the ranks of one
    pipeline, ``SimResult.exposed_s_by_kind``, over pp).

    Finer checks where the row gives the measurement (``plansim.planner.run_checks``):
    ``layer`` (one layer's forward and backward milliseconds and their errors; a row with
    per-layer times but no step time has status ``PER_LAYER`` and only this) and
    ``peak_memory_error_pct`` (the predicted peak against ``measured_peak_mem_gb``).
    """

    status: str
    note: str
    predicted_step_time_s: float | None = None
    step_time_error_pct: float | None = None
    predicted_peak_memory_gib: float | None = None
    plan_label: str = ""
    mfu_pct: float | None = None
    bubble_fraction: float | None = None
    exposed_comm_s_by_kind: dict[str, float] = field(default_factory=dict)
    layer: LayerCheck | None = None
    peak_memory_error_pct: float | None = None


def _fixed(row: RunRow, column: str, notes: list[str], label: str) -> tuple[int, ...] | None:
    value = row.integer(column)
    if value is None:
        notes.append(f"{label} searched")
        return None
    return (value,)


#: An NGC container release named in ``framework`` ("NeMo 24.07", "Megatron-Bridge 25.11",
#: "nvcr.io/nvidia/pytorch:20.12-py3"): NVIDIA numbers its containers YY.MM.
_CONTAINER_RELEASE = re.compile(
    r"(?:nemo|megatron[- ]?bridge|pytorch)\S*[ :]v?(\d\d)\.(?:0[1-9]|1[0-2])\b", re.IGNORECASE
)


def run_year(row: RunRow) -> int | None:
    """Year the run was made: from ``framework`` ("Megatron-LM (2021)", or an NGC container
    release "NeMo 24.07"), else from ``source_locator`` ("SC21", "MLSys 2023",
    "arXiv:2104.04473"), else from the launch script the locator cites
    (``plansim.planner.run_scripts``); None when undated."""
    framework = row.text("framework") or ""
    match = re.search(r"\b(20\d\d)\b", framework)
    if match:
        return int(match.group(1))
    release = _CONTAINER_RELEASE.search(framework)
    if release:
        return 2000 + int(release.group(1))
    locator = row.text("source_locator") or ""
    for pattern, fmt in (
        (r"\b(?:SC|ISCA|MLSys|NSDI|OSDI|SOSP|ATC|EuroSys|PPoPP)[ \'’]?(\d\d)\b", "20{}"),
        (r"\b(20\d\d)\b", "{}"),
        (r"arXiv:(\d\d)\d\d\.\d{4,5}", "20{}"),
    ):
        found = re.search(pattern, locator)
        if found:
            return int(fmt.format(found.group(1)))
    facts = script_facts(locator)
    return facts.year if facts else None


def _attention(year: int | None, notes: list[str]) -> AttentionKernel:
    if year is not None and year < FLASH_IN_MEGATRON_YEAR:
        notes.append(f"unfused attention (run dated {year})")
        return AttentionKernel.UNFUSED
    return AttentionKernel.FLASH


def _space(row: RunRow, notes: list[str]) -> SearchSpace:
    precision_text = row.choice("precision") or ""
    if precision_text not in {p.value for p in Precision}:
        raise Skip(f"precision {precision_text or 'blank'} not modelled")
    facts = script_facts(row.text("source_locator") or "")
    recompute = row.choice("recompute")
    if recompute is None and facts is not None:
        recompute = facts.recompute
        notes.append(f"recompute {recompute} from {facts.source}")
    zero = zero_stage(row, notes)
    sp = row.flag("sequence_parallel")
    for label, value in (("recompute", recompute), ("zero_stage", zero), ("sp", sp)):
        if value is None:
            notes.append(f"{label} searched")
    if recompute is not None and recompute not in {r.value for r in Recompute}:
        raise Skip(f"recompute {recompute!r} not modelled")
    year = run_year(row)
    stated_cp = row.integer("cp")
    if stated_cp is not None and stated_cp > 1:
        attention = AttentionKernel.FLASH
        notes.append(f"cp {stated_cp} (flash attention, as context parallelism needs)")
    else:
        attention = _attention(year, notes)
    cps = _cp_values(row, stated_cp, attention, notes)
    modern = (year is None or year >= SP_AND_SELECTIVE_YEAR) and not is_megatron_fork(row, year)
    vpps, schedules = _pipeline_schedule(row, year, notes)
    return SearchSpace(
        vpps=vpps,
        schedules=schedules,
        tp=_fixed(row, "tp", notes, "tp"),
        cp=cps,
        pp=deepspeed_pp(row, zero, notes),
        dp=_fixed(row, "dp", notes, "dp"),
        micro_batch_size=_fixed(row, "micro_batch_size_seqs", notes, "mbs"),
        zero_stages=zero_stages(row, zero, year, notes),
        recomputes=(Recompute(recompute),)
        if recompute
        else (Recompute.NONE, Recompute.FULL)
        + ((Recompute.SELECTIVE,) if modern and attention is AttentionKernel.UNFUSED else ()),
        sequence_parallel=(sp,) if sp is not None else ((False, True) if modern else (False,)),
        overlap_p2p_comm=(False, True) if year is None or year >= OVERLAP_P2P_YEAR else (False,),
        overlap_grad_reduce=(False, True)
        if year is None or year >= OVERLAP_GRAD_REDUCE_YEAR
        else (False,),
        precision=Precision(precision_text),
        attention=attention,
        gradient_accumulation_fusion=year is None or year >= GRAD_ACC_FUSION_YEAR,
        grad_reduce_in_bf16=bf16_grad_modes(row, year, notes),
        scatter_gather_p2p=year is None or year >= SCATTER_GATHER_P2P_YEAR,
        zero3_param_fetch=zero3_fetch(row, year, notes),
        use_torch_fsdp2=is_torch_fsdp(row, notes),
        uneven_pipeline=uneven_pipeline(row, year),
        # Megatron-LM's block method (--recompute-method block) came with selective
        # recompute (Korthikanti et al. 2022's release); a stated "full" is every layer.
        partial_recompute=recompute is None and modern,
    )


def _cp_values(
    row: RunRow, stated: int | None, attention: AttentionKernel, notes: list[str]
) -> tuple[int, ...]:
    """cp values to search: the stated one; for a blank cell 1 plus the divisors of num_gpus
    up to MAX_SEARCHED_CP when the sequence has at least LONG_CONTEXT_TOKENS tokens and
    attention is flash, else 1 (noted)."""
    if stated is not None:
        return (stated,)
    seq = row.integer("seq_len_tokens") or 0
    if seq < LONG_CONTEXT_TOKENS:
        notes.append(f"cp blank: 1 (seq_len {seq} < {LONG_CONTEXT_TOKENS})")
        return (1,)
    if attention is not AttentionKernel.FLASH:
        notes.append("cp blank: 1 (context parallelism needs flash attention)")
        return (1,)
    gpus = row.integer("num_gpus") or 1
    values = tuple(c for c in range(1, MAX_SEARCHED_CP + 1) if gpus % c == 0)
    notes.append(
        f"cp searched ({', '.join(map(str, values))}; seq_len {seq} >= {LONG_CONTEXT_TOKENS})"
    )
    return values


def _pipeline_schedule(
    row: RunRow, year: int | None, notes: list[str]
) -> tuple[tuple[int, ...] | None, tuple[Schedule, ...]]:
    """(vpps, schedules) to search: a stated virtual_pipeline_size v > 1 means interleaved 1F1B
    with vpp = v only; v = 1 the non-interleaved schedules; blank searches vpp (interleaving
    only for runs dated from its introduction on). ZB-H1 joins the non-interleaved schedules
    for runs dated ZERO_BUBBLE_YEAR or later, and undated ones."""
    flat: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
    if year is None or year >= ZERO_BUBBLE_YEAR:
        flat += (Schedule.ZB_H1,)
    vpp = row.integer("virtual_pipeline_size")
    facts = script_facts(row.text("source_locator") or "")
    if vpp is None and facts is not None:
        vpp = facts.virtual_pipeline_size
        notes.append(f"vpp {vpp} from the launch script")
    if vpp is not None:
        return (vpp,), ((Schedule.INTERLEAVED_1F1B,) if vpp > 1 else flat)
    if deepspeed_pipeline_engine(row):
        notes.append("1F1B (DeepSpeed's pipeline engine has no other training schedule)")
        return (1,), (Schedule.ONE_F_ONE_B,)
    if year is not None and year < INTERLEAVED_YEAR:
        return (1,), flat
    notes.append("vpp searched")
    return None, (*flat, Schedule.INTERLEAVED_1F1B)


def _closest_to_fitting(
    rejected: tuple[Rejected, ...], profile: HardwareProfile
) -> Rejected | None:
    """The out-of-memory rejection with the smallest need, when that need is within
    ``MEMORY_MODEL_SLACK`` of the GPU's memory (None otherwise, or without one)."""
    closest = closest_miss(rejected)
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


def predict_row(row: RunRow, *, simulate_top: int = 8) -> Prediction:
    """Predict one run; a Prediction with status 'skipped' and the reason when it cannot,
    ``OVER_MEMORY`` when only the layouts plansim thinks slightly too big could be predicted.
    """
    notes: list[str] = []
    try:
        measured = row.number("step_time_s")
        if measured is None and not has_layer_times(row):
            raise Skip("no measured step_time_s or per-layer times")
        if measured is not None and (not math.isfinite(measured) or measured <= 0):
            raise Skip(f"step_time_s {measured!r} is not a positive number of seconds")
        model = row_model(row, notes)
        try:
            gpu = row.text("gpu_type") or ""
            profile = load_profile(gpu if gpu.endswith((".yaml", ".yml")) else gpu.lower())
        except PlansimError:
            raise Skip(f"unknown hardware profile {row.text('gpu_type')!r}") from None
        space = _space(row, notes)
        if measured is None:  # per-layer timings only: the layout the row states
            plan = stated_layer_plan(row, space, notes)
            notes.append(f"per-layer times of {plan.label()}")
            return Prediction(
                status=PER_LAYER,
                note="; ".join(notes),
                plan_label=plan.label(),
                layer=layer_check(row, model, plan, profile),
            )
        num_gpus, gbs = row.integer("num_gpus"), row.integer("global_batch_size_seqs")
        if not num_gpus or not gbs:
            raise Skip("num_gpus or global_batch_size_seqs blank")

        def run(prof: HardwareProfile) -> SearchResult:
            return search(
                model,
                prof,
                num_gpus=num_gpus,
                global_batch_size=gbs,
                space=space,
                simulate_top=simulate_top,
            )

        result = run(profile)
    except Skip as exc:
        return Prediction(status="skipped", note=str(exc))
    except PlansimError as exc:  # a malformed or inconsistent row: skip it, keep the others
        return Prediction(status="skipped", note=f"row not usable: {exc}")
    status = "ok"
    closest = None if result.ranked else _closest_to_fitting(result.rejected, profile)
    if closest is not None:
        # The run did fit, so plansim's memory model is pessimistic for it: predict the
        # layouts that come closest to fitting (module docstring).
        roomier = replace(profile, hbm_capacity_bytes=closest.need_bytes * (1 + 1e-9))
        relaxed = run(roomier)
        if relaxed.ranked:  # else the skip below keeps the real capacity's reasons
            result, status = relaxed, OVER_MEMORY
            notes.append(
                f"no layout fits plansim's memory model; predicted the closest: {closest.reason}"
            )
    if not result.ranked:
        examples = result.rejection_examples  # the nearest miss on memory says the most
        first = examples.get(OUT_OF_MEMORY) or next(
            iter(examples.values()), _no_candidate(row, num_gpus, gbs)
        )
        if result.batch_indivisible_dps:
            dps = ", ".join(map(str, result.batch_indivisible_dps))
            first += f"; layouts with dp in ({dps}) not tried: gbs {gbs} is not divisible by dp"
        return Prediction(status="skipped", note=f"no feasible layout: {first}")
    best = result.ranked[0]
    notes.append(f"chosen: {best.plan.label()}")
    try:
        layer = layer_check(row, model, best.plan, profile)
        memory_error = memory_error_pct(row, best.peak_memory_bytes)
    except Skip as exc:
        return Prediction(status="skipped", note=str(exc))
    return Prediction(
        status=status,
        note="; ".join(notes),
        predicted_step_time_s=best.step_time_s,
        step_time_error_pct=100.0 * (best.step_time_s - measured) / measured,
        predicted_peak_memory_gib=best.peak_memory_bytes / 2**30,
        plan_label=best.plan.label(),
        mfu_pct=100.0 * best.mfu,
        bubble_fraction=best.bubble_fraction,
        exposed_comm_s_by_kind={
            kind: seconds / best.plan.pp for kind, seconds in best.exposed_comm_s_by_kind.items()
        },
        layer=layer,
        peak_memory_error_pct=memory_error,
    )
