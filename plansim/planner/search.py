"""Search: enumerate, prune (divisibility, memory), bound, simulate, rank by step time.

Exact by default (branch and bound). Every candidate is checked (cheap, analytic: layout
divisibility, then memory, before any costing); each feasible one gets a guaranteed lower
bound on its simulated step time from its compute and ZeRO-2/3 segments alone
(``bounds.compute_lower_bound_s``, no pipeline work built). Candidates are then taken in
increasing bound order: one whose bound is still the compute-only one is costed (its work
built, memoised per search) and gets the full bound (``bounds.step_time_lower_bound_s``,
never below the compute-only one) and goes back in line; one with its full bound is
simulated as events, in batches: the first of K plans (the K lowest full bounds are never
above the final K-th step time, so all K would be simulated anyway), then fixed-size ones
(``PRUNED_BATCH``). The search stops when the next bound exceeds the
K-th best simulated step time (K = ``top_k``). Plans leave the line in the order of their
full bounds, as if every plan had been fully bounded first, so the plans simulated do not
depend on the cheap bound. Every plan that could be among the K fastest (ties included) has
been simulated, so the top K equal those of simulating every feasible plan
(``exhaustive=True``), which the tests check.

``simulate_top=N`` keeps the older heuristic mode: simulate the N best analytic estimates
(``plansim.planner.estimate.estimate_step_time_s``, not a bound), fast but not guaranteed to
find the best plan.

Both phases run on ``jobs`` processes (``plansim.planner.parallel``); batches do not depend
on ``jobs``, so results are identical for any number of processes.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from plansim.errors import SpecError, require_positive_int
from plansim.io.result_cache import ResultCache
from plansim.planner.context import Candidate, SearchContext, Simulated
from plansim.planner.enumerate import layouts
from plansim.planner.evaluate import OUT_OF_MEMORY, Evaluation, Rejected
from plansim.planner.parallel import Workers
from plansim.planner.progress import Progress
from plansim.planner.rejections import RejectedRows, Rejections
from plansim.planner.space import SearchSpace
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec

#: Plans simulated per round of the exact search (independent of jobs: determinism).
PRUNED_BATCH = 4
#: Plans simulated per round of the exhaustive search.
EXHAUSTIVE_BATCH = 32
#: Plans whose compute-only bound the exact search refines to the full one per round, and
#: per task (both independent of jobs: determinism).
REFINE_BATCH = 64
REFINE_TASK = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    """Outcome of a planner search.

    Attributes:
        ranked: simulated plans kept with their timelines, fastest first (ties: lower peak
            memory, then label). Exact mode: every simulated plan; exhaustive mode: those
            that could still be in the top K when simulated (the top K and ties included).
        rejection_counts: category -> how many candidates were rejected for it.
        rejection_examples: category -> the first rejection's full reason; for "out of
            memory" the rejection of the plan that needs the least memory.
        num_candidates: plans enumerated.
        num_feasible: plans that passed the checks.
        num_not_simulated: feasible plans never simulated (bound above the K-th best, or
            estimate below the ``simulate_top`` set).
        num_simulated: plans simulated as events.
        num_fully_costed: plans whose pipeline work was built for the full lower bound
            (every feasible plan in exhaustive and ``simulate_top`` modes; in exact mode
            those whose compute-only bound reached the front of the line).
        top_k: the K the search was exact for (0 in ``simulate_top`` mode).
        rejected: every rejection, in enumeration then simulation order (a
            :class:`~plansim.planner.rejections.Rejections`: each Rejected is built when
            read).
        closest_miss: the out-of-memory rejection whose plan needs the least memory (ties:
            the first), or None.
        batch_indivisible_dps: dp sizes of (tp, cp, pp, dp) layouts the GPUs allow but the
            global batch does not split over (global_batch_size % dp != 0); no candidate is
            enumerated for them, so they are not among the rejections.
    """

    ranked: tuple[Evaluation, ...]
    rejection_counts: dict[str, int]
    rejection_examples: dict[str, str]
    num_candidates: int
    num_feasible: int
    num_not_simulated: int
    num_simulated: int = 0
    num_fully_costed: int = 0
    top_k: int = 0
    rejected: Sequence[Rejected] = field(default=(), repr=False)
    closest_miss: Rejected | None = None
    batch_indivisible_dps: tuple[int, ...] = ()


def search(
    model: ModelSpec,
    profile: HardwareProfile,
    *,
    num_gpus: int,
    global_batch_size: int,
    space: SearchSpace,
    top_k: int = 10,
    simulate_top: int | None = None,
    exhaustive: bool = False,
    jobs: int = 1,
    progress: Progress | None = None,
    cache: ResultCache | None = None,
) -> SearchResult:
    """Rank the layouts of ``model`` on ``num_gpus`` GPUs of ``profile`` by step time.

    Args:
        top_k: the search is exact for the ``top_k`` fastest plans (and ties).
        simulate_top: heuristic mode instead: simulate this many best estimates.
        exhaustive: simulate every feasible plan (the reference the exact mode equals).
        jobs: worker processes (1: this process only).
        progress: receives phases and counts (``plansim.planner.progress``).
        cache: a persistent cache (``plansim.io.result_cache``): a search asked before with
            the same arguments (``jobs`` and ``progress`` aside, which change no result)
            is read back whole, and each plan simulated before is read back instead of
            simulated again; the result is the one the search computes without it.

    Raises:
        SpecError: a count is not a positive integer, or simulate_top with exhaustive.
        OutputFileError: the cache folder cannot be written.
    """
    require_positive_int("top_k", top_k)
    require_positive_int("jobs", jobs)
    if simulate_top is not None:
        require_positive_int("simulate_top", simulate_top)
        if exhaustive:
            raise SpecError("simulate_top and exhaustive exclude each other; give one")
    if cache is not None:
        key = cache.key(
            "search",
            model,
            profile,
            num_gpus,
            global_batch_size,
            space,
            top_k,
            simulate_top,
            exhaustive,
        )
        found = cache.get(key)
        if isinstance(found, SearchResult):
            return found
    result = _search(
        model,
        profile,
        num_gpus=num_gpus,
        global_batch_size=global_batch_size,
        space=space,
        top_k=top_k,
        simulate_top=simulate_top,
        exhaustive=exhaustive,
        jobs=jobs,
        progress=progress,
        cache=cache,
    )
    if cache is not None:
        cache.put(key, result)
    return result


def _search(
    model: ModelSpec,
    profile: HardwareProfile,
    *,
    num_gpus: int,
    global_batch_size: int,
    space: SearchSpace,
    top_k: int,
    simulate_top: int | None,
    exhaustive: bool,
    jobs: int,
    progress: Progress | None,
    cache: ResultCache | None,
) -> SearchResult:
    """:func:`search` without the whole-search cache."""
    with Workers(model, profile, jobs=jobs) as workers:
        num_candidates, feasible, rejected = _cost_all(
            workers,
            num_gpus=num_gpus,
            global_batch_size=global_batch_size,
            space=space,
            with_estimate=simulate_top is not None,
            refine=exhaustive,
            progress=progress,
        )
        if simulate_top is not None:
            chosen = sorted(feasible, key=lambda c: (c.estimate_s, c.label))[:simulate_top]
            if progress is not None:
                progress.start("simulate", len(chosen))
            outcomes = _simulate(workers, chosen, keep_below_s=math.inf, cache=cache)
            sims = list(zip(chosen, outcomes, strict=True))
            _report(progress, len(chosen), feasible=len(feasible), sims=sims)
            fully_costed = len(feasible)  # the estimates need every plan's work
        else:
            sims, fully_costed = _branch_and_bound(
                workers,
                feasible,
                top_k=top_k,
                exhaustive=exhaustive,
                progress=progress,
                cache=cache,
            )
    if progress is not None:
        progress.close()
    return _result(
        sims,
        rejected,
        num_candidates=num_candidates,
        num_feasible=len(feasible),
        fully_costed=fully_costed,
        top_k=0 if simulate_top is not None else top_k,
        indivisible_dps=tuple(
            sorted({lay.dp for lay in layouts(num_gpus, space) if global_batch_size % lay.dp})
        ),
    )


def _result(
    sims: list[tuple[Candidate, Outcome]],
    rejected: list[RejectedRows],
    *,
    num_candidates: int,
    num_feasible: int,
    fully_costed: int,
    top_k: int,
    indivisible_dps: tuple[int, ...],
) -> SearchResult:
    """The search's outcome: the simulated plans ranked by (step time, peak memory, label),
    the rejections counted by category (most first), and the closest miss on memory as the
    example of running out of it."""
    evaluations = [out for _, out in sims if isinstance(out, Evaluation)]
    rejections = Rejections(rejected, [out for _, out in sims if isinstance(out, Rejected)])
    evaluations.sort(key=lambda e: (e.step_time_s, e.peak_memory_bytes, e.plan.label()))
    counts = rejections.counts()
    examples = rejections.examples()
    closest = rejections.closest_miss()
    if closest is not None:  # the plan closest to fitting says the most
        examples[OUT_OF_MEMORY] = closest.reason
    return SearchResult(
        ranked=tuple(evaluations),
        rejection_counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        rejection_examples=examples,
        num_candidates=num_candidates,
        num_feasible=num_feasible,
        num_not_simulated=num_feasible - len(sims),
        num_simulated=len(sims),
        num_fully_costed=fully_costed,
        top_k=top_k,
        rejected=rejections,
        closest_miss=closest,
        batch_indivisible_dps=indivisible_dps,
    )


def _cost_all(
    workers: Workers,
    *,
    num_gpus: int,
    global_batch_size: int,
    space: SearchSpace,
    with_estimate: bool,
    refine: bool,
    progress: Progress | None,
) -> tuple[int, list[Candidate], list[RejectedRows]]:
    """Check and bound every candidate, one task per (tp, cp, pp, dp) layout, in order
    (``refine``: full bounds, else compute-only ones)."""
    todo = list(layouts(num_gpus, space))
    kwargs = {
        "num_gpus": num_gpus,
        "global_batch_size": global_batch_size,
        "space": space,
        "with_estimate": with_estimate,
        "refine": refine,
    }
    if progress is not None:
        progress.start("cost layouts", len(todo))
    num_candidates = 0
    feasible: list[Candidate] = []
    rejected: list[RejectedRows] = []
    calls = [((layout,), kwargs) for layout in todo]
    for costing in workers.map(SearchContext.cost_layout, calls):
        num_candidates += costing.num_candidates
        feasible += costing.feasible
        rejected.append(costing.rejected)
        if progress is not None:
            progress.update(1, feasible=len(feasible), best_s=None)
    return num_candidates, feasible, rejected


Outcome = Evaluation | Simulated | Rejected


def _simulate(
    workers: Workers,
    chosen: list[Candidate],
    *,
    keep_below_s: float,
    cache: ResultCache | None = None,
) -> list[Outcome]:
    """Simulate ``chosen`` (``SearchContext.simulate``), in order; with a cache, the plans
    simulated before are read back (a full Evaluation or Rejected serves any
    ``keep_below_s``; a :class:`Simulated` only a slower one) and the others stored."""
    found: list[Outcome | None] = [None] * len(chosen)
    keys: list[str] = []
    if cache is not None:
        model, profile = workers.local.model, workers.local.profile
        keys = [cache.key("simulation", model, profile, c.plan) for c in chosen]
        found = [_cached_outcome(cache.get(key), keep_below_s=keep_below_s) for key in keys]
    todo = [i for i, out in enumerate(found) if out is None]
    calls = [((chosen[i].plan,), {"keep_below_s": keep_below_s}) for i in todo]
    for i, out in zip(todo, workers.map(SearchContext.simulate, calls), strict=True):
        if cache is not None:
            cache.put(keys[i], out)
        found[i] = out
    return [out for out in found if out is not None]


def _cached_outcome(value: object, *, keep_below_s: float) -> Outcome | None:
    """A cached simulation as ``SearchContext.simulate`` with ``keep_below_s`` returns it, or
    None when it cannot serve (absent, or kept without its timeline but needed with it)."""
    if isinstance(value, Evaluation):
        if value.step_time_s > keep_below_s:
            return Simulated(
                plan=value.plan,
                step_time_s=value.step_time_s,
                peak_memory_bytes=value.peak_memory_bytes,
            )
        return value
    if isinstance(value, Rejected):
        return value
    if isinstance(value, Simulated) and value.step_time_s > keep_below_s:
        return value
    return None


def _branch_and_bound(
    workers: Workers,
    feasible: list[Candidate],
    *,
    top_k: int,
    exhaustive: bool,
    progress: Progress | None,
    cache: ResultCache | None = None,
) -> tuple[list[tuple[Candidate, Outcome]], int]:
    """Simulate in (bound, label) order until the next bound exceeds the K-th best step
    time (exhaustive: until every plan is simulated); returns what was simulated, in order,
    and how many candidates then hold a full bound. Candidates with a compute-only bound are
    refined when they reach the front (module docstring)."""
    line = [(c.bound_s, c.label, i, c) for i, c in enumerate(feasible)]
    fully_costed = sum(c.refined for c in feasible)
    heapq.heapify(line)
    batch = EXHAUSTIVE_BATCH if exhaustive else PRUNED_BATCH
    times: list[float] = []  # simulated step times, sorted
    sims: list[tuple[Candidate, Outcome]] = []
    if progress is not None:
        progress.start("simulate", len(line))
    while line:
        kth = times[top_k - 1] if len(times) >= top_k else math.inf
        limit = math.inf if exhaustive else kth
        # the top_k lowest bounds are all <= the final K-th step time (each of the K fastest
        # plans is bounded below its time), so a first round of top_k wastes no simulation
        size = batch if sims or exhaustive else max(batch, top_k)
        take: list[Candidate] = []
        while line and len(take) < size and line[0][0] <= limit:
            if line[0][3].refined:
                take.append(heapq.heappop(line)[3])
            else:
                fully_costed += _refine(workers, line, limit=limit)
        if not take:
            break
        outcomes = _simulate(
            workers, take, keep_below_s=kth if exhaustive else math.inf, cache=cache
        )
        for cand, out in zip(take, outcomes, strict=True):
            sims.append((cand, out))
            if not isinstance(out, Rejected):
                bisect.insort(times, out.step_time_s)
        _report(progress, len(take), feasible=len(feasible), sims=sims)
    if progress is not None and line:
        progress.update(len(line), feasible=len(feasible), best_s=times[0] if times else None)
    return sims, fully_costed


Line = list[tuple[float, str, int, Candidate]]


def _refine(workers: Workers, line: Line, *, limit: float) -> int:
    """Replace the compute-only bounds at the front of ``line`` (up to REFINE_BATCH, while
    <= ``limit``) by full ones, in tasks of REFINE_TASK plans; returns how many."""
    popped: Line = []
    while line and len(popped) < REFINE_BATCH and line[0][0] <= limit:
        if line[0][3].refined:
            break
        popped.append(heapq.heappop(line))
    plans = [entry[3].plan for entry in popped]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((tuple(plans[k : k + REFINE_TASK]),), {}) for k in range(0, len(plans), REFINE_TASK)
    ]
    bounds = [b for chunk in workers.map(SearchContext.refine_bounds, calls) for b in chunk]
    for (_, label, i, cand), bound in zip(popped, bounds, strict=True):
        heapq.heappush(line, (bound, label, i, replace(cand, bound_s=bound, refined=True)))
    return len(popped)


def _report(
    progress: Progress | None,
    done: int,
    *,
    feasible: int,
    sims: list[tuple[Candidate, Outcome]],
) -> None:
    if progress is None:
        return
    times = [out.step_time_s for _, out in sims if not isinstance(out, Rejected)]
    progress.update(done, feasible=feasible, best_s=min(times) if times else None)
