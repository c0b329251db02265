"""Parameter-server DP sync: hand-computed push/pull on round numbers, the classic trade-off
against ring collectives, the engine's step, bounds, planner, CLI and errors.

Round-number profile (``tests.unit.synthetic``): NVLink sendrecv 100 GB/s with 10 us, NIC
10 GB/s with 5 us. A PS phase pays one round trip, 2 x the one-way latency (20 us inside a
node, 10 us across nodes), plus its bandwidth term.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pandas as pd
import pytest

from plansim.analytic.comm import collective_time_s
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.elementwise import adam_step_bytes
from plansim.analytic.memory import rank_memory, rank_parameters
from plansim.analytic.param_server import (
    PsTraffic,
    job_parameters,
    ps_pull,
    ps_push,
    ps_transfer,
    uses_parameter_server,
)
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.bounds import step_time_lower_bound_s
from plansim.planner.context import Candidate, SearchContext
from plansim.planner.enumerate import SearchSpace, enumerate_plans, layouts
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import Activation, ModelSpec
from plansim.specs.plan import DpSync, ParallelPlan, Precision, Schedule, plan_from_fields
from tests.unit.synthetic import round_profile

PS = DpSync.PARAMETER_SERVER
US = 1e-6
#: A small model (~0.1M parameters: messages of ~0.5 MB, near the latency-bound end).
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=2,
    num_query_groups=2,
    ffn_hidden_size=256,
    activation=Activation.GELU,
    seq_length=128,
    vocab_size=256,
    tied_embeddings=True,
)


def ps_plan(
    dp: int, *, tp: int = 1, pp: int = 1, servers: int = 0, m: int = 1, **kw: Any
) -> ParallelPlan:
    """A parameter-server plan with m micro-batches of one sequence."""
    return plan_from_fields(
        dp=dp, tp=tp, pp=pp, micro_batch_size=1, global_batch_size=dp * m,
        dp_sync=PS, ps_servers=servers, **kw,
    )  # fmt: skip


def transfer(plan: ParallelPlan, prof: HardwareProfile, message: float) -> PsTraffic:
    groups = layout_groups(plan, gpus_per_node=prof.gpus_per_node)
    return ps_transfer(plan, prof, groups, message_bytes=message)


# --- traffic and times, by hand ------------------------------------------------------------


def test_colocated_inside_one_node_moves_ring_volume_on_nvlink() -> None:
    t = transfer(ps_plan(8), round_profile(gpus_per_node=8), 8e8)
    # 7 other servers get X/8 each over NVLink; each server receives X/8 from 7 workers
    assert t.worker_nvlink_bytes == pytest.approx(7e8)
    assert t.worker_nic_bytes == 0.0
    assert t.server_bytes == pytest.approx(7e8)
    assert (t.num_servers, t.incast, t.link) == (7, 1.0, "nvlink")
    assert t.latency_s == pytest.approx(20 * US)
    assert t.duration_s == pytest.approx(20 * US + 7e8 / 100e9)


def test_colocated_across_nodes_sends_remote_shards_over_the_nic() -> None:
    # 4 GPUs per node: the 8 workers sit 4 + 4; X/2 crosses the NIC, 3X/8 stays on NVLink
    t = transfer(ps_plan(8), round_profile(gpus_per_node=4), 8e8)
    assert t.worker_nic_bytes == pytest.approx(4e8)
    assert t.worker_nvlink_bytes == pytest.approx(3e8)
    assert t.link == "nic"
    assert t.duration_s == pytest.approx(10 * US + max(4e8 / 10e9, 3e8 / 100e9))


@pytest.mark.parametrize(("servers", "incast"), [(1, 8.0), (2, 4.0), (8, 1.0), (16, 0.5)])
def test_dedicated_servers_are_the_bottleneck_by_workers_over_servers(
    servers: int, incast: float
) -> None:
    prof = round_profile(gpus_per_node=8)
    for plan in (ps_plan(8, servers=servers), ps_plan(2, tp=2, pp=2, servers=servers)):
        t = transfer(plan, prof, 8e8)  # W = 8 workers either way
        assert t.incast == pytest.approx(incast)
        assert t.server_bytes == pytest.approx(incast * 8e8)
        assert t.worker_nic_bytes == 8e8
        assert t.link == "nic"
        # max(X/B, W X/(K B)) after one NIC round trip
        expected = 10 * US + 8e8 / 10e9 * max(1.0, incast)
        assert t.duration_s == pytest.approx(expected)


def test_server_nic_bottleneck_factor_is_exactly_w_over_k() -> None:
    prof = round_profile(gpus_per_node=8)
    enough = transfer(ps_plan(16, servers=16), prof, 1e9)
    for servers in (1, 2, 4, 8):
        few = transfer(ps_plan(16, servers=servers), prof, 1e9)
        ratio = (few.duration_s - few.latency_s) / (enough.duration_s - enough.latency_s)
        assert ratio == pytest.approx(16 / servers)


def test_push_is_the_fp32_gradient_and_pull_the_16bit_weights() -> None:
    prof = round_profile()
    for precision, grad_bytes in ((Precision.BF16, 4.0), (Precision.FP16, 2.0)):
        plan = ps_plan(4, pp=2, precision=precision, m=2)
        groups = layout_groups(plan, gpus_per_node=8)
        for rank in (0, 1):
            params = rank_parameters(TINY, plan, rank=rank)
            push = ps_push(TINY, plan, prof, groups, rank=rank)
            pull = ps_pull(TINY, plan, prof, groups, rank=rank)
            assert push.message_bytes == pytest.approx(grad_bytes * params)
            assert pull.message_bytes == pytest.approx(2.0 * params)
    plan = ps_plan(2, tp=2, pp=2, m=2)
    expected = 2 * (rank_parameters(TINY, plan, rank=0) + rank_parameters(TINY, plan, rank=1))
    assert job_parameters(TINY, plan) == pytest.approx(expected)


def test_one_colocated_worker_moves_nothing_but_dedicated_servers_still_sync() -> None:
    prof = round_profile()
    assert not uses_parameter_server(ps_plan(1))
    assert transfer(ps_plan(1), prof, 1e9).duration_s == 0.0
    assert uses_parameter_server(ps_plan(1, tp=8, servers=2))
    t = transfer(ps_plan(1, tp=8, servers=2), prof, 1e9)
    assert t.duration_s == pytest.approx(10 * US + 4 * 1e9 / 10e9)
    assert not uses_parameter_server(ps_plan(8).with_fields(dp_sync=DpSync.RING))


# --- the pipeline work, memory and the engine ----------------------------------------------


def test_rank_work_push_update_pull_and_memory() -> None:
    prof = round_profile()
    rate = prof.streaming_bytes_per_s()
    colocated = ps_plan(8)
    groups = layout_groups(colocated, gpus_per_node=8)
    params = rank_parameters(TINY, colocated, rank=0)
    rank = build_pipeline_work(TINY, colocated, prof).ranks[0]
    push = ps_push(TINY, colocated, prof, groups, rank=0)
    pull = ps_pull(TINY, colocated, prof, groups, rank=0)
    assert [(s.kind, s.stream, s.link) for s in rank.grad_sync] == [("ps_push", "dp", "nvlink")]
    assert rank.grad_sync[0].duration_s == push.duration_s
    assert rank.grad_sync[0].latency_s == pytest.approx(20 * US)
    assert [(s.kind, s.stream) for s in rank.optimizer] == [
        ("optimizer", "compute"),
        ("ps_pull", "dp"),
    ]
    assert rank.optimizer[0].duration_s == pytest.approx(adam_step_bytes(params / 8) / rate)
    assert rank.optimizer[1].duration_s == pull.duration_s
    dedicated = ps_plan(8, servers=2)
    rank = build_pipeline_work(TINY, dedicated, prof).ranks[0]
    assert [s.kind for s in rank.optimizer] == ["ps_update", "ps_pull"]
    per_server = job_parameters(TINY, dedicated) / 2
    assert rank.optimizer[0].duration_s == pytest.approx(adam_step_bytes(per_server) / rate)
    # memory: the servers hold the optimizer states (12 B/param with bf16)
    ring = colocated.with_fields(dp_sync=DpSync.RING)
    assert rank_memory(TINY, ring, prof, rank=0).optimizer_bytes == pytest.approx(12 * params)
    assert rank_memory(TINY, colocated, prof, rank=0).optimizer_bytes == pytest.approx(
        12 * params / 8
    )
    assert rank_memory(TINY, dedicated, prof, rank=0).optimizer_bytes == 0.0
    for plan in (colocated, dedicated):
        mem = rank_memory(TINY, plan, prof, rank=0)
        assert mem.gradients_bytes == pytest.approx(4 * params)
        assert mem.weights_bytes == pytest.approx(2 * params)


def test_overlapped_push_goes_in_buckets_of_the_same_bytes() -> None:
    prof = round_profile()
    model = resolve_model("megatron-1.7b")
    plan = ps_plan(8, pp=2, overlap_grad_reduce=True, m=2)
    work = build_pipeline_work(model, plan, prof)
    assert [s.kind for s in work.ranks[0].grad_sync] == ["embedding_grad_comm"]
    for rank in (0, 1):
        buckets = work.stages[rank].grad_buckets
        assert {b.segment.kind for b in buckets} == {"ps_push"}
        grad_bytes = 4 * rank_parameters(model, plan, rank=rank)
        assert sum(b.segment.num_bytes for b in buckets) == pytest.approx(grad_bytes)
    assert len(work.stages[0].grad_buckets) > 1  # stage 0 is bucketed by 40M parameters
    # dedicated servers with one worker per DP group still push, in buckets
    solo = ps_plan(1, tp=8, servers=4, overlap_grad_reduce=True)
    solo_buckets = build_pipeline_work(model, solo, prof).stages[0].grad_buckets
    assert {b.segment.kind for b in solo_buckets} == {"ps_push"}


def _rows(ev: Evaluation, kind: str) -> pd.DataFrame:
    tl = ev.result.timeline
    return tl[tl.kind == kind]


@pytest.mark.parametrize("servers", [0, 2])
def test_engine_runs_push_update_pull_back_to_back(servers: int) -> None:
    prof = round_profile()
    plan = ps_plan(2, servers=servers)
    ev = evaluate(TINY, plan, prof)
    assert isinstance(ev, Evaluation)
    rank = build_pipeline_work(TINY, plan, prof).ranks[0]
    backward_end = float(_rows(ev, "backward").end_s.max())
    push = _rows(ev, "ps_push").iloc[0]
    update = _rows(ev, "optimizer" if servers == 0 else "ps_update").iloc[0]
    pull = _rows(ev, "ps_pull").iloc[0]
    assert (push.stream, pull.stream) == ("dp", "dp")
    assert push.start_s == pytest.approx(backward_end)
    assert push.end_s - push.start_s == pytest.approx(rank.grad_sync[0].duration_s)
    assert update.start_s == pytest.approx(push.end_s)
    assert pull.start_s == pytest.approx(update.end_s)
    assert ev.step_time_s == pytest.approx(
        backward_end + sum(s.duration_s for s in rank.grad_sync + rank.optimizer)
    )


def test_simulation_is_deterministic() -> None:
    model = resolve_model("megatron-1.7b")
    prof = load_profile("a100-sxm4-80gb")
    plan = ps_plan(4, pp=2, servers=3, overlap_grad_reduce=True, m=4)
    a, b = evaluate(model, plan, prof), evaluate(model, plan, prof)
    assert isinstance(a, Evaluation) and isinstance(b, Evaluation)
    assert a.step_time_s == b.step_time_s
    pd.testing.assert_frame_equal(a.result.timeline, b.result.timeline)
    assert build_pipeline_work(model, plan, prof) == build_pipeline_work(model, plan, prof)


# --- the classic trade-off -----------------------------------------------------------------


def _sync_s(model: ModelSpec, plan: ParallelPlan, prof: HardwareProfile) -> float:
    """Seconds of DP traffic on rank 0's tail (everything but the optimizer compute)."""
    rank = build_pipeline_work(model, plan, prof).ranks[0]
    segs = rank.grad_sync + rank.optimizer
    return sum(s.duration_s for s in segs if s.kind not in ("optimizer", "ps_update"))


