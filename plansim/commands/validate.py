"""plansim validate: run a plan for real with torch.distributed, compare with its simulation.

Runs the plan (``plansim.validate.runner``: DeviceMesh, DTensor TP, activation checkpointing,
FSDP2 / ZeroRedundancyOptimizer, torch.distributed.pipelining) on a GPT/Llama-style model
with synthetic data, simulates the same model and plan on ``--profile``, and writes in
``--out DIR``: ``measured_timeline.csv`` (the median measured step) and
``simulated_timeline.csv`` (Timeline schema), ``measured_trace.json`` and
``simulated_trace.json`` (Chrome/Perfetto), ``overlay.png`` (simulated above measured),
``events.csv`` (event-by-event match) and ``comparison.json``. ``--update-profile`` refits
the profile from the run (``plansim.validate.refit``), writes it back atomically and reports
the error after calibration. Under ``torchrun`` (multi-node) every process runs this
command; global rank 0 writes the outputs. torch is imported only when the run starts.
Exit status 0 when the run was measured and compared; 1 when it failed (a rank raised,
died or hung: ``DIR/failure.json`` says which and how far each got); 2 for bad input,
including a CPU run whose ranks would not fit the host's available memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.catalog import resolve_model
from plansim.commands.common import (
    add_pipeline_split_args,
    add_recompute_args,
    check_no_plan_flags,
    plan_flag_defaults,
    require_args,
    shared_plan_fields,
)
from plansim.errors import SpecError, require_positive, require_positive_int
from plansim.io.outputs import check_writable, write_json_atomic, write_text_atomic
from plansim.io.plan_file import read_plan_file
from plansim.io.profiles import load_profile, write_profile
from plansim.planner.lookups import OutOfRange, out_of_range, recording_profile
from plansim.report.sensitivity_table import outside_text
from plansim.report.trace import chrome_trace, write_trace
from plansim.specs.hardware import HardwareProfile
from plansim.specs.layer_split import require_plan_divides_model
from plansim.specs.model import ModelSpec
from plansim.specs.plan import (
    PLAN_FIELDS,
    ParallelPlan,
    Precision,
    Schedule,
    plan_from_fields,
)
from plansim.validate.compare import (
    Comparison,
    compare,
    error_pct,
    median_step_index,
    rounded_json,
    simulate_plan,
)
from plansim.validate.preflight import check_host_memory, require_devices
from plansim.validate.refit import Refit, profile_path, refit
from plansim.validate.result import QUIET_CPU_SHARE, MeasuredRun, RunFailed
from plansim.validate.run_config import check_schedule_supported
from plansim.validate.run_dtype import RUN_DTYPES, check_dtype_supported

#: Backend -> device it runs on.
BACKENDS = {"gloo": "cpu", "nccl": "cuda"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plansim validate``."""
    p = sub.add_parser("validate", help="run a plan for real and compare", description=__doc__)
    p.add_argument(
        "--plan",
        metavar="PLAN.yaml",
        help="run the plan of a plan file ('plansim plan --save-plan'): it gives the model, "
        "the layout and the dtype (--nproc = its GPUs); no layout flag goes with it, the "
        "model-scaling flags and --profile may",
    )
    p.add_argument("--model", help="preset name or a config.json path (required without --plan)")
    scale = p.add_argument_group("model scaling (the report says what was run)")
    scale.add_argument("--num-layers", type=int, help="layers to run instead of the model's")
    scale.add_argument(
        "--hidden-size", type=int, help="width to run (the MLP width scales with it)"
    )
    scale.add_argument("--num-heads", type=int, help="attention heads (and KV groups) to run")
    scale.add_argument("--seq-len", type=int, help="sequence length to run")
    scale.add_argument("--vocab-size", type=int, help="vocabulary size to run")
    p.add_argument("--tp", type=int, help="tensor-parallel size")
    p.add_argument("--pp", type=int, help="pipeline-parallel size")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size (default: derived)")
    p.add_argument(
        "--vpp",
        type=int,
        default=None,
        help="model chunks per pipeline rank (default 2 with zb-v / dualpipev, else 1)",
    )
    p.add_argument("--mbs", type=int, help="micro-batch size (sequences)")
    p.add_argument("--gbs", type=int, help="global batch size (sequences)")
    p.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (default 0)")
    p.add_argument(
        "--dp-shard",
        type=int,
        default=None,
        metavar="N",
        help="ZeRO-3 hybrid sharding over N DP ranks (FSDP2 on a 2-D replicate x shard mesh; tp 1)",
    )
    p.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert-parallel size, models with experts (dp ranks hold E/ep experts each)",
    )
    p.add_argument(
        "--etp",
        type=int,
        default=None,
        help="expert tensor-parallel size (the runner runs etp 1 only; default: tp)",
    )
    add_recompute_args(p)
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron SP (tp > 1)")
    p.add_argument("--schedule", choices=[s.value for s in Schedule], default="1f1b")
    add_pipeline_split_args(p)
    p.add_argument("--backend", choices=list(BACKENDS), required=True, help="gloo (CPU), nccl")
    p.add_argument("--nproc", type=int, help="processes = tp * pp * dp")
    p.add_argument(
        "--profile", help="hardware profile name or YAML path (default with --plan: its gpu)"
    )
    p.add_argument(
        "--dtype",
        choices=RUN_DTYPES,
        default=None,
        help="run dtype (default fp32; with --plan its precision): fp32, or bf16 mixed "
        "precision (Megatron-LM's fp32 master weights and "
        "main gradients; FSDP2's MixedPrecisionPolicy for ZeRO-2/3; not ZeRO-1)",
    )
    p.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    p.add_argument("--warmup-steps", type=int, default=1, help="warm-up steps (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="per-rank timeout, s")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument(
        "--update-profile",
        action="store_true",
        help="refit the profile from the run, write it back (atomically), report the new error",
    )
    keep = (
        "plan", "backend", "profile", "steps", "warmup_steps", "timeout", "seed", "out",
        "update_profile", "num_layers", "hidden_size", "num_heads", "seq_len", "vocab_size",
    )  # fmt: skip
    p.set_defaults(func=run, plan_flag_defaults=plan_flag_defaults(p, keep=keep))


