"""Do the profiles price the GEMMs of real transformer layers right? Measure them and compare.

plansim prices a GEMM from its FLOPs alone (``plansim.analytic.layer_cost.gemm_time_s``: the
profile's efficiency curve over FLOPs, built from square-ish shapes, or the HBM roofline),
and prices a layer's two backward GEMMs of each weight (input gradient, weight gradient) at
the forward GEMM's time. The published runs plansim predicts too fast are mostly models with
a small hidden size (MosaicML MPT 125M-3B, NeMo's 5-13B runs; ``benchmarks/published_runs``),
whose GEMMs are thin: k or n of 768-5120 against 8K-64K token rows. This script times, one
call at a time with cold caches (the calibration's own timer), every weight GEMM of one layer
of such models, forward (X W: m = tokens, n = out, k = in), input gradient (dY W^T: m =
tokens, n = in, k = out) and weight gradient (X^T dY: m = in, n = out, k = tokens), and
prints measured TFLOP/s against what each ``--profile`` predicts.

Meant for a GPU (``--device cuda``: one rank, NCCL); ``--device cpu`` runs the same sweep
with ``--tokens`` and ``--hidden`` small enough for a CPU, to check the script itself.
Writes the table as CSV with ``--out``.

Run (on a GPU machine, from the repository root):
    python3 benchmarks/bench_gemm_shapes.py --device cuda --profile h100-sxm5-80gb \\
        [--profile MEASURED.yaml] [--out gemm_shapes.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

from plansim.analytic.flops import Gemm
from plansim.analytic.layer_cost import gemm_time_s
from plansim.calibrate.build import aggregate
from plansim.calibrate.plan_types import Item, Plan
from plansim.calibrate.raw import frame
from plansim.calibrate.runner import run_items
from plansim.calibrate.timing import Timing
from plansim.io.profiles import load_profile

#: (label, hidden size, tensor-parallel size): MPT 125M-70B (llm-foundry yamls), Llama 3 8B
#: (NeMo), and the Megatron 22B and 175B layers of Korthikanti et al. and SC21 at tp 8.
MODELS = (
    ("mpt-125m", 768, 1),
    ("mpt-350m", 1024, 1),
    ("mpt-760m", 1536, 1),
    ("mpt-1b", 2048, 1),
    ("mpt-3b", 2560, 1),
    ("mpt-7b", 4096, 1),
    ("mpt-13b", 5120, 1),
    ("mpt-30b", 7168, 1),
    ("mpt-70b", 8192, 1),
    ("gpt-22b-tp8", 6144, 8),
    ("gpt-175b-tp8", 12288, 8),
)
PASSES = ("fwd", "dgrad", "wgrad")
#: Passes over every shape, spread over the run; the table takes the median.
SWEEPS = 3


def layer_gemms(hidden: int, tp: int, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(m, n, k) of one GPT layer's forward weight GEMMs on one TP rank (fused QKV, attention
    output, MLP up and down with a 4h FFN), ``tokens`` rows."""
    return {
        "qkv": (tokens, 3 * hidden // tp, hidden),
        "attn_out": (tokens, hidden, hidden // tp),
        "mlp_up": (tokens, 4 * hidden // tp, hidden),
        "mlp_down": (tokens, hidden, 4 * hidden // tp),
    }


def pass_shape(kind: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The (m, n, k) of a forward GEMM's pass ``kind``: fwd, dgrad or wgrad."""
    return {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}[kind]


def sweep_items(
    models: tuple[tuple[str, int, int], ...], *, tokens: int, dtype: str
) -> list[tuple[str, str, str, tuple[int, int, int], Item]]:
    """(model, gemm, pass, forward shape, item) for every pass of every weight GEMM."""
    rows = []
    for label, hidden, tp in models:
        for name, shape in layer_gemms(hidden, tp, tokens).items():
            for kind in PASSES:
                m, n, k = pass_shape(kind, *shape)
                item = Item(
                    kind="gemm",
                    op=f"{label}.{name}.{kind}",
                    dtype=dtype,
                    shape=(m, n, k),
                    work=2.0 * m * n * k,
                    work_unit="flop",
                )
                rows.append((label, name, kind, shape, item))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--profile", action="append", required=True, help="name or YAML path")
    parser.add_argument("--dtype", default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--tokens", type=int, default=None, help="default: 16384 cuda, 256 cpu")
    parser.add_argument("--hidden", default=None, help="comma list: only these hidden sizes")
    parser.add_argument("--out", default=None, help="write the table as CSV here")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    tokens = args.tokens or (16384 if gpu else 256)
    models = MODELS
    if args.hidden:
        wanted = {int(h) for h in args.hidden.split(",")}
        models = tuple((f"h{h}", h, 1) for h in sorted(wanted))
    profiles = [load_profile(p) for p in args.profile]
    for profile in profiles:
        if dtype not in profile.matmul_efficiency:
            have = ", ".join(sorted(profile.matmul_efficiency))
            parser.error(f"--profile {profile.name} has no {dtype} GEMM curve (has: {have})")
    sweep = sweep_items(models, tokens=tokens, dtype=dtype)
    items = [dataclasses.replace(s[4], sweep=i) for i in range(SWEEPS) for s in sweep]
    timing = Timing(warmup=2, min_reps=3, max_reps=20, target_s=0.05, min_rep_s=1e-3, max_call_s=30)
    plan = Plan(items=tuple(items), timing=timing, group_sizes=(), quick=False)
    backend = "nccl" if gpu else "gloo"
    rows, env = run_items(
        plan, backend=backend, device=args.device, nproc=1, timeout_s=args.timeout
    )
    table = aggregate(frame(rows, run_id="gemm-shapes"))
    records = []
    for label, name, kind, (m, n, k), item in sweep:
        match = table[(table["op"] == item.op) & (table["shape"] == item.shape_text)]
        measured = float(match["time_s"].iloc[0]) if not match.empty else float("nan")
        record = {
            "model": label,
            "gemm": name,
            "pass": kind,
            "m": item.shape[0],
            "n": item.shape[1],
            "k": item.shape[2],
            "measured_tflops_per_s": item.work / measured / 1e12,
        }
        forward = Gemm(name=name, m=m, n=n, k=k)
        for profile in profiles:
            predicted = gemm_time_s(forward, profile, dtype=dtype)
            record[f"{profile.name}_predicted_over_measured"] = predicted / measured
        records.append(record)
    result = pd.DataFrame.from_records(records)
    device_name = env.get("device_name", args.device)
    print(f"{device_name}, {dtype}, {tokens} tokens per GEMM, median of {SWEEPS} passes")
    print("predicted_over_measured < 1: the profile prices the GEMM too fast")
    print(result.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for profile in profiles:
        column = f"{profile.name}_predicted_over_measured"
        by_pass = result.groupby("pass")[column].median()
        passes = ", ".join(f"{kind} {by_pass[kind]:.3f}" for kind in PASSES)
        print(f"{profile.name}: median predicted/measured {result[column].median():.3f} ({passes})")
    if args.out:
        path = Path(args.out)
        tmp = path.with_name(f".{path.name}.tmp")
        result.to_csv(tmp, index=False)
        tmp.replace(path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
