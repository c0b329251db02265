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
          = min(intra-node busbw(S), members_per_node * nic_bytes_per_s * m(S))
            (several nodes; all-gather and reduce-scatter times the ring fraction below)
    alpha = intra-node latency + nic_latency_s * ceil(log2(num_nodes))  (all-reduce: tree
            depth; N02: a 2-node all_reduce of 8 B takes one nic_latency_s)

m(S) is the fraction of the line rate a multi-node run reached at message size S (the
profile's ``inter_node_message_fraction``, imported from nccl-tests across nodes; 1 without
it): a transfer across nodes needs larger messages than NVLink to reach its rate (N02 2 x 8
H100: 951.6 us for a 16 MiB all_reduce where the NVLink-shaped curve capped at the line rate
gives 240 us).

All-gather and reduce-scatter have no tree in NCCL: across nodes they run as one ring of all
n ranks, whose latency grows with n, not log n. For them (:func:`ring_collective_time_s`)
plansim uses NCCL's own tuning model (``src/graph/tuning.cc``, ``ncclTopoTuneModel``, NCCL
2.18-2.21), taking the fastest of its three protocols as NCCL's tuner does:

    time = min over protocol p of  lat_p + bus_factor * S / (busbw * bw_fraction_p)
    lat_p = base_p + (nsteps - nInter) * max(intra_p, net_overhead_p) + nInter * net_p
    nsteps = n - 1, nInter = num_nodes - 1

with the tuning.cc constants (us): base LL 6.6, LL128 14.0, Simple 8.4 (``baseLat`` ring);
NVLink per step LL 0.6, LL128 1.9, Simple 3.4 and network per step LL 2.7, LL128 4.0,
Simple 14.0 (``hwLat`` ring); the per-step network post overhead of an Intel host 1 us, x3
for Simple (``getNetOverhead``); LL moves data at 1/4 of the bus bandwidth across nodes
(capped at ``llMaxBw`` 20.4 GB/s), LL128 at 0.92 of it. At 1536 ranks on 192 nodes a 24 KiB
all-gather costs ~1.9 ms (LL), a large one ~3.3 ms of latency (LL128): the term that makes
many small sharded-parameter gathers slow at scale (``plansim.analytic.zero3``).

A ring waits at every step for its slowest link, so the longer it runs over the fabric the
less bandwidth it keeps: N16 (NVIDIA/nccl issue #1229, H100 reduce_scatter with the ring
across nodes) measured busbw 360, 345, 320, 300, 280 and 260 GB/s on 4, 8, 16, 32, 64 and
128 nodes. The profile's ``inter_node_ring_fraction`` holds that loss as a fraction of the
bus bandwidth by node count (clamped outside the measured counts, not extrapolated), and
all-gather and reduce-scatter spanning nodes run at ``busbw * fraction(num_nodes)``.
All-reduce is left at its rate: across nodes NCCL runs it as a tree, which N15 (248 nodes x 8
H200, about 350 GB/s) and N11 (4 nodes, 365 GB/s) show holding its bandwidth.

Limits: no congestion between concurrent collectives (issue 3), no NVLS/SHARP/CollNet or
PAT algorithms beyond what the measured curves contain.
"""

from __future__ import annotations

import math

from plansim.analytic.ranks import GroupSpan
from plansim.errors import SpecError
from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.curves import bus_factor
from plansim.specs.hardware import HardwareProfile


class Collective(ChoiceEnum):
    """A collective as nccl-tests names it; the values are the keys of
    ``HardwareProfile.intra_node`` and of a profile file's ``intra_node:`` section
    (``plansim.specs.curves.COLLECTIVES``, in that order)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    SENDRECV = "sendrecv"


#: Collectives NCCL runs only as rings across nodes (no tree): all-gather, reduce-scatter.
RING_ONLY = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


def collective_time_s(
    profile: HardwareProfile, *, collective: Collective, message_bytes: float, span: GroupSpan
) -> float:
    """Seconds for one collective of ``message_bytes`` over a group with ``span``.

    ``message_bytes`` is nccl-tests' size: the buffer being all-reduced, the full output of an
    all-gather, the full input of a reduce-scatter, the message of a send/recv.

    Raises:
        SpecError: ``collective`` is neither a :class:`Collective` nor one's value.
    """
    collective = Collective.parse(collective, field="collective")
    if span.size <= 1 or message_bytes <= 0:
        return 0.0
    curve = profile.intra_node[collective.value]
    if span.num_nodes == 1:
        return curve.time_s(message_bytes, span.size)
    busbw = min(
        curve.busbw_bytes_per_s(message_bytes),
        span.members_per_node
        * profile.nic_bytes_per_s
        * profile.message_busbw_fraction(message_bytes),
    )
    if collective in RING_ONLY:
        busbw *= profile.ring_busbw_fraction(span.num_nodes)
        return ring_collective_time_s(
            collective=collective, message_bytes=message_bytes, span=span, busbw_bytes_per_s=busbw
        )
    alpha = collective_latency_s(profile, collective=collective, span=span)
    return alpha + bus_factor(collective.value, span.size) * message_bytes / busbw


