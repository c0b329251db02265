"""What DTensor's TP all-reduces and FSDP2's units cost the validate run beyond the
collectives plansim prices (pure).

``plansim calibrate`` times a chain of tiny linears tensor-parallel over every rank and the
same chain as FSDP2 units (``plansim.calibrate.bench_host``): the profile's
``host_overhead.dtensor_all_reduce_*`` is one DTensor all-reduce of a tiny message, latency
and redistribution host work together, and ``host_overhead.fsdp_unit_*`` what one FSDP2
unit adds, its collectives' latencies and its hooks' host work together. The simulator
already charges each collective's time from the profile's curves, which includes the
latency, so the extra per collective is the measured figure less the collective's latency
(the alpha of its alpha-beta fit, ``comm.collective_latency_s``: what the model gives the
chain's messages, 64 B all-reduces of 2 x 8 fp32 activations and 288 B units of an 8 x 8
linear with its bias), never below 0. Likewise ``host_overhead.pipeline_action_*``
(``plansim.calibrate.bench_pipeline``): one ``torch.distributed.pipelining`` action's
seconds beyond its stage's ops, less the latency of the send/recv the simulator already
prices for each action's transfer.
Not the curve's time at that size: gloo's measured times below a few KiB scatter between
0.3 and 2 ms on the CI VM (TCP on loopback), far more than the alpha the fit gives over all
sizes. Nothing without the measured figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.comm import Collective, collective_latency_s, p2p_latency_s
from plansim.analytic.ranks import layout_groups
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import ParallelPlan

#: DTensor all-reduces of one layer's forward (the two row-parallel outputs, Shoeybi et al.
#: 2019 §3), as Megatron-LM; the backward count is ``simulated.dtensor_backward_all_reduces``.
FORWARD_ALL_REDUCES = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Extra:
    """Seconds added to a forward and to a backward."""

    forward_s: float
    backward_s: float


NONE = Extra(forward_s=0.0, backward_s=0.0)


def tp_all_reduce_extra(
    plan: ParallelPlan, profile: HardwareProfile, *, backward_all_reduces: int
) -> Extra:
    """Extra seconds of one layer's DTensor all-reduces: :data:`FORWARD_ALL_REDUCES` in
    forward, ``backward_all_reduces`` in backward (0 with tp == 1)."""
    host = profile.host_overhead
    if plan.tp == 1 or host is None or host.dtensor_all_reduce_forward_s is None:
        return NONE
    groups = layout_groups(plan, gpus_per_node=profile.gpus_per_node)
    priced = collective_latency_s(profile, collective=Collective.ALL_REDUCE, span=groups.tp)
    backward = host.dtensor_all_reduce_backward_s or 0.0
    return Extra(
        forward_s=FORWARD_ALL_REDUCES * max(0.0, host.dtensor_all_reduce_forward_s - priced),
        backward_s=backward_all_reduces * max(0.0, backward - priced),
    )


def fsdp_unit_extra(plan: ParallelPlan, profile: HardwareProfile) -> Extra:
    """Extra seconds of one FSDP2 unit (ZeRO-3 with dp > 1; else nothing): forward less one
    all-gather's priced time, backward less one all-gather's and one reduce-scatter's."""
    host = profile.host_overhead
    if plan.zero_stage != 3 or plan.dp == 1 or host is None or host.fsdp_unit_forward_s is None:
        return NONE
    span = layout_groups(plan, gpus_per_node=profile.gpus_per_node).dp_cp
    gather, scatter = (
        collective_latency_s(profile, collective=c, span=span)
        for c in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
    )
    backward = host.fsdp_unit_backward_s or 0.0
    return Extra(
        forward_s=max(0.0, host.fsdp_unit_forward_s - gather),
        backward_s=max(0.0, backward - gather - scatter),
    )


def pipeline_action_extra(plan: ParallelPlan, profile: HardwareProfile) -> Extra:
    """Extra seconds of one forward and one backward action of a pipeline (pp > 1; else
    nothing): the measured per-action figures less the latency of one pipeline send/recv
    (``comm.p2p_latency_s``)."""
    host = profile.host_overhead
    if plan.pp == 1 or host is None or host.pipeline_action_forward_s is None:
        return NONE
    across = layout_groups(plan, gpus_per_node=profile.gpus_per_node).pp.num_nodes > 1
    priced = p2p_latency_s(profile, inter_node=across)
    backward = host.pipeline_action_backward_s or 0.0
    return Extra(
        forward_s=max(0.0, host.pipeline_action_forward_s - priced),
        backward_s=max(0.0, backward - priced),
    )
