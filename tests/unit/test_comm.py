"""Rank-group spans and collective pricing on the round-number synthetic profile."""

from __future__ import annotations

import pytest

from plansim.analytic.comm import collective_time_s, p2p_time_s, ring_latency_s
from plansim.analytic.ranks import GroupSpan, group_span, layout_groups
from plansim.errors import SpecError
from plansim.specs.curves import bus_factor
from plansim.specs.hardware import LinkTier
from plansim.specs.plan import plan_from_fields
from tests.unit.synthetic import round_profile


def test_rank_order_tp_cp_dp_pp_worked_example() -> None:
    plan = plan_from_fields(dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=2)
    groups = layout_groups(plan, gpus_per_node=4)
    assert groups.tp == GroupSpan(size=2, members_per_node=2, num_nodes=1)
    assert groups.dp == GroupSpan(size=2, members_per_node=2, num_nodes=1)
    assert groups.pp == GroupSpan(size=2, members_per_node=1, num_nodes=2)
    assert groups.pp_hop_tier is LinkTier.INTER_NODE


def test_gpt3_layout_spans() -> None:
    plan = plan_from_fields(dp=8, tp=8, pp=16, micro_batch_size=1, global_batch_size=1536)
    groups = layout_groups(plan, gpus_per_node=8)
    assert groups.tp.num_nodes == 1
    assert groups.dp == GroupSpan(size=8, members_per_node=1, num_nodes=8)
    assert group_span(size=384, stride=1, gpus_per_node=8) == GroupSpan(
        size=384, members_per_node=8, num_nodes=48
    )


def test_bus_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("sendrecv", 2) == 1.0


def test_intra_node_alpha_beta_round_numbers() -> None:
    prof = round_profile()  # 100 GB/s busbw, 10 us latency
    span = GroupSpan(size=8, members_per_node=8, num_nodes=1)
    t = collective_time_s(prof, collective="all_reduce", message_bytes=1e9, span=span)
    assert t == pytest.approx(10e-6 + 1.75 * 1e9 / 100e9)
    assert (
        collective_time_s(
            prof,
            collective="all_reduce",
            message_bytes=1e9,
            span=GroupSpan(size=1, members_per_node=1, num_nodes=1),
        )
        == 0.0
    )


def test_inter_node_bottleneck_is_nics_of_local_members() -> None:
    prof = round_profile()  # NIC 10 GB/s per GPU, 5 us
    one_per_node = GroupSpan(size=4, members_per_node=1, num_nodes=4)
    t1 = collective_time_s(prof, collective="all_reduce", message_bytes=1e9, span=one_per_node)
    assert t1 == pytest.approx(10e-6 + 5e-6 * 2 + 1.5 * 1e9 / 10e9)  # tree alpha: log2(4)
    eight_per_node = GroupSpan(size=16, members_per_node=8, num_nodes=2)
    t8 = collective_time_s(prof, collective="all_reduce", message_bytes=1e9, span=eight_per_node)
    # 8 NICs x 10 GB/s = 80 GB/s < 100 GB/s NVLink: the NICs bound it
    assert t8 == pytest.approx(10e-6 + 5e-6 * 1 + (30 / 16) * 1e9 / 80e9)


def test_inter_node_all_gather_is_a_ring_with_nccls_latency() -> None:
    prof = round_profile()
    # 1 GB over 4 nodes, one rank each: Simple wins (8.4 us + 3 network steps of 14 us)
    span = GroupSpan(size=4, members_per_node=1, num_nodes=4)
    t = collective_time_s(prof, collective="all_gather", message_bytes=1e9, span=span)
    assert t == pytest.approx(8.4e-6 + 3 * 14e-6 + 0.75 * 1e9 / 10e9)
    # 8 B over 1536 ranks on 192 nodes: LL wins: 6.6 + 1344 x max(0.6, 1.0) + 191 x 2.7 us
    big = GroupSpan(size=1536, members_per_node=8, num_nodes=192)
    t = collective_time_s(prof, collective="reduce_scatter", message_bytes=8, span=big)
    assert t == pytest.approx(6.6e-6 + 1344 * 1.0e-6 + 191 * 2.7e-6, rel=1e-6)
    # the ring latency grows linearly with the ranks, the all-reduce tree's with log2(nodes)
    half = GroupSpan(size=768, members_per_node=8, num_nodes=96)
    lat = [
        collective_time_s(prof, collective="all_gather", message_bytes=8, span=s)
        for s in (half, big)
    ]
    assert lat[1] / lat[0] == pytest.approx((1344 + 191 * 2.7) / (672 + 95 * 2.7), rel=0.01)


def test_ring_latency_protocols_and_errors() -> None:
    assert ring_latency_s("Simple", num_ranks=8, num_nodes=1) == pytest.approx(8.4e-6 + 7 * 3.4e-6)
    assert ring_latency_s("LL128", num_ranks=16, num_nodes=2) == pytest.approx(
        14e-6 + 14 * 1.9e-6 + 1 * 4e-6
    )
    with pytest.raises(SpecError, match=r"protocol='Fast'.*LL"):
        ring_latency_s("Fast", num_ranks=8, num_nodes=1)
    with pytest.raises(SpecError, match="num_nodes"):
        ring_latency_s("LL", num_ranks=2, num_nodes=3)


def test_p2p_tiers() -> None:
    prof = round_profile()
    assert p2p_time_s(prof, message_bytes=1e8, inter_node=True) == pytest.approx(5e-6 + 1e-2)
    assert p2p_time_s(prof, message_bytes=1e8, inter_node=False) == pytest.approx(10e-6 + 1e-3)
    assert p2p_time_s(prof, message_bytes=0, inter_node=True) == 0.0
