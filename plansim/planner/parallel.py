"""Run planner tasks in this process or in a pool of worker processes, results in order.

:class:`Workers` maps a :class:`plansim.planner.context.SearchContext` method over a list of
inputs and returns the outputs in input order whatever the number of processes, so a search
gives identical results for any ``jobs``; :func:`map_in_order` does the same for independent
jobs (sweep cells, back-test rows). With ``jobs > 1`` it uses
``concurrent.futures.ProcessPoolExecutor``; each worker process builds its own context once
(the pool initializer) and keeps its memo for the whole search.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, TypeVar

from plansim.errors import require_positive_int
from plansim.planner.context import SearchContext
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec

T = TypeVar("T")
A = TypeVar("A")

#: The context of a worker process (set once by the pool initializer; never in the parent).
_WORKER_CONTEXT: list[SearchContext] = []


def default_jobs() -> int:
    """Cores this process may use (``os.process_cpu_count`` on Python >= 3.13)."""
    count = getattr(os, "process_cpu_count", os.cpu_count)()
    return max(1, count or 1)


def map_in_order(task: Callable[[A], T], items: Sequence[A], jobs: int) -> Iterator[T]:
    """``task(item)`` for each of ``items``, yielded in input order, on ``jobs`` processes (1,
    or a single item: this process). ``task`` and the items must pickle (a module-level
    function or a ``functools.partial`` of one). Used for independent jobs: the cells of a
    sweep, the rows of a back-test.

    Raises:
        SpecError: jobs is not a positive integer.
    """
    require_positive_int("jobs", jobs)
    if jobs == 1 or len(items) <= 1:
        yield from map(task, items)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(items))) as pool:
        yield from pool.map(task, items)


def _init_worker(model: ModelSpec, profile: HardwareProfile) -> None:
    _WORKER_CONTEXT[:] = [SearchContext(model, profile)]


def _call(task: tuple[str, tuple[Any, ...], dict[str, Any]]) -> Any:
    name, args, kwargs = task
    return getattr(_WORKER_CONTEXT[0], name)(*args, **kwargs)


class Workers:
    """The processes a search runs its tasks on (use as a context manager).

    Args:
        model, profile: what the search is about.
        jobs: processes; 1 runs every task here, in order.

    Raises:
        SpecError: jobs is not a positive integer.
    """

    def __init__(self, model: ModelSpec, profile: HardwareProfile, *, jobs: int) -> None:
        require_positive_int("jobs", jobs)
        self.jobs = jobs
        self.local = SearchContext(model, profile)
        self._pool: Executor | None = None
        if jobs > 1:
            self._pool = ProcessPoolExecutor(
                max_workers=jobs, initializer=_init_worker, initargs=(model, profile)
            )

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(
        self, method: Callable[..., T], calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> Iterator[T]:
        """``method(*args, **kwargs)`` for each (args, kwargs) in ``calls``, yielded in order.

        ``method`` is a SearchContext method (``SearchContext.cost_layout``); each call runs
        on this process's context or a worker's.
        """
        if self._pool is None or len(calls) <= 1:
            bound = getattr(self.local, method.__name__)
            for args, kwargs in calls:
                yield bound(*args, **kwargs)
            return
        tasks = [(method.__name__, args, kwargs) for args, kwargs in calls]
        yield from self._pool.map(_call, tasks)
