"""A whole training run: time to train, GPU-hours, goodput under failures, energy and cost.

One layout runs every phase of the batch ramp (``plansim.specs.training_run``): each phase's
step is simulated with that phase's global batch and sequence length (its micro-batch count
changes; the layout must divide every phase's batch). The failure-free time of the run is

    work_s = sum over phases of steps x (step time + data loading per step)
             + evaluations x eval_s

With a failure model (``plansim.specs.failure_model``), the run checkpoints every
``interval`` seconds of work (Daly's optimum unless given) and its expected wall time is
Daly's complete model (``plansim.analytic.goodput``), checked by a Monte Carlo over failure
arrivals (``plansim.sim.failures``); goodput = work_s / wall_s. Energy: each phase's steps at
the power of their simulated activities (``plansim.analytic.run_energy``), re-done work at the
run's mean training power, checkpoint writes and restarts at idle power, then the facility's
host, network and PUE when one is given. Cost: GPU-hours x the price of the profile's
GPU-hour, plus facility kWh x the price of a kWh when the table has one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from plansim.analytic.goodput import GoodputEstimate, goodput
from plansim.analytic.moe_counts import count_moe_parameters
from plansim.analytic.run_energy import (
    JOULES_PER_KWH,
    PowerDraw,
    StepActivity,
    checkpoint_bytes,
    facility_energy_j,
    power_draw,
    step_gpu_energy_j,
)
from plansim.errors import SpecError
from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.sim.failures import MonteCarloGoodput, monte_carlo_goodput
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.facility import Facility, PriceTable
from plansim.specs.failure_model import SECONDS_PER_HOUR, FailureModel
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.specs.training_run import TrainingRun, steps_in_phase

SECONDS_PER_DAY = 86400.0
#: Monte Carlo trials of a run's failure arrivals (its 95% CI is printed with the result).
MONTE_CARLO_TRIALS = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseEstimate:
    """One phase of the ramp as simulated.

    Attributes:
        tokens: tokens the phase trains; steps: optimizer steps (whole).
        global_batch_size, seq_length: the phase's batch and sequence length.
        evaluation: the simulated step of the phase's plan.
        activity: seconds of one step by activity (per GPU, mean over pipeline ranks).
        work_s: steps x (step time + data loading per step).
    """

    tokens: float
    steps: int
    global_batch_size: int
    seq_length: int
    evaluation: Evaluation
    activity: StepActivity
    work_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEstimate:
    """A whole run of one layout.

    Attributes:
        num_gpus: GPUs of the job.
        phases: per ramp phase.
        work_s: failure-free seconds (module formula), evaluations included.
        wall_s: expected wall seconds (= work_s without a failure model).
        goodput: Daly's expectation, or None without a failure model.
        monte_carlo: the Monte Carlo check of it, or None.
        checkpoint_bytes, checkpoint_s: one checkpoint and its blocking write time.
        gpu_energy_j: the GPUs' joules; energy_j: with the facility's host, network and PUE
            (equal to gpu_energy_j without a facility); None when the profile has no power.
        power: the power figures used, or None.
        cost_usd: dollars, or None without a price table.
        deadline_s: the run's deadline (``TrainingRun.deadline_s``), or None.
    """

    num_gpus: int
    phases: tuple[PhaseEstimate, ...]
    work_s: float
    wall_s: float
    goodput: GoodputEstimate | None
    monte_carlo: MonteCarloGoodput | None
    checkpoint_bytes: float
    checkpoint_s: float | None
    gpu_energy_j: float | None
    energy_j: float | None
    power: PowerDraw | None
    cost_usd: float | None
    deadline_s: float | None = None

    @property
    def meets_deadline(self) -> bool | None:
        """Whether the expected wall time is within the deadline; None without one."""
        return None if self.deadline_s is None else self.wall_s <= self.deadline_s

    @property
    def days(self) -> float:
        """Expected wall time in days."""
        return self.wall_s / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        """GPUs x expected wall hours."""
        return self.num_gpus * self.wall_s / SECONDS_PER_HOUR

    @property
    def energy_mwh(self) -> float | None:
        """Facility energy (GPU energy without a facility) in MWh."""
        return None if self.energy_j is None else self.energy_j / JOULES_PER_KWH / 1e3


def step_activity(ev: Evaluation) -> StepActivity:
    """Seconds of one simulated step by activity, per GPU as the mean over pipeline ranks:
    the compute stream's kernels, exposed communication (``SimResult.exposed_s_by_kind``)
    and the rest (idle); they add up to the step time."""
    busy = ev.result.compute_busy_s
    ranks = len(busy)
    compute_s = sum(busy) / ranks
    comm_s = sum(ev.exposed_comm_s_by_kind.values()) / ranks
    idle_s = max(ev.step_time_s - compute_s - comm_s, 0.0)
    return StepActivity(compute_s=compute_s, communication_s=comm_s, idle_s=idle_s)


def phase_keys(model: ModelSpec, run: TrainingRun) -> tuple[tuple[int, int], ...]:
    """The distinct (global batch size, sequence length) of the run's phases, in order."""
    keys = (
        (p.global_batch_size, model.seq_length if p.seq_length is None else p.seq_length)
        for p in run.phases
    )
    return tuple(dict.fromkeys(keys))


