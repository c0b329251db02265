"""Simulated vs measured step time of a few plans run for real on the CPU (gloo).

Each plan runs with ``plansim.validate.runner.run_plan`` (2 ranks, one thread each, fp32,
synthetic data) on a scaled-down GPT, is simulated on the CPU profile
(``hardware_profiles/cpu-2core-gloo.yaml`` unless ``--profile``) as the run executes it
(``plansim.validate.simulated``: fp32 precision, asynchronous pipeline sends; the profile's
``attention_efficiency`` and ``host_overhead`` when it has them), and the profile is then
refitted from that run (``plansim.validate.refit``, the ``--update-profile`` path, in memory:
no file is written). Columns:

- ``meas_ms``: median measured step time; ``sim_ms``: simulated on the profile;
- ``err_pct``: signed error before the refit (target |err| <= 10%);
- ``refit_pct``: after refitting on the same run (in-sample; target |err| <= 5%);
- ``held_out_pct``: on the profile refitted from the *previous* plan's run (a plan the fit did
  not see), the honest figure of what calibration buys;
- ``fwd_pct`` / ``bwd_pct`` / ``opt_pct`` / ``comm_pct``: per-kind total errors before the
  refit (which kind dominates the step-time error);
- ``repeat_spread_pct`` (with ``--repeats R``): the plan is run R times (round-robin over
  the plans, so a slow phase of the machine reaches one repeat of several plans rather than
  every repeat of one) and the run with the median step time is the one compared; (slowest
  - fastest) / median of the R runs' step times says how far this machine's own run-to-run
  variation reaches; ``fastest_err_pct``: the simulation against the fastest of the R runs
  (other load on a shared machine only ever adds time, so the fastest run is the one least
  disturbed: the reading ``timeit`` recommends; the target is judged on ``err_pct``);
- ``run_queue``: the largest fraction of a measured step any rank spent runnable but waiting
  for a CPU behind other work (Linux schedstat), and ``disturbed``: measured steps where that
  exceeds 10% (``MeasuredRun.disturbed_steps``, the calibration's 90%-of-a-core rule): those
  step times measure other load on the machine as much as the plan.

- ``probe_gflops``: a 512^3 fp32 GEMM looped for a quarter second in one process just before
  the compared run, GFLOP/s: the machine's speed at that moment (the same plan measures
  slower when this is lower; the profile's GEMMs were timed cold, so compare probes with
  each other, not with the profile).

Run:
    .venv/bin/python benchmarks/bench_validate.py [--profile P] [--steps S] [--layers L]
        [--hidden H] [--seq S] [--plans tp2,pp2-1f1b,...] [--repeats R]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import time
from pathlib import Path

import pandas as pd

from plansim.catalog import resolve_model
from plansim.io.profiles import load_profile
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Recompute, Schedule, plan_from_fields
from plansim.validate.compare import Comparison, compare, simulate_plan
from plansim.validate.refit import refit
from plansim.validate.result import MeasuredRun

#: name -> plan fields (2 ranks each: the CI machine has 2 cores).
PLANS: dict[str, dict[str, object]] = {
    "tp2": {"tp": 2, "pp": 1, "dp": 1},
    "pp2-1f1b": {"tp": 1, "pp": 2, "dp": 1},
    "pp2-gpipe": {"tp": 1, "pp": 2, "dp": 1, "schedule": Schedule.GPIPE},
    "pp2-interleaved": {"tp": 1, "pp": 2, "dp": 1, "vpp": 2, "schedule": Schedule.INTERLEAVED_1F1B},
    "dp2-zero1": {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 1},
    "dp2-zero2": {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 2},
    "dp2-zero3": {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 3},
    "dp2-zero3-full": {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 3, "recompute": Recompute.FULL},
    "dp2-zero3-selective-op": {
        "tp": 1,
        "pp": 1,
        "dp": 2,
        "zero_stage": 3,
        "recompute": Recompute.SELECTIVE_OP,
    },
}


def model_for(args: argparse.Namespace) -> ModelSpec:
    """GPT-3's shape scaled to ``--layers`` x ``--hidden`` (4 heads, 4h MLP)."""
    base = resolve_model("gpt3-175b")
    return dataclasses.replace(
        base,
        name=f"gpt-l{args.layers}-h{args.hidden}",
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=4 * args.hidden,
        seq_length=args.seq,
        vocab_size=args.vocab,
    )


def run_one(model: ModelSpec, plan: ParallelPlan, args: argparse.Namespace) -> MeasuredRun:
    from plansim.validate.run_config import RunConfig
    from plansim.validate.runner import run_plan

    return run_plan(
        RunConfig(
            model=model,
            plan=plan,
            backend="gloo",
            device="cpu",
            num_processes=plan.num_gpus,
            num_steps=args.steps,
            num_warmup_steps=args.warmup,
            timeout_s=300.0,
        )
    )


