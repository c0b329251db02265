"""Where one micro-batch of the validator's model spends its device time, kernel by kernel.

The one-GPU validations say how far plansim's step is from the measured one; this says
which part: one forward and backward of the validate model (``plansim.validate.model``, the
runner's own modules, loss and, in bf16, its bf16 weights) under ``torch.profiler``, each
CUDA kernel put in a category by its name (GEMM, flash attention, cross-entropy's
log-softmax, other elementwise), and the pass's wall time (CUDA events) beside the sum of
its kernels, which shows whether the host kept the device busy.

Usage (one GPU; CPU runs at small sizes as a smoke test, with CPU op times):
    python benchmarks/profile_validate_kernels.py --device cuda --dtype bf16 --out OUT.csv
        [--num-layers 8 --hidden-size 2048 --num-heads 16 --seq-len 2048 --vocab-size 50304
         --mbs 2]
Prints a table per pass and category and writes one CSV row per (dtype, pass, category):
kernels, their count and summed seconds, and the pass's wall seconds; ``--kernels-out``
one row per (dtype, pass, kernel name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plansim.commands.validate import scaled_model
from plansim.io.outputs import write_text_atomic
from plansim.validate.model import build_model, loss_fn

#: Kernel-name fragments of each category, tried in order (lower case).
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("softmax_loss", ("softmax", "nll", "cross_entropy")),
    ("norm", ("layer_norm", "gammabeta", "rms_norm")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "linear", "matmul", "addmm", "mm")),
)
#: Warm-up passes before the profiled one.
WARMUP = 3


def category(name: str) -> str:
    """The category of a kernel (or, on CPU, an op) name."""
    low = name.lower()
    for label, parts in CATEGORIES:
        if any(p in low for p in parts):
            return label
    return "elementwise_other"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), nargs="+", default=["fp32", "bf16"])
    p.add_argument("--model", default="gpt3-175b")
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--num-heads", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--vocab-size", type=int, default=50304)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--kernels-out", type=Path, default=None)
    return p.parse_args(argv)


def profile_passes(args: argparse.Namespace, dtype: str) -> list[dict[str, object]]:
    """Rows (dtype, pass, category, kernels, seconds, wall seconds) of one profiled micro-batch."""
    device = torch.device(args.device)
    spec = scaled_model(argparse.Namespace(**vars(args), tp=1))
    model = build_model(spec, seed=0).to(device)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, spec.vocab_size, (args.mbs, spec.seq_length), generator=gen)
    tokens, targets = tokens.to(device), tokens.roll(-1, dims=1).to(device)
    cuda = device.type == "cuda"

    def mark() -> object:
        if cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        import time

        return time.perf_counter()

    def seconds(a: object, b: object) -> float:
        if cuda:
            return float(a.elapsed_time(b)) / 1e3  # type: ignore[attr-defined]
        return float(b) - float(a)  # type: ignore[arg-type]

    def one() -> tuple[float, float]:
        t0 = mark()
        with record_function("pass_forward"):
            loss = loss_fn(model(tokens), targets)
            t1 = mark()
            if cuda:  # every forward kernel ends inside the forward's span
                torch.cuda.synchronize()
        with record_function("pass_backward"):
            loss.backward()  # type: ignore[no-untyped-call]
        t2 = mark()
        if cuda:
            torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return seconds(t0, t1), seconds(t1, t2)

    for _ in range(WARMUP):
        one()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        wall = dict(zip(("forward", "backward"), one(), strict=True))
    return _rows(prof, dtype=dtype, wall=wall, cuda=cuda)


def _rows(
    prof: object, *, dtype: str, wall: dict[str, float], cuda: bool
) -> list[dict[str, object]]:
    events = list(prof.events())  # type: ignore[attr-defined]
    spans = {
        e.name.removeprefix("pass_"): (e.time_range.start, e.time_range.end)
        for e in events
        if e.name in ("pass_forward", "pass_backward") and e.device_type.name == "CPU"
    }
    totals: dict[tuple[str, str, str], list[float]] = {}
    for e in events:
        if cuda and (e.device_type.name != "CUDA" or e.name.startswith("pass_")):
            continue  # kernels only (the passes' own ranges show on the device too)
        if not cuda and not _top_level_cpu_op(e):
            continue
        # the forward's span ends after a device synchronisation: whatever starts later
        # is backward (autograd's thread launches it)
        forward_end = spans.get("forward", (0, 0))[1]
        pass_name = "forward" if e.time_range.start < forward_end else "backward"
        key = (pass_name, category(e.name), e.name)
        dur_s = (e.time_range.end - e.time_range.start) / 1e6
        acc = totals.setdefault(key, [0.0, 0.0])
        acc[0] += 1
        acc[1] += dur_s
    return [
        {
            "dtype": dtype,
            "pass": pass_name,
            "category": cat,
            "name": name[:200],
            "kernels": int(n),
            "kernel_s": s,
            "pass_wall_s": wall[pass_name],
        }
        for (pass_name, cat, name), (n, s) in sorted(totals.items())
    ]


def _top_level_cpu_op(event: object) -> bool:
    """On CPU: an aten op called by the pass itself or by an autograd node (not nested)."""
    name = event.name  # type: ignore[attr-defined]
    parent = event.cpu_parent  # type: ignore[attr-defined]
    if not name.startswith("aten::"):
        return False
    return parent is None or parent.name.startswith(("pass_", "autograd::engine", "Backward"))


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    kernels = pd.DataFrame([r for dtype in args.dtype for r in profile_passes(args, dtype)])
    keys = ["dtype", "pass", "category"]
    df = kernels.groupby(keys, sort=False).agg(
        kernels=("kernels", "sum"),
        kernel_s=("kernel_s", "sum"),
        pass_wall_s=("pass_wall_s", "first"),
    )
    df = df.reset_index()
    print(df.to_string(index=False))
    if args.out is not None:
        write_text_atomic(args.out, df.to_csv(index=False), label="--out")
    if args.kernels_out is not None:
        text = kernels.sort_values([*keys, "kernel_s"], ascending=[True, True, True, False])
        write_text_atomic(args.kernels_out, text.to_csv(index=False), label="--kernels-out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
