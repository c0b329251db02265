"""The enumerated vocabularies: collectives (analytic.comm), streams and Timeline kinds
(sim.timeline), links (sim.links). Each matches the strings the specs and files use, parses
those strings, and rejects anything else with one SpecError naming the field and the choices;
outputs carry the values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import simpy

from plansim.analytic.comm import (
    RING_ONLY,
    Collective,
    collective_latency_s,
    collective_time_s,
    ring_collective_time_s,
)
from plansim.analytic.offload import OFFLOAD_KINDS
from plansim.analytic.param_server import PULL_KIND, PUSH_KIND, UPDATE_KIND
from plansim.analytic.ranks import GroupSpan
from plansim.errors import SpecError
from plansim.sim import timeline as tl
from plansim.sim.links import GPU_TIERS, LinkKind, Network
from plansim.specs.curves import COLLECTIVES
from plansim.specs.work import LINKS, STREAMS
from plansim.validate.compare import CATEGORY_KINDS
from plansim.validate.simulated import PIPELINE_ACTION_KIND
from tests.unit.synthetic import round_profile

SPAN = GroupSpan(size=8, members_per_node=8, num_nodes=1)
ACROSS = GroupSpan(size=16, members_per_node=8, num_nodes=2)


def test_enum_values_are_the_spec_strings_in_order() -> None:
    assert tuple(c.value for c in Collective) == COLLECTIVES
    assert tl.STREAMS == tuple(s.value for s in tl.Stream) == STREAMS
    assert GPU_TIERS == tuple(k.value for k in LinkKind) == tuple(x for x in LINKS if x)
    assert RING_ONLY == (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


@pytest.mark.parametrize("enum", [Collective, tl.Stream, tl.TimelineKind, LinkKind])
def test_parse_takes_members_and_values_and_names_the_choices(enum: type) -> None:
    for member in enum:
        assert enum.parse(member, field="x") is member
        assert enum.parse(member.value, field="x") is member
        assert not isinstance(member, str)  # outputs use .value, never str() of a member
    allowed = ", ".join(m.value for m in enum)
    with pytest.raises(SpecError) as info:
        enum.parse("bogus", field="where")
    assert str(info.value) == f"where='bogus' is not allowed; choose one of: {allowed}"


def test_an_unknown_collective_is_a_spec_error_not_a_key_error() -> None:
    profile = round_profile()
    choices = "choose one of: all_reduce, all_gather, reduce_scatter, sendrecv"
    with pytest.raises(SpecError, match=f"collective='allreduce' is not allowed; {choices}"):
        collective_time_s(profile, collective="allreduce", message_bytes=1e6, span=SPAN)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="collective='allreduce'"):
        collective_latency_s(profile, collective="allreduce", span=ACROSS)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="collective='ring'"):
        ring_collective_time_s(
            collective="ring",  # type: ignore[arg-type]
            message_bytes=1e6,
            span=ACROSS,
            busbw_bytes_per_s=1e11,
        )


@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("span", [SPAN, ACROSS])
def test_a_collective_and_its_value_price_the_same(collective: Collective, span: GroupSpan) -> None:
    profile = round_profile()
    by_member = collective_time_s(profile, collective=collective, message_bytes=3e7, span=span)
    by_value = collective_time_s(
        profile,
        collective=collective.value,  # type: ignore[arg-type]
        message_bytes=3e7,
        span=span,
    )
    assert by_member == by_value > 0


def test_an_unknown_link_is_a_spec_error_naming_the_links() -> None:
    network = Network(simpy.Environment(), rank_nodes=(0, 0))
    assert network.collective_links(0, LinkKind.NVLINK) == network.collective_links(0, "nvlink")
    assert [link.name for link in network.p2p_links(0, 1, "pcie")] == [
        "pcie/0/send",
        "pcie/0/recv",
        "host_memory/0",
        "pcie/1/send",
        "pcie/1/recv",
    ]
    with pytest.raises(
        SpecError, match="link='infiniband' is not allowed; choose one of: nvlink, nic, pcie"
    ):
        network.collective_links(0, "infiniband")
    with pytest.raises(SpecError, match="link='infiniband'"):
        network.p2p_links(0, 1, "infiniband")


def test_every_kind_the_costing_and_validator_name_is_a_timeline_kind() -> None:
    named = {*OFFLOAD_KINDS, PUSH_KIND, PULL_KIND, UPDATE_KIND, PIPELINE_ACTION_KIND}
    named |= {k for kinds in CATEGORY_KINDS.values() for k in kinds}
    named |= set(tl.EXPOSED_PRIORITY)
    assert named <= set(tl.KINDS)
    assert tl.Stream.COMPUTE.value == tl.COMPUTE
    assert tl.COMPUTE_STREAMS == ("compute", "tp")


_SIMULATE = [
    # ZeRO-3, zero-bubble schedule: split backward, in-action dp gathers
    "--model llama2-7b --gpu h100-sxm5-80gb --gpus 16 --tp 2 --pp 4 --mbs 1 --gbs 8 --zero 3 "
    "--schedule zb-h1",
    # context parallelism and selective recompute
    "--model llama3-8b --gpu h100-sxm5-80gb --gpus 16 --tp 2 --cp 2 --pp 2 --mbs 1 --gbs 8 "
    "--zero 1 --attention flash --recompute selective",
    # ZeRO-Offload: host copies and CPU Adam
    "--model megatron-1.7b --gpu h100-sxm5-80gb-1gpu --gpus 8 --tp 1 --pp 1 --mbs 1 --gbs 8 "
    "--zero 2 --offload-optimizer cpu",
    # parameter server
    "--model megatron-1.7b --gpu a100-sxm4-80gb --gpus 8 --tp 1 --pp 2 --mbs 1 --gbs 8 "
    "--dp-sync parameter-server --ps-servers 2",
]


@pytest.mark.parametrize("args", _SIMULATE)
def test_simulated_traces_use_only_enumerated_streams_and_kinds(args: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    subprocess.run(
        [sys.executable, "-m", "plansim", "simulate", *args.split(), "--trace", str(trace)],
        check=True,
        capture_output=True,
        text=True,
    )
    events = json.loads(trace.read_text())["traceEvents"]
    kinds = {e["cat"] for e in events if e.get("ph") == "X"}
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert kinds and kinds <= set(tl.KINDS)
    assert threads and threads <= set(tl.STREAMS)