def simulate_phases(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    run: TrainingRun,
    *,
    phase_steps: Mapping[tuple[int, int], Evaluation] | None = None,
) -> tuple[PhaseEstimate, ...] | Rejected:
    """Every phase of ``run`` with ``plan``'s layout; a Rejected (its reason naming the
    phase) when the layout cannot run one of them. ``phase_steps``: steps already simulated
    per (global batch, sequence length) (:func:`phase_keys`), e.g. each phase's own best
    plan, used instead of ``plan`` for those phases.

    Raises:
        SpecError: as ``evaluate``.
    """
    out: list[PhaseEstimate] = []
    cache: dict[tuple[int, int], Evaluation | Rejected] = dict(phase_steps or {})
    for i, (phase, tokens) in enumerate(zip(run.phases, run.phase_tokens(), strict=True)):
        seq = model.seq_length if phase.seq_length is None else phase.seq_length
        gbs = phase.global_batch_size
        key = (gbs, seq)
        if key not in cache:
            cache[key] = _phase_step(model, plan, profile, gbs=gbs, seq=seq, index=i)
        ev = cache[key]
        if isinstance(ev, Rejected):
            return ev
        steps = steps_in_phase(tokens, global_batch_size=gbs, seq_length=seq)
        out.append(
            PhaseEstimate(
                tokens=tokens,
                steps=steps,
                global_batch_size=gbs,
                seq_length=seq,
                evaluation=ev,
                activity=step_activity(ev),
                work_s=steps * (ev.step_time_s + run.data_loading_s_per_step),
            )
        )
    return tuple(out)


def _phase_step(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    *,
    gbs: int,
    seq: int,
    index: int,
) -> Evaluation | Rejected:
    """The simulated step of phase ``index`` (batch ``gbs``, sequence ``seq``)."""
    where = f"ramp phase {index} (global batch {gbs}, seq {seq})"
    per_step = plan.micro_batch_size * plan.dp
    if gbs % per_step:
        reason = (
            f"{where}: the global batch does not split into micro-batches of "
            f"{plan.micro_batch_size} over dp {plan.dp}"
        )
        return Rejected(plan=plan, category="ramp", reason=reason)
    phase_model = model if seq == model.seq_length else dataclasses.replace(model, seq_length=seq)
    try:
        phase_plan = plan.with_fields(global_batch_size=gbs)
        ev = evaluate(phase_model, phase_plan, profile)
    except SpecError as exc:  # the layout cannot take this phase's batch or sequence
        return Rejected(plan=plan, category="ramp", reason=f"{where}: {exc}")
    if isinstance(ev, Rejected):
        return Rejected(
            plan=plan,
            category=ev.category,
            reason=f"{where}: {ev.reason}",
            need_bytes=ev.need_bytes,
        )
    return ev


