"""Predict published Mixture-of-Experts runs (``reference/moe_runs.csv``) at their stated layout.

A row of the MoE schema (``moe_SOURCES.md``: the runs CSV columns plus ``num_experts``,
``top_k``, ``ep``, ``etp``, ``moe_ffn_hidden_size``, ...) names a model plansim has a preset
for (``plansim.catalog.MOE_PRESETS``; the row's sequence length replaces the preset's) and
the layout it ran: tp, pp, cp, virtual pipeline size, ep, etp, micro-batch and global
batch. That layout is simulated as Megatron-Core runs it (distributed optimizer, ZeRO-1;
gradient reduction and parameter gathers overlapped; sequence parallel with tp > 1;
interleaved 1F1B with a virtual pipeline size, else 1F1B, DualPipe where the row names it
(simulated as DualPipeV over twice the stages); the dispatcher deduplicated per node for
DeepSeek's own framework, Megatron-Core's all-to-all otherwise; Megatron's uneven first/last
stage split where the layers do not divide into the stages), with forced-balance routing
(the Megatron-Bridge rows' footnote, ``expert_load_imbalance`` 1.0). Cells the source left
blank are searched or assumed, and the note says so.

What is compared: the step time; a row that gives tokens/s/GPU has its step time
(GBS x seq / (tokens/s/GPU x GPUs)); a row that gives only model TFLOP/s/GPU has the step
time those imply under Megatron's FLOP count (``moe_counts.model_flops_per_token`` with
MTP and the causal attention half, what Megatron-Bridge's ``num_floating_point_operations``
counts: ``moe_SOURCES.md`` "FLOP conventions").

Skipped with the reason: hybrid Mamba/attention models (Nemotron-3), models without a
preset or published shape, precisions plansim does not price.
"""

from __future__ import annotations

import dataclasses
import re

from plansim.analytic.moe_counts import AttentionCore, model_flops_per_token
from plansim.catalog import MOE_PRESETS
from plansim.errors import PlansimError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.evaluate import OUT_OF_MEMORY, Evaluation, Rejected, evaluate
from plansim.planner.prediction import MEMORY_MODEL_SLACK, OVER_MEMORY, Prediction
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.layer_split import uneven_split_fields
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Precision, Recompute, Schedule, plan_from_fields
from plansim.units import bytes_to_gib

#: Row precisions -> plansim's: every fp8 recipe (MXFP8, per-tensor current scaling,
#: DeepSeek's blockwise) is priced at the fp8 GEMM rate; NVFP4 at fp4's.
PRECISIONS = {
    "bf16": Precision.BF16,
    "mxfp8": Precision.FP8,
    "fp8-cs": Precision.FP8,
    "fp8-blockwise": Precision.FP8,
    "fp8-delayed": Precision.FP8,
    "fp8": Precision.FP8,
    "nvfp4": Precision.FP4,
}
#: Model names of hybrid Mamba/attention MoE models, which plansim does not model.
HYBRID_PREFIXES = ("nemotron-3", "nemotron-h", "qwen3-next")
#: Sequence length assumed where a row leaves it blank (the DeepSeek-V3 report's 4K).
ASSUMED_SEQ_LENGTH = 4096
#: Frameworks whose MoE dispatch crosses the network once per token and destination node:
#: DeepSeek's HAI-LLM (arXiv 2412.19437 §3.2.2; DeepEP is its open release) and DeepEP.
DEDUP_DISPATCH_FRAMEWORKS = ("HAI-LLM", "DeepEP")
#: Micro-batch sizes tried where a row leaves it blank (the fastest that fits is kept).
SEARCHED_MICRO_BATCH_SIZES = (1, 2, 4)


def is_moe_row(row: RunRow) -> bool:
    """Whether ``row`` is of the MoE schema (it has a routed-expert count or an ep)."""
    return row.text("num_experts") is not None or row.text("ep") is not None


