"""Do the profiles price the kernels of real transformer layers right? Measure and compare.

plansim prices a GEMM from its FLOPs alone (``plansim.analytic.layer_cost.gemm_time_s``: the
profile's efficiency curve over FLOPs, built from square-ish shapes, or the HBM roofline),
and prices a layer's two backward GEMMs of each weight (input gradient, weight gradient) at
the forward GEMM's time; a fused attention call comes from the profile's measured curve or,
on a datasheet profile, from its mechanism (``plansim.analytic.op_overheads``:
FlashAttention-2's share of the GEMM rate, IO-aware). The published runs plansim predicts
too fast are mostly models with a small hidden size (MosaicML MPT 125M-3B, NeMo's 5-13B
runs; ``benchmarks/published_runs``), whose GEMMs are thin (k or n of 768-5120 against
8K-64K token rows) and whose attention is a larger share of the step.

This script times, one call at a time with cold caches (the calibration's own timer):

* every weight GEMM of one layer of such models: forward (X W: m = tokens, n = out, k = in),
  input gradient (dY W^T: m = tokens, n = in, k = out) and weight gradient (X^T dY: m = in,
  n = out, k = tokens);
* causal ``scaled_dot_product_attention`` at their (batch, heads, sequence, head size),
  forward and forward + backward (every head with its own K and V: plansim's upper bound
  under GQA);

and prints measured TFLOP/s against what each ``--profile`` predicts (predicted over
measured time: below 1, the profile prices the call too fast).

Meant for a GPU (``--device cuda``: one rank, NCCL); ``--device cpu`` runs small shapes
(``--tokens``, ``--hidden``; attention at sequence ``--tokens``) to check the script itself.
Writes the table as CSV with ``--out``.

``--runs CSV --gpu-type GPU`` probes the layers of that GPU's published runs instead: every
weight GEMM of one layer as plansim builds it for the row (``plansim.planner.run_model``,
``plansim.analytic.flops.layer_forward_gemms``: GQA, SwiGLU's gate, tp; m = micro-batch x
sequence / cp tokens), deduplicated over rows with the same shapes, and each row's causal
attention call where cp is 1. ``--dtype fp8`` times the weight GEMMs through
``torch._scaled_mm`` (tensor-wise scales, as Transformer Engine's delayed scaling) and the
attention in bf16, as plansim prices an fp8 layer (its attention core stays 16-bit).

Run (on a GPU machine, from the repository root):
    python3 benchmarks/bench_layer_shapes.py --device cuda --profile h100-sxm5-80gb \\
        [--profile MEASURED.yaml] [--out layer_shapes.csv]
    python3 benchmarks/bench_layer_shapes.py --device cuda --profile h100-sxm5-80gb \\
        --runs benchmarks/published_runs/nemo_performance.csv --gpu-type h100-sxm5-80gb \\
        --dtype fp8
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from plansim.analytic.flops import Gemm, layer_forward_gemms
from plansim.analytic.layer_cost import gemm_time_s
from plansim.analytic.op_overheads import attention_core_times
from plansim.calibrate.build import aggregate
from plansim.calibrate.plan import Item, Plan
from plansim.calibrate.raw import frame
from plansim.calibrate.runner import run_items
from plansim.calibrate.timing import Timing
from plansim.errors import PlansimError
from plansim.io.profiles import load_profile
from plansim.io.runs import read_runs
from plansim.planner.run_model import row_model
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import AttentionKernel, Precision, plan_from_fields

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
#: (label, batch, heads, sequence, head size) of one layer's attention call on one rank.
ATTENTION = (
    ("mpt-1b-s2048", 8, 16, 2048, 128),
    ("mpt-1b-s32768", 1, 16, 32768, 128),
    ("mpt-7b-s2048", 8, 32, 2048, 128),
    ("llama3-8b-s8192", 1, 32, 8192, 128),
    ("llama3-70b-tp4-s8192", 1, 16, 8192, 128),
    ("gpt-175b-tp8-s2048", 1, 12, 2048, 128),
)
GEMM_PASSES = ("fwd", "dgrad", "wgrad")
#: Quantized GEMM dtypes: the layer's attention core runs in bf16 beside them.
QUANTIZED = ("fp8", "fp4")
ATTENTION_PASSES = {"fwd": "sdpa_fwd", "fwd_bwd": "sdpa_fwd_bwd"}
#: ``--attention-grid``: one causal call per (batch x heads, sequence) at head size 128, batch
#: 1: how a fused attention call's rate falls as it holds fewer (head, query block) pieces of
#: work for the device's multiprocessors (the datasheet profiles price it by FLOPs alone).
ATTENTION_GRID_HEADS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
ATTENTION_GRID_SEQS = (1024, 2048, 4096, 8192)
#: Passes over every shape, spread over the run; the table takes the median.
SWEEPS = 3


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """One timed call: what it is, the item timed and the seconds a profile predicts."""

    kind: str
    model: str
    op: str
    pass_name: str
    item: Item
    predict: Callable[[HardwareProfile], float]
    rows: str = ""


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


def weight_gemm_probes(
    label: str, gemms: tuple[Gemm, ...], *, dtype: str, rows: str = ""
) -> list[Probe]:
    """Every pass of each forward weight GEMM in ``gemms``; each priced at its forward GEMM's
    time, as ``plansim.analytic.layer_cost`` prices a layer's backward."""
    probes = []
    for forward in gemms:
        for kind in GEMM_PASSES:
            m, n, k = pass_shape(kind, forward.m, forward.n, forward.k)
            item = Item(
                kind="gemm",
                op=f"{label}.{forward.name}.{kind}",
                dtype=dtype,
                shape=(m, n, k),
                work=2.0 * m * n * k,
                work_unit="flop",
            )

            def predict(profile: HardwareProfile, gemm: Gemm = forward) -> float:
                return gemm_time_s(gemm, profile, dtype=dtype)

            probe = Probe(
                kind="gemm",
                model=label,
                op=forward.name,
                pass_name=kind,
                item=item,
                predict=predict,
                rows=rows,
            )
            probes.append(probe)
    return probes