def estimate_run(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    run: TrainingRun,
    *,
    failures: FailureModel | None = None,
    facility: Facility | None = None,
    prices: PriceTable | None = None,
    phase_steps: Mapping[tuple[int, int], Evaluation] | None = None,
) -> RunEstimate | Rejected:
    """The whole run of ``plan``'s layout (module docstring); a Rejected when a phase cannot
    run. ``phase_steps``: as :func:`simulate_phases` (each phase its own plan).

    Raises:
        SpecError: the price table has no price for the profile; as ``evaluate``.
    """
    phases = simulate_phases(model, plan, profile, run, phase_steps=phase_steps)
    if isinstance(phases, Rejected):
        return phases
    evals = 0 if run.eval_interval_tokens is None else int(run.tokens // run.eval_interval_tokens)
    work_s = sum(p.work_s for p in phases) + evals * run.eval_s
    ckpt_bytes = checkpoint_bytes(count_moe_parameters(model).total_with_mtp, plan.precision)
    estimate, mc, ckpt_s = _failures(work_s, ckpt_bytes, plan.num_gpus, failures)
    wall_s = work_s if estimate is None else estimate.wall_s
    power = power_draw(profile) if profile.max_power_w is not None else None
    gpu_j = None
    if power is not None:
        gpu_j = _gpu_energy_j(phases, estimate, failures, power, plan, work_s=work_s)
    energy_j = gpu_j
    if gpu_j is not None and facility is not None:
        energy_j = facility_energy_j(
            gpu_j,
            wall_s=wall_s,
            num_gpus=plan.num_gpus,
            gpus_per_node=profile.gpus_per_node,
            facility=facility,
        )
    cost = None
    if prices is not None:
        cost = plan.num_gpus * wall_s / SECONDS_PER_HOUR * prices.gpu_hour_usd(profile.name)
        if prices.usd_per_kwh is not None and energy_j is not None:
            cost += energy_j / JOULES_PER_KWH * prices.usd_per_kwh
    return RunEstimate(
        num_gpus=plan.num_gpus,
        phases=phases,
        work_s=work_s,
        wall_s=wall_s,
        goodput=estimate,
        monte_carlo=mc,
        checkpoint_bytes=ckpt_bytes,
        checkpoint_s=ckpt_s,
        gpu_energy_j=gpu_j,
        energy_j=energy_j,
        power=power,
        cost_usd=cost,
        deadline_s=run.deadline_s,
    )


def _failures(
    work_s: float, ckpt_bytes: float, num_gpus: int, failures: FailureModel | None
) -> tuple[GoodputEstimate | None, MonteCarloGoodput | None, float | None]:
    """Daly's expectation, its Monte Carlo check and the checkpoint write seconds."""
    if failures is None or work_s <= 0:
        return None, None, None
    ckpt_s = ckpt_bytes / failures.checkpoint_write_bytes_per_s
    mtbf_s = failures.mtbf_s(num_gpus)
    interval = failures.checkpoint_interval_s
    estimate = goodput(
        work_s=work_s,
        checkpoint_s=ckpt_s,
        restart_s=failures.restart_s,
        mtbf_s=mtbf_s,
        interval_s=None if interval is None else min(interval, work_s),
    )
    mc = monte_carlo_goodput(
        work_s=work_s,
        interval_s=estimate.interval_s,
        checkpoint_s=ckpt_s,
        restart_s=failures.restart_s,
        mtbf_s=mtbf_s,
        num_trials=MONTE_CARLO_TRIALS,
        seed=0,
    )
    return estimate, mc, ckpt_s


def _gpu_energy_j(
    phases: tuple[PhaseEstimate, ...],
    estimate: GoodputEstimate | None,
    failures: FailureModel | None,
    power: PowerDraw,
    plan: ParallelPlan,
    *,
    work_s: float,
) -> float:
    """GPU joules of a run of ``work_s`` failure-free seconds: the phases' steps at their
    activities' power, the rest of ``work_s`` (data loading and evaluations) at idle power
    (the GPUs wait on the input pipeline; an evaluation's forward passes are a small share of
    a run); with failures, re-done work at the mean training power and checkpoints and
    restarts at idle power."""
    n = plan.num_gpus
    train_j = sum(p.steps * step_gpu_energy_j(p.activity, power, num_gpus=n) for p in phases)
    steps_s = sum(p.steps * p.evaluation.step_time_s for p in phases)
    overhead_j = (work_s - steps_s) * power.idle_w * n
    if estimate is None or failures is None or steps_s <= 0:
        return train_j + overhead_j
    restarts_s = estimate.expected_failures * failures.restart_s
    rework_s = max(estimate.lost_s - restarts_s, 0.0)
    idle_s = estimate.checkpoint_s_total + restarts_s
    return train_j * (1 + rework_s / steps_s) + idle_s * power.idle_w * n + overhead_j


def run_columns(est: RunEstimate) -> dict[str, float | int | bool | None]:
    """The run columns of a ranked table, sweep row or JSON plan (days, GPU-hours, MWh,
    dollars, percent, minutes): ``days``, ``gpu_hours``,
    ``energy_mwh``, ``cost_usd`` (None without prices), ``goodput_pct`` and
    ``checkpoint_interval_min`` (None without a failure model); ``meets_deadline`` first
    when the run has a deadline."""
    gp = est.goodput
    deadline = {} if est.meets_deadline is None else {"meets_deadline": est.meets_deadline}
    return {
        **deadline,
        "days": round(est.days, 2),
        "gpu_hours": round(est.gpu_hours),
        "energy_mwh": None if est.energy_mwh is None else round(est.energy_mwh, 3),
        "cost_usd": None if est.cost_usd is None else round(est.cost_usd),
        "goodput_pct": None if gp is None else round(100 * gp.goodput_fraction, 2),
        "checkpoint_interval_min": None if gp is None else round(gp.interval_s / 60.0, 2),
    }


class Objective(ChoiceEnum):
    """What ``plansim plan --objective`` ranks plans by (lowest first)."""

    STEP_TIME = "step-time"  # simulated seconds per step (the search's own order)
    TIME_TO_TRAIN = "time-to-train"  # expected wall time of the whole run
    COST = "cost"  # dollars of the whole run (needs a price table)
    ENERGY = "energy"  # joules of the whole run (needs the profile's power)


def objective_value(objective: Objective, ev: Evaluation, est: RunEstimate | None) -> float:
    """The quantity ``objective`` ranks by for one plan; ``inf`` when its run cannot be
    estimated (a ramp phase the layout cannot take), so such plans rank last.

    Raises:
        SpecError: cost without a price table, energy without a power figure.
    """
    if objective is Objective.STEP_TIME:
        return ev.step_time_s
    if est is None:
        return float("inf")
    if objective is Objective.TIME_TO_TRAIN:
        return est.wall_s
    if objective is Objective.COST:
        if est.cost_usd is None:
            raise SpecError("--objective cost needs --prices (a price per GPU-hour)")
        return est.cost_usd
    if est.energy_j is None:
        raise SpecError("--objective energy needs a hardware profile with max_power_w")
    return est.energy_j


def rank_runs(
    evaluations: Sequence[Evaluation],
    estimates: Sequence[RunEstimate | None],
    objective: Objective,
) -> list[int]:
    """Indices of ``evaluations`` ordered by ``objective``, the runs that meet their
    deadline first (ties: the step-time order they came in, so the order is deterministic).

    Raises:
        SpecError: as :func:`objective_value`.
    """
    keys = [
        (est is not None and est.meets_deadline is False, objective_value(objective, ev, est), i)
        for i, (ev, est) in enumerate(zip(evaluations, estimates, strict=True))
    ]
    return [i for _, _, i in sorted(keys)]


def estimate_runs(
    model: ModelSpec,
    evaluations: Sequence[Evaluation],
    profile: HardwareProfile,
    run: TrainingRun,
    *,
    failures: FailureModel | None = None,
    facility: Facility | None = None,
    prices: PriceTable | None = None,
) -> list[RunEstimate | Rejected]:
    """:func:`estimate_run` of each evaluated plan's layout, in order.

    Raises:
        SpecError: as :func:`estimate_run`.
    """
    return [
        estimate_run(
            model, ev.plan, profile, run, failures=failures, facility=facility, prices=prices
        )
        for ev in evaluations
    ]


def order_by_objective(
    evaluations: Sequence[Evaluation],
    outcomes: Sequence[RunEstimate | Rejected],
    objective: Objective,
) -> list[tuple[Evaluation, RunEstimate | Rejected]]:
    """The plans with their runs, best first by ``objective`` (:func:`rank_runs`; a plan
    whose run was rejected ranks last).

    Raises:
        SpecError: as :func:`objective_value`.
    """
    runs = [o if isinstance(o, RunEstimate) else None for o in outcomes]
    return [(evaluations[i], outcomes[i]) for i in rank_runs(evaluations, runs, objective)]