def test_ps_beats_ring_when_latency_bound_many_nodes() -> None:
    # 64 workers, one per node, a tiny model: one round trip per phase against a ring whose
    # latency grows with the nodes it spans (comm.collective_time_s)
    prof = round_profile(gpus_per_node=1)
    ps = ps_plan(64)
    zero1 = ps.with_fields(dp_sync=DpSync.RING, zero_stage=1)  # same optimizer shard and memory
    groups = layout_groups(ps, gpus_per_node=1)
    grad = 4 * rank_parameters(TINY, ps, rank=0)
    weights = grad / 2
    ps_s = _sync_s(TINY, ps, prof)
    assert ps_s == pytest.approx(4 * 5 * US + (63 / 64) * (grad + weights) / 10e9)
    ring = collective_time_s(
        prof, collective="reduce_scatter", message_bytes=grad, span=groups.dp_cp
    ) + collective_time_s(prof, collective="all_gather", message_bytes=weights, span=groups.dp_cp)
    assert _sync_s(TINY, zero1, prof) == pytest.approx(ring)
    assert ps_s < ring
    a, b = evaluate(TINY, ps, prof), evaluate(TINY, zero1, prof)
    assert isinstance(a, Evaluation) and isinstance(b, Evaluation)
    # the ring also pays Megatron-core's 1/dp pass over its fp32 gradient buffer (read +
    # write, elementwise.grad_average_bytes); the servers average as they apply the update
    average_s = 2 * grad / prof.streaming_bytes_per_s()
    assert b.step_time_s - a.step_time_s == pytest.approx(ring - ps_s + average_s, rel=1e-6)
    assert a.step_time_s < b.step_time_s


