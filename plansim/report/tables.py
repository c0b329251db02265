"""Tables for people: pandas DataFrames in edge units (ms, GiB, TFLOP/s, %), and renderers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from plansim.planner.evaluate import Evaluation
from plansim.specs.plan import DdpImpl, DpSync, OffloadDevice, ParallelPlan, Zero3ParamFetch
from plansim.units import bytes_to_gib


def plan_row(ev: Evaluation) -> dict[str, Any]:
    """One ranked-table row for an evaluated plan (edge units in the column names); ``sp`` is
    'no', 'yes', or 'overlap' (with TP communication overlap); ``exposed_comm_pct`` is
    :func:`exposed_comm_fraction` in percent; a parameter-server plan adds a last column
    ``dp_sync`` ('ps' or 'ps<K>')."""
    p = ev.plan
    row = {
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "vpp": p.vpp,
        "mbs": p.micro_batch_size,
        "num_microbatches": p.num_microbatches,
        "zero": p.zero_stage,
        "recompute": p.recompute_label,
        "sp": ("overlap" if p.tp_comm_overlap else "yes") if p.sequence_parallel else "no",
        "schedule": p.schedule.value,
        "p2p": "overlap" if p.overlap_p2p_comm else "sync",
        "grad_reduce": _grad_reduce(p),
        "step_time_s": round(ev.step_time_s, 3),
        "tokens_per_s": round(ev.tokens_per_s),
        "mfu_pct": round(100 * ev.mfu, 1),
        "hfu_pct": round(100 * ev.hfu, 1),
        "bubble_pct": round(100 * ev.bubble_fraction, 1),
        "exposed_comm_pct": round(100 * exposed_comm_fraction(ev), 1),
        "peak_mem_gib": round(bytes_to_gib(ev.peak_memory_bytes), 1),
    }
    if p.dp_sync is DpSync.PARAMETER_SERVER:  # ring rows keep their columns unchanged
        row["dp_sync"] = f"ps{p.ps_servers or ''}"
    if _offload_label(p):  # plans without offload keep their columns unchanged
        row["offload"] = _offload_label(p)
    if p.uneven_pipeline:  # evenly split plans keep their columns unchanged
        row["pipeline_split"] = pipeline_split_label(p)
    if p.dp_shard is not None:  # fully sharded plans keep their columns unchanged
        row["zero_shard"] = f"hsdp{p.dp_shard}"
    if p.cp > 1:  # plans without context parallelism keep their columns unchanged
        row["cp"] = p.cp
    if p.ep > 1 or p.etp is not None:  # dense plans keep their columns unchanged
        row["ep"] = p.ep
        row["etp"] = p.dims.expert_tensor_parallel_size
        row["edp"] = p.dims.edp
        row["exposed_a2a_pct"] = round(
            100 * _mean_kind_s(ev, "ep_comm") / ev.step_time_s if ev.step_time_s > 0 else 0.0, 1
        )
    if not p.reshard_after_forward:  # resharding plans keep their columns unchanged
        row["zero3_reshard"] = "backward"
    if p.zero_stage == 3 and p.zero3_param_fetch is not Zero3ParamFetch.LAYER_PREFETCH:
        row["zero3_fetch"] = p.zero3_param_fetch.value  # prefetching plans: unchanged
    return row


def exposed_comm_fraction(ev: Evaluation) -> float:
    """Share of the step the mean pipeline rank's compute stream waits on communication of
    any kind (the exposed parts of :func:`step_breakdown_s` over the step time)."""
    if ev.step_time_s <= 0:
        return 0.0
    return _mean_exposed_s(ev) / ev.step_time_s


def _mean_exposed_s(ev: Evaluation) -> float:
    """Exposed communication seconds, all kinds, of the mean pipeline rank."""
    return sum(ev.exposed_comm_s_by_kind.values()) / len(ev.result.compute_busy_s)


def _mean_kind_s(ev: Evaluation, kind: str) -> float:
    """Exposed seconds of one communication kind on the mean pipeline rank."""
    return ev.exposed_comm_s_by_kind.get(kind, 0.0) / len(ev.result.compute_busy_s)


def _grad_reduce(p: ParallelPlan) -> str:
    """'end', 'overlap', or 'overlap+params' (the parameter all-gather hidden too), with
    ' bf16' when the gradients are reduced in bf16."""
    when = "end"
    if p.overlap_grad_reduce:
        when = "overlap+params" if p.overlap_param_gather else "overlap"
    return f"{when} bf16" if p.grad_reduce_in_bf16 else when


def pipeline_split_label(p: ParallelPlan) -> str:
    """How an uneven plan splits its layers: 'first7 last7' (decoder first/last layer
    counts), 'embedding+loss' (counted as layers of the split); '' for an even split."""
    parts = []
    if p.pipeline_model_parallel_layout is not None:
        parts.append(p.pipeline_model_parallel_layout)
    if p.decoder_first_pipeline_num_layers is not None:
        parts.append(f"first{p.decoder_first_pipeline_num_layers}")
    if p.decoder_last_pipeline_num_layers is not None:
        parts.append(f"last{p.decoder_last_pipeline_num_layers}")
    counted = [
        name
        for name, on in (
            ("embedding", p.account_for_embedding_in_pipeline_split),
            ("loss", p.account_for_loss_in_pipeline_split),
        )
        if on
    ]
    if counted:
        parts.append("+".join(counted))
    return " ".join(parts)


def _offload_label(p: ParallelPlan) -> str:
    """'opt-cpu', 'opt-nvme param-nvme', ... or '' for a plan that offloads nothing."""
    parts = [
        f"{name}-{device.value}"
        for name, device in (("opt", p.offload_optimizer), ("param", p.offload_param))
        if device is not OffloadDevice.NONE
    ]
    return " ".join(parts)


def ranked_table(evaluations: Sequence[Evaluation]) -> pd.DataFrame:
    """Ranked plans, fastest first, with a 1-based ``rank`` column (and ``dp_sync``,
    'ring' on ring rows, when some plan uses a parameter server; ``pipeline_split``, 'even'
    on evenly split rows, when some plan splits its layers unevenly; ``zero_shard``, 'full'
    on fully sharded rows, when some plan uses hybrid sharding, e.g. 'hsdp8'; ``cp``, after
    ``tp``, when some plan uses context parallelism; ``zero3_reshard``, when ZeRO-3
    parameters are released: 'forward' (FSDP's default), 'backward' for plans that keep them
    gathered until the backward, '' for plans without ZeRO-3; ``zero3_fetch``, when some
    ZeRO-3 plan does not prefetch per layer: its fetch mode, 'layer-prefetch' for the
    others, '' for plans without ZeRO-3)."""
    rows = [{"rank": i + 1, **plan_row(ev)} for i, ev in enumerate(evaluations)]
    df = pd.DataFrame(rows)
    if "dp_sync" in df:
        df["dp_sync"] = df["dp_sync"].fillna(DpSync.RING.value)
    if "offload" in df:
        df["offload"] = df["offload"].fillna(OffloadDevice.NONE.value)
    if "pipeline_split" in df:
        df["pipeline_split"] = df["pipeline_split"].fillna("even")
    if "zero_shard" in df:
        df["zero_shard"] = df["zero_shard"].fillna("full")
    for column, default in (
        ("zero3_reshard", "forward"),
        ("zero3_fetch", Zero3ParamFetch.LAYER_PREFETCH.value),
    ):
        if column in df:  # the default on ZeRO-3 rows, blank on the others
            filled = df[column].where(df[column].notna() | (df["zero"] != 3), default)
            df[column] = filled.fillna("")
    if "cp" in df:  # next to tp, as Megatron's rank order tp -> cp -> dp -> pp
        cp = df.pop("cp").fillna(1).astype(int)
        df.insert(df.columns.get_loc("tp") + 1, "cp", cp)
    return df


def _optional_plan_fields(p: ParallelPlan) -> dict[str, Any]:
    """The plan fields ``evaluation_dict`` writes only when they are not at their default,
    each with the group of fields that goes with it, keyed by the flag that gates it."""
    return {
        "bf16_layers": {
            "num_layers_at_start_in_bf16": p.num_layers_at_start_in_bf16,
            "num_layers_at_end_in_bf16": p.num_layers_at_end_in_bf16,
        }
        if p.num_layers_at_start_in_bf16 or p.num_layers_at_end_in_bf16
        else {},
        "uneven": {
            "decoder_first_pipeline_num_layers": p.decoder_first_pipeline_num_layers,
            "decoder_last_pipeline_num_layers": p.decoder_last_pipeline_num_layers,
            "account_for_embedding_in_pipeline_split": p.account_for_embedding_in_pipeline_split,
            "account_for_loss_in_pipeline_split": p.account_for_loss_in_pipeline_split,
            "pipeline_model_parallel_layout": p.pipeline_model_parallel_layout,
        }
        if p.uneven_pipeline
        else {},
        "dp_sync": {"dp_sync": p.dp_sync.value, "ps_servers": p.ps_servers}
        if p.dp_sync is DpSync.PARAMETER_SERVER
        else {},
        "offload": {
            "offload_optimizer": p.offload_optimizer.value,
            "offload_param": p.offload_param.value,
        }
        if _offload_label(p)
        else {},
    }


def plan_dict(p: ParallelPlan) -> dict[str, Any]:
    """The plan's knobs as ``evaluation_dict`` writes them: every core field, the optional
    ones only where they differ from their defaults (so older outputs keep their bytes)."""
    extra = _optional_plan_fields(p)
    return {
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "cp": p.cp,
        "vpp": p.vpp,
        "micro_batch_size": p.micro_batch_size,
        "global_batch_size": p.global_batch_size,
        "num_microbatches": p.num_microbatches,
        "zero_stage": p.zero_stage,
        "recompute": p.recompute.value,
        **(
            {"recompute_num_layers": p.recompute_num_layers}
            if p.recompute_num_layers is not None
            else {}
        ),
        "sequence_parallel": p.sequence_parallel,
        "schedule": p.schedule.value,
        "precision": p.precision.value,
        **extra["bf16_layers"],
        "attention": p.attention.value,
        "overlap_p2p_comm": p.overlap_p2p_comm,
        **({"tp_comm_overlap": True} if p.tp_comm_overlap else {}),
        "overlap_grad_reduce": p.overlap_grad_reduce,
        **({"overlap_param_gather": True} if p.overlap_param_gather else {}),
        "gradient_accumulation_fusion": p.gradient_accumulation_fusion,
        **({"fused_elementwise": False} if not p.fused_elementwise else {}),
        **({"persist_layer_norm": False} if not p.persist_layer_norm else {}),
        **({"grad_reduce_in_bf16": True} if p.grad_reduce_in_bf16 else {}),
        **({"use_torch_fsdp2": True} if p.use_torch_fsdp2 else {}),
        **({"reshard_after_forward": False} if not p.reshard_after_forward else {}),
        **({"dp_shard": p.dp_shard} if p.dp_shard is not None else {}),
        **({"ddp_impl": p.ddp_impl.value} if p.ddp_impl is not DdpImpl.MEGATRON_CORE else {}),
        "scatter_gather_p2p": p.scatter_gather_p2p,
        "num_gpus": p.num_gpus,
        **extra["uneven"],
        **extra["dp_sync"],
        **extra["offload"],
    }


def evaluation_dict(ev: Evaluation) -> dict[str, Any]:
    """Machine-readable summary of one simulated plan (SI units): the plan
    (:func:`plan_dict`), step time, throughput, MFU/HFU, bubble, memory and busy/exposed
    seconds by kind."""
    return {
        "plan": plan_dict(ev.plan),
        "step_time_s": ev.step_time_s,
        "tokens_per_s": ev.tokens_per_s,
        "mfu": ev.mfu,
        "hfu": ev.hfu,
        "bubble_fraction": ev.bubble_fraction,
        "peak_memory_bytes": ev.peak_memory_bytes,
        "per_rank_peak_memory_bytes": list(ev.result.peak_memory_bytes),
        "memory_breakdown_bytes": {"rank": ev.memory.rank, **ev.memory.as_dict()},
        "busy_s_by_kind": dict(sorted(ev.result.busy_s_by_kind.items())),
        "exposed_comm_s_by_kind": dict(sorted(ev.exposed_comm_s_by_kind.items())),
        "per_rank_compute_busy_s": list(ev.result.compute_busy_s),
        "num_grad_buckets": ev.num_grad_buckets,
    }


def memory_table(ev: Evaluation) -> pd.DataFrame:
    """Memory breakdown of the worst rank in GiB."""
    rows = [
        {"component": k, "gib": round(bytes_to_gib(v), 2)} for k, v in ev.memory.as_dict().items()
    ]
    rows.append({"component": "total", "gib": round(bytes_to_gib(ev.memory.total_bytes), 2)})
    return pd.DataFrame(rows)


def step_breakdown_s(ev: Evaluation) -> dict[str, float]:
    """Where one simulated step goes, seconds in the mean over the pipeline ranks: the
    compute stream's kernels (pipeline work and optimizer), each communication kind's exposed
    time (the compute stream idle while it runs; ``SimResult.exposed_s_by_kind``), and the
    rest of the step, in which the compute stream waits on nothing it could run (pipeline
    bubbles, waits on other ranks). The parts add up to the step time (key ``step``)."""
    busy = ev.result.compute_busy_s
    ranks = len(busy)
    parts = {"compute (kernels)": sum(busy) / ranks}
    parts.update(
        (f"exposed {kind}", seconds / ranks)
        for kind, seconds in sorted(ev.exposed_comm_s_by_kind.items())
        if seconds > 0
    )
    parts["idle (bubbles, waits)"] = (
        ev.step_time_s - parts["compute (kernels)"] - _mean_exposed_s(ev)
    )
    parts["step"] = ev.step_time_s
    return parts


def step_breakdown_table(ev: Evaluation) -> pd.DataFrame:
    """:func:`step_breakdown_s` as a table: columns ``part``, ``seconds`` (ms digits) and
    ``pct_of_step``."""
    parts = step_breakdown_s(ev)
    step = ev.step_time_s
    return pd.DataFrame(
        {
            "part": list(parts),
            "seconds": [round(seconds, 3) for seconds in parts.values()],
            "pct_of_step": [
                round(100 * seconds / step, 1) if step > 0 else 0.0 for seconds in parts.values()
            ],
        }
    )


def render(df: pd.DataFrame, fmt: str) -> str:
    """Render a table as aligned text, CSV or JSON records."""
    if fmt == "csv":
        return str(df.to_csv(index=False))
    if fmt == "json":
        return json.dumps(df.to_dict(orient="records"), indent=2, sort_keys=False) + "\n"
    return str(df.to_string(index=False)) + "\n"