def sharded_reduce_time_s(
    profile: HardwareProfile, *, message_bytes: float, shard: GroupSpan, replicate: GroupSpan
) -> float:
    """Seconds to reduce ``message_bytes`` of gradients onto their shard owners: a
    reduce-scatter over the ``shard`` group, then, with hybrid sharding (``replicate`` of
    more than one rank), an all-reduce of each shard over its replicas (PyTorch FSDP
    ``HYBRID_SHARD``; Megatron-core's partial distributed optimizer,
    ``--num-distributed-optimizer-instances``: reduce-scatter inside an instance, all-reduce
    across instances)."""
    scatter = collective_time_s(
        profile, collective=Collective.REDUCE_SCATTER, message_bytes=message_bytes, span=shard
    )
    return scatter + collective_time_s(
        profile,
        collective=Collective.ALL_REDUCE,
        message_bytes=message_bytes / shard.size,
        span=replicate,
    )


def collective_latency_s(
    profile: HardwareProfile, *, collective: Collective, span: GroupSpan
) -> float:
    """The latency (alpha) :func:`collective_time_s` gives ``collective`` over ``span``: the
    curve's inside a node; across nodes, all-reduce and send/recv add ``nic_latency_s`` per
    tree level (module docstring), all-gather and reduce-scatter take the fastest NCCL ring
    protocol's latency (:func:`ring_latency_s`).

    Raises:
        SpecError: ``collective`` is neither a :class:`Collective` nor one's value.
    """
    collective = Collective.parse(collective, field="collective")
    curve = profile.intra_node[collective.value]
    if span.num_nodes == 1:
        return curve.latency_s
    if collective in RING_ONLY:
        return min(
            ring_latency_s(name, num_ranks=span.size, num_nodes=span.num_nodes)
            for name in _NCCL_RING_PROTOCOLS
        )
    return curve.latency_s + profile.nic_latency_s * math.ceil(math.log2(span.num_nodes))


#: NCCL ring tuning constants (``src/graph/tuning.cc``, NCCL 2.18-2.21), per protocol:
#: (base latency, NVLink latency per step, network latency per step, net post overhead per
#: step on an Intel host, fraction of the bus bandwidth, cap on that bandwidth), seconds and
#: bytes/s. See the module docstring.
_NCCL_RING_PROTOCOLS = {
    "LL": (6.6e-6, 0.6e-6, 2.7e-6, 1.0e-6, 0.25, 20.4e9),
    "LL128": (14.0e-6, 1.9e-6, 4.0e-6, 1.0e-6, 0.92, math.inf),
    "Simple": (8.4e-6, 3.4e-6, 14.0e-6, 3.0e-6, 1.0, math.inf),
}


def ring_latency_s(protocol: str, *, num_ranks: int, num_nodes: int) -> float:
    """NCCL's latency of one all-gather or reduce-scatter ring over ``num_ranks`` ranks on
    ``num_nodes`` nodes with ``protocol`` (LL, LL128 or Simple), seconds (module docstring).

    Raises:
        SpecError: unknown protocol, or fewer ranks than nodes.
    """
    if protocol not in _NCCL_RING_PROTOCOLS:
        names = ", ".join(_NCCL_RING_PROTOCOLS)
        raise SpecError(f"protocol={protocol!r} is not allowed; choose one of: {names}")
    base, intra, net, overhead, _, _ = _NCCL_RING_PROTOCOLS[protocol]
    if not 1 <= num_nodes <= num_ranks:
        raise SpecError(f"num_nodes({num_nodes}) must be in [1, num_ranks({num_ranks})]")
    steps, inter = num_ranks - 1, num_nodes - 1
    per_intra = max(intra, overhead) if num_nodes > 1 else intra
    return base + (steps - inter) * per_intra + inter * net


def ring_collective_time_s(
    *, collective: Collective, message_bytes: float, span: GroupSpan, busbw_bytes_per_s: float
) -> float:
    """Seconds for an all-gather or reduce-scatter ring spanning nodes: the fastest NCCL
    protocol's latency (:func:`ring_latency_s`) plus the bytes at that protocol's share of
    ``busbw_bytes_per_s`` (the tier bottleneck of :func:`collective_time_s`).

    Raises:
        SpecError: ``collective`` is neither a :class:`Collective` nor one's value.
    """
    volume = (
        bus_factor(Collective.parse(collective, field="collective").value, span.size)
        * message_bytes
    )
    return min(
        ring_latency_s(name, num_ranks=span.size, num_nodes=span.num_nodes)
        + volume / min(busbw_bytes_per_s * fraction, cap)
        for name, (_, _, _, _, fraction, cap) in _NCCL_RING_PROTOCOLS.items()
    )