def test_ps_loses_when_bandwidth_bound_with_few_servers() -> None:
    prof = round_profile(gpus_per_node=1)
    model = resolve_model("megatron-1.7b")
    ps = ps_plan(8, servers=2)
    ring = ps.with_fields(dp_sync=DpSync.RING, ps_servers=0)
    grad = 4 * rank_parameters(model, ps, rank=0)
    # push and pull each at the server NIC: W/K = 4 times the worker's own bytes
    assert _sync_s(model, ps, prof) == pytest.approx(2 * 10 * US + 4 * 1.5 * grad / 10e9)
    assert _sync_s(model, ps, prof) > 3 * _sync_s(model, ring, prof)
    a, b = evaluate(model, ps, prof), evaluate(model, ring, prof)
    assert isinstance(a, Evaluation) and isinstance(b, Evaluation)
    assert a.step_time_s > b.step_time_s
    # enough dedicated servers (K = W) bring the server side down to the worker's NIC
    assert _sync_s(model, ps.with_fields(ps_servers=8), prof) == pytest.approx(
        2 * 10 * US + 1.5 * grad / 10e9
    )


# --- planner: bounds and enumeration ------------------------------------------------------


def test_lower_bound_never_exceeds_the_simulated_step_time() -> None:
    rng = random.Random(7)
    cases = (
        ("megatron-1.7b", load_profile("a100-sxm4-80gb"), 16, 32, 0),
        ("megatron-1.7b", round_profile(gpus_per_node=2), 8, 32, 3),
    )
    checked = 0
    for name, prof, gpus, gbs, servers in cases:
        ctx = SearchContext(resolve_model(name), prof)
        space = SearchSpace(max_micro_batch_size=2, dp_syncs=(PS,), ps_servers=servers)
        feasible: list[Candidate] = []
        for layout in layouts(gpus, space):
            feasible += ctx.cost_layout(
                layout, num_gpus=gpus, global_batch_size=gbs, space=space
            ).feasible
        for cand in rng.sample(feasible, 12):
            assert cand.plan.dp_sync is PS
            ev = ctx.simulate(cand.plan, keep_below_s=float("inf"))
            if isinstance(ev, Evaluation):
                assert cand.bound_s <= ev.step_time_s, cand.label
                work = build_pipeline_work(ctx.model, cand.plan, prof)
                bound = step_time_lower_bound_s(work, schedule=cand.plan.schedule)
                assert bound == pytest.approx(cand.bound_s)
                checked += 1
    assert checked >= 20


