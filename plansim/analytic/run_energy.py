"""Energy of training and the size of a checkpoint (pure).

Power by activity: a GPU draws ``max_power_w`` while its compute stream runs kernels (the
GEMMs of LLM training hold a GPU at its power limit: an A100 at 400 W lowers its clock on
random-data GEMMs, ``hardware_profiles`` HP10, which is why profiles carry a
``sustained_matmul_fraction``), ``communication_power_w`` while it only communicates (an
exposed collective) and ``idle_power_w`` while it waits (pipeline bubbles, waits on other
ranks, checkpoint writes, restarts). A profile with only the datasheet figure prices every
activity at it: an upper bound, and the method of Meta's model cards (each GPU at its peak
power capacity, adjusted for PUE: Touvron et al. 2023, Llama 2, Table 2); node measurements
(Latif et al. 2024, arXiv 2412.08602: an 8 x H100 node peaked at 8.4 kW of its rated 10.2 kW
training Llama-2-13B) show how far above the mean draw it can be.

Facility energy = (GPU energy + host power x nodes x wall + network power x GPUs x wall) x
PUE (``plansim.specs.facility``).

Checkpoint: the model state a restart needs, written once for the whole job whatever the
sharding (every DP replica holds the same weights; ZeRO shards the optimizer state, it does
not copy it): 16-bit weights plus the fp32 master weights and Adam's two moments, 2 + 12 =
14 bytes per parameter in mixed precision (the ZeRO paper's 2 + K, K = 12 without the
gradients, Rajbhandari et al. SC20 §3.1), 4 + 8 = 12 in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.errors import SpecError
from plansim.specs.facility import Facility
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import Precision

#: Joules per kWh.
JOULES_PER_KWH = 3.6e6
#: Bytes per parameter a checkpoint keeps: weights + fp32 master + Adam m, v (module docstring).
MIXED_PRECISION_CHECKPOINT_BYTES_PER_PARAM = 14.0
#: The same in fp32 training: weights (the master copy) + m, v.
FP32_CHECKPOINT_BYTES_PER_PARAM = 12.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerDraw:
    """Watts one GPU draws per activity, and what the figures rest on.

    Attributes:
        compute_w: while kernels run.
        communication_w: while only communication runs (exposed collectives).
        idle_w: while waiting.
        basis: what the figures rest on: the provenance kind of ``max_power_w``
            ("datasheet", "measured") and which activities fall back to it.
    """

    compute_w: float
    communication_w: float
    idle_w: float
    basis: str


def power_draw(profile: HardwareProfile) -> PowerDraw:
    """The profile's power by activity (module docstring).

    Raises:
        SpecError: the profile has no ``max_power_w`` (energy needs one; names the profile).
    """
    top = profile.max_power_w
    if top is None:
        raise SpecError(
            f"hardware profile {profile.name!r} has no max_power_w: energy needs the GPU's "
            "power (add max_power_w with its source to the profile)"
        )
    comm, idle = profile.communication_power_w, profile.idle_power_w
    return PowerDraw(
        compute_w=top,
        communication_w=top if comm is None else comm,
        idle_w=top if idle is None else idle,
        basis=_basis(profile),
    )


def _basis(profile: HardwareProfile) -> str:
    """What the power figures rest on, in words (the profile's provenance kinds)."""
    kind = profile.provenance.get("max_power_w", "").split(":")[0] or "given"
    missing = [
        name
        for name, value in (
            ("communication", profile.communication_power_w),
            ("idle", profile.idle_power_w),
        )
        if value is None
    ]
    if len(missing) == 2:
        return f"{kind} max power for every activity (upper bound)"
    if missing:
        return f"{kind} power by activity, {missing[0]} at max power (upper bound)"
    return f"{kind} power by activity"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepActivity:
    """Seconds of one step a GPU spends in each activity (mean over the pipeline ranks;
    they add up to the step time).

    Attributes:
        compute_s: the compute stream runs kernels.
        communication_s: communication runs and the compute stream waits on it.
        idle_s: the rest (bubbles, waits on other ranks).
    """

    compute_s: float
    communication_s: float
    idle_s: float

    @property
    def step_s(self) -> float:
        """The step time the activities add up to."""
        return self.compute_s + self.communication_s + self.idle_s


def step_gpu_energy_j(activity: StepActivity, power: PowerDraw, *, num_gpus: int) -> float:
    """Joules all ``num_gpus`` GPUs draw in one step: sum over activities of seconds x watts."""
    per_gpu = (
        activity.compute_s * power.compute_w
        + activity.communication_s * power.communication_w
        + activity.idle_s * power.idle_w
    )
    return per_gpu * num_gpus


def facility_energy_j(
    gpu_energy_j: float, *, wall_s: float, num_gpus: int, gpus_per_node: int, facility: Facility
) -> float:
    """Facility joules of a run whose GPUs drew ``gpu_energy_j`` over ``wall_s`` seconds
    (module formula)."""
    nodes = -(-num_gpus // gpus_per_node)
    it_j = (
        gpu_energy_j
        + facility.host_power_w_per_node * nodes * wall_s
        + facility.network_power_w_per_gpu * num_gpus * wall_s
    )
    return it_j * facility.pue


def checkpoint_bytes(num_params: float, precision: Precision) -> float:
    """Bytes of one checkpoint of a model of ``num_params`` parameters trained in
    ``precision`` (module docstring)."""
    per_param = (
        FP32_CHECKPOINT_BYTES_PER_PARAM
        if precision is Precision.FP32
        else MIXED_PRECISION_CHECKPOINT_BYTES_PER_PARAM
    )
    return num_params * per_param
