"""Parameter-server DP synchronisation: push/pull traffic, times and links (pure).

With ``plan.dp_sync`` = parameter-server, each worker (GPU) pushes its gradients to server
shards, the servers sum them and run the optimizer, and each worker pulls its updated
16-bit weights (Li et al., "Scaling Distributed Machine Learning with the Parameter
Server", OSDI 2014, §3.2 range push and pull, §4.3 keys partitioned over the servers;
Jiang et al., "BytePS", OSDI 2020, §3.1 and §4.1: traffic per worker and per server
against all-reduce).

Notation: a worker's message X (push: its fp32 gradient bytes, ``state_bytes_per_param``
``.grad`` per parameter, the bytes a ring all-reduce moves; pull: its 16-bit weights,
``.param`` per parameter, as the ZeRO-1 all-gather), n = dp * cp workers holding the same
weights (``groups.dp_cp``, m of them per node over N nodes), B = ``nic_bytes_per_s`` (one
NIC rail per GPU), B_nvl = the profile's NVLink sendrecv busbw at the per-server chunk, l =
the one-way latency of a message on the slowest tier crossed (``nic_latency_s`` across
nodes, the sendrecv curve's latency inside one: the figures ``comm.p2p_time_s`` uses).

Colocated servers (``ps_servers`` = 0; BytePS with k = 0, "sharded PS"): every worker also
serves 1/n of its DP group's shard. A worker sends X/n to each of the n - 1 other servers
and each server receives X/n from n - 1 workers, so worker and server move the same
(n - 1)X/n each way (no incast; BytePS §3.1: colocated PS has all-reduce's volume). Of it,
(n - m)X/n crosses the worker's NIC and (m - 1)X/n its NVLink (no in-node pre-aggregation:
each GPU is its own worker, Li et al.'s flat model; BytePS §4.2's local reduce is not
modelled), on separate links at once:

    t = 2 l + max((n - m) X / (n B), (m - 1) X / (n B_nvl(X / n)))

The optimizer runs on each worker over its 1/n shard (ZeRO-1's compute) before the pull.

Dedicated servers (``ps_servers`` = K > 0; Li et al.'s server group, BytePS with k CPU
machines): K processes outside the GPU nodes, each with one NIC of bandwidth B, each holding
1/K of every parameter of the job. A worker's whole message crosses its NIC (X/B); a
server's NIC carries 1/K of the message of each of the W = tp * pp * dp * cp workers, all
pushing at once, each flow getting an equal share B/W of it (processor sharing, as the
engine shares links), so a worker's X/K bytes to one server take W X/(K B):

    t = 2 l + max(X / B, W X / (K B)) = 2 l + X / B * max(1, W / K)

BytePS §3.1's nM/(kB) bottleneck of k < n servers (W = n without tp and pp): a server count
below the worker count makes the server NIC the bottleneck by W/K. With unequal shards
(the embedding on the edge stages) equal shares are an upper bound for the larger ones.
The servers update after all pushes and run Adam over their 1/K of ``job_parameters``
(``adam_step_bytes`` at the profile's streaming HBM rate: the profile describes no server,
so servers are taken as fast as the GPU's memory; CPU servers are slower, which is why
BytePS §5 moves the update back to the GPUs). The worker waits on its ``dp`` stream (kind
``ps_update``), then pulls.

Latency (alpha): one request/response round trip per phase, 2 l (a push is the data message
and its acknowledgement, a pull its request and the data; ps-lite's ``Wait`` returns on the
response), not the O(n) steps of a ring: the n - 1 (or K) messages of a phase go out at once
and their bytes are in the bandwidth term.

Segments (stream ``dp``, so they overlap compute like the ring reduction): ``ps_push``
after the rank's last backward, or per gradient bucket with ``overlap_grad_reduce`` (each
bucket a push of its own, round trip included: ``plansim.analytic.grad_buckets``); then
the optimizer (colocated) or ``ps_update`` (dedicated); then ``ps_pull``. Each names its
link (``nic`` when it leaves the node, else ``nvlink``) and its unstretched latency, for
``plansim.sim.links``.

Limits: the servers' NICs are not simulated as shared links (their load is in the costed
durations, like the other replicas' traffic); pushes of all workers are taken as concurrent
on dedicated servers (the pipeline ranks' pushes overlap when the push outlasts the
drain's stagger); no pipelining of push and pull (BytePS's tensor partitioning overlaps
them on full-duplex NICs); no asynchronous or bounded-delay consistency (Li et al. §3.5):
synchronous SGD.
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.analytic.comm import Collective
from plansim.analytic.elementwise import adam_step_bytes
from plansim.analytic.memory import plan_state_bytes, rank_parameters
from plansim.analytic.ranks import LayoutGroups, dp_cp_size
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import DpSync, ParallelPlan
from plansim.specs.work import Segment

#: Segment kinds of the parameter-server sync (reports tell them from the ring's dp_comm).
PUSH_KIND = "ps_push"
PULL_KIND = "ps_pull"
UPDATE_KIND = "ps_update"


def uses_parameter_server(plan: ParallelPlan) -> bool:
    """True when the plan synchronises through servers: dp_sync parameter-server with
    dedicated servers, or colocated ones and more than one worker per DP group (one
    colocated worker is its own server: nothing moves, as a ring over one rank)."""
    if plan.dp_sync is not DpSync.PARAMETER_SERVER:
        return False
    return plan.ps_servers > 0 or dp_cp_size(plan) > 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PsTraffic:
    """One worker's push or pull (see the module docstring for the equations).

    Attributes:
        message_bytes: X, the worker's message (gradients or 16-bit weights), bytes.
        worker_nic_bytes: bytes crossing the worker's NIC, one direction.
        worker_nvlink_bytes: bytes on the worker's NVLink (colocated servers in its node).
        server_bytes: bytes one server moves in the phase (received on push, sent on pull):
            (n - 1)X/n colocated, W X / K dedicated (every worker's message taken as X).
        num_servers: servers the worker exchanges with (n - 1 colocated others, or K).
        incast: a server's bytes over the worker's NIC bytes: W / K dedicated, 1
            colocated; > 1 means the server's NIC is the bottleneck by that factor.
        link: ``nic`` when the traffic leaves the node, else ``nvlink``.
        latency_s: one request/response round trip, 2 l.
        duration_s: latency_s plus the slower of the NIC and NVLink bandwidth terms.
    """

    message_bytes: float
    worker_nic_bytes: float
    worker_nvlink_bytes: float
    server_bytes: float
    num_servers: int
    incast: float
    link: str
    latency_s: float
    duration_s: float

    def segment(self, kind: str) -> Segment:
        """The phase as a ``dp``-stream Segment with its link and latency."""
        return Segment(
            kind=kind,
            stream="dp",
            duration_s=self.duration_s,
            num_bytes=self.message_bytes,
            link=self.link,
            latency_s=min(self.latency_s, self.duration_s),
        )


def _one_way_latency_s(profile: HardwareProfile, groups: LayoutGroups, dedicated: bool) -> float:
    """l: a message's latency on the slowest tier crossed (``comm.p2p_time_s``'s alphas)."""
    if dedicated or groups.dp_cp.num_nodes > 1:
        return profile.nic_latency_s
    return profile.intra_node[Collective.SENDRECV.value].latency_s


def ps_transfer(
    plan: ParallelPlan, profile: HardwareProfile, groups: LayoutGroups, *, message_bytes: float
) -> PsTraffic:
    """One push or pull of ``message_bytes`` (X) by one worker (module docstring).

    Returns:
        The traffic; zero bytes and seconds when the plan does not use servers
        (:func:`uses_parameter_server`) or X <= 0.
    """
    if not uses_parameter_server(plan) or message_bytes <= 0:
        return PsTraffic(
            message_bytes=0.0, worker_nic_bytes=0.0, worker_nvlink_bytes=0.0, server_bytes=0.0,
            num_servers=0, incast=1.0, link="", latency_s=0.0, duration_s=0.0,
        )  # fmt: skip
    n = dp_cp_size(plan)
    dedicated = plan.ps_servers > 0
    latency_s = 2.0 * _one_way_latency_s(profile, groups, dedicated)
    if dedicated:
        incast = plan.num_gpus / plan.ps_servers
        nic_bytes, nvl_bytes, servers = message_bytes, 0.0, plan.ps_servers
        server_bytes = incast * message_bytes
        nic_s = max(nic_bytes, server_bytes) / profile.nic_bytes_per_s
        nvl_s = 0.0
    else:
        m = groups.dp_cp.members_per_node
        nic_bytes = (n - m) * message_bytes / n
        nvl_bytes = (m - 1) * message_bytes / n
        servers, incast = n - 1, 1.0
        server_bytes = nic_bytes + nvl_bytes
        nic_s = nic_bytes / profile.nic_bytes_per_s
        sendrecv = profile.intra_node[Collective.SENDRECV.value]
        nvl_s = nvl_bytes / sendrecv.busbw_bytes_per_s(message_bytes / n) if nvl_bytes else 0.0
    return PsTraffic(
        message_bytes=message_bytes,
        worker_nic_bytes=nic_bytes,
        worker_nvlink_bytes=nvl_bytes,
        server_bytes=server_bytes,
        num_servers=servers,
        incast=incast,
        link="nic" if nic_bytes > 0 else "nvlink",
        latency_s=latency_s,
        duration_s=latency_s + max(nic_s, nvl_s),
    )


def job_parameters(model: ModelSpec, plan: ParallelPlan) -> float:
    """Parameters of one DP replica summed over its tp * pp model shards (``rank_parameters``
    per pipeline rank, times tp; replicated norms once per tp rank, as each worker holds
    them): what the dedicated servers hold together."""
    total = sum(rank_parameters(model, plan, rank=r) for r in sorted({0, plan.pp - 1}))
    if plan.pp > 2:
        total += (plan.pp - 2) * rank_parameters(model, plan, rank=1)
    return plan.tp * total


def ps_push(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    rank: int,
) -> PsTraffic:
    """The push of pipeline rank ``rank``'s gradients (``plan_state_bytes(plan).grad`` bytes
    per parameter: the main gradients a ring would all-reduce, fp32 unless reduced in bf16)."""
    per_param = plan_state_bytes(plan).grad
    return _rank_transfer(model, plan, profile, groups, rank=rank, bytes_per_param=per_param)


def ps_pull(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    rank: int,
) -> PsTraffic:
    """The pull of pipeline rank ``rank``'s updated 16-bit weights (``.param`` bytes per
    parameter, as the ZeRO-1 all-gather)."""
    per_param = plan_state_bytes(plan).param
    return _rank_transfer(model, plan, profile, groups, rank=rank, bytes_per_param=per_param)


def _rank_transfer(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    rank: int,
    bytes_per_param: float,
) -> PsTraffic:
    """:func:`ps_transfer` of pipeline rank ``rank``'s parameters at ``bytes_per_param``."""
    message = rank_parameters(model, plan, rank=rank) * bytes_per_param
    return ps_transfer(plan, profile, groups, message_bytes=message)


