"""Per-rank microbenchmarks: the code each launched rank runs (imports torch).

Every rank runs every compute item at the same time as the others and times it itself;
collectives run in groups of ranks 0..g-1. Before timing an item the ranks agree (all_reduce
MAX over the world) on its warm-up time, so they take the same decisions (repetitions, skip)
and stay in step. Timing: ``time.perf_counter`` around a loop of calls on CPU (ops are
synchronous), CUDA events on a GPU; GEMM and attention calls one at a time, each after a
cache-evicting write (:mod:`.cold_timer`). Each rank writes its rows to ``rank<r>.json`` in
the run's work folder; :mod:`plansim.calibrate.runner` aggregates them.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plansim.calibrate.bench_collective import collective_call
from plansim.calibrate.bench_host import host_op_chain
from plansim.calibrate.bench_kernels import LOCAL_CALLS
from plansim.calibrate.bench_overlap import overlap_rows
from plansim.calibrate.bench_pipeline import pipeline_chain
from plansim.calibrate.bench_sustained import sustained_rows
from plansim.calibrate.cold_timer import ColdTimer
from plansim.calibrate.environment import environment, rss_bytes
from plansim.calibrate.plan import CPU_SHARE_OK, PIPELINE_OPS, Item, Plan

#: Item kinds that time themselves over all ranks: a GEMM alone and beside all_reduces
#: (``bench_overlap``), a burst then a soak at the power limit (``bench_sustained``).
SELF_TIMED = {"overlap": overlap_rows, "sustained": sustained_rows}
#: Item kinds timed one call at a time with the caches evicted first (:mod:`.cold_timer`).
COLD_KINDS = ("gemm", "attention")

Fn = Callable[[], object]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankConfig:
    """What every rank needs (pickled to the spawned processes)."""

    backend: str
    device: str
    plan: Plan
    workdir: str
    pg_timeout_s: float


def rank_main(rank: int, world: int, config: RankConfig, queue: Any) -> None:
    """Entry point of one rank (``torch.multiprocessing`` passes ``rank`` first)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    device = torch.device("cpu")
    if config.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(
        config.backend,
        init_method=Path(config.workdir, "store").as_uri(),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=config.pg_timeout_s),
        # nccl: bind to this rank's GPU (NCCL otherwise guesses it from the rank, and warns)
        device_id=device if config.backend == "nccl" else None,
    )
    bench = _Bench(rank=rank, world=world, device=device, plan=config.plan)
    rows = bench.memory_rows()
    for index, item in enumerate(config.plan.items):
        if rank == 0:
            queue.put((index, item.label))
        rows += bench.measure(item)
    result = {"rank": rank, "rows": rows, "env": environment(device) if rank == 0 else {}}
    target = Path(config.workdir, f"rank{rank}.json")
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, target)
    dist.barrier()
    dist.destroy_process_group()