def predict_moe_row(row: RunRow) -> Prediction:
    """Predict one MoE row at its stated layout (module docstring); status ``ok``,
    ``over-memory`` (plansim's memory model says no stated layout fits: predicted anyway),
    or ``skipped`` with the reason."""
    notes: list[str] = []
    try:
        model = _row_model(row, notes)
        if isinstance(model, str):
            return Prediction(status="skipped", note=model)
        measured = _measured_step_s(row, model, notes)
        if measured is None:
            return Prediction(status="skipped", note="no tokens/s/GPU or model TFLOP/s to compare")
        profile = load_profile(row.choice("gpu_type") or "")
        plans = _row_plans(row, model, notes)
        if isinstance(plans, str):
            return Prediction(status="skipped", note=plans)
        results = [evaluate(model, p, profile) for p in plans]
        status = "ok"
        fits = [r for r in results if isinstance(r, Evaluation)]
        rejected = [r for r in results if isinstance(r, Rejected)]
        if not fits and rejected and rejected[0].category == OUT_OF_MEMORY:
            # a published run did fit: predict it anyway, on the closest layout
            closest = min(rejected, key=lambda r: r.need_bytes)
            if closest.need_bytes > (1 + MEMORY_MODEL_SLACK) * profile.hbm_capacity_bytes:
                return Prediction(status="skipped", note=f"layout rejected: {closest.reason}")
            notes.append(f"over memory in plansim's model: {closest.reason}")
            roomier = dataclasses.replace(profile, hbm_capacity_bytes=closest.need_bytes * 1.001)
            fits = [
                e for e in [evaluate(model, closest.plan, roomier)] if isinstance(e, Evaluation)
            ]
            status = OVER_MEMORY
        if not fits:
            reason = rejected[0].reason if rejected else "no plan"
            return Prediction(status="skipped", note=f"layout rejected: {reason}")
    except PlansimError as exc:
        return Prediction(status="skipped", note=f"row not usable: {exc}")
    return _outcome(fits, measured, notes, status)


def _outcome(fits: list[Evaluation], measured: float, notes: list[str], status: str) -> Prediction:
    best = min(fits, key=lambda e: e.step_time_s)
    error = 100.0 * (best.step_time_s - measured) / measured
    stages = max(1, len(best.result.compute_busy_s))
    return Prediction(
        status=status,
        note="; ".join(notes),
        predicted_step_time_s=best.step_time_s,
        step_time_error_pct=error,
        predicted_peak_memory_gib=bytes_to_gib(best.peak_memory_bytes),
        plan_label=best.plan.label(),
        plan=best.plan,
        mfu_pct=100.0 * best.mfu,
        bubble_fraction=best.bubble_fraction,
        exposed_comm_s_by_kind={k: v / stages for k, v in best.exposed_comm_s_by_kind.items()},
    )


def _row_model(row: RunRow, notes: list[str]) -> ModelSpec | str:
    """The preset of the row's model with its sequence length, or the reason to skip."""
    name = (row.text("model_name") or "").lower()
    if name.startswith(HYBRID_PREFIXES):
        return f"{row.text('model_name')}: hybrid Mamba/attention layers are not modelled"
    factory = MOE_PRESETS.get(name)
    if factory is None:
        return f"{row.text('model_name')}: no preset and no published shape plansim can use"
    seq = row.integer("seq_len_tokens")
    if seq is None:
        seq = ASSUMED_SEQ_LENGTH
        notes.append(f"seq length not stated: {seq} assumed")
    return dataclasses.replace(factory(), seq_length=seq)


def _measured_step_s(row: RunRow, model: ModelSpec, notes: list[str]) -> float | None:
    """The published step time: from tokens/s/GPU, else implied by model TFLOP/s/GPU."""
    gbs, gpus = row.integer("global_batch_size_seqs"), row.integer("num_gpus")
    tokens_per_gpu = row.number("tokens_per_s_per_gpu")
    if gbs is None or gpus is None:
        return None
    tokens = gbs * model.seq_length
    if tokens_per_gpu:
        return tokens / (tokens_per_gpu * gpus)
    tflops = row.number("tflops_per_gpu")
    if not tflops:
        return None
    per_token = model_flops_per_token(model, with_mtp=True, attention_core=AttentionCore.CAUSAL)
    notes.append(
        f"compared on model TFLOP/s ({tflops:g}): step implied at "
        f"{per_token / 1e9:.0f} GFLOP/token (causal attention, MTP)"
    )
    return tokens * per_token / (tflops * 1e12 * gpus)