def _err(c: Comparison, category: str) -> float | None:
    m, s = c.categories[category]
    return None if m == 0 else round(100 * (s - m) / m, 1)


def probe_gflops(seconds: float = 0.25) -> float:
    """GFLOP/s of a 512^3 fp32 GEMM looped for ``seconds`` on one thread (this process)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        torch.mm(a, b)
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b)
            calls += 1
        return calls * 2 * 512**3 / (time.perf_counter() - start) / 1e9
    finally:
        torch.set_num_threads(threads)


def row(
    name: str, run: MeasuredRun, profile: HardwareProfile, previous: HardwareProfile | None
) -> tuple[dict[str, object], HardwareProfile]:
    before = compare(run, simulate_plan(run.model, run.plan, profile, dtype="fp32"))
    fitted = refit(run, profile, dtype="fp32", source=f"bench_validate {name}")
    held = None
    if previous is not None:
        c = compare(run, simulate_plan(run.model, run.plan, previous, dtype="fp32"))
        held = round(c.step_time_error_pct, 1)
    return {
        "plan": name,
        "meas_ms": round(1e3 * before.measured_step_time_s, 1),
        "sim_ms": round(1e3 * before.simulated_step_time_s, 1),
        "err_pct": round(before.step_time_error_pct, 1),
        "refit_pct": round(fitted.after.step_time_error_pct, 1),
        "held_out_pct": held,
        "fwd_pct": _err(before, "forward"),
        "bwd_pct": _err(before, "backward"),
        "opt_pct": _err(before, "optimizer"),
        "comm_pct": _err(before, "communication"),
        "bubble_meas": round(sum(before.measured_bubble) / len(before.measured_bubble), 3),
        "bubble_sim": round(sum(before.simulated_bubble) / len(before.simulated_bubble), 3),
        "run_queue": round(max(run.run_queue_fractions), 2) if run.run_queue_fractions else None,
        "disturbed": f"{len(run.disturbed_steps)}/{len(run.step_times_s)}",
    }, fitted.profile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu-2core-gloo", help="profile name or YAML path")
    p.add_argument("--plans", default=",".join(PLANS), help=f"comma list of {', '.join(PLANS)}")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per plan, round-robin over the plans; the run with the median step time "
        "is compared and the spread (max - min) / median of the runs' step times is printed",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--gbs", type=int, default=8)
    p.add_argument("--save", metavar="DIR", help="also pickle each MeasuredRun to DIR/<plan>.pkl")
    args = p.parse_args()
    profile = load_profile(args.profile)
    start_load = os.getloadavg()[0]
    model = model_for(args)
    rows = []
    previous: HardwareProfile | None = None
    names = args.plans.split(",")
    plans = {
        name: plan_from_fields(micro_batch_size=args.mbs, global_batch_size=args.gbs, **PLANS[name])  # type: ignore[arg-type]
        for name in names
    }
    # Round-robin over the plans: this VM's speed drifts over seconds to minutes, so a slow
    # phase lands on one repeat of several plans rather than on every repeat of one plan.
    runs: dict[str, list[tuple[MeasuredRun, float]]] = {name: [] for name in names}
    walls = dict.fromkeys(names, 0.0)
    for _ in range(args.repeats):
        for name in names:
            start = time.perf_counter()
            probe = probe_gflops()
            runs[name].append((run_one(model, plans[name], args), probe))
            walls[name] += time.perf_counter() - start
    for name in names:
        pairs = sorted(runs[name], key=lambda pair: pair[0].median_step_time_s)
        ordered = [r for r, _ in pairs]
        run, probe = pairs[len(pairs) // 2]  # the run whose median step time is the median's
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            Path(args.save, f"{name}.pkl").write_bytes(pickle.dumps(run))
        result, previous = row(name, run, profile, previous)
        medians = [r.median_step_time_s for r in ordered]
        result["repeat_spread_pct"] = round(
            100 * (medians[-1] - medians[0]) / run.median_step_time_s, 1
        )
        simulated_s = float(result["sim_ms"]) / 1e3  # type: ignore[arg-type]
        result["fastest_err_pct"] = round(100 * (simulated_s - medians[0]) / medians[0], 1)
        result["probe_gflops"] = round(probe, 1)
        result["wall_s"] = round(walls[name], 1)
        rows.append(result)
        print(pd.DataFrame([result]).to_string(index=False), flush=True)
    load = os.getloadavg()[0]
    print(
        f"\n1-min load average {start_load:.2f} at the start, {load:.2f} at the end, on "
        f"{os.cpu_count()} CPUs (the runs' own 2 ranks count; well above 2: other work)"
    )
    print(
        f"{model.name} s{model.seq_length} V{model.vocab_size} mbs{args.mbs} gbs{args.gbs} "
        f"on {profile.name}, {args.steps} measured steps after {args.warmup} warm-up"
    )
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
