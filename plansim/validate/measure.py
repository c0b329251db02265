"""Per-rank measurement of one training step: event intervals and peak memory (torch).

A :class:`Recorder` collects intervals ``(stream, kind, stage, microbatch, start_s, end_s,
bytes)`` of the current step, seconds from the step start of this rank (taken right after
a barrier, so ranks on different hosts line up to within the barrier's skew). On CPU the
clock is ``time.perf_counter_ns``; on CUDA each interval is a pair of CUDA events on the
current stream, resolved after the step against an event recorded at the step start (no
synchronisation inside the step, so overlap is kept).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` over the measured steps; on CPU
the peak of live tensor bytes (:class:`LiveBytes`, a TorchDispatchMode counting parameters,
gradients, optimizer states, activations and temporaries) during one extra step run after
the measured ones (steady state: optimizer states exist; not timed, its loss not reported).
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._python_dispatch import TorchDispatchMode

#: (stream, kind, stage, microbatch, start_s, end_s, bytes) of one measured interval.
Interval = tuple[str, str, int, int, float, float, float]


class Recorder:
    """Intervals of one step of this rank (see module docstring).

    Args:
        device: ``cpu`` or ``cuda``.
    """

    def __init__(self, *, device: str) -> None:
        self.cuda = device == "cuda"
        self._pending: list[tuple[str, str, int, int, Any, Any, float]] = []
        self._start: Any = None
        self.enabled = False

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter_ns()

    def start_step(self) -> None:
        """Begin a step: clear the intervals and take the step's time origin."""
        self._pending = []
        self._start = self._mark()

    def mark(self) -> Any:
        """A time point (resolve it with :meth:`finish_step`)."""
        return self._mark()

    def add(
        self,
        *,
        stream: str,
        kind: str,
        stage: int,
        microbatch: int,
        start: Any,
        end: Any,
        num_bytes: float = 0.0,
    ) -> None:
        """Record an interval between two marks."""
        if self.enabled:
            self._pending.append((stream, kind, stage, microbatch, start, end, num_bytes))

    @contextlib.contextmanager
    def interval(
        self, *, stream: str, kind: str, stage: int, microbatch: int, num_bytes: float = 0.0
    ) -> Iterator[None]:
        """Record the time spent in the ``with`` body."""
        start = self._mark()
        yield
        self.add(
            stream=stream,
            kind=kind,
            stage=stage,
            microbatch=microbatch,
            start=start,
            end=self._mark(),
            num_bytes=num_bytes,
        )

    def _seconds(self, mark: Any) -> float:
        if self.cuda:
            return float(self._start.elapsed_time(mark)) / 1e3
        return float(mark - self._start) / 1e9

    def finish_step(self) -> tuple[float, list[Interval]]:
        """End the step: (this rank's step time in seconds, its intervals)."""
        end = self._mark()
        if self.cuda:
            torch.cuda.synchronize()
        rows = [
            (stream, kind, stage, mb, self._seconds(a), self._seconds(b), float(nbytes))
            for stream, kind, stage, mb, a, b, nbytes in self._pending
        ]
        return self._seconds(end), rows


def wrap_method(obj: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """Replace ``obj.name`` on this instance by ``wrapper(original, *args, **kwargs)``."""
    original = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(obj, name, wrapped)


class LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Peak bytes of live CPU tensor storages while the mode is active.

    Starts from the storages of ``baseline`` tensors (parameters, gradients, optimizer
    states alive before the step), adds every storage an op outputs (DTensor and other
    wrapper subclasses through their inner tensors, ``get_untyped_storages``) and subtracts
    it when the storage is freed (weak reference callback). No autograd hooks, so it does
    not disturb ``torch.autograd.grad`` (pipelining's split backward), unlike ``MemTracker``.
    """

    def __init__(self, baseline: Iterable[torch.Tensor]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.current_bytes = 0
        for tensor in baseline:
            self._track(tensor)
        self.peak_bytes = self.current_bytes

    def _track(self, tensor: torch.Tensor) -> None:
        for storage in get_untyped_storages(tensor):
            if storage.device.type != "cpu":
                continue
            key = storage._cdata
            if key in self._refs:
                continue
            nbytes = storage.nbytes()
            self._refs[key] = weakref.ref(storage, functools.partial(self._free, key, nbytes))
            self.current_bytes += nbytes

    def _free(self, key: int, nbytes: int, _ref: Any) -> None:
        if self._refs.pop(key, None) is not None:
            self.current_bytes -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out


def state_tensors(modules: Iterable[Any], optimizer: Any) -> list[torch.Tensor]:
    """Parameters, gradients, buffers and optimizer-state tensors alive now (the optimizer's
    own parameters too: the fp32 master weights of a bf16 run; a tensor listed twice is
    counted once by :class:`LiveBytes`)."""
    out: list[torch.Tensor] = []
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps one
    modules = list(modules)
    params = [p for module in modules for p in module.parameters()]
    params += [p for group in inner.param_groups for p in group["params"]]  # bf16: masters
    for param in params:
        out.append(param)
        if param.grad is not None:
            out.append(param.grad)
    for module in modules:
        out.extend(module.buffers())
    for state in inner.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


def cpu_peak_bytes(run_step: Callable[[], object], *, baseline: list[torch.Tensor]) -> int:
    """Peak live CPU tensor bytes while ``run_step`` runs (:class:`LiveBytes`)."""
    mode = LiveBytes(baseline)
    del baseline
    with mode:
        run_step()
    return int(mode.peak_bytes)


def cuda_peak_bytes() -> int:
    """``torch.cuda.max_memory_allocated`` since the last reset, bytes."""
    return int(torch.cuda.max_memory_allocated())