class _Bench:
    """Builds, times and records the items of one rank."""

    def __init__(self, *, rank: int, world: int, device: torch.device, plan: Plan) -> None:
        self.rank, self.world, self.device, self.plan = rank, world, device, plan
        self.groups = {g: dist.new_group(list(range(g))) for g in plan.group_sizes}
        #: family -> the smallest work per call found slower than ``max_call_s``: items of the
        #: family at least that large are skipped (in every pass).
        self.too_slow: dict[str, float] = {}
        #: DeviceMeshes of the host-op chains (``bench_host``), built on first use.
        self.meshes: dict[str, Any] = {}
        #: GEMM and attention calls are timed one at a time with caches evicted (cold_timer).
        self.cold = ColdTimer(device)

    # ------------------------------------------------------------------ timing
    def _time(self, fn: Fn, inner: int) -> float:
        """Seconds per call of ``fn`` over ``inner`` back-to-back calls."""
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) * 1e-3 / inner
        begin = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - begin) / inner

    def _agree_max(self, value: float) -> float:
        """The largest ``value`` over all ranks (inf when any rank failed)."""
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    # ------------------------------------------------------------------ items
    def measure(self, item: Item) -> list[dict[str, Any]]:
        """Rows for ``item`` (this rank's timing, or rank 0's note of a skip)."""
        self_timed = SELF_TIMED.get(item.kind)
        if self_timed is not None:  # GEMM loops that pace themselves over all ranks
            return self_timed(
                item,
                device=self.device,
                timing=self.plan.timing,
                timer=self._time,
                agree_max=self._agree_max,
                row=self._row,
                note=self._note,
            )
        timing = self.plan.timing
        if item.work >= self.too_slow.get(item.family, math.inf):  # the same on every rank
            reason = f"a call this large of this {item.kind} dtype took over {timing.max_call_s} s"
            return self._note(item, "skipped", reason)
        cold = item.kind in COLD_KINDS
        timer = self.cold if cold else self._time
        fn, agreed, note = self._build_and_estimate(item, timer)
        if math.isinf(agreed):
            return self._note(item, "unsupported", note)
        if item.kind in ("gemm", "attention") and agreed > timing.max_call_s:
            self.too_slow[item.family] = min(item.work, self.too_slow.get(item.family, math.inf))
        if fn is None:
            return []
        inner, reps = timing.repetitions(agreed, cold=cold)
        note = self.cold.note if cold else ""
        if self.device.type != "cpu" or not _busy(item):
            samples, _ = self._repeat(item, fn, inner, reps, timer)
            return [self._row(item, samples, inner, math.nan, note=note)]
        return self._timed_on_shared_cpu(item, fn, timer, inner=inner, reps=reps, note=note)

    def _build_and_estimate(
        self, item: Item, timer: Callable[[Fn, int], float]
    ) -> tuple[Fn | None, float, str]:
        """Build ``item``'s call on the ranks that run it and agree on its one-call estimate:
        (the call or None, the largest estimate over all ranks (inf when any rank failed),
        the note for a failure)."""
        member = item.kind != "collective" or self.rank < item.group_size
        fn: Fn | None = None
        estimate, note = 0.0, "failed on another rank"
        if member:
            try:
                fn = self._build(item)
                estimate = self._estimate(item, fn, timer)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
                fn, estimate = None, math.inf
                note = f"unsupported: {str(exc).splitlines()[0][:200]}"
        return fn, self._agree_max(estimate), note

    def _timed_on_shared_cpu(
        self,
        item: Item,
        fn: Fn,
        timer: Callable[[Fn, int], float],
        *,
        inner: int,
        reps: int,
        note: str,
    ) -> list[dict[str, Any]]:
        """Time a CPU item whose ranks share the cores, again (up to ``timing.retries``
        times) while some rank had less than ``CPU_SHARE_OK`` of a core; keeps the attempt
        whose least-CPU rank had the most."""
        timing = self.plan.timing
        samples, share = self._repeat(item, fn, inner, reps, timer)
        worst = -self._agree_max(-share)  # the least CPU any rank had (same on all ranks)
        best, attempts = (worst, samples, share), 1
        while worst < CPU_SHARE_OK and attempts <= timing.retries:
            time.sleep(0.5 * attempts)  # let the competing work pass
            samples, share = self._repeat(item, fn, inner, reps, timer)
            worst = -self._agree_max(-share)
            attempts += 1
            if worst > best[0]:
                best = (worst, samples, share)
        if attempts > 1:
            retried = (
                f"timed {attempts} times (a rank had < {CPU_SHARE_OK:.0%} of a core); "
                f"kept the attempt whose least-CPU rank had {best[0]:.0%}"
            )
            note = "; ".join(filter(None, (note, retried)))
        return [self._row(item, best[1], inner, best[2], note=note)]

    def _estimate(self, item: Item, fn: Fn, timer: Callable[[Fn, int], float]) -> float:
        """Seconds of one call: the fastest of the warm-up calls, and of one more when that is
        over ``max_call_s``.

        A shape's first call also pays one-time costs that training pays once per run: on a
        GPU, loading the kernel's module (CUDA lazy loading, the default since CUDA 11.7) and
        cuBLAS's heuristic choice. Only GEMM and attention calls (the families a slow call
        cuts) are timed again: a rank's own decision, so never a collective, which every rank
        of its group must enter together. Seen on an H100 (torch 2.11, CUDA 13): with one warm-up
        call, the first fp32 and fp16 GEMMs of 512 x 1536 x 512 (0.8 GFLOP, microseconds of
        work) took over 0.12 s, so every larger GEMM of both dtypes was skipped as too slow.
        """
        timing = self.plan.timing
        samples = []
        for _ in range(max(1, timing.warmup)):
            self._barrier(item)
            samples.append(timer(fn, 1))
        if item.kind in COLD_KINDS and min(samples) > timing.max_call_s:
            samples.append(timer(fn, 1))  # no barrier: compute calls wait for no other rank
        return min(samples)

    def _repeat(
        self, item: Item, fn: Fn, inner: int, reps: int, timer: Callable[[Fn, int], float]
    ) -> tuple[list[float], float]:
        """``reps`` timed repetitions and this process's CPU time / wall time over them."""
        samples = []
        cpu_begin, wall_begin = time.process_time(), time.perf_counter()
        for _ in range(reps):
            self._barrier(item)
            samples.append(timer(fn, inner))
        wall = time.perf_counter() - wall_begin
        return samples, (time.process_time() - cpu_begin) / wall if wall > 0 else math.nan

    def _barrier(self, item: Item) -> None:
        if item.kind == "collective":
            dist.barrier(group=self.groups[item.group_size])

    def _row(
        self, item: Item, samples: list[float], inner: int, cpu_share: float, *, note: str = ""
    ) -> dict[str, Any]:
        """One timing row; ``cpu_share`` is this process's CPU time / wall time while timing
        (compute on a CPU device: below 1 when the rank waited for a core, i.e. other work
        competed; not recorded for collectives, which wait in the transport)."""
        return {
            **item.raw_columns(),
            "rank": self.rank,
            "status": "ok",
            "reps": len(samples),
            "inner": inner,
            "median_s": statistics.median(samples),
            "min_s": min(samples),
            "max_s": max(samples),
            "cpu_share": cpu_share,
            "note": note,
        }

    def _note(self, item: Item, status: str, note: str) -> list[dict[str, Any]]:
        if self.rank != 0:
            return []
        nan = math.nan
        return [
            {
                **item.raw_columns(),
                "rank": 0,
                "status": status,
                "reps": 0,
                "inner": 0,
                "median_s": nan,
                "min_s": nan,
                "max_s": nan,
                "cpu_share": nan,
                "note": note,
            }
        ]

    def memory_rows(self) -> list[dict[str, Any]]:
        """Memory this rank's process holds after start-up (torch, process group, buffers)."""
        self._agree_max(0.0)  # a first collective: communicator buffers are allocated
        rows = []
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            values = {"device_total": float(total), "device_used_after_init": float(total - free)}
        else:
            values = {"rss_after_init": float(rss_bytes())}
        for op, value in values.items():
            rows.append(
                {
                    "kind": "memory",
                    "op": op,
                    "dtype": "",
                    "shape": "1",
                    "group_size": 1,
                    "work": value,
                    "work_unit": "byte",
                    "sweep": 0,
                    "rank": self.rank,
                    "status": "ok",
                    "reps": 1,
                    "inner": 1,
                    "median_s": math.nan,
                    "min_s": math.nan,
                    "max_s": math.nan,
                    "cpu_share": math.nan,
                    "note": "",
                }
            )
        return rows

    # ------------------------------------------------------------------ builders
    def _build(self, item: Item) -> Fn:
        if item.kind in LOCAL_CALLS:
            return LOCAL_CALLS[item.kind](item, self.device)
        if item.kind == "collective":
            return collective_call(
                item, group=self.groups[item.group_size], rank=self.rank, device=self.device
            )
        if item.kind == "host_op":
            return self._host_op(item)
        raise KeyError(item.kind)

    def _host_op(self, item: Item) -> Fn:
        """The tiny-op chain of ``item`` (:func:`.bench_host.host_op_chain`), or its pipeline
        (:func:`.bench_pipeline.pipeline_chain`)."""
        if item.op in PIPELINE_OPS:
            return pipeline_chain(item, device=self.device, world=self.world)
        return host_op_chain(item, device=self.device, world=self.world, meshes=self.meshes)


def _busy(item: Item) -> bool:
    """Items that keep their core busy all the time (collectives wait in the transport, a
    pipeline's ranks for each other)."""
    return item.kind != "collective" and item.op not in PIPELINE_OPS