#: Flags a validation needs when no plan file gives them.
REQUIRED_FLAGS = ("--model", "--tp", "--pp", "--mbs", "--gbs", "--nproc", "--profile")
#: Plan fields the validator runs as the plan says (``plan_from_args``); it runs the others
#: as torch does (``plansim.validate.simulated.run_plan`` prices that run).
VALIDATED_FIELDS = (
    "dp", "tp", "pp", "vpp", "micro_batch_size", "global_batch_size", "zero_stage", "dp_shard",
    "recompute", "recompute_num_layers", "sequence_parallel", "schedule", "precision",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "ep",
    "etp",
)  # fmt: skip


def apply_plan_file(args: argparse.Namespace) -> ParallelPlan | None:
    """With ``--plan``: fill the flags the file gives (model, sequence length, profile,
    dtype, --nproc) into ``args`` and return the plan of the fields the validator runs
    (:data:`VALIDATED_FIELDS`), saying on stderr which other fields differ from what it runs.
    Without: check the required flags and return None.

    Raises:
        SpecError: a required flag is missing without --plan, a layout flag is given with it,
            or the file's precision is not a run dtype.
        InputFileError: the plan file is unreadable or invalid.
    """
    if args.plan is None:
        require_args(args, REQUIRED_FLAGS, unless="--plan")
        args.dtype = args.dtype or "fp32"
        return None
    check_no_plan_flags(args, args.plan_flag_defaults)
    plan_file = read_plan_file(args.plan)
    planned = plan_file.plan
    if planned.precision.value not in RUN_DTYPES:
        raise SpecError(
            f"{args.plan}: plan precision {planned.precision.value} cannot be run by the "
            f"validator; it runs {', '.join(RUN_DTYPES)}"
        )
    args.model, args.dtype, args.nproc = plan_file.model, planned.precision.value, planned.num_gpus
    args.seq_len = args.seq_len or plan_file.seq_length
    args.profile = args.profile or plan_file.gpu
    args.tp = planned.tp  # the model scaling rounds the MLP width to it
    plan = plan_from_fields(**{name: getattr(planned, name) for name in VALIDATED_FIELDS})
    others = [
        f"{name}={_shown(getattr(planned, name))}"
        for name in PLAN_FIELDS
        if getattr(planned, name) != getattr(plan, name)
    ]
    if others:
        sys.stderr.write(
            "plansim: the validator runs these planned fields as torch does (the simulation "
            f"it compares with prices that run): {', '.join(others)}\n"
        )
    return plan


