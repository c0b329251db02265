"""Megatron-LM --tp-comm-overlap: TP collectives pipelined with their GEMMs (tp_comm)."""

from __future__ import annotations

import json

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.ranks import layout_groups
from plansim.analytic.tp_comm import LinearGemms, overlapped_tp_s, pipelined_s
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.specs.plan import ParallelPlan, Recompute, plan_from_fields


def test_pipelined_exposure_hand_computed() -> None:
    # GEMM covers every chunk: only the first chunk's transfer shows
    assert pipelined_s(8.0, 16.0, chunked_gemm_s=16.0, chunks=4, slowdown=0.0) == 2.0
    # communication-bound: first chunk + 3 x (4 - 2)
    assert pipelined_s(16.0, 8.0, chunked_gemm_s=8.0, chunks=4, slowdown=0.0) == 10.0
    # hidden, but the GEMM runs 25% slower beside it: 2 + 3 x 2 x 0.25 / 1.25
    assert pipelined_s(8.0, 16.0, chunked_gemm_s=16.0, chunks=4, slowdown=0.25) == pytest.approx(
        3.2
    )
    # tp pieces of m / tp rows take 20 instead of 16: the 4 extra seconds are charged
    assert pipelined_s(8.0, 16.0, chunked_gemm_s=20.0, chunks=4, slowdown=0.0) == 6.0
    with pytest.raises(SpecError, match="chunks"):
        pipelined_s(8.0, 16.0, chunked_gemm_s=16.0, chunks=0, slowdown=0.0)


def test_layer_exposure_adds_pipelined_and_bulk_parts() -> None:
    g = LinearGemms(qkv=30.0, proj=10.0, fc1=40.0, fc2=40.0)
    fwd, bwd = overlapped_tp_s(
        all_gather_s=8.0, reduce_scatter_s=8.0, gemms=g, chunked=g, tp=2, slowdown=0.0
    )
    # forward: 4 pipelined pairs, each GEMM chunk (>= 5) covers the 4 s transfer chunk
    assert fwd == 4 * 4.0
    # backward: proj and fc2 dgrad pipelined (4 each); qkv/fc1 bulk: 0 (GEMMs longer)
    assert bwd == 8.0
    slow = LinearGemms(qkv=2.0, proj=2.0, fc1=2.0, fc2=2.0)
    fwd, bwd = overlapped_tp_s(
        all_gather_s=8.0, reduce_scatter_s=8.0, gemms=slow, chunked=slow, tp=2, slowdown=0.0
    )
    assert fwd == 4 * (4.0 + (4.0 - 1.0))  # each chunk exposes what its GEMM chunk misses
    assert bwd == 2 * 7.0 + 4 * (8.0 - 2.0)


H100 = load_profile("h100-sxm5-80gb")
GPT3 = resolve_model("gpt3-175b")


def _plan(**kw: object) -> ParallelPlan:
    base = dict(dp=1, tp=8, pp=1, micro_batch_size=1, global_batch_size=1)
    return plan_from_fields(**{**base, **kw})  # type: ignore[arg-type]


def test_overlap_hides_most_tp_time_of_a_large_layer_and_changes_nothing_else() -> None:
    plain = _plan(sequence_parallel=True)
    over = plain.with_fields(tp_comm_overlap=True)
    groups = layout_groups(plain, gpus_per_node=H100.gpus_per_node)
    a = layer_pass_times(GPT3, plain, H100, groups)
    b = layer_pass_times(GPT3, over, H100, groups)
    # mbs 1 at tp 8: the QKV/MLP GEMMs run as 8 pieces of 256 rows, less efficient; the
    # pieces' extra time is charged to the exposed TP time, so about half stays
    assert 0 < b.tp_forward_s < 0.6 * a.tp_forward_s
    assert 0 < b.tp_backward_s < 0.6 * a.tp_backward_s
    assert b.tp_recompute_s == a.tp_recompute_s == 0.0
    assert (b.forward_s, b.backward_input_s, b.backward_weight_s) == (
        a.forward_s,
        a.backward_input_s,
        a.backward_weight_s,
    )
    full = layer_pass_times(GPT3, over.with_fields(recompute=Recompute.FULL), H100, groups)
    assert full.tp_recompute_s == pytest.approx(b.tp_forward_s)


def test_plan_needs_sequence_parallelism_and_is_labelled() -> None:
    with pytest.raises(SpecError, match=r"tp_comm_overlap needs sequence_parallel"):
        _plan(tp_comm_overlap=True)
    assert "sp-overlap" in _plan(sequence_parallel=True, tp_comm_overlap=True).label()


def test_planner_tries_it_only_with_sp_when_asked() -> None:
    def count(space: SearchSpace) -> tuple[int, int]:
        plans = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=space))
        return len(plans), sum(p.tp_comm_overlap for p in plans)

    narrow = dict(zero_stages=(0,), recomputes=(Recompute.NONE,), micro_batch_size=(1,), pp=(1,))
    total, with_overlap = count(SearchSpace(**narrow))  # type: ignore[arg-type]
    assert with_overlap == 0
    total2, with_overlap2 = count(SearchSpace(**narrow, tp_comm_overlap=(False, True)))  # type: ignore[arg-type]
    sp_plans = [
        p
        for p in enumerate_plans(num_gpus=8, global_batch_size=8, space=SearchSpace(**narrow))  # type: ignore[arg-type]
        if p.sequence_parallel
    ]
    assert with_overlap2 == len(sp_plans) > 0 and total2 == total + len(sp_plans)


def test_simulate_cli_flag_json_and_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt3-175b", "--gpu", "h100-sxm5-80gb", "--gpus", "64"]
    args += ["--gbs", "64", "--tp", "8", "--pp", "8", "--mbs", "1", "--recompute", "full"]
    assert main([*args, "--tp-comm-overlap"]) == 2
    assert "tp_comm_overlap needs sequence_parallel" in capsys.readouterr().err
    results = []
    for extra in ([], ["--tp-comm-overlap"]):
        assert main([*args, "--sequence-parallel", *extra, "--format", "json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    plain, over = results
    assert "tp_comm_overlap" not in plain["plan"] and over["plan"]["tp_comm_overlap"] is True
    assert over["exposed_comm_s_by_kind"]["tp_comm"] < plain["exposed_comm_s_by_kind"]["tp_comm"]
    assert over["step_time_s"] < plain["step_time_s"]


def test_a_search_memo_keeps_overlap_and_plain_layers_apart() -> None:
    """The planner prices many plans with one memo: the overlap plan must not reuse the
    plain plan's layer times (the memo key carries tp_comm_overlap)."""
    plain = _plan(sequence_parallel=True, pp=2, global_batch_size=4)
    over = plain.with_fields(tp_comm_overlap=True)
    memo: dict[object, object] = {}
    build_pipeline_work(GPT3, plain, H100, memo=memo)
    shared = build_pipeline_work(GPT3, over, H100, memo=memo)
    assert shared == build_pipeline_work(GPT3, over, H100)
    assert shared != build_pipeline_work(GPT3, plain, H100)