def test_planner_enumerates_ps_only_when_asked_and_only_with_zero0() -> None:
    kw = {"num_gpus": 8, "global_batch_size": 16, "num_layers": 24}
    small = {"max_micro_batch_size": 2, "schedules": (Schedule.ONE_F_ONE_B,)}
    ring = list(enumerate_plans(space=SearchSpace(**small), **kw))  # type: ignore[arg-type]
    assert all(p.dp_sync is DpSync.RING for p in ring)
    both = list(enumerate_plans(space=SearchSpace(dp_syncs=tuple(DpSync), **small), **kw))  # type: ignore[arg-type]
    ps = [p for p in both if p.dp_sync is PS]
    assert [p for p in both if p.dp_sync is DpSync.RING] == ring
    # every ring ZeRO-0 plan with dp * cp > 1 has its colocated-PS twin, nothing else
    twins = {p.with_fields(dp_sync=PS) for p in ring if p.zero_stage == 0 and p.dp > 1}
    assert set(ps) == twins and len(ps) == len(twins)
    dedicated = list(
        enumerate_plans(space=SearchSpace(dp_syncs=(PS,), ps_servers=4, **small), **kw)  # type: ignore[arg-type]
    )
    assert {p.ps_servers for p in dedicated} == {4}
    assert any(p.dp == 1 for p in dedicated)  # dedicated servers serve one replica too


