"""Which link each transfer of a PipelineWork loads, and its latency (pure).

Each communication segment and P2P names the link it loads on its rank (``plansim.sim.links``),
from the tier its group spans (NVLink inside a node, the NIC across nodes): PP sends by the pp
group, DP/ZeRO collectives by the dp (x cp) group, TP by the tp group, CP ring transfers by the
cp group, the tied-embedding all-reduce by the first/last stage pair; and the latency (alpha)
the engine never stretches when transfers share a link. Durations are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from plansim.analytic.comm import Collective
from plansim.analytic.memo import Memo
from plansim.analytic.ranks import GroupSpan, LayoutGroups
from plansim.specs.curves import COLLECTIVES
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import ParallelPlan
from plansim.specs.work import P2P, GradBucket, PipelineWork, RankWork, Segment, StageWork

#: A search-scoped cache (one model and one profile): key tuple -> costed object.


def _tier(span: GroupSpan) -> str:
    """Link of a group's traffic on each member: NVLink inside one node, else the NIC."""
    return "nvlink" if span.num_nodes == 1 else "nic"


def _alpha_s(profile: HardwareProfile, span: GroupSpan) -> float:
    """Latency (alpha) of one collective over ``span``, as ``comm.collective_time_s`` prices
    it: the intra-node latency (the smallest of the collective curves', a lower bound where
    they differ), plus nic_latency_s per tree level when the group spans nodes."""
    alpha = min(
        c.latency_s
        for name, c in profile.intra_node.items()
        if name in COLLECTIVES and name != Collective.SENDRECV.value
    )
    if span.num_nodes > 1:
        alpha += profile.nic_latency_s * math.ceil(math.log2(span.num_nodes))
    return alpha


@dataclass(frozen=True, slots=True, kw_only=True)
class _LinkTags:
    """Link and unstretched latency of each kind of transfer of a plan.

    Attributes:
        by_kind: {segment kind: (link, latency_s)} for communication segments. TP and CP
            segments sum several collectives or ring steps per pass, whose count costing
            does not keep: latency 0 (their whole duration stretches when shared).
        p2p: (link, latency_s) of a pipeline send (``comm.p2p_time_s``'s alpha); the send's
            own ``latency_s`` (the scatter/gather all-gather on the receiver) adds to it.
    """

    by_kind: dict[str, tuple[str, float]]
    p2p: tuple[str, float]
    done: dict[Segment, Segment] = field(default_factory=dict)  # equal segments tag once
    done_buckets: dict[tuple[GradBucket, ...], tuple[GradBucket, ...]] = field(default_factory=dict)

    def segment(self, seg: Segment) -> Segment:
        if seg.stream == "compute":
            return seg
        tagged = self.done.get(seg)
        if tagged is None:
            tag = self.by_kind.get(seg.kind)
            if tag is None:
                tagged = seg
            else:  # the constructor, not dataclasses.replace: costing runs per candidate
                tagged = Segment(
                    kind=seg.kind,
                    stream=seg.stream,
                    duration_s=seg.duration_s,
                    num_bytes=seg.num_bytes,
                    link=tag[0],
                    latency_s=min(tag[1], seg.duration_s),
                )
            self.done[seg] = tagged
        return tagged

    def segments(self, segs: tuple[Segment, ...]) -> tuple[Segment, ...]:
        return tuple([self.segment(seg) for seg in segs])

    def send(self, p2p: P2P) -> P2P:
        if p2p.duration_s <= 0:
            return p2p
        link, alpha = self.p2p
        return P2P(
            duration_s=p2p.duration_s,
            num_bytes=p2p.num_bytes,
            link=link,
            latency_s=min(alpha + p2p.latency_s, p2p.duration_s),
        )

    def buckets(self, buckets: tuple[GradBucket, ...]) -> tuple[GradBucket, ...]:
        """Tagged ``buckets``; an equal tuple (a memoised costing's) is tagged once."""
        if not buckets:
            return buckets
        tagged = self.done_buckets.get(buckets)
        if tagged is None:
            tagged = self.done_buckets[buckets] = tuple(self.bucket(b) for b in buckets)
        return tagged

    def bucket(self, b: GradBucket) -> GradBucket:
        return GradBucket(
            segment=self.segment(b.segment),
            ready_fraction=b.ready_fraction,
            num_params=b.num_params,
        )

    def stage(self, st: StageWork) -> StageWork:
        return replace(
            st,
            forward=self.segments(st.forward),
            backward=self.segments(st.backward),
            backward_input=self.segments(st.backward_input),
            backward_weight=self.segments(st.backward_weight),
            send_forward=self.send(st.send_forward),
            send_backward=self.send(st.send_backward),
            grad_buckets=self.buckets(st.grad_buckets),
        )


def _link_tags(profile: HardwareProfile, groups: LayoutGroups) -> _LinkTags:
    """Links from the tiers the groups span (rank order tp -> cp -> dp -> pp)."""
    pair = GroupSpan(size=2, members_per_node=1, num_nodes=min(2, groups.pp.num_nodes))
    inter = groups.pp.num_nodes > 1
    send_alpha = (
        profile.nic_latency_s if inter else profile.intra_node[Collective.SENDRECV.value].latency_s
    )
    return _LinkTags(
        by_kind={
            "tp_comm": (_tier(groups.tp), 0.0),
            "cp_comm": (_tier(groups.cp), 0.0),
            "ep_comm": (_tier(groups.ep), 0.0),
            "dp_comm": (_tier(groups.dp_cp), _alpha_s(profile, groups.dp_cp)),
            "embedding_grad_comm": (_tier(pair), _alpha_s(profile, pair)),
        },
        p2p=(_tier(groups.pp), send_alpha),
    )


def with_links(
    work: PipelineWork,
    *,
    plan: ParallelPlan,
    profile: HardwareProfile,
    groups: LayoutGroups,
    memo: Memo | None = None,
) -> PipelineWork:
    """``work`` with every transfer tagged with its link and latency (durations unchanged),
    and the node of each pipeline rank (rank r of the first replica is global rank
    r * tp * cp * dp). Stages and ranks that were one object stay one."""
    if memo is None:
        tags = _link_tags(profile, groups)
    else:
        key = ("tags", plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.etp)
        found = memo.get(key)
        if found is None:
            found = memo[key] = _link_tags(profile, groups)
        assert isinstance(found, _LinkTags)
        tags = found
    stages: dict[int, StageWork] = {}
    for st in work.stages:
        if id(st) not in stages:
            stages[id(st)] = tags.stage(st)
    ranks: dict[int, RankWork] = {}
    for rk in work.ranks:
        if id(rk) not in ranks:
            ranks[id(rk)] = replace(
                rk, grad_sync=tags.segments(rk.grad_sync), optimizer=tags.segments(rk.optimizer)
            )
    stride = plan.tp * plan.cp * plan.dp
    return replace(
        work,
        stages=tuple(stages[id(st)] for st in work.stages),
        ranks=tuple(ranks[id(rk)] for rk in work.ranks),
        rank_nodes=tuple(r * stride // profile.gpus_per_node for r in range(plan.pp)),
    )
