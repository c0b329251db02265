"""One pipeline send of a micro-batch's activations or their gradients (pure).

Priced from the plan's TP split of the tensor (Megatron-LM: sequence parallelism, or the
scatter/gather optimisation of Narayanan et al. SC21 §4.1, or whole tensors as in 2020) and
the profile's send/recv and all-gather curves.
"""

from __future__ import annotations

from plansim.analytic.comm import Collective, collective_time_s, p2p_time_s
from plansim.analytic.ranks import LayoutGroups
from plansim.analytic.tp_comm import hidden_message_bytes
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import P2P


def pipeline_send(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups
) -> P2P:
    """One pipeline send of a micro-batch's b*(s/cp)*h activations (or their gradients).

    Sequence parallel: each TP rank holds and sends its s/tp tokens. Scatter/gather
    (``plan.scatter_gather_p2p``, Narayanan et al. SC21 §4.1): each TP rank sends a 1/tp
    slice and the receiver all-gathers the tensor over its TP group before using it; the
    all-gather is the P2P's ``latency_s`` (it does not load the link between the stages).
    Neither: every TP rank sends the whole tensor on its own link.
    """
    tensor_bytes = hidden_message_bytes(model, plan)
    split = plan.sequence_parallel or plan.scatter_gather_p2p
    p2p_bytes = tensor_bytes / plan.tp if split else tensor_bytes
    gather_s = 0.0
    if plan.scatter_gather_p2p and not plan.sequence_parallel and plan.tp > 1:
        gather_s = collective_time_s(
            profile, collective=Collective.ALL_GATHER, message_bytes=tensor_bytes, span=groups.tp
        )
    link_s = p2p_time_s(profile, message_bytes=p2p_bytes, inter_node=groups.pp.num_nodes > 1)
    return P2P(duration_s=link_s + gather_s, num_bytes=p2p_bytes, latency_s=gather_s)