def p2p_latency_s(profile: HardwareProfile, *, inter_node: bool) -> float:
    """The latency (alpha) :func:`p2p_time_s` gives a send/recv: ``nic_latency_s`` across
    nodes, the send/recv curve's inside a node."""
    return (
        profile.nic_latency_s
        if inter_node
        else profile.intra_node[Collective.SENDRECV.value].latency_s
    )


def p2p_time_s(profile: HardwareProfile, *, message_bytes: float, inter_node: bool) -> float:
    """Seconds for one send/recv of ``message_bytes`` between two GPUs.

    Inside a node: the measured sendrecv curve. Across nodes: one NIC rail,
    nic_latency_s + S / nic_bytes_per_s.
    """
    if message_bytes <= 0:
        return 0.0
    if inter_node:
        return profile.nic_latency_s + message_bytes / profile.nic_bytes_per_s
    return profile.intra_node[Collective.SENDRECV.value].time_s(message_bytes, 2)


#: Profile key of the measured all-to-all curve (optional; nccl-tests ``alltoall_perf``).
ALL_TO_ALL = "all_to_all"


def all_to_all_time_s(profile: HardwareProfile, *, message_bytes: float, span: GroupSpan) -> float:
    """Seconds of one all-to-all over a group with ``span``, ``message_bytes`` the whole send
    buffer of one rank (nccl-tests ``alltoall_perf`` "size"); 1/n of it stays on the rank.

    Each rank sends (n - 1)/n of its buffer (the nccl-tests busbw factor of alltoall,
    ``doc/PERFORMANCE.md``). Inside one node the bytes move at the profile's measured
    all-to-all bus bandwidth (``intra_node.all_to_all``), or, where the profile has no such
    curve, at its all-gather curve's: NCCL runs both as peer-to-peer copies over the same
    NVLink/NVSwitch ports with the same per-rank volume, so this is the estimate a datasheet
    profile allows (stated limit: NCCL's all-to-all launches n - 1 sends per rank and is
    slower at small messages than the all-gather ring measured there). Across nodes each
    rank's share for the ranks outside its node, S x (n - m)/n with m members per node,
    leaves through its own NIC rail (NCCL's PXN routes a peer on another rail through the
    NVLink of that rail's GPU), at ``nic_bytes_per_s`` x the multi-node message fraction;
    the node-local share moves over NVLink meanwhile, so the slower of the two sets the
    time (DeepSeek-V3 report arXiv:2412.19437 §3.2.2: IB 50 GB/s against NVLink 160 GB/s
    per H800, which is why it limits each token to 4 nodes). alpha: the curve's latency,
    plus ``nic_latency_s`` across nodes.
    """
    if span.size <= 1 or message_bytes <= 0:
        return 0.0
    curve = profile.intra_node.get(ALL_TO_ALL) or profile.intra_node[Collective.ALL_GATHER.value]
    if span.num_nodes == 1:  # both curves' bus factor is (n - 1)/n
        return curve.time_s(message_bytes, span.size)
    n, m = span.size, span.members_per_node
    local_volume = message_bytes * (m - 1) / n
    intra_s = local_volume / curve.busbw_bytes_per_s(message_bytes) if m > 1 else 0.0
    remote_volume = message_bytes * (n - m) / n
    nic = profile.nic_bytes_per_s * profile.message_busbw_fraction(message_bytes)
    return curve.latency_s + profile.nic_latency_s + max(intra_s, remote_volume / nic)


def deduplicated_all_to_all_time_s(
    profile: HardwareProfile,
    *,
    network_bytes: float,
    nvlink_bytes: float,
    message_bytes: float,
    span: GroupSpan,
) -> float:
    """Seconds of one node-deduplicated dispatch or combine (DeepEP's internode kernels,
    DeepSeek-V3 arXiv:2412.19437 §3.2.2) over a group with ``span``: ``network_bytes`` each
    rank sends to other nodes (once per destination node, through its own NIC rail, to the
    GPU of the same in-node index) and ``nvlink_bytes`` it moves inside nodes (forwarding to
    the experts), the two at once, the slower setting the time; the NVLink side at the
    profile's all-to-all (or all-gather) bus bandwidth for ``message_bytes``, the network at
    ``nic_bytes_per_s`` x the multi-node message fraction. Inside one node it is the plain
    all-to-all of ``message_bytes`` (:func:`all_to_all_time_s`). alpha: the curve's latency
    plus ``nic_latency_s``."""
    if span.num_nodes == 1 or message_bytes <= 0:
        return all_to_all_time_s(profile, message_bytes=message_bytes, span=span)
    curve = profile.intra_node.get(ALL_TO_ALL) or profile.intra_node[Collective.ALL_GATHER.value]
    intra_s = nvlink_bytes / curve.busbw_bytes_per_s(message_bytes)
    nic = profile.nic_bytes_per_s * profile.message_busbw_fraction(message_bytes)
    return curve.latency_s + profile.nic_latency_s + max(intra_s, network_bytes / nic)