def _shown(value: object) -> object:
    """An enum as its value."""
    return getattr(value, "value", value)


def scaled_model(args: argparse.Namespace) -> ModelSpec:
    """The model named by ``--model`` with the scaling flags applied.

    ``--hidden-size`` scales ``ffn_hidden_size`` by the same ratio (rounded down to a
    multiple of ``--tp``); ``--num-heads`` sets the heads and, for GQA models, keeps the
    ratio of heads to KV groups when it divides.

    Raises:
        SpecError: a flag is not a positive integer or the result is not a valid model.
    """
    model = resolve_model(args.model, seq_length=args.seq_len)
    changes: dict[str, Any] = {}
    for flag, value in (
        ("--num-layers", args.num_layers),
        ("--hidden-size", args.hidden_size),
        ("--num-heads", args.num_heads),
        ("--vocab-size", args.vocab_size),
    ):
        if value is not None:
            require_positive_int(flag, value)
    if args.num_layers is not None:
        changes["num_layers"] = args.num_layers
    if args.vocab_size is not None:
        changes["vocab_size"] = args.vocab_size
    if args.hidden_size is not None:
        ffn = model.ffn_hidden_size * args.hidden_size // model.hidden_size
        changes["hidden_size"] = args.hidden_size
        changes["ffn_hidden_size"] = max(args.tp, ffn - ffn % args.tp)
    if args.num_heads is not None:
        group = model.num_attention_heads // model.num_query_groups
        changes["num_attention_heads"] = args.num_heads
        changes["num_query_groups"] = (
            args.num_heads // group if args.num_heads % group == 0 else args.num_heads
        )
    if not changes:
        return model
    return dataclasses.replace(model, name=f"{model.name} (scaled)", **changes)


def plan_from_args(args: argparse.Namespace) -> ParallelPlan:
    """The plan of the flags; ``--nproc`` must equal tp * pp * dp.

    Raises:
        SpecError: names the flags that disagree.
    """
    for name in ("nproc", "tp", "pp", "mbs", "gbs", "steps"):
        require_positive_int(f"--{name}", getattr(args, name))
    if args.vpp is not None:
        require_positive_int("--vpp", args.vpp)
    if args.warmup_steps < 0:
        raise SpecError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    require_positive("--timeout", args.timeout)
    model_parallel = args.tp * args.pp
    dp = args.dp if args.dp is not None else args.nproc // model_parallel
    require_positive_int("--dp", dp)
    if model_parallel * dp != args.nproc:
        raise SpecError(
            f"--nproc({args.nproc}) must equal tp({args.tp}) * pp({args.pp}) * dp({dp}) = "
            f"{model_parallel * dp}"
        )
    return plan_from_fields(
        **shared_plan_fields(args, dp=dp),
        precision=Precision(args.dtype),
        ep=args.ep,
        etp=args.etp,
    )


