"""The simulated ranks' communication resources (thin over SimPy): FIFO streams and links.

**Streams** (``plansim.sim.streams.FifoStream``): a rank's ``pp_send`` and ``dp`` streams carry
one transfer at a time, first come first served (one NCCL communicator / CUDA stream each).

**Links** (:class:`Network`): each GPU has an NVLink, a NIC and a PCIe link; each node has
its host memory. A transfer loads the links it uses for its bandwidth-bound part, and the
transfers active on one link share it equally (processor sharing, as a fair-queueing
switch port or a DMA engine interleaving copies would): with n of them on a link, each
moves at 1/n of the rate it has alone. When a transfer joins or leaves a link, the
remaining bytes of the others on it are re-timed.

Transfer model (alpha-beta, Hockney 1994): a transfer of ``duration_s`` seconds alone, of
which ``latency_s`` is startup latency, first waits ``latency_s`` without loading any link,
then moves its bytes, which alone take ``duration_s - latency_s``. Costing already priced
that bandwidth part at what the profile says the transfer gets alone, so the engine needs
no link bandwidths: a transfer progresses at ``1 / max(n_l)`` of its lone rate, n_l the
transfers in their bandwidth part on link l, over the links it uses (the busiest one limits
it); its latency never stretches. Alone throughout, it ends exactly ``duration_s`` after it
started (the same float as a plain timeout).

Which links a transfer uses (``plansim.specs.work.LINKS``): NVLink and NIC are full duplex,
modelled as a sending and a receiving half. A collective (TP, DP, ZeRO) moves as much in as
out on every member (ring), so it loads both halves of its rank's link; a pipeline send loads
the sending half of the sender's link and the receiving half of the receiver's, so the two
directions between neighbours do not slow each other. A ``pcie`` transfer loads both halves
of the rank's PCIe link and its node's host memory (the contract carries no direction; a
``pcie`` send loads those of both ends).

Cost: a transfer that never shares a link costs one SimPy event (its end), like a plain
timeout; its latency's end is an event only when another transfer is on one of its links
by then. Each re-timing adds an event (the superseded end events fire and are ignored).

Limits: equal shares, not max-min fairness (a transfer held back by a busier link does not
leave its unused share to the others on a quieter one); no switch or rail congestion beyond
the GPU's own links; other replicas' traffic is not simulated (symmetry), so what they
load on a shared node resource must be in the costed durations.

Determinism: transfers are re-timed in the order they started; simultaneous events run in
SimPy's scheduling order, which depends only on the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import partial

import simpy

from plansim.specs.choice_enum import ChoiceEnum
from plansim.specs.work import PipelineWork

#: ``on_done(start_s, end_s)``, called when a transfer ends.
Done = Callable[[float, float], None]


class LinkKind(ChoiceEnum):
    """A GPU's links, one each per GPU: what a transfer can load on its rank
    (``plansim.specs.work.LINKS`` less "", no link modelled, in that order)."""

    NVLINK = "nvlink"
    NIC = "nic"
    PCIE = "pcie"  # with the node's host memory behind it


#: Per-GPU tiers (one link each per GPU) and the per-node one.
GPU_TIERS = tuple(link.value for link in LinkKind)
HOST_MEMORY = "host_memory"
SEND, RECV = "send", "recv"


class Link:
    """One link (or one direction of a full-duplex link), shared by its active transfers.

    Attributes:
        name: ``tier/owner[/half]``, e.g. ``nic/3/send`` or ``host_memory/0``.
        active: transfers on it from their start to their end, in start order; those past
            their latency share it.
    """

    __slots__ = ("active", "name", "sources")

    def __init__(self, name: str) -> None:
        self.name = name
        self.active: dict[Transfer, None] = {}  # an ordered set
        self.sources: set[Hashable] = set()  # what may put transfers on it (declare())


class Transfer:
    """A transfer in flight (what :meth:`Network.start` returns).

    Attributes:
        finished: it has ended.
        end_event: the event of its current end time. A process waits with
            ``while not t.finished: yield t.end_event`` (sharing may move the end; the
            event it waited on is then stale and it waits on the new one).
    """

    __slots__ = (
        "end_event",
        "end_s",
        "finished",
        "join_scheduled",
        "joins_at_s",
        "links",
        "on_done",
        "rate",
        "remaining_s",
        "since_s",
        "start_s",
    )

    def __init__(self, links: tuple[Link, ...], start_s: float, on_done: Done | None) -> None:
        self.links = links
        self.start_s = start_s
        self.on_done = on_done
        self.finished = False
        self.end_event: simpy.Event  # set by Network.start
        self.remaining_s = 0.0  # bandwidth part left, in seconds at the lone rate
        self.rate = 1.0  # fraction of the lone rate it moves at once it loads its links
        self.joins_at_s = start_s  # when its latency ends and it loads its links
        self.join_scheduled = False  # an event re-times the others at joins_at_s
        self.since_s = start_s  # when remaining_s was last brought up to date
        self.end_s = 0.0  # when its current end event fires (earlier ones are stale)


class Network:
    """The links of one simulated pipeline: one per (GPU tier, rank, half) and per node.

    Args:
        env: the simulation's environment.
        rank_nodes: node of each rank (index = rank).
    """

    def __init__(self, env: simpy.Environment, *, rank_nodes: Sequence[int]) -> None:
        self._env = env
        self._rank_nodes = tuple(rank_nodes)
        self._links: dict[tuple[str, int, str], Link] = {}
        self._collective: dict[tuple[int, LinkKind | str], tuple[Link, ...]] = {}
        self._p2p: dict[tuple[int, int, LinkKind | str], tuple[Link, ...]] = {}
        self._routes: dict[tuple[Link, ...], tuple[Link, ...]] = {}

    def link(self, tier: str, owner: int, half: str = "") -> Link:
        """The link of ``tier`` owned by GPU (rank) or node ``owner`` (created on first use)."""
        key = (tier, owner, half)
        found = self._links.get(key)
        if found is None:
            name = f"{tier}/{owner}/{half}" if half else f"{tier}/{owner}"
            found = self._links[key] = Link(name)
        return found

    def collective_links(self, rank: int, tier: LinkKind | str) -> tuple[Link, ...]:
        """Links a collective (or any non-directional transfer) of ``rank`` on ``tier`` (a
        LinkKind, or its value as a segment names it) loads.

        Raises:
            SpecError: ``tier`` is not a :class:`LinkKind` nor one's value.
        """
        key = (rank, tier)
        links = self._collective.get(key)
        if links is None:
            kind = LinkKind.parse(tier, field="link")
            links = (self.link(kind.value, rank, SEND), self.link(kind.value, rank, RECV))
            if kind is LinkKind.PCIE:
                links += (self.link(HOST_MEMORY, self._rank_nodes[rank]),)
            self._collective[key] = links
        return links

    def p2p_links(self, src: int, dst: int, tier: LinkKind | str) -> tuple[Link, ...]:
        """Links a send from rank ``src`` to rank ``dst`` on ``tier`` (a LinkKind, or its
        value as a P2P names it) loads.

        Raises:
            SpecError: ``tier`` is not a :class:`LinkKind` nor one's value.
        """
        key = (src, dst, tier)
        links = self._p2p.get(key)
        if links is None:
            kind = LinkKind.parse(tier, field="link")
            if kind is LinkKind.PCIE:
                both = self.collective_links(src, kind) + self.collective_links(dst, kind)
                links = tuple(dict.fromkeys(both))  # one host memory when on one node
            else:
                links = (self.link(kind.value, src, SEND), self.link(kind.value, dst, RECV))
            self._p2p[key] = links
        return links

    def declare(self, links: tuple[Link, ...], source: Hashable) -> None:
        """Record that ``source`` (one sequential issuer: a rank's compute process, one of
        its FIFO streams) may put transfers on ``links``."""
        for link in links:
            link.sources.add(source)

    def may_share(self, links: tuple[Link, ...]) -> bool:
        """Whether transfers on ``links`` can ever overlap another: some link has two
        declared sources. If not, a transfer there is a plain delay of its duration (the
        same end time, without the bookkeeping)."""
        return any(len(link.sources) > 1 for link in links)

    def route(self, links: tuple[Link, ...]) -> tuple[Link, ...]:
        """``links`` when a transfer on them may share one, else () (a plain delay).
        Call once every source is declared."""
        routed = self._routes.get(links)
        if routed is None:
            routed = self._routes[links] = links if self.may_share(links) else ()
        return routed

    def start(
        self,
        links: tuple[Link, ...],
        *,
        duration_s: float,
        latency_s: float,
        on_done: Done | None = None,
    ) -> Transfer:
        """Start a transfer now; ``on_done(start_s, end_s)`` (if given) runs when it ends.

        The transfer registers on its links at once but counts on them only from the end of
        its latency. An event marks that moment only when another transfer is on one of its
        links by then (alone, nothing needs re-timing); so a transfer that never shares
        costs one event, its end, exactly ``duration_s`` after its start.

        Args:
            links: the links it loads (``collective_links`` / ``p2p_links``); empty: none.
            duration_s: seconds alone (latency included).
            latency_s: seconds of it that no sharing stretches, spent first.

        Returns:
            The transfer, to wait for (``Transfer.end_event``).
        """
        env = self._env
        now = env.now
        transfer = Transfer(links, now, on_done)
        transfer.remaining_s = duration_s - latency_s
        if not links or transfer.remaining_s <= 0:
            transfer.links = ()
            self._schedule_end(transfer, duration_s)
            return transfer
        self._schedule_end(transfer, duration_s)  # exact while it stays alone
        transfer.joins_at_s = now + latency_s if latency_s > 0 else now
        others: tuple[Transfer, ...] = ()
        for link in links:
            if link.active:
                others = self._sharing(transfer)
                break
        for link in links:
            link.active[transfer] = None
        if others:
            for t in (*others, transfer):
                if t.joins_at_s > now and not t.join_scheduled:
                    t.join_scheduled = True
                    env.timeout(t.joins_at_s - now).callbacks.append(partial(self._join, t))
            self._settle(others)
            self._retime((*others, transfer))
        return transfer

    def _schedule_end(self, transfer: Transfer, delay_s: float) -> None:
        env = self._env
        transfer.end_s = env.now + delay_s  # the float SimPy schedules the event at
        # The callback, not the event's value, holds the transfer: SimPy drops callbacks
        # once an event is processed, so no Transfer <-> Timeout cycle outlives it (cycles
        # would leave every transfer to the garbage collector: measured 25% slower).
        event = transfer.end_event = env.timeout(delay_s)
        event.callbacks.append(partial(self._end, transfer))

    def _join(self, transfer: Transfer, _event: simpy.Event) -> None:
        """``transfer``'s latency is over: it loads its links; re-time the others."""
        now = self._env.now
        transfer.joins_at_s = transfer.since_s = now  # the event's own time
        others = self._sharing(transfer)
        if others:
            self._settle(others)
            self._retime((*others, transfer))

    def _end(self, transfer: Transfer, event: simpy.Event) -> None:
        if event is not transfer.end_event:  # re-timed since this event was scheduled
            return
        transfer.finished = True
        shared = False
        for link in transfer.links:
            del link.active[transfer]
            shared = shared or bool(link.active)
        others = self._sharing(transfer) if shared else ()
        if others:
            self._settle(others)  # at the rates they had with ``transfer``
            self._retime(others)
        if transfer.on_done is not None:
            transfer.on_done(transfer.start_s, self._env.now)

    @staticmethod
    def _sharing(transfer: Transfer) -> tuple[Transfer, ...]:
        """Transfers registered on any of ``transfer``'s links but itself, in start order."""
        seen: dict[Transfer, None] = {}
        for link in transfer.links:
            if link.active:
                seen.update(link.active)
        seen.pop(transfer, None)
        return tuple(seen)

    def _settle(self, transfers: Sequence[Transfer]) -> None:
        """Bring the remaining seconds of ``transfers`` up to now at their current rates
        (no progress before a transfer's latency ends)."""
        now = self._env.now
        for t in transfers:
            begin = max(t.since_s, t.joins_at_s)
            if now > begin:
                t.remaining_s = max(0.0, t.remaining_s - (now - begin) * t.rate)
            t.since_s = now

    def _retime(self, transfers: Sequence[Transfer]) -> None:
        """New rates after a join or leave; a changed rate moves the transfer's end.

        A transfer still in its latency is left alone (its join re-times it); one whose end
        is this instant too (it finished together with the one leaving) keeps it."""
        now = self._env.now
        for t in transfers:
            if t.joins_at_s > now or t.end_s <= now:
                continue
            busiest = max(sum(x.joins_at_s <= now for x in link.active) for link in t.links)
            rate = 1.0 / busiest
            if rate != t.rate:
                t.rate = rate
                self._schedule_end(t, t.remaining_s / rate)


