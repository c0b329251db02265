"""Search-scoped state and the two kinds of planner work: costing a layout, simulating a plan.

A :class:`SearchContext` holds one model, one hardware profile and a memo (costings of
per-layer passes, gradient buckets, whole pipeline replicas, action lists) that lives as
long as the search: no module-level caches. Its methods are the tasks the planner runs
(cost a layout, refine bounds, simulate a plan), in this process or in worker processes
(``plansim.planner.parallel``); all are pure functions of their arguments, so results do
not depend on where they run.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.memo import Memo
from plansim.analytic.stage_compute import stage_compute_s
from plansim.analytic.zero_segments import sharded_action_s
from plansim.planner.bounds import compute_lower_bound_s, step_time_lower_bound_s
from plansim.planner.enumerate import Layout, enumerate_plan_groups, restrict_to_layout
from plansim.planner.estimate import estimate_step_time_s
from plansim.planner.evaluate import Evaluation, Rejected, check_plan, evaluate
from plansim.planner.rejections import RejectedRows, plan_from_values, plan_values
from plansim.planner.space import SearchSpace
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import PipelineWork


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A feasible plan before simulation.

    Attributes:
        plan_values: the plan's field values (:attr:`plan` builds it).
        label: ``plan.label()`` (tie-breaker of every ordering).
        bound_s: guaranteed lower bound on its simulated step time, seconds: the full one
            (``plansim.planner.bounds.step_time_lower_bound_s``) when ``refined``, else
            the cheaper compute-only one (``bounds.compute_lower_bound_s``), never above
            the full one.
        estimate_s: the heuristic estimate (``estimate.estimate_step_time_s``) when asked for
            (the ``simulate_top`` mode), else 0.
        refined: ``bound_s`` is the full bound.
    """

    plan_values: tuple[object, ...]
    label: str
    bound_s: float
    estimate_s: float = 0.0
    refined: bool = True

    @property
    def plan(self) -> ParallelPlan:
        """The plan (built from ``plan_values``, ``rejections.plan_values``: a candidate
        travels between processes as plain values; most are never simulated)."""
        return plan_from_values(self.plan_values)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutCosting:
    """Outcome of costing every plan of one layout, in enumeration order (``rejected``: one
    row per rejected plan, ``plansim.planner.rejections``)."""

    num_candidates: int
    feasible: tuple[Candidate, ...]
    rejected: RejectedRows


@dataclass(frozen=True, slots=True, kw_only=True)
class Simulated:
    """A simulated plan kept without its timeline (it cannot enter the requested top K).

    Attributes:
        plan: the plan.
        step_time_s: simulated seconds per step.
        peak_memory_bytes: highest per-GPU peak of the simulated ranks.
    """

    plan: ParallelPlan
    step_time_s: float
    peak_memory_bytes: float


class SearchContext:
    """Model, profile and the memo of one search (see the module docstring).

    Args:
        model: the model searched.
        profile: the GPU/node profile.
    """

    def __init__(self, model: ModelSpec, profile: HardwareProfile) -> None:
        self.model = model
        self.profile = profile
        self.memo: Memo = {}

    def cost_layout(
        self,
        layout: Layout,
        *,
        num_gpus: int,
        global_batch_size: int,
        space: SearchSpace,
        with_estimate: bool = False,
        refine: bool = True,
    ) -> LayoutCosting:
        """Check every plan of ``layout`` (divisibility, memory) and bound the feasible ones.

        Memory is pruned before any costing: only plans that pass ``check_plan`` are costed;
        one check serves each group of plans that differ only in overlap flags
        (``enumerate_plan_groups``). ``refine=False`` gives each the compute-only bound
        (``Candidate.refined`` False; :meth:`refine_bounds` later), without building its
        work; the estimate, when asked for, needs the work and refines too.
        """
        model, profile = self.model, self.profile
        feasible: list[Candidate] = []
        rejected = RejectedRows()
        count = 0
        for group in enumerate_plan_groups(
            num_gpus=num_gpus,
            global_batch_size=global_batch_size,
            space=restrict_to_layout(space, layout),
            num_layers=model.num_layers,
        ):
            count += len(group)
            why = check_plan(model, group[0], profile, memo=self.memo)  # same for the group
            if why is not None:
                rejected.add(why, group)
                continue
            if not (refine or with_estimate):  # per plan: ZeRO-2's overlap flag counts
                feasible += [
                    Candidate(
                        plan_values=plan_values(plan),
                        label=plan.label(),
                        bound_s=self._compute_bound_s(plan),
                        refined=False,
                    )
                    for plan in group
                ]
                continue
            for plan in group:
                work, bound = self._work_and_bound(plan)
                feasible.append(
                    Candidate(
                        plan_values=plan_values(plan),
                        label=plan.label(),
                        bound_s=bound,
                        estimate_s=estimate_step_time_s(work, schedule=plan.schedule)
                        if with_estimate
                        else 0.0,
                    )
                )
        return LayoutCosting(num_candidates=count, feasible=tuple(feasible), rejected=rejected)

    def _compute_bound_s(self, plan: ParallelPlan) -> float:
        if plan.schedule.overlaps_forward_backward:
            return 0.0  # its collectives may hide behind compute: the full bound decides
        stages = stage_compute_s(self.model, plan, self.profile, memo=self.memo)
        # ZeRO-2/3 segments the actions hold, so sharded plans are not under-bounded
        sharded = sharded_action_s(self.model, plan, self.profile, memo=self.memo)
        stages = tuple((f + zf, b + zb) for (f, b), (zf, zb) in zip(stages, sharded, strict=True))
        return compute_lower_bound_s(
            stages,
            num_ranks=plan.pp,
            num_microbatches=plan.num_microbatches,
            placement=plan.schedule.placement,
        )

    def _work_and_bound(self, plan: ParallelPlan) -> tuple[PipelineWork, float]:
        """The plan's work (untagged, memoised) and its full lower bound."""
        work = build_pipeline_work(self.model, plan, self.profile, memo=self.memo, links=False)
        return work, step_time_lower_bound_s(work, schedule=plan.schedule, memo=self.memo)

    def refine_bounds(self, plans: tuple[ParallelPlan, ...]) -> tuple[float, ...]:
        """The full lower bound (``step_time_lower_bound_s``) of each checked plan."""
        return tuple(self._work_and_bound(plan)[1] for plan in plans)

    def simulate(
        self, plan: ParallelPlan, *, keep_below_s: float
    ) -> Evaluation | Simulated | Rejected:
        """Simulate a checked plan; the full Evaluation only when its step time is
        <= ``keep_below_s`` (else a :class:`Simulated` without the timeline)."""
        outcome = evaluate(self.model, plan, self.profile, checked=True, memo=self.memo)
        if isinstance(outcome, Evaluation) and outcome.step_time_s > keep_below_s:
            return Simulated(
                plan=plan,
                step_time_s=outcome.step_time_s,
                peak_memory_bytes=outcome.peak_memory_bytes,
            )
        return outcome