def _row_plans(row: RunRow, model: ModelSpec, notes: list[str]) -> list[ParallelPlan] | str:
    """The row's stated layout as plans (one per micro-batch size tried), or why not."""
    precision = PRECISIONS.get((row.choice("precision") or "").split(" ")[0])
    if precision is None:
        return f"precision {row.text('precision')!r} is not priced"
    tp, pp = row.integer("tp") or 1, row.integer("pp") or 1
    cp, ep = row.integer("cp") or 1, row.integer("ep") or 1
    etp = row.integer("etp")
    if etp is None:
        etp = 1
        notes.append("etp not stated: 1 (Megatron-Bridge's MoE recipes)")
    vpp = row.integer("virtual_pipeline_size") or 1
    gpus, gbs = row.integer("num_gpus") or 1, row.integer("global_batch_size_seqs") or 1
    dp = gpus // (tp * pp * cp)
    mbs_cell = row.integer("micro_batch_size_seqs")
    mbs_values = (mbs_cell,) if mbs_cell else SEARCHED_MICRO_BATCH_SIZES
    if mbs_cell is None:
        notes.append(f"micro-batch not stated: fastest of {SEARCHED_MICRO_BATCH_SIZES}")
    recompute = Recompute.SELECTIVE if row.text("recompute") else Recompute.NONE
    modules = _recompute_modules(row.text("recompute") or "", notes)
    framework = row.text("framework") or ""
    dualpipe = "dualpipe" in (row.text("notes") or "").lower() or "DualPipe" in framework
    schedule = Schedule.INTERLEAVED_1F1B if vpp > 1 else Schedule.ONE_F_ONE_B
    if dualpipe:
        schedule, vpp = Schedule.DUALPIPE_V, 2
        notes.append(
            "DualPipe simulated as DualPipeV (its V-shaped variant: the same overlapped "
            "forward/backward pairs, one copy of the parameters)"
        )
    dispatcher = MoeTokenDispatcher.ALLTOALL
    if any(name in framework for name in DEDUP_DISPATCH_FRAMEWORKS):
        dispatcher = MoeTokenDispatcher.DEEPEP
        notes.append("node-deduplicated dispatch (DeepSeek-V3 §3.2.2, DeepEP): deepep dispatcher")
    split = uneven_split_fields(model.num_layers, pp=pp, vpp=vpp, layouts=True) or {}
    stated = re.search(r"PP layout (\S+)", row.text("notes") or "")
    if stated:
        split = {"pipeline_model_parallel_layout": stated.group(1).rstrip(",;")}
    elif "pipeline_model_parallel_layout" in split:
        notes.append(f"pipeline layout not stated: {split['pipeline_model_parallel_layout']}")
    fields = dict(
        dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp, global_batch_size=gbs,
        zero_stage=1, sequence_parallel=tp > 1, precision=precision, recompute=recompute,
        recompute_modules=modules, schedule=schedule, moe_token_dispatcher_type=dispatcher,
        overlap_grad_reduce=dp > 1, overlap_param_gather=dp > 1, **split,
    )  # fmt: skip
    plans, invalid = [], []
    for mbs in mbs_values:
        if gbs % (mbs * dp):
            continue
        try:
            plans.append(plan_from_fields(micro_batch_size=mbs, **fields))
        except PlansimError as exc:  # e.g. too few micro-batches for the schedule at this mbs
            invalid.append(f"stated layout not valid: {exc}")
    if plans:
        return plans
    return (
        invalid[0] if invalid else f"global batch {gbs} does not split over dp({dp}) micro-batches"
    )


def _recompute_modules(text: str, notes: list[str]) -> str | None:
    """Megatron-Core recompute modules a row's recompute cell names: ``layernorm`` for
    RMSNorm/LayerNorm, ``mla_up_proj`` for the MLA up-projections (unless the cell says that
    recompute was removed), ``moe_act``; the dense layers' ``mlp`` recompute is not priced
    (noted)."""
    lowered = text.lower()
    modules = []
    if "rmsnorm" in lowered or "layernorm" in lowered:
        modules.append("layernorm")
    if ("up_proj" in lowered or "up-proj" in lowered) and "removed" not in lowered:
        modules.append("mla_up_proj")
    if "moe_act" in lowered:
        modules.append("moe_act")
    if re.search(r"\bmlp\b", lowered):
        notes.append("the dense layers' mlp recompute is not priced")
    return ",".join(modules) or None