def declare_sources(network: Network, work: PipelineWork) -> None:
    """Declare on ``network`` every link a transfer of ``work`` may use, with its issuer:
    ``("action", r)``: segments inside rank r's actions and optimizer (run one at a time);
    ``("dp", r)``: its dp stream; ``("send", r)``: its pp_send stream (sending half of r's
    link, receiving half of the neighbour's). Stages handed over on one rank send nothing."""
    graph = work.graph
    for s, stage in enumerate(work.stages):
        r = work.rank_of_stage(s)
        for segs in (stage.forward, stage.backward, stage.backward_input, stage.backward_weight):
            for seg in segs:
                if seg.link:
                    network.declare(network.collective_links(r, seg.link), ("action", r))
        for bucket in stage.grad_buckets:
            if bucket.segment.link:
                network.declare(network.collective_links(r, bucket.segment.link), ("dp", r))
        for p2p, consumer in (
            (stage.send_forward, graph.next_stage(s)),
            (stage.send_backward, graph.previous_stage(s)),
        ):
            if p2p.link and consumer is not None:
                dst = work.rank_of_stage(consumer)
                if dst != r:
                    network.declare(network.p2p_links(r, dst, p2p.link), ("send", r))
    for r, rank in enumerate(work.ranks):
        for source, segs in ((("dp", r), rank.grad_sync), (("action", r), rank.optimizer)):
            for seg in segs:
                if seg.link:
                    network.declare(network.collective_links(r, seg.link), source)