# --- plan fields, labels, errors, CLI -------------------------------------------------------


def test_label_and_defaults() -> None:
    plain = plan_from_fields(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8)
    assert (plain.dp_sync, plain.ps_servers) == (DpSync.RING, 0)
    assert "ps" not in plain.label().split()
    assert ps_plan(8).label().endswith(" ps")
    assert ps_plan(8, servers=4).label().endswith(" ps4")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dp_sync": "ps"}, "plan.dp_sync='ps' is not allowed; choose one of: ring, parameter-"),
        ({"dp_sync": PS, "ps_servers": -1}, "plan.ps_servers must be an integer >= 0, got -1"),
        ({"dp_sync": PS, "ps_servers": True}, "plan.ps_servers must be an integer >= 0"),
        ({"ps_servers": 2}, "plan.ps_servers(2) needs dp_sync parameter-server (got ring)"),
        ({"dp_sync": PS, "zero_stage": 1}, "dp_sync parameter-server needs zero_stage 0 (got 1)"),
    ],
)  # fmt: skip
def test_errors_name_the_field_and_the_allowed_values(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError) as err:
        plan_from_fields(dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8, **changes)  # type: ignore[arg-type]
    assert message in str(err.value)


SIM = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
SIM += ["--tp", "1", "--pp", "1", "--mbs", "1", "--gbs", "16"]


def test_cli_simulate_and_plan_with_dp_sync(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main([*SIM, "--dp-sync", "parameter-server", "--ps-servers", "4", "--format", "json"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert (doc["plan"]["dp_sync"], doc["plan"]["ps_servers"]) == ("parameter-server", 4)
    assert doc["busy_s_by_kind"]["ps_push"] > 0 and doc["busy_s_by_kind"]["ps_pull"] > 0
    assert main([*SIM, "--format", "json"]) == 0
    assert "dp_sync" not in json.loads(capsys.readouterr().out)["plan"]  # ring: unchanged
    plan = ["plan", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "4"]
    plan += ["--gbs", "8", "--jobs", "1", "--top", "200", "--format", "csv", "--dp-sync", "all"]
    assert main(plan) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.endswith(",dp_sync")
    assert {row.rsplit(",", 1)[1] for row in rows} == {"ring", "ps"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ps-servers", "2"], "--ps-servers 2 needs --dp-sync parameter-server"),
        (["--dp-sync", "parameter-server", "--ps-servers", "-1"], "--ps-servers must be"),
        (["--dp-sync", "parameter-server", "--zero", "2"], "needs zero_stage 0 (got 2)"),
    ],
)
def test_cli_errors_are_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SIM, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