def _out_dir(path: str) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {path!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--out {path!r}: cannot create: {exc.strerror or exc}") from None
    check_writable(out / "comparison.json", label="--out")
    return out


def run(args: argparse.Namespace) -> int:
    """Check the inputs, run the plan, compare, write DIR; exit 0 on success.

    Raises:
        PlansimError: bad flags, unknown model or profile, a plan the profile rejects, or a
            failed run (``ValidateError`` naming the rank and the error).
    """
    plan = apply_plan_file(args) or plan_from_args(args)
    check_dtype_supported(args.dtype, plan)
    check_schedule_supported(plan)
    model = scaled_model(args)
    require_plan_divides_model(plan, model)
    profile = load_profile(args.profile)
    planned = simulate_plan(model, plan, profile, dtype=args.dtype)  # fail before launching
    if "WORLD_SIZE" not in os.environ:
        require_devices(BACKENDS[args.backend])
    if BACKENDS[args.backend] == "cpu" and "WORLD_SIZE" not in os.environ:
        check_host_memory(planned, num_processes=args.nproc, pp=plan.pp)
    out = _out_dir(args.out)
    try:
        measured = _measure(args, model=model, plan=plan)
    except RunFailed as exc:
        _write_failure(out, exc, plan=plan, model=model)
        sys.stderr.write(f"plansim: error: {exc}\nplansim: wrote {out / 'failure.json'}\n")
        return 1
    if os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ:
        return 0  # under torchrun every rank gets the results; global rank 0 writes them
    recorded, lookups = recording_profile(profile)  # same prices, lookups logged
    simulated = simulate_plan(measured.model, measured.plan, recorded, dtype=args.dtype)
    outside = out_of_range(profile, lookups)
    comparison = compare(measured, simulated)
    fitted = None
    if args.update_profile:
        fitted = refit(measured, profile, dtype=args.dtype, source=_source(measured, args))
    doc = write_outputs(
        out, measured, simulated.result, comparison, profile=profile, outside=outside
    )
    if fitted is not None:
        target = profile_path(args.profile)
        write_profile(fitted.profile, target)
        doc["after_refit"] = _refit_dict(fitted, target)
        write_json_atomic(out / "comparison.json", rounded_json(doc), label="--out")
    sys.stdout.write(summary_table(comparison, fitted))
    sys.stdout.write(outside_text(outside, profile_name=profile.name))
    disturbed = measured.disturbed_steps
    if disturbed:
        worst = max(measured.run_queue_fractions)
        sys.stderr.write(
            f"plansim: warning: in {len(disturbed)} of {len(measured.step_times_s)} measured "
            f"steps a rank waited for a CPU behind other work for more than "
            f"{1 - QUIET_CPU_SHARE:.0%} of the step (up to {worst:.0%}): the measured times "
            f"overstate the plan's\n"
        )
    sys.stderr.write(f"plansim: wrote {out}\n")
    return 0


def _write_failure(out: Path, exc: RunFailed, *, plan: ParallelPlan, model: ModelSpec) -> None:
    """``DIR/failure.json``: what failed and each rank's status, exit status, last progress
    and error, for scripts and CI (written atomically)."""
    doc = {
        "status": "failed",
        "model": model.name,
        "plan": plan.label(),
        "error": str(exc),
        "ranks": list(exc.ranks),
    }
    write_json_atomic(out / "failure.json", doc, label="--out")


def _measure(args: argparse.Namespace, *, model: ModelSpec, plan: ParallelPlan) -> MeasuredRun:
    """Run the plan (torch imported here, not at module import)."""
    from plansim.validate.run_config import RunConfig
    from plansim.validate.runner import run_plan

    config = RunConfig(
        model=model,
        plan=plan,
        backend=args.backend,
        device=BACKENDS[args.backend],
        num_processes=args.nproc,
        num_steps=args.steps,
        num_warmup_steps=args.warmup_steps,
        timeout_s=args.timeout,
        seed=args.seed,
        dtype=args.dtype,
    )
    return run_plan(config)


def _source(measured: MeasuredRun, args: argparse.Namespace) -> str:
    today = datetime.date.today().isoformat()
    m = measured.model
    torch_version = measured.versions.get("torch", "?")
    return (
        f"refit by plansim validate, {today}: {measured.plan.label()} of {m.name} "
        f"(L{m.num_layers} h{m.hidden_size} s{m.seq_length}), {measured.backend} on "
        f"{measured.device}, {measured.num_processes} ranks, {args.dtype}, torch "
        f"{torch_version}, {len(measured.step_times_s)} measured steps"
    )


def _csv(df: pd.DataFrame) -> str:
    """CSV text; floats in shortest round-trip form (``0.0`` stays a float when read back)."""
    return str(df.to_csv(index=False, lineterminator="\n"))


def write_outputs(
    out: Path,
    measured: MeasuredRun,
    simulated: Any,
    comparison: Comparison,
    *,
    profile: HardwareProfile,
    outside: tuple[OutOfRange, ...] = (),
) -> dict[str, Any]:
    """Write the timelines, traces, overlay, events and comparison.json; return the json doc.

    Args:
        simulated: the ``SimResult`` of the plan on ``profile``.
        outside: the profile curves the simulation read outside their measured points
            (``plansim.planner.lookups``), written as ``out_of_range_lookups``.
    """
    from plansim.report.plots.overlay import plot_overlay  # matplotlib only here

    step = median_step_index(measured)
    meas_tl = measured.timelines[step]
    label = f"{measured.model.name}: {measured.plan.label()}"
    write_text_atomic(out / "measured_timeline.csv", _csv(meas_tl), label="--out")
    write_text_atomic(out / "simulated_timeline.csv", _csv(simulated.timeline), label="--out")
    write_text_atomic(out / "events.csv", _csv(comparison.events), label="--out")
    write_trace(
        out / "measured_trace.json",
        chrome_trace(meas_tl, memory=None, title=f"measured {label}"),
        label="--out",
    )
    write_trace(
        out / "simulated_trace.json",
        chrome_trace(simulated.timeline, memory=simulated.memory, title=f"simulated {label}"),
        label="--out",
    )
    plot_overlay(
        simulated.timeline,
        meas_tl,
        out / "overlay.png",
        num_ranks=measured.plan.pp,
        vpp=measured.plan.vpp,
        title=f"{label} on {profile.name} (top: simulated, below: measured)",
        label="--out",
    )
    doc = comparison.to_dict()
    doc["profile"] = profile.name
    doc["out_of_range_lookups"] = [dataclasses.asdict(o) for o in outside]
    write_json_atomic(out / "comparison.json", doc, label="--out")
    return doc


def _refit_dict(fitted: Refit, target: Path) -> dict[str, Any]:
    return {
        "profile_path": str(target),
        "simulated_step_time_s": fitted.after.simulated_step_time_s,
        "step_time_error_pct": fitted.after.step_time_error_pct,
        "step_time_error_pct_before": fitted.before.step_time_error_pct,
        "time_factors": dict(sorted(fitted.factors.items())),
        "notes": list(fitted.notes),
        "categories_s": fitted.after.to_dict()["categories_s"],
    }


def summary_table(c: Comparison, fitted: Refit | None = None) -> str:
    """A short text table: step time, categories, bubble, memory (ms, %, MiB)."""
    rows = [("step time", c.measured_step_time_s, c.simulated_step_time_s, "ms")]
    rows += [(name, m, s, "ms") for name, (m, s) in c.categories.items()]
    mean = sum(c.measured_bubble) / len(c.measured_bubble)
    sim_mean = sum(c.simulated_bubble) / len(c.simulated_bubble)
    rows.append(("bubble fraction", mean, sim_mean, "%"))
    rows.append(
        (
            "peak memory (max rank)",
            max(c.measured_memory_bytes),
            max(c.simulated_memory_bytes),
            "MiB",
        )
    )
    if fitted is not None:
        rows.append(
            (
                "step time after refit",
                c.measured_step_time_s,
                fitted.after.simulated_step_time_s,
                "ms",
            )
        )
    scale = {"ms": 1e3, "%": 100.0, "MiB": 1.0 / 2**20}
    records = []
    for name, m, s, unit in rows:
        err = error_pct(s, m)
        text = "" if err is None else f"{err:+.1f}"
        if unit == "%":  # a fraction: its difference in percentage points
            text = f"{100 * (s - m):+.1f} pts"
        records.append(
            {
                "metric": f"{name} ({unit})",
                "measured": f"{m * scale[unit]:.4g}",
                "simulated": f"{s * scale[unit]:.4g}",
                "error": text,
            }
        )
    table = pd.DataFrame(records)
    return str(table.to_string(index=False)) + "\n"