@dataclass(frozen=True, slots=True, kw_only=True)
class PsRankWork:
    """A pipeline rank's once-per-step parameter-server segments.

    Attributes:
        push: ``ps_push`` (empty when the stages' gradient buckets carry it).
        optimizer: the update (``optimizer`` on the compute stream over the rank's 1/n
            shard with colocated servers; ``ps_update`` on ``dp`` while dedicated servers
            run it), then ``ps_pull``.
    """

    push: tuple[Segment, ...]
    optimizer: tuple[Segment, ...]


def ps_rank_work(
    model: ModelSpec,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    *,
    rank: int,
) -> PsRankWork:
    """Push (unless ``plan.overlap_grad_reduce`` buckets it), update and pull of ``rank``.

    Update seconds: ``adam_step_bytes`` of the parameters updated, at
    ``profile.streaming_bytes_per_s()``: the rank's params / n colocated (ZeRO-1's shard),
    ``job_parameters`` / K on a dedicated server.
    """
    params = rank_parameters(model, plan, rank=rank)
    push = ps_push(model, plan, profile, groups, rank=rank)
    pull = ps_pull(model, plan, profile, groups, rank=rank)
    rate = profile.streaming_bytes_per_s()
    if plan.ps_servers > 0:
        update_s = adam_step_bytes(job_parameters(model, plan) / plan.ps_servers) / rate
        update = Segment(kind=UPDATE_KIND, stream="dp", duration_s=update_s)
    else:
        update_s = adam_step_bytes(params / dp_cp_size(plan)) / rate
        update = Segment(kind="optimizer", stream="compute", duration_s=update_s)
    pushes = () if plan.overlap_grad_reduce or push.duration_s <= 0 else (push.segment(PUSH_KIND),)
    pulls = (pull.segment(PULL_KIND),) if pull.duration_s > 0 else ()
    return PsRankWork(push=pushes, optimizer=(update, *pulls))