def gemm_probes(
    models: tuple[tuple[str, int, int], ...], *, tokens: int, dtype: str
) -> list[Probe]:
    """Every pass of every weight GEMM of one GPT layer of each of ``models``."""
    probes = []
    for label, hidden, tp in models:
        gemms = tuple(
            Gemm(name=name, m=m, n=n, k=k)
            for name, (m, n, k) in layer_gemms(hidden, tp, tokens).items()
        )
        probes += weight_gemm_probes(label, gemms, dtype=dtype)
    return probes


@dataclasses.dataclass(frozen=True, slots=True)
class RunLayer:
    """One layer shape of a group of published runs: its forward weight GEMMs on one rank,
    its attention call (batch, heads, sequence, head size) where cp is 1, the row ids."""

    label: str
    gemms: tuple[Gemm, ...]
    attention: tuple[int, int, int, int] | None
    rows: tuple[str, ...]


def run_layers(path: str, gpu_type: str) -> list[RunLayer]:
    """The distinct layer shapes of the runs in ``path`` on ``gpu_type`` (module docstring);
    rows without tp or micro-batch size, or that ``row_model`` skips, are left out."""
    _, rows = read_runs(path)
    layers: dict[tuple[object, ...], RunLayer] = {}
    for row in rows:
        if row.choice("gpu_type") != gpu_type:
            continue
        tp, mbs = row.integer("tp"), row.integer("micro_batch_size_seqs")
        cp = row.integer("cp") or 1
        try:
            model = row_model(row, [])
        except PlansimError:
            continue
        if not tp or not mbs or model.seq_length % cp:
            continue
        local = dataclasses.replace(model, seq_length=model.seq_length // cp)
        gemms = tuple(
            g for g in layer_forward_gemms(local, micro_batch_size=mbs, tp=tp) if g.has_weight
        )
        heads = model.num_attention_heads // tp
        attention = (mbs, heads, model.seq_length, model.head_dim) if cp == 1 else None
        key = (gemms, attention)
        if key in layers:
            known = layers[key]
            layers[key] = dataclasses.replace(known, rows=(*known.rows, row.row_id))
            continue
        tokens = mbs * local.seq_length
        label = f"{model.name}/tp{tp}/t{tokens}"
        layers[key] = RunLayer(label=label, gemms=gemms, attention=attention, rows=(row.row_id,))
    return list(layers.values())


def attention_seconds(
    profile: HardwareProfile, *, shape: tuple[int, int, int, int], dtype: str
) -> tuple[float, float]:
    """(forward, backward) seconds plansim prices for one causal fused attention call of
    (batch, heads, sequence, head size) on ``profile`` (``op_overheads.attention_core_times``
    with FlashAttention)."""
    batch, heads, seq, head = shape
    count = batch * heads
    gemms = (
        Gemm(name="attn_scores", m=seq, n=seq, k=head, count=count, has_weight=False),
        Gemm(name="attn_over_v", m=seq, n=head, k=seq, count=count, has_weight=False),
    )
    plan = plan_from_fields(
        dp=1,
        tp=1,
        pp=1,
        micro_batch_size=batch,
        global_batch_size=batch,
        precision=Precision(dtype),
        attention=AttentionKernel.FLASH,
    )
    times = attention_core_times(gemms, plan, profile, dtype=dtype, gemm_forward_s=0.0)
    return times.forward_s, times.backward_s


def attention_probes(
    shapes: tuple[tuple[str, int, int, int, int], ...], *, dtype: str, rows: str = ""
) -> list[Probe]:
    """Forward and forward + backward of each attention call; FLOPs as the calibration counts
    them (causal forward 2 b h s^2 d, backward twice that). Under fp8 or fp4 the call runs in
    bf16, as plansim prices the attention core of a quantized layer."""
    dtype = "bf16" if dtype in QUANTIZED else dtype
    probes = []
    for label, batch, heads, seq, head in shapes:
        shape = (batch, heads, seq, head)
        forward_flops = 2.0 * batch * heads * seq * seq * head
        for kind, op in ATTENTION_PASSES.items():
            item = Item(
                kind="attention",
                op=op,
                dtype=dtype,
                shape=shape,
                work=forward_flops * (1.0 if kind == "fwd" else 3.0),
                work_unit="flop",
            )

            def predict(
                profile: HardwareProfile, s: tuple[int, int, int, int] = shape, k: str = kind
            ) -> float:
                forward_s, backward_s = attention_seconds(profile, shape=s, dtype=dtype)
                return forward_s if k == "fwd" else forward_s + backward_s

            probe = Probe(
                kind="attention",
                model=label,
                op="sdpa",
                pass_name=kind,
                item=item,
                predict=predict,
                rows=rows,
            )
            probes.append(probe)
    return probes


def attention_grid(gpu: bool) -> tuple[tuple[str, int, int, int, int], ...]:
    """The ``--attention-grid`` shapes (label, batch, heads, sequence, head size); on a CPU a
    small stand-in (two head counts at sequence 128, head size 32)."""
    if not gpu:
        return tuple((f"bh{h}-s128", 1, h, 128, 32) for h in (1, 2))
    return tuple(
        (f"bh{h}-s{s}", 1, h, s, 128) for s in ATTENTION_GRID_SEQS for h in ATTENTION_GRID_HEADS
    )


def runs_probes(path: str, gpu_type: str, *, dtype: str) -> list[Probe]:
    """The probes of every distinct layer of ``path``'s runs on ``gpu_type``."""
    probes = []
    for layer in run_layers(path, gpu_type):
        rows = " ".join(layer.rows)
        probes += weight_gemm_probes(layer.label, layer.gemms, dtype=dtype, rows=rows)
        if layer.attention is not None:
            shape = (layer.label, *layer.attention)
            probes += attention_probes((shape,), dtype=dtype, rows=rows)
    return probes


def layer_totals(result: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per layer shape and kind (gemm: its weight GEMMs' three passes; attention: forward +
    backward), the summed predicted over summed measured seconds: what the layer's time is
    priced at, not the median call."""
    priced = result.assign(predicted_s=result["measured_s"] * result[column])
    keep = (priced["kind"] == "gemm") | (priced["pass"] == "fwd_bwd")
    sums = priced[keep].groupby(["model", "kind"], sort=False)[["predicted_s", "measured_s"]].sum()
    return (sums["predicted_s"] / sums["measured_s"]).unstack("kind").rename_axis(None, axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--profile", action="append", required=True, help="name or YAML path")
    parser.add_argument("--dtype", default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--tokens", type=int, default=None, help="default: 16384 cuda, 256 cpu")
    parser.add_argument("--hidden", default=None, help="comma list: only these hidden sizes")
    parser.add_argument("--runs", default=None, help="probe the layers of this runs CSV's rows")
    parser.add_argument("--gpu-type", default=None, help="with --runs: the rows on this GPU")
    parser.add_argument(
        "--attention-grid",
        action="store_true",
        help="only causal attention calls over batch x heads and sequence (ATTENTION_GRID)",
    )
    parser.add_argument("--out", default=None, help="write the table as CSV here")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if (args.runs is None) != (args.gpu_type is None):
        parser.error("--runs and --gpu-type go together")
    gpu = args.device == "cuda"
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    tokens = args.tokens or (16384 if gpu else 256)
    models, shapes = MODELS, ATTENTION
    if args.hidden:
        models = tuple((f"h{h}", int(h), 1) for h in args.hidden.split(","))
    if not gpu:
        shapes = ((f"s{tokens}", 1, 2, tokens, 32),)
    profiles = [load_profile(p) for p in args.profile]
    for profile in profiles:
        if dtype not in profile.matmul_efficiency:
            have = ", ".join(sorted(profile.matmul_efficiency))
            parser.error(f"--profile {profile.name} has no {dtype} GEMM curve (has: {have})")
    if args.attention_grid:
        probes = attention_probes(attention_grid(gpu), dtype=dtype)
    elif args.runs:
        try:
            probes = runs_probes(args.runs, args.gpu_type, dtype=dtype)
        except PlansimError as exc:
            parser.error(f"--runs: {exc}")
        if not probes:
            parser.error(f"--runs {args.runs} has no modelled row on --gpu-type {args.gpu_type}")
    else:
        probes = gemm_probes(models, tokens=tokens, dtype=dtype)
        probes += attention_probes(shapes, dtype=dtype)
    items = [dataclasses.replace(p.item, sweep=i) for i in range(SWEEPS) for p in probes]
    timing = Timing(warmup=2, min_reps=3, max_reps=20, target_s=0.05, min_rep_s=1e-3, max_call_s=30)
    plan = Plan(items=tuple(items), timing=timing, group_sizes=(), quick=False)
    backend = "nccl" if gpu else "gloo"
    rows, env = run_items(
        plan, backend=backend, device=args.device, nproc=1, timeout_s=args.timeout
    )
    table = aggregate(frame(rows, run_id="layer-shapes"))
    records = []
    for probe in probes:
        item = probe.item
        match = table[(table["op"] == item.op) & (table["shape"] == item.shape_text)]
        match = match[match["kind"] == item.kind]
        measured = float(match["time_s"].iloc[0]) if not match.empty else float("nan")
        record: dict[str, object] = {
            "kind": probe.kind,
            "model": probe.model,
            "op": probe.op,
            "pass": probe.pass_name,
            "shape": item.shape_text,
            "rows": probe.rows,
            "measured_s": measured,
            "measured_tflops_per_s": item.work / measured / 1e12,
        }
        for profile in profiles:
            predicted = probe.predict(profile)
            record[f"{profile.name}_predicted_over_measured"] = predicted / measured
        records.append(record)
    result = pd.DataFrame.from_records(records)
    device_name = env.get("device_name", args.device)
    print(f"{device_name}, {dtype}, {tokens} tokens per GEMM, median of {SWEEPS} passes")
    print("predicted_over_measured < 1: the profile prices the call too fast")
    print(result.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for profile in profiles:
        column = f"{profile.name}_predicted_over_measured"
        medians = result.groupby(["kind", "pass"])[column].median()
        parts = ", ".join(f"{kind} {name} {value:.3f}" for (kind, name), value in medians.items())
        print(f"{profile.name}: median predicted/measured {parts}")
        if args.runs:
            print(layer_totals(result, column).to_string(float_format=lambda v: f"{v:.3f}"))
    if args.out:
        path = Path(args.out)
        tmp = path.with_name(f".{path.name}.tmp")
        result.to_csv(tmp, index=False)
        tmp.replace(path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
