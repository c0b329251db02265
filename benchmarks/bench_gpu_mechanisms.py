"""Two mechanisms the validator's one-GPU run pointed at, measured on the device itself.

1. ``sustained``: burst and sustained rate of a random 8192^3 GEMM per dtype (fp32 on the
   CUDA cores, bf16 and fp8 on the tensor cores; ``--sustained-dtypes``, fp8 through
   ``torch._scaled_mm`` as the calibration times it). ``plansim calibrate`` measures bf16
   only and the profile's ``sustained_matmul_fraction`` scales every dtype's GEMM curve; this
   says whether an fp32 or fp8 GEMM loop slows down as much as the GPU reaches its power
   limit.
2. ``recompute``: one training step of the validator's model (plansim.validate.model, fp32)
   without recompute and with every block wrapped in torch's checkpoint, three ways:
   non-reentrant with early stop (torch's default, what ``checkpoint_wrapper`` and so the
   validator and torchtitan use), non-reentrant without early stop
   (``torch.utils.checkpoint.set_checkpoint_early_stop(False)``), and reentrant (a full
   re-run of the block's forward, as Megatron-LM's own checkpoint function does). Early stop
   ends the recomputation once every tensor the backward saved is back, so a block's last
   GEMM (the MLP down projection: its output is not saved) is not recomputed.

3. ``cache``: the validate model's layer GEMMs timed cold (after an L2-evicting write, as
   the calibration times them) and warm (back to back).
4. ``duty``: the bf16 GEMM rate when GEMMs fill only part of the device's time, as in a
   training step (elementwise kernels, attention, the loss, host gaps between them). The
   profile's ``sustained_matmul_fraction`` is measured with GEMMs back to back (part 1);
   a one-GPU bf16 validation ran its layer GEMMs at the burst rate or above. Groups of 8
   n^3 GEMMs alternate with a filler that takes (1 - share) / share of their time: HBM
   copies (``copy``: the device busy, memory-bound) or the device idle (``idle``: a host
   sleep); the GEMM groups' own time (CUDA events) over the last quarter of the soak gives
   the rate, against the burst rate.

Usage (one GPU; CPU works at small sizes for a smoke test):
    python benchmarks/bench_gpu_mechanisms.py --device cuda --out OUT.csv
Prints a table and writes one CSV row per measurement (``part``, ``case``, seconds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import set_checkpoint_early_stop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plansim.calibrate.bench_kernels import gemm_call
from plansim.calibrate.plan import Item
from plansim.commands.validate import scaled_model
from plansim.io.outputs import write_text_atomic
from plansim.specs.model import ModelSpec
from plansim.validate.model import build_model, loss_fn

#: Sleep before a burst (idle clocks and power), burst and window seconds of the soak.
IDLE_S, BURST_S, WINDOW_S = 1.0, 0.05, 0.25


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop_s(fn, seconds: float, device: torch.device) -> tuple[float, int]:
    """Seconds per call of ``fn`` called back to back for about ``seconds``."""
    calls, begin = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        if calls % 4 == 0:
            _sync(device)
            elapsed = time.perf_counter() - begin
            if elapsed >= seconds:
                return elapsed / calls, calls


def sustained(
    device: torch.device, *, n: int, soak_s: float, dtypes: tuple[str, ...] = ("fp32", "bf16")
) -> list[dict[str, object]]:
    """Burst (after an idle second) and sustained (last quarter of the soak) seconds per
    random n^3 GEMM of each dtype (the calibration's GEMM call, ``gemm_call``)."""
    rows: list[dict[str, object]] = []
    for dtype in dtypes:
        item = Item(
            kind="gemm",
            op="sustained",
            dtype=dtype,
            shape=(n, n, n),
            work=2.0 * n**3,
            work_unit="flop",
        )
        gemm = gemm_call(item, device)
        gemm()
        _sync(device)
        time.sleep(IDLE_S)
        burst, _ = _loop_s(gemm, BURST_S, device)
        windows = [_loop_s(gemm, WINDOW_S, device)[0] for _ in range(int(soak_s / WINDOW_S))]
        last = statistics.median(windows[-max(1, len(windows) // 4) :])
        flops = 2.0 * n**3
        for case, seconds in (("burst", burst), ("sustained", last)):
            rows.append(
                {
                    "part": "sustained",
                    "case": f"{dtype} {case}",
                    "seconds": seconds,
                    "tflops_per_s": flops / seconds / 1e12,
                }
            )
        rows.append(
            {"part": "sustained", "case": f"{dtype} sustained/burst rate", "ratio": burst / last}
        )
    return rows


#: GEMM shares of the device's time the ``duty`` part tries, and GEMMs per group.
DUTY_SHARES = (1.0, 0.75, 0.5, 0.25)
DUTY_GROUP = 8


def duty(device: torch.device, *, n: int, soak_s: float) -> list[dict[str, object]]:
    """bf16 n^3 GEMM rate at each GEMM share of the time, copy or idle filler (docstring)."""
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    src = torch.randn(4 * n * n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)

    def gemm() -> None:
        torch.matmul(a, b, out=out)

    def copy() -> None:
        dst.copy_(src)

    gemm(), copy()
    _sync(device)
    time.sleep(IDLE_S)
    burst, _ = _loop_s(gemm, BURST_S, device)
    copy_s, _ = _loop_s(copy, BURST_S, device)
    flops = 2.0 * n**3
    rows: list[dict[str, object]] = [
        {"part": "duty", "case": "burst", "seconds": burst, "tflops_per_s": flops / burst / 1e12}
    ]
    for filler in ("copy", "idle"):
        for share in DUTY_SHARES:
            if filler == "idle" and share == 1.0:
                continue  # the same as copy at share 1
            fill_s = DUTY_GROUP * burst * (1.0 - share) / share
            copies = round(fill_s / copy_s)
            time.sleep(IDLE_S)
            groups: list[tuple[Any, Any]] = []
            begin = time.perf_counter()
            while time.perf_counter() - begin < soak_s:
                start, end = _event(device), _event(device)
                _record(start)
                for _ in range(DUTY_GROUP):
                    gemm()
                _record(end)
                groups.append((start, end))
                if filler == "copy":
                    for _ in range(copies):
                        copy()
                else:
                    _sync(device)
                    time.sleep(fill_s)
                if len(groups) % 16 == 0:
                    _sync(device)
            _sync(device)
            last = groups[-max(1, len(groups) // 4) :]
            per_call = sum(_elapsed_s(s, e) for s, e in last) / (len(last) * DUTY_GROUP)
            rows.append(
                {
                    "part": "duty",
                    "case": f"{filler} filler, gemm share {share}",
                    "seconds": per_call,
                    "tflops_per_s": flops / per_call / 1e12,
                    "ratio": per_call / burst,
                }
            )
    return rows


def _event(device: torch.device) -> Any:
    """A CUDA timing event, or a perf_counter holder on CPU."""
    if device.type == "cuda":
        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    return [0.0]


def _record(event: Any) -> None:
    if isinstance(event, list):
        event[0] = time.perf_counter()
    else:
        event.record()


def _elapsed_s(start: Any, end: Any) -> float:
    if isinstance(start, list):
        return float(end[0] - start[0])
    return float(start.elapsed_time(end)) / 1e3


def cache(device: torch.device, args: argparse.Namespace) -> list[dict[str, object]]:
    """Seconds per call of the validate model's layer GEMMs (m = mbs * seq tokens), timed
    cold (each call after an L2-evicting write, as ``plansim calibrate`` times them) and warm
    (back to back: operands partly in L2, as consecutive ops of a training step may find
    them), fp32 and bf16."""
    from plansim.calibrate.cold_timer import ColdTimer

    cold = ColdTimer(device)
    h, f, m = args.hidden_size, 4 * args.hidden_size, args.mbs * args.seq_len
    shapes = {
        "qkv": (m, 3 * h, h),
        "attn_out": (m, h, h),
        "mlp_up": (m, f, h),
        "mlp_down": (m, h, f),
    }
    rows: list[dict[str, object]] = []
    for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for name, (mm, n, k) in shapes.items():
            a = torch.randn(mm, k, device=device, dtype=torch_dtype)
            b = torch.randn(k, n, device=device, dtype=torch_dtype)

            def gemm(a=a, b=b) -> None:
                torch.matmul(a, b)

            for _ in range(3):
                gemm()
            _sync(device)
            cold_s = statistics.median(cold(gemm, 1) for _ in range(args.steps * 2))
            warm_s, _ = _loop_s(gemm, 0.05, device)
            rows.append(
                {
                    "part": "cache",
                    "case": f"{dtype} {name} {mm}x{n}x{k}",
                    "seconds": cold_s,
                    "warm_seconds": warm_s,
                    "ratio": warm_s / cold_s,
                }
            )
    return rows


def _model(args: argparse.Namespace) -> ModelSpec:
    """The validate run's model: ``plansim validate --model gpt3-175b`` scaled by the flags."""
    return scaled_model(argparse.Namespace(**vars(args), model="gpt3-175b", tp=1))


def recompute(device: torch.device, args: argparse.Namespace) -> list[dict[str, object]]:
    """Median seconds of one forward + backward of one micro-batch, per checkpoint mode."""
    spec = _model(args)
    rows: list[dict[str, object]] = []
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (args.mbs, spec.seq_length + 1), generator=gen)
    inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    for case in ("none", "non-reentrant early-stop", "non-reentrant full", "reentrant"):
        model = build_model(spec, seed=0).to(device)
        if case != "none":
            impl = CheckpointImpl.REENTRANT if case == "reentrant" else CheckpointImpl.NO_REENTRANT
            for name, block in list(model.blocks.items()):
                model.blocks[name] = checkpoint_wrapper(block, checkpoint_impl=impl)
        times = []
        with set_checkpoint_early_stop(case != "non-reentrant full"):
            for step in range(args.warmup + args.steps):
                _sync(device)
                begin = time.perf_counter()
                loss_fn(model(inputs), targets).backward()
                _sync(device)
                if step >= args.warmup:
                    times.append(time.perf_counter() - begin)
                model.zero_grad(set_to_none=True)
        rows.append({"part": "recompute", "case": case, "seconds": statistics.median(times)})
        del model
    base = rows[0]["seconds"]
    for row in rows[1:]:
        row["extra_over_none_s"] = float(row["seconds"]) - float(base)  # type: ignore[arg-type]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--part", choices=("all", "sustained", "recompute", "cache", "duty"), default="all"
    )
    parser.add_argument("--duty-soak-s", type=float, default=6.0)
    parser.add_argument("--gemm-n", type=int, default=8192)
    parser.add_argument("--soak-s", type=float, default=15.0)
    parser.add_argument(
        "--sustained-dtypes", default="fp32,bf16", help="comma list of fp32, bf16, fp16, fp8"
    )
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=2048)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vocab-size", type=int, default=50304)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu_mechanisms: no GPU", file=sys.stderr)
        return 1
    rows: list[dict[str, object]] = []
    if args.part in ("all", "sustained"):
        dtypes = tuple(args.sustained_dtypes.split(","))
        unknown = sorted(set(dtypes) - {"fp32", "bf16", "fp16", "fp8"})
        if unknown:
            parser.error(f"--sustained-dtypes: {unknown} not in fp32, bf16, fp16, fp8")
        rows += sustained(device, n=args.gemm_n, soak_s=args.soak_s, dtypes=dtypes)
    if args.part in ("all", "recompute"):
        rows += recompute(device, args)
    if args.part in ("all", "cache"):
        rows += cache(device, args)
    if args.part in ("all", "duty"):
        rows += duty(device, n=args.gemm_n, soak_s=args.duty_soak_s)
    table = pd.DataFrame.from_records(rows)
    print(table.to_string(index=False))
    write_text_atomic(args.out, table.to_csv(index=False), label="--out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
