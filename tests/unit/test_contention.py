"""Network contention: links as shared resources (``plansim.sim.links``) under the engine.

Round numbers worked out by hand: 1 GB over a 100 GB/s link takes 10 ms alone; with n
transfers on one link each moves at 1/n of its lone rate (processor sharing), so two that
start together each end after 20 ms; the latency part is never stretched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
import simpy

from plansim.analytic.comm import p2p_time_s
from plansim.analytic.cost import build_pipeline_work
from plansim.catalog import resolve_model
from plansim.errors import SpecError
from plansim.schedule import Action, build_actions
from plansim.schedule.actions import PerRankActions
from plansim.sim import SimResult, simulate
from plansim.sim.links import Link, Network
from plansim.sim.timeline import exposure
from plansim.specs.plan import Schedule, plan_from_fields
from plansim.specs.work import P2P, GradBucket, PipelineWork, RankWork, Segment, StageWork
from tests.unit.synthetic import round_profile

MS = 1e-3
GB = 1e9
LINK_BYTES_PER_S = 100e9
ALONE_S = GB / LINK_BYTES_PER_S  # 10 ms


# --- the link model alone (SimPy-style: run tiny processes, assert the (who, start, end) log) --


def run_transfers(
    transfers: Sequence[tuple[str, float, Sequence[Link], float, float]],
    env: simpy.Environment,
    network: Network,
) -> dict[str, tuple[float, float]]:
    """Start (name, at_s, links, duration_s, latency_s) transfers; {name: (start_ms, end_ms)}."""
    log: dict[str, tuple[float, float]] = {}

    def launch(name: str, at_s: float, links: Sequence[Link], d: float, lat: float) -> Any:
        yield env.timeout(at_s)

        def done(start: float, end: float) -> None:
            log[name] = (start / MS, end / MS)

        network.start(tuple(links), duration_s=d, latency_s=lat, on_done=done)

    for spec in transfers:
        env.process(launch(*spec))
    env.run()
    return log


def fresh(
    num_ranks: int = 3, nodes: Sequence[int] | None = None
) -> tuple[simpy.Environment, Network]:
    env = simpy.Environment()
    return env, Network(env, rank_nodes=tuple(nodes) if nodes else tuple(range(num_ranks)))


def test_two_concurrent_transfers_on_one_link_each_take_twice_as_long() -> None:
    env, net = fresh()
    nic0 = net.collective_links(0, "nic")
    alone = run_transfers([("a", 0.0, nic0, ALONE_S, 0.0)], *fresh())
    assert alone == {"a": (0.0, 10.0)}  # no contention: exactly its duration
    log = run_transfers([("a", 0.0, nic0, ALONE_S, 0.0), ("b", 0.0, nic0, ALONE_S, 0.0)], env, net)
    assert log == {"a": pytest.approx((0.0, 20.0)), "b": pytest.approx((0.0, 20.0))}


def test_three_on_one_link_take_three_times_as_long() -> None:
    env, net = fresh()
    nvl = net.collective_links(1, "nvlink")
    log = run_transfers([(n, 0.0, nvl, ALONE_S, 0.0) for n in "abc"], env, net)
    assert log == {n: pytest.approx((0.0, 30.0)) for n in "abc"}


def test_a_transfer_starting_halfway_through_another_is_processor_shared() -> None:
    # a alone for 5 ms (half done); then both at half rate: a's last 5 ms of work take 10 ms,
    # ending at 15 ms, when b has done 5 of its 10 ms; b alone again: ends at 20 ms.
    env, net = fresh()
    nic = net.collective_links(0, "nic")
    log = run_transfers([("a", 0.0, nic, ALONE_S, 0.0), ("b", 5 * MS, nic, ALONE_S, 0.0)], env, net)
    assert log == {"a": pytest.approx((0.0, 15.0)), "b": pytest.approx((5.0, 20.0))}


def test_a_short_transfer_leaves_and_the_long_one_speeds_up() -> None:
    # 10 ms and 4 ms at 0: both at half rate until the short one's 4 ms of work are done at
    # 8 ms; the long one has done 4 ms, its last 6 ms alone: ends at 14 ms.
    env, net = fresh()
    nic = net.collective_links(0, "nic")
    log = run_transfers(
        [("long", 0.0, nic, 10 * MS, 0.0), ("short", 0.0, nic, 4 * MS, 0.0)], env, net
    )
    assert log == {"long": pytest.approx((0.0, 14.0)), "short": pytest.approx((0.0, 8.0))}


def test_latency_is_not_stretched() -> None:
    # 1 ms latency + 10 ms of bytes each, together: 1 + 2 x 10 = 21 ms (not 2 x 11 = 22).
    env, net = fresh()
    nic = net.collective_links(0, "nic")
    log = run_transfers([(n, 0.0, nic, 11 * MS, 1 * MS) for n in "ab"], env, net)
    assert log == {n: pytest.approx((0.0, 21.0)) for n in "ab"}
    # Alone, latency + bytes is exactly the duration given.
    assert run_transfers([("a", 0.0, nic, 11 * MS, 1 * MS)], *fresh()) == {"a": (0.0, 11.0)}


def test_a_transfer_in_its_latency_does_not_load_the_link() -> None:
    # a: 10 ms of bytes from 0. b: 6 ms latency, then 4 ms of bytes. b joins at 6 ms with a
    # 4 ms from done: both at half rate, both done 8 ms later, at 14 ms.
    env, net = fresh()
    nic = net.collective_links(0, "nic")
    log = run_transfers([("a", 0.0, nic, 10 * MS, 0.0), ("b", 0.0, nic, 10 * MS, 6 * MS)], env, net)
    assert log == {"a": pytest.approx((0.0, 14.0)), "b": pytest.approx((0.0, 14.0))}


def test_a_transfer_arriving_during_anothers_latency_is_slowed_once_that_latency_ends() -> None:
    # a: 6 ms latency then 4 ms of bytes, from 0 (alone: no event at 6 ms needed until b
    # comes). b: 10 ms of bytes from 2 ms: alone until 6 ms (4 ms done), then both at half
    # rate: a's 4 ms end at 14 ms, when b has 2 ms left, alone: b ends at 16 ms.
    env, net = fresh()
    nic = net.collective_links(0, "nic")
    log = run_transfers(
        [("a", 0.0, nic, 10 * MS, 6 * MS), ("b", 2 * MS, nic, 10 * MS, 0.0)], env, net
    )
    assert log == {"a": pytest.approx((0.0, 14.0)), "b": pytest.approx((2.0, 16.0))}


def test_a_transfer_past_its_latency_shares_from_where_it_is() -> None:
    # a: 2 ms latency then 10 ms of bytes, alone from 0: 5 ms of bytes done at 7 ms, when b
    # (10 ms of bytes) starts; both at half rate: a's last 5 ms end at 17 ms, b has done
    # 5 ms by then, its last 5 alone: 22 ms.
    env, net = fresh()
    nic = net.collective_links(0, "nic")
    log = run_transfers(
        [("a", 0.0, nic, 12 * MS, 2 * MS), ("b", 7 * MS, nic, 10 * MS, 0.0)], env, net
    )
    assert log == {"a": pytest.approx((0.0, 17.0)), "b": pytest.approx((7.0, 22.0))}


def test_transfers_on_different_links_do_not_interact() -> None:
    env, net = fresh()
    log = run_transfers(
        [
            ("nic0", 0.0, net.collective_links(0, "nic"), ALONE_S, 0.0),
            ("nvlink0", 0.0, net.collective_links(0, "nvlink"), ALONE_S, 0.0),
            ("pcie0", 0.0, net.collective_links(0, "pcie"), ALONE_S, 0.0),
            ("nic1", 0.0, net.collective_links(1, "nic"), ALONE_S, 0.0),
        ],
        env,
        net,
    )
    assert log == {name: (0.0, 10.0) for name in ("nic0", "nvlink0", "pcie0", "nic1")}


def test_sends_in_opposite_directions_share_nothing_but_a_common_receiver_shares() -> None:
    env, net = fresh()
    log = run_transfers(
        [
            ("0->1", 0.0, net.p2p_links(0, 1, "nic"), ALONE_S, 0.0),
            ("1->0", 0.0, net.p2p_links(1, 0, "nic"), ALONE_S, 0.0),
        ],
        env,
        net,
    )
    assert log == {"0->1": (0.0, 10.0), "1->0": (0.0, 10.0)}  # full duplex
    env, net = fresh()
    log = run_transfers(
        [
            ("0->1", 0.0, net.p2p_links(0, 1, "nic"), ALONE_S, 0.0),
            ("2->1", 0.0, net.p2p_links(2, 1, "nic"), ALONE_S, 0.0),
        ],
        env,
        net,
    )
    assert log == {n: pytest.approx((0.0, 20.0)) for n in ("0->1", "2->1")}  # rank 1 receives


def test_a_collective_shares_the_sending_half_with_a_send() -> None:
    env, net = fresh()
    log = run_transfers(
        [
            ("bucket", 0.0, net.collective_links(0, "nic"), ALONE_S, 0.0),
            ("send", 0.0, net.p2p_links(0, 1, "nic"), ALONE_S, 0.0),
        ],
        env,
        net,
    )
    assert log == {n: pytest.approx((0.0, 20.0)) for n in ("bucket", "send")}


def test_pcie_transfers_on_one_node_share_its_host_memory() -> None:
    env, net = fresh(nodes=(0, 0, 1))
    same = [(f"r{r}", 0.0, net.collective_links(r, "pcie"), ALONE_S, 0.0) for r in (0, 1)]
    assert run_transfers(same, env, net) == {n: pytest.approx((0.0, 20.0)) for n in ("r0", "r1")}
    env, net = fresh(nodes=(0, 0, 1))
    apart = [(f"r{r}", 0.0, net.collective_links(r, "pcie"), ALONE_S, 0.0) for r in (0, 2)]
    assert run_transfers(apart, env, net) == {"r0": (0.0, 10.0), "r2": (0.0, 10.0)}


def test_unknown_tier_is_refused() -> None:
    _, net = fresh()
    with pytest.raises(SpecError, match="host_memory"):
        net.collective_links(0, "host_memory")


# --- the engine: what contention does to a step ---------------------------------------------


def acts(*rows: str) -> PerRankActions:
    return tuple(tuple(Action.parse(s) for s in row.split()) for row in rows)


def compute(kind: str, ms: float) -> Segment:
    return Segment(kind=kind, stream="compute", duration_s=ms * MS)


def two_rank_work(*, send_link: str, bucket_link: str) -> PipelineWork:
    """F 10 ms, B 20 ms per stage; 10 ms sends; the last stage's one DP bucket (10 ms) is
    ready at the end of its B, together with the gradient it sends back."""

    def stage(buckets: tuple[GradBucket, ...]) -> StageWork:
        p2p = P2P(duration_s=10 * MS, num_bytes=GB / 10, link=send_link)
        return StageWork(
            forward=(compute("forward", 10),),
            backward=(compute("backward", 20),),
            backward_input=(),
            backward_weight=(),
            send_forward=p2p,
            send_backward=p2p,
            activation_bytes=0.0,
            grad_buckets=buckets,
        )

    seg = Segment(kind="dp_comm", stream="dp", duration_s=10 * MS, num_bytes=GB, link=bucket_link)
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=())
    return PipelineWork(
        stages=(stage(()), stage((GradBucket(segment=seg),))),
        ranks=(rank, rank),
        num_microbatches=1,
        overlap_grad_reduce=True,
    )


TWO_RANKS = acts("0F0 0B0", "1F0 1B0")


def ms_rows(result: SimResult, **where: object) -> list[tuple[Any, ...]]:
    """(rank, stream, kind, start_ms, end_ms) of the rows matching ``where``, in order."""
    df = result.timeline
    for column, value in where.items():
        df = df[df[column] == value]
    return [
        (r, s, k, pytest.approx(a / MS), pytest.approx(b / MS))
        for r, s, k, a, b in zip(
            df["rank"], df["stream"], df["kind"], df["start_s"], df["end_s"], strict=True
        )
    ]


def test_dp_bucket_on_the_nic_slows_a_concurrent_pipeline_send_on_the_nic() -> None:
    # F0 [0,10], send 0->1 [10,20], F1 [20,30], B1 [30,50]. At 50 rank 1's bucket and its
    # gradient send start together on rank 1's NIC: 10 ms each alone, 20 ms shared, so
    # rank 0's B starts at 70 (not 60) and the step ends at 90 (not 80).
    shared = simulate(TWO_RANKS, two_rank_work(send_link="nic", bucket_link="nic"))
    assert ms_rows(shared, stream="pp_send") == [
        (0, "pp_send", "send_forward", 10, 20),
        (1, "pp_send", "send_backward", 50, 70),
    ]
    assert ms_rows(shared, stream="dp") == [(1, "dp", "dp_comm", 50, 70)]
    assert ms_rows(shared, rank=0, kind="backward") == [(0, "compute", "backward", 70, 90)]
    assert shared.step_time_s == pytest.approx(90 * MS)
    for links in (("", ""), ("nic", "nvlink"), ("nvlink", "nic")):  # no shared link
        apart = simulate(TWO_RANKS, two_rank_work(send_link=links[0], bucket_link=links[1]))
        assert ms_rows(apart, stream="dp") == [(1, "dp", "dp_comm", 50, 60)], links
        assert ms_rows(apart, rank=1, stream="pp_send") == [(1, "pp_send", "send_backward", 50, 60)]
        assert apart.step_time_s == pytest.approx(80 * MS)


def tp_and_bucket_work(link: str, ready_fraction: float = 0.5) -> PipelineWork:
    """One rank: F 10 ms; B = 10 ms compute then a 10 ms TP collective; a 10 ms DP bucket
    ready ``ready_fraction`` of the way through B (0.5: as the TP collective starts);
    optimizer 5 ms."""
    tp = Segment(kind="tp_comm", stream="tp", duration_s=10 * MS, link=link)
    seg = Segment(kind="dp_comm", stream="dp", duration_s=10 * MS, num_bytes=GB, link=link)
    stage = StageWork(
        forward=(compute("forward", 10),),
        backward=(compute("backward", 10), tp),
        backward_input=(),
        backward_weight=(),
        send_forward=P2P(duration_s=0.0, num_bytes=0.0),
        send_backward=P2P(duration_s=0.0, num_bytes=0.0),
        activation_bytes=0.0,
        grad_buckets=(GradBucket(segment=seg, ready_fraction=ready_fraction),),
    )
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=(compute("optimizer", 5),))
    return PipelineWork(
        stages=(stage,), ranks=(rank,), num_microbatches=1, overlap_grad_reduce=True
    )


def test_blocking_tp_collective_and_dp_bucket_on_nvlink_slow_each_other() -> None:
    shared = simulate(acts("0F0 0B0"), tp_and_bucket_work("nvlink"))
    assert ms_rows(shared, stream="tp") == [(0, "tp", "tp_comm", 20, 40)]
    assert ms_rows(shared, stream="dp") == [(0, "dp", "dp_comm", 20, 40)]
    assert ms_rows(shared, kind="optimizer") == [(0, "compute", "optimizer", 40, 45)]
    alone = simulate(acts("0F0 0B0"), tp_and_bucket_work(""))
    assert ms_rows(alone, stream="tp") == [(0, "tp", "tp_comm", 20, 30)]
    assert ms_rows(alone, stream="dp") == [(0, "dp", "dp_comm", 20, 30)]
    assert alone.step_time_s == pytest.approx(35 * MS)


def test_a_bucket_arriving_mid_collective_moves_the_collectives_end() -> None:
    # The bucket is ready 3/4 through B (at 25 ms), half-way through the TP collective
    # [20, 30]: 5 ms of it done alone, the other 5 at half rate end at 35 ms; the bucket
    # has done 5 of its 10 ms by then, the rest alone: 40 ms. Compute waits for the TP end.
    shared = simulate(acts("0F0 0B0"), tp_and_bucket_work("nvlink", ready_fraction=0.75))
    assert ms_rows(shared, stream="tp") == [(0, "tp", "tp_comm", 20, 35)]
    assert ms_rows(shared, stream="dp") == [(0, "dp", "dp_comm", 25, 40)]
    assert ms_rows(shared, kind="optimizer") == [(0, "compute", "optimizer", 40, 45)]


def test_exposed_communication_stays_consistent_under_contention() -> None:
    # One rank: every instant is compute or exposed communication, so they add up to the
    # step; the TP collective (blocking, first in priority) takes the whole 20 ms it now
    # lasts, the bucket beside it nothing.
    for link, tp_ms in (("nvlink", 20.0), ("", 10.0)):
        result = simulate(acts("0F0 0B0"), tp_and_bucket_work(link))
        exposed = result.exposed_s_by_kind
        assert exposed == {"dp_comm": 0.0, "tp_comm": pytest.approx(tp_ms * MS)}
        assert result.compute_busy_s == (pytest.approx(25 * MS),)
        total = sum(exposed.values()) + result.compute_busy_s[0]
        assert total == pytest.approx(result.step_time_s)
        again = exposure(result.timeline, num_ranks=1)
        assert again.exposed_s_by_kind == exposed  # read from the stretched events only
    # Two ranks: rank 0 waits 20 ms (not 10) for the shared gradient send; the bucket runs
    # beside that send on rank 1, so the send takes the time first (EXPOSED_PRIORITY).
    shared = simulate(TWO_RANKS, two_rank_work(send_link="nic", bucket_link="nic"))
    assert shared.exposed_s_by_kind["recv_backward"] == pytest.approx(20 * MS)
    assert shared.exposed_s_by_kind["send_backward"] == pytest.approx(20 * MS)
    assert shared.exposed_s_by_kind["dp_comm"] == 0.0


def uniform(p: int, m: int, *, link: str, latency_ms: float = 1.0) -> PipelineWork:
    """Uniform stages with 3 ms sends (1 ms latency), buckets and TP, all on ``link``."""
    tp = Segment(kind="tp_comm", stream="tp", duration_s=2 * MS, link=link)
    buckets = tuple(
        GradBucket(
            segment=Segment(kind="dp_comm", stream="dp", duration_s=7 * MS, link=link),
            ready_fraction=f,
        )
        for f in (0.25, 0.5, 1.0)
    )
    p2p = P2P(duration_s=3 * MS, num_bytes=1.0, link=link, latency_s=latency_ms * MS)
    stage = StageWork(
        forward=(compute("forward", 10), tp),
        backward=(compute("backward", 20), tp),
        backward_input=(),
        backward_weight=(),
        send_forward=p2p,
        send_backward=p2p,
        activation_bytes=1.0,
        grad_buckets=buckets,
    )
    rank = RankWork(static_bytes=0.0, grad_sync=(), optimizer=(compute("optimizer", 5),))
    return PipelineWork(
        stages=(stage,) * p,
        ranks=(rank,) * p,
        num_microbatches=m,
        blocking_p2p=True,
        overlap_grad_reduce=True,
    )


def stretched(result: SimResult) -> int:
    """Rows of communication that took longer than their lone duration."""
    df = result.timeline
    lone = {"tp_comm": 2 * MS, "dp_comm": 7 * MS, "send_forward": 3 * MS, "send_backward": 3 * MS}
    took = df["end_s"] - df["start_s"]
    expected = df["kind"].map(lone)
    return int((took > expected * (1 + 1e-9)).sum())


def test_simulation_with_contention_is_deterministic() -> None:
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=4, num_microbatches=8)
    work = uniform(4, 8, link="nic")
    first, second = simulate(actions, work), simulate(actions, work)
    assert stretched(first) > 0  # the case does exercise sharing
    pd.testing.assert_frame_equal(first.timeline, second.timeline, check_exact=True)
    pd.testing.assert_frame_equal(first.memory, second.memory, check_exact=True)
    assert first.step_time_s == second.step_time_s


def test_transfers_that_never_share_a_link_keep_their_times_exactly() -> None:
    # Two ranks, tagged sends only: each rank sends one at a time (FIFO) and the two
    # directions use different halves, so nothing overlaps on a link: bit-identical rows.
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=4)
    send = P2P(duration_s=3 * MS, num_bytes=1.0, link="nvlink", latency_s=1 * MS)
    plain = uniform(2, 4, link="")
    tagged = replace(
        plain, stages=tuple(replace(s, send_forward=send, send_backward=send) for s in plain.stages)
    )
    a, b = simulate(actions, plain), simulate(actions, tagged)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    assert a.step_time_s == b.step_time_s
    # ... while tagging everything on one link does change the step.
    assert simulate(actions, uniform(2, 4, link="nvlink")).step_time_s > a.step_time_s


# --- the contract and the costing ----------------------------------------------------------


def test_contract_validates_links_and_latency() -> None:
    with pytest.raises(SpecError, match="link='infiniband'"):
        Segment(kind="dp_comm", stream="dp", duration_s=1.0, link="infiniband")
    with pytest.raises(SpecError, match="compute stream"):
        Segment(kind="forward", stream="compute", duration_s=1.0, link="nvlink")
    with pytest.raises(SpecError, match=r"latency_s must be in \[0, duration_s=1.0\], got 2.0"):
        Segment(kind="dp_comm", stream="dp", duration_s=1.0, latency_s=2.0, link="nic")
    with pytest.raises(SpecError, match="p2p: link='x'"):
        P2P(duration_s=1.0, num_bytes=1.0, link="x")
    with pytest.raises(SpecError, match="p2p: duration_s must be >= 0"):
        P2P(duration_s=-1.0, num_bytes=1.0)
    work = uniform(2, 2, link="")
    with pytest.raises(SpecError, match="rank_nodes"):
        replace(work, rank_nodes=(0,))
    assert replace(work, rank_nodes=(3, 3)).node_of_rank(1) == 3 and work.node_of_rank(1) == 1


MODEL = resolve_model("megatron-1.7b")


def test_cost_tags_each_transfer_with_the_tier_its_group_spans() -> None:
    # 4 GPUs per node, tp 2 x dp 2 x pp 2: TP and DP inside a node, each PP hop crosses one.
    prof = round_profile(gpus_per_node=4)
    plan = plan_from_fields(
        dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=8, overlap_grad_reduce=True
    )
    work = build_pipeline_work(MODEL, plan, prof)
    first = work.stages[0]
    p2p_bytes = 2.0 * MODEL.seq_length * MODEL.hidden_size / 2
    # scatter/gather: the receiver's all-gather over the tp pair (0.5 x 2 p2p_bytes at
    # 100 GB/s + 10 us) is unstretched latency on top of the NIC's 5 us
    gather_s = 10e-6 + 0.5 * 2 * p2p_bytes / 100e9
    assert first.send_forward.link == "nic"
    assert first.send_forward.latency_s == pytest.approx(5e-6 + gather_s)
    assert first.send_forward.duration_s == pytest.approx(
        p2p_time_s(prof, message_bytes=p2p_bytes, inter_node=True) + gather_s
    )
    assert first.send_backward.link == "" and first.send_backward.duration_s == 0.0  # never sent
    assert {seg.link for seg in first.forward if seg.kind == "tp_comm"} == {"nvlink"}
    assert {seg.link for seg in first.forward if seg.kind == "forward"} == {""}
    buckets = [b.segment for s in work.stages for b in s.grad_buckets]
    assert buckets and {(b.link, b.latency_s) for b in buckets} == {("nvlink", 10e-6)}
    assert [(s.kind, s.link) for s in work.ranks[0].grad_sync] == [("embedding_grad_comm", "nic")]
    assert work.ranks[0].grad_sync[0].latency_s == pytest.approx(15e-6)  # 10 us + one NIC hop
    assert work.rank_nodes == (0, 1)
    # 1 GPU per node: every group spans nodes, everything on the NIC; 8 per node: NVLink.
    spread = build_pipeline_work(MODEL, plan, round_profile(gpus_per_node=1))
    assert {b.segment.link for s in spread.stages for b in s.grad_buckets} == {"nic"}
    assert {seg.link for seg in spread.stages[0].forward if seg.kind == "tp_comm"} == {"nic"}
    packed = build_pipeline_work(MODEL, plan, round_profile(gpus_per_node=8))
    assert packed.stages[0].send_forward.link == "nvlink"
    assert packed.stages[0].send_forward.latency_s == pytest.approx(10e-6 + gather_s)
    assert packed.rank_nodes == (0, 0)


def test_costed_step_is_slowed_only_by_contention() -> None:
    # Every group across nodes: rank 1's DP reduction and its last gradient send share its
    # NIC. Without links the same work runs faster; the compute is the same.
    plan = plan_from_fields(
        dp=2, tp=1, pp=2, micro_batch_size=1, global_batch_size=8, overlap_grad_reduce=True
    )
    work = build_pipeline_work(MODEL, plan, round_profile(gpus_per_node=1))
    plain = strip_links(work)
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=2, num_microbatches=4)
    tagged, untagged = simulate(actions, work), simulate(actions, plain)
    assert tagged.step_time_s > untagged.step_time_s
    assert tagged.compute_busy_s == pytest.approx(untagged.compute_busy_s, rel=1e-12)
    assert stretched_rows(tagged, untagged) > 0


def strip_links(work: PipelineWork) -> PipelineWork:
    def seg(s: Segment) -> Segment:
        return replace(s, link="", latency_s=0.0)

    def stage(st: StageWork) -> StageWork:
        return replace(
            st,
            forward=tuple(map(seg, st.forward)),
            backward=tuple(map(seg, st.backward)),
            backward_input=tuple(map(seg, st.backward_input)),
            backward_weight=tuple(map(seg, st.backward_weight)),
            send_forward=replace(st.send_forward, link="", latency_s=0.0),
            send_backward=replace(st.send_backward, link="", latency_s=0.0),
            grad_buckets=tuple(replace(b, segment=seg(b.segment)) for b in st.grad_buckets),
        )

    ranks = tuple(
        replace(r, grad_sync=tuple(map(seg, r.grad_sync)), optimizer=tuple(map(seg, r.optimizer)))
        for r in work.ranks
    )
    return replace(work, stages=tuple(map(stage, work.stages)), ranks=ranks)


def stretched_rows(a: SimResult, b: SimResult) -> int:
    """Rows of ``a`` that last longer than in ``b`` (same events, same order of kinds)."""
    key = ["rank", "stream", "kind", "stage", "microbatch"]
    da = a.timeline.assign(took=a.timeline["end_s"] - a.timeline["start_s"]).sort_values(key)
    db = b.timeline.assign(took=b.timeline["end_s"] - b.timeline["start_s"]).sort_values(key)
    return int((da["took"].to_numpy() > db["took"].to_numpy() * (1 + 1e-9)).sum())


# --------------------------------------------------------------------------- rendezvous
def test_tied_embedding_all_reduce_is_one_collective_of_first_and_last_stage() -> None:
    """The embedding-gradient all-reduce starts on both sides only when both stages reach
    it: the last stage (done with backward first under 1F1B) waits for stage 0, both end
    together, and the last stage's optimizer runs after that end."""
    from plansim.planner.evaluate import Evaluation, evaluate
    from plansim.specs.model import Activation, ModelSpec
    from tests.unit.synthetic import round_profile

    model = ModelSpec(
        name="tied",
        num_layers=4,
        hidden_size=1024,
        num_attention_heads=8,
        num_query_groups=8,
        ffn_hidden_size=4096,
        activation=Activation.GELU,
        seq_length=1024,
        vocab_size=32768,
        tied_embeddings=True,
    )
    plan = plan_from_fields(tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=8)
    ev = evaluate(model, plan, round_profile())
    assert isinstance(ev, Evaluation)
    df = ev.result.timeline
    emb = df[df["kind"] == "embedding_grad_comm"].sort_values("rank")
    assert list(emb["rank"]) == [0, 1]
    assert emb["end_s"].iloc[0] == pytest.approx(emb["end_s"].iloc[1])
    last_compute = df[(df["rank"] == 0) & (df["stream"] == "compute") & (df["stage"] >= 0)]
    # stage 1 arrives before stage 0 finishes its last backward, so it waits for it
    assert emb["start_s"].iloc[1] < last_compute["end_s"].max() <= emb["start_s"].iloc[0]
    duration_s = emb["end_s"].iloc[0] - emb["start_s"].iloc[0]
    assert emb["end_s"].iloc[1] - emb["start_s"].iloc[1] > duration_s
    opt = df[(df["rank"] == 1) & (df["kind"] == "optimizer")]
    assert opt["start_s"].min() >= emb["end_s"].iloc[1] - 1e-12
