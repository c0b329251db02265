"""Collective and point-to-point times on the tiers a group spans (alpha-beta, pure).

Inside one node a collective uses the profile's measured bus-bandwidth curve (nccl-tests
busbw definition). A group spanning nodes runs NCCL rings/trees over one NIC rail per GPU:
with C channels each crossing the node boundary on a different NIC, the traffic that leaves a
node is spread over the NICs of the group's members in that node, so the inter-node
bottleneck bandwidth per rank is members_per_node * nic_bytes_per_s (NCCL ring model; cf. the
2-node H100 all_reduce of N02, 339 GB/s busbw against 8 x 48 GB/s NICs, N14). The chunked ring
pipelines the intra- and inter-node hops, so the busbw is the slower of the two tiers.

    time = alpha + bus_factor(collective, n) * S / busbw
    busbw = intra-node busbw(S)                            (one node)
          = min(intra-node busbw(S), members_per_node * nic_bytes_per_s)   (several nodes)
    alpha = intra-node latency + nic_latency_s * ceil(log2(num_nodes))  (tree depth; N02:
            a 2-node all_reduce of 8 B takes one nic_latency_s)

Limits: no congestion between concurrent collectives (issue 3), no NVLS/SHARP special cases
beyond what the measured curves contain, no degradation at very large node counts.
"""

from __future__ import annotations

import math

from plansim.analytic.ranks import GroupSpan
from plansim.specs.hardware import HardwareProfile, bus_factor


def collective_time_s(
    profile: HardwareProfile, *, collective: str, message_bytes: float, span: GroupSpan
) -> float:
    """Seconds for one collective of ``message_bytes`` over a group with ``span``.

    ``message_bytes`` is nccl-tests' size: the buffer being all-reduced, the full output of an
    all-gather, the full input of a reduce-scatter, the message of a send/recv.

    Raises:
        SpecError: unknown collective.
    """
    if span.size <= 1 or message_bytes <= 0:
        return 0.0
    curve = profile.intra_node[collective]
    if span.num_nodes == 1:
        return curve.time_s(message_bytes, span.size)
    busbw = min(
        curve.busbw_bytes_per_s(message_bytes),
        span.members_per_node * profile.nic_bytes_per_s,
    )
    alpha = curve.latency_s + profile.nic_latency_s * math.ceil(math.log2(span.num_nodes))
    return alpha + bus_factor(collective, span.size) * message_bytes / busbw


def p2p_time_s(profile: HardwareProfile, *, message_bytes: float, inter_node: bool) -> float:
    """Seconds for one send/recv of ``message_bytes`` between two GPUs.

    Inside a node: the measured sendrecv curve. Across nodes: one NIC rail,
    nic_latency_s + S / nic_bytes_per_s.
    """
    if message_bytes <= 0:
        return 0.0
    if inter_node:
        return profile.nic_latency_s + message_bytes / profile.nic_bytes_per_s
    return profile.intra_node["sendrecv"].time_s(message_bytes, 2)
