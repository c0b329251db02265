"""Hybrid sharding (HSDP, ``ParallelPlan.dp_shard``): ZeRO-3 sharded over dp_shard * cp
ranks and replicated over dp / dp_shard groups (PyTorch FSDP ``HYBRID_SHARD``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plansim.analytic.comm import collective_time_s
from plansim.analytic.memory import rank_memory
from plansim.analytic.ranks import GroupSpan, layout_groups, zero_replicate_size, zero_shard_size
from plansim.analytic.zero3 import layer_param_tensors, unit_traffic
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.io.runs import RunRow
from plansim.planner.backtest import predict_row
from plansim.planner.enumerate import SearchSpace, enumerate_plans
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.planner.hsdp import dp_shard_options
from plansim.planner.search import SearchResult, search
from plansim.specs.plan import (
    OffloadDevice,
    ParallelPlan,
    Recompute,
    Zero3ParamFetch,
    plan_from_fields,
)

H100 = load_profile("h100-sxm5-80gb")
MODEL = resolve_model("llama2-7b")
NONE2 = (OffloadDevice.NONE, OffloadDevice.NONE)


def _plan(dp: int, dp_shard: int | None = None, **kw: object) -> ParallelPlan:
    fields: dict[str, object] = {
        "tp": 1,
        "pp": 1,
        "dp": dp,
        "micro_batch_size": 1,
        "global_batch_size": dp,
        "zero_stage": 3,
        "recompute": Recompute.FULL,
        "use_torch_fsdp2": True,
        "dp_shard": dp_shard,
    }
    return plan_from_fields(**{**fields, **kw})  # type: ignore[arg-type]


def test_groups_worked_example() -> None:
    # tp 2, dp 8, dp_shard 4 on 8-GPU nodes: a shard group is the 4 DP ranks of one node
    # (stride tp = 2), its replica group the 2 nodes' same-position ranks (stride 8).
    plan = _plan(8, 4, tp=2)
    groups = layout_groups(plan, gpus_per_node=8)
    assert (zero_shard_size(plan), zero_replicate_size(plan)) == (4, 2)
    assert groups.shard == GroupSpan(size=4, members_per_node=4, num_nodes=1)
    assert groups.replicate == GroupSpan(size=2, members_per_node=1, num_nodes=2)
    full = layout_groups(_plan(8, tp=2), gpus_per_node=8)
    assert full.shard == full.dp_cp and full.replicate.size == 1


def test_states_shard_over_the_shard_group_only() -> None:
    # dp 64 with shard groups of 8 holds what dp 8 fully sharded holds
    hsdp = rank_memory(MODEL, _plan(64, 8), H100, rank=0)
    dp8 = rank_memory(MODEL, _plan(8), H100, rank=0)
    dp64 = rank_memory(MODEL, _plan(64), H100, rank=0)
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert getattr(hsdp, field) == pytest.approx(getattr(dp8, field), rel=1e-12)
        assert getattr(hsdp, field) == pytest.approx(8 * getattr(dp64, field), rel=1e-12)


def test_traffic_is_the_shard_groups_plus_an_all_reduce_over_the_replicas() -> None:
    plan, dp8 = _plan(64, 8), _plan(8)
    tensors = layer_param_tensors(MODEL, plan)
    kw = {"profile": H100, "param_bytes": 2.0, "grad_bytes": 2.0}
    hsdp = unit_traffic(tensors, plan=plan, groups=layout_groups(plan, gpus_per_node=8), **kw)
    one = unit_traffic(tensors, plan=dp8, groups=layout_groups(dp8, gpus_per_node=8), **kw)
    assert hsdp.gather_s == pytest.approx(one.gather_s, rel=1e-12)  # inside one node
    replicas = GroupSpan(size=8, members_per_node=1, num_nodes=8)
    shard_bytes = sum(tensors) * 2.0 / 8
    all_reduce = collective_time_s(
        H100, collective="all_reduce", message_bytes=shard_bytes, span=replicas
    )
    assert hsdp.scatter_s - one.scatter_s == pytest.approx(all_reduce, rel=1e-9)
    assert all_reduce > 0
    # fully sharded over 64 ranks (8 nodes), the gathers cross the NICs instead
    full = _plan(64)
    far = unit_traffic(tensors, plan=full, groups=layout_groups(full, gpus_per_node=8), **kw)
    assert far.gather_s != hsdp.gather_s


def test_engine_peak_memory_equals_analytic() -> None:
    plan = _plan(16, 8, global_batch_size=32)
    ev = evaluate(MODEL, plan, H100)
    assert isinstance(ev, Evaluation)
    total = rank_memory(MODEL, plan, H100, rank=0).total_bytes
    assert ev.result.peak_memory_bytes[0] == pytest.approx(total, rel=1e-12)
    assert "hsdp8" in plan.label()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"zero_stage": 0, "use_torch_fsdp2": False}, r"needs zero_stage 1, 2 or 3 \(got 0\)"),
        ({"dp_shard": 3}, r"a divisor of dp\(16\) below it"),
        ({"dp_shard": 16}, r"dp_shard = dp is full sharding: leave dp_shard unset"),
        ({"dp_shard": 1}, r"a shard group of at least 2 ranks \(dp_shard \* cp = 1\)"),
        ({"dp_shard": 0}, "plan.dp_shard"),
        (
            {"offload_optimizer": OffloadDevice.CPU, "use_torch_fsdp2": False},
            "needs no offload",
        ),
        (
            {"zero3_param_fetch": Zero3ParamFetch.PER_TENSOR_SYNC, "use_torch_fsdp2": False},
            "per-tensor-sync",
        ),
    ],
)
def test_bad_hybrid_sharding_is_one_clear_error(kw: dict[str, object], message: str) -> None:
    fields = {"dp_shard": 8, **kw}
    with pytest.raises(SpecError, match=message):
        _plan(16, **fields)  # type: ignore[arg-type]


def test_shard_options_fill_one_node() -> None:
    options = dict(zero_stage=3, offload=NONE2, fetch=Zero3ParamFetch.LAYER_PREFETCH)
    assert dp_shard_options(8, tp=2, cp=1, dp=32, **options) == (None, 4)  # type: ignore[arg-type]
    assert dp_shard_options(8, tp=1, cp=2, dp=32, **options) == (None, 4)  # type: ignore[arg-type]
    assert dp_shard_options(None, tp=1, cp=1, dp=32, **options) == (None,)  # type: ignore[arg-type]
    assert dp_shard_options(8, tp=8, cp=1, dp=32, **options) == (None,)  # type: ignore[arg-type]
    assert dp_shard_options(8, tp=1, cp=1, dp=8, **options) == (None,)  # type: ignore[arg-type]
    assert dp_shard_options(8, tp=1, cp=1, dp=12, **options) == (None,)  # type: ignore[arg-type]
    assert dp_shard_options(  # no sharded state
        8, tp=1, cp=1, dp=32, zero_stage=0, offload=NONE2, fetch=Zero3ParamFetch.LAYER_PREFETCH
    ) == (None,)
    assert dp_shard_options(  # ZeRO-2: Megatron-core's partial distributed optimizer
        8, tp=1, cp=1, dp=32, zero_stage=2, offload=NONE2, fetch=Zero3ParamFetch.LAYER_PREFETCH
    ) == (None, 8)


def test_the_search_tries_it_only_when_asked() -> None:
    space = SearchSpace(tp=(1, 2), pp=(1,), micro_batch_size=(1,), zero_stages=(2, 3))
    kw = {"num_gpus": 32, "global_batch_size": 32, "num_layers": 32}
    assert {p.dp_shard for p in enumerate_plans(space=space, **kw)} == {None}  # type: ignore[arg-type]
    plans = list(enumerate_plans(space=replace(space, hsdp_shard_gpus=8), **kw))  # type: ignore[arg-type]
    hybrid = {(p.tp, p.dp, p.dp_shard) for p in plans if p.dp_shard is not None}
    assert hybrid == {(1, 32, 8), (2, 16, 4)}
    assert {p.zero_stage for p in plans if p.dp_shard is not None} == {2, 3}
    full = [p for p in plans if p.dp_shard is None]
    assert sum(p.dp_shard is not None for p in plans) == len(full)  # one hybrid twin each


def test_cli_simulate_and_plan(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--model", "llama2-7b", "--gpu", "h100-sxm5-80gb", "--gpus", "32"]
    base += ["--gbs", "32", "--tp", "1", "--pp", "1", "--mbs", "1", "--zero", "3"]
    assert main([*base, "--dp-shard", "8"]) == 0
    assert "hsdp8" in capsys.readouterr().out
    assert main([*base, "--dp-shard", "5"]) == 2
    err = capsys.readouterr().err
    assert "plan.dp_shard(5) needs a divisor of dp(32) below it" in err
    assert "Traceback" not in err


ROW = {
    "row_id": "H1",
    "model_name": "Llama 2 7B",
    "num_layers": "32",
    "hidden_size": "4096",
    "num_attention_heads": "32",
    "ffn_hidden_size": "11008",
    "ffn_activation": "swiglu",
    "vocab_size": "32000",
    "seq_len_tokens": "4096",
    "gpu_type": "h100-sxm5-80gb",
    "precision": "bf16",
    "num_gpus": "64",
    "tp": "1",
    "pp": "1",
    "dp": "64",
    "micro_batch_size_seqs": "2",
    "global_batch_size_seqs": "512",
    "recompute": "none",
    "framework": "torchtitan (2024)",
    "step_time_s": "2.5",
}


@pytest.mark.parametrize(
    ("sharding", "hybrid", "torch_fsdp"),
    [
        ("FSDP HYBRID_SHARD", True, True),
        ("HSDP", True, True),
        ("hybrid-shard", True, False),
        ("FSDP", False, True),
    ],
)
def test_a_run_stated_as_hybrid_sharded_is_predicted_so(
    sharding: str, hybrid: bool, torch_fsdp: bool
) -> None:
    row = RunRow(path="runs.csv", line=2, cells={**ROW, "zero_stage_or_sharding": sharding})
    prediction = predict_row(row)
    assert prediction.status == "ok", prediction.note
    assert "zero3" in prediction.plan_label
    assert ("hsdp8" in prediction.plan_label) is hybrid
    assert ("torch-fsdp" in prediction.plan_label) is torch_fsdp
    assert ("shard groups of 8 GPUs" in prediction.note) is hybrid


def test_the_pruned_search_with_hybrid_sharding_is_exact() -> None:
    """Branch and bound over a space with HSDP plans returns the exhaustive top k, and some
    of the feasible plans are hybrid-sharded (ZeRO-3 over 4 GPUs of a node)."""
    space = SearchSpace(
        max_micro_batch_size=1,
        zero_stages=(1, 3),
        recomputes=(Recompute.FULL,),
        max_vpp=2,
        hsdp_shard_gpus=4,
    )
    kw = {"num_gpus": 16, "global_batch_size": 32, "space": space, "top_k": 8}
    model = resolve_model("megatron-1.7b")
    pruned = search(model, H100, **kw)  # type: ignore[arg-type]
    full = search(model, H100, exhaustive=True, **kw)  # type: ignore[arg-type]

    def top(result: SearchResult) -> list[tuple[str, float]]:
        return [(e.plan.label(), e.step_time_s) for e in result.ranked[:8]]

    assert top(pruned) == top(full)
    assert any(e.plan.dp_shard is not None for e in full.ranked)
    assert pruned.num_simulated < full.num_simulated


def test_zero1_with_a_partial_distributed_optimizer() -> None:
    """ZeRO-1 with dp_shard (Megatron-core --num-distributed-optimizer-instances = dp /
    dp_shard): optimizer states sharded over the shard group, gradients reduce-scattered in
    it and the shard all-reduced over the instances, parameters gathered in it."""
    from plansim.analytic.comm import sharded_reduce_time_s
    from plansim.analytic.rank_work import rank_work

    plan = _plan(64, 8, zero_stage=1, use_torch_fsdp2=False)
    assert "shard8" in plan.label() and "hsdp" not in plan.label()
    dp8 = _plan(8, zero_stage=1, use_torch_fsdp2=False)
    mem, mem8 = (rank_memory(MODEL, p, H100, rank=0) for p in (plan, dp8))
    assert mem.optimizer_bytes == pytest.approx(mem8.optimizer_bytes, rel=1e-12)
    groups = layout_groups(plan, gpus_per_node=8)
    work = rank_work(0, model=MODEL, plan=plan, profile=H100, groups=groups)
    sync = [s for s in work.grad_sync if s.kind == "dp_comm"]
    assert len(sync) == 1
    expected = sharded_reduce_time_s(
        H100, message_bytes=sync[0].num_bytes, shard=groups.shard, replicate=groups.replicate
    )
    assert sync[0].duration_s == pytest.approx(expected, rel=1e-12)
    scatter_only = collective_time_s(
        H100, collective="reduce_scatter", message_bytes=sync[0].num_bytes, span=groups.shard
    )
    assert sync[0].duration_s > scatter_only  # the all-reduce over the 8 instances
