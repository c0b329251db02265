"""Planning and simulating models with routed experts: dispatch volumes, expert shards,
all-to-all pricing, the ep/etp enumeration, rejections, the timeline and the MoE back-test."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plansim.analytic.comm import all_to_all_time_s
from plansim.analytic.memory import rank_model_states as states
from plansim.analytic.memory import worst_rank_memory
from plansim.analytic.moe_counts import count_moe_parameters
from plansim.analytic.moe_layer import (
    dispatch_message_bytes,
    expert_traffic,
    rank_parameter_split,
    tokens_per_local_expert,
)
from plansim.analytic.ranks import GroupSpan
from plansim.analytic.stored_activations import microbatch_activation_bytes
from plansim.catalog import MOE_PRESETS, resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.plan_file import PlanFile, read_plan_file, write_plan_file
from plansim.io.profiles import load_profile
from plansim.io.runs import read_runs
from plansim.planner.backtest import predict_row
from plansim.planner.enumerate import enumerate_plans
from plansim.planner.evaluate import Evaluation, Rejected, check_plan, evaluate
from plansim.planner.space import SearchSpace
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.moe import MoESpec, RouterScore, RouterSpec
from plansim.specs.plan import Precision, Recompute, Schedule, plan_from_fields

MOE_RUNS = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "moe_runs.csv"


def _tiny_moe(**changes: object) -> ModelSpec:
    """4 layers (the first dense), h 1024, 8 experts of 512, top-2, 1 shared expert."""
    fields: dict[str, object] = {
        "name": "tiny-moe",
        "num_layers": 4,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_query_groups": 8,
        "ffn_hidden_size": 2048,
        "activation": Activation.SWIGLU,
        "seq_length": 512,
        "vocab_size": 4096,
        "tied_embeddings": False,
        "normalization": Normalization.RMSNORM,
        "position_embedding": PositionEmbedding.ROPE,
        "add_bias_linear": False,
        "dropout": False,
        "moe": MoESpec(
            num_experts=8,
            expert_ffn_hidden_size=512,
            router=RouterSpec(score=RouterScore.SOFTMAX, top_k=2),
            num_shared_experts=1,
            first_k_dense_layers=1,
        ),
    }
    fields.update(changes)
    return ModelSpec(**fields)  # type: ignore[arg-type]


def _plan(**fields: object):
    base: dict[str, object] = {
        "dp": 8, "tp": 1, "pp": 1, "ep": 4, "etp": 1, "micro_batch_size": 2,
        "global_batch_size": 32, "zero_stage": 1,
    }  # fmt: skip
    base.update(fields)
    return plan_from_fields(**base)


def test_dispatch_volume_hand_worked() -> None:
    # b = 2 sequences of s = 512 tokens, tp = cp = 1: T = 1024 tokens routed by a rank, each
    # to top_k = 2 experts: 2048 rows of h = 1024 16-bit values = 4 MiB per all-to-all.
    model, plan = _tiny_moe(), _plan()
    assert dispatch_message_bytes(model, plan) == 2 * 1024 * 2 * 1024
    # the EP group of 4 ranks holds 8 experts, 2 each; it routes 4 x 2048 rows: 1024 per expert
    assert tokens_per_local_expert(model, plan) == 1024
    traffic = expert_traffic(model, plan)
    assert traffic.etp_gather_bytes == 0.0
    assert traffic.stored_rows_bytes == 2 * 1024 * 2 * 1024
    # a 1.5x busier rank gets 1.5x the rows and bytes
    busy = _plan(expert_load_imbalance=1.5)
    assert tokens_per_local_expert(model, busy) == 1536
    assert dispatch_message_bytes(model, busy) == 1.5 * 2 * 1024 * 2 * 1024


def test_all_to_all_inside_and_across_nodes() -> None:
    profile = load_profile("h100-sxm5-80gb")
    message = 64 * 2**20
    curve = profile.intra_node.get("all_to_all") or profile.intra_node["all_gather"]
    inside = all_to_all_time_s(
        profile, message_bytes=message, span=GroupSpan(size=8, members_per_node=8, num_nodes=1)
    )
    assert inside == pytest.approx(
        curve.latency_s + message * 7 / 8 / curve.busbw_bytes_per_s(message)
    )
    across = all_to_all_time_s(
        profile, message_bytes=message, span=GroupSpan(size=64, members_per_node=8, num_nodes=8)
    )
    nic = profile.nic_bytes_per_s * profile.message_busbw_fraction(message)
    # 56/64 of the buffer leaves the node through the rank's own NIC rail
    assert across >= message * 56 / 64 / nic
    assert across > inside
    assert (
        all_to_all_time_s(
            profile, message_bytes=message, span=GroupSpan(size=1, members_per_node=1, num_nodes=1)
        )
        == 0.0
    )


def test_expert_shards_add_up_to_the_model() -> None:
    model = MOE_PRESETS["deepseek-v3"]()
    plan = plan_from_fields(
        dp=128, tp=1, pp=16, ep=64, micro_batch_size=1, global_batch_size=15360,
        zero_stage=1, decoder_first_pipeline_num_layers=3, decoder_last_pipeline_num_layers=2,
    )  # fmt: skip
    counts = count_moe_parameters(model)
    splits = [rank_parameter_split(model, plan, rank=r) for r in range(plan.pp)]
    whole = sum(s.dense for s in splits) + sum(s.expert for s in splits) * plan.ep
    assert whole == pytest.approx(counts.total_with_mtp, rel=1e-12)
    # 58 MoE layers' 256 experts of 3 x 7168 x 2048 over ep 64: 4 experts a layer per rank
    moe_layers = sum(model.moe.is_moe_layer(i) for i in range(model.num_layers))  # type: ignore[union-attr]
    assert moe_layers == 58
    assert splits[1].expert == 4 * 4 * 3 * 7168 * 2048


def test_plan_with_experts_shows_dispatch_on_the_timeline() -> None:
    model, profile = _tiny_moe(), load_profile("h100-sxm5-80gb")
    ev = evaluate(model, _plan(), profile)
    assert isinstance(ev, Evaluation)
    kinds = set(ev.result.timeline["kind"])
    assert "ep_comm" in kinds
    assert ev.exposed_comm_s_by_kind["ep_comm"] > 0
    # no expert parallelism: no all-to-all, and each rank holds all 8 experts
    alone = evaluate(model, _plan(ep=1), profile)
    assert isinstance(alone, Evaluation)
    assert alone.exposed_comm_s_by_kind.get("ep_comm", 0.0) == 0.0
    assert alone.memory.weights_bytes > ev.memory.weights_bytes


def test_rejections_name_the_expert_rule() -> None:
    model, profile = _tiny_moe(), load_profile("h100-sxm5-80gb")
    bad = check_plan(model, _plan(dp=6, ep=6, global_batch_size=24), profile)
    assert isinstance(bad, Rejected)
    assert bad.category == "layout does not divide the experts"
    assert "num_experts(8) is not divisible by ep(6)" in bad.reason
    zero3 = check_plan(model, _plan(zero_stage=3), profile)
    assert isinstance(zero3, Rejected) and zero3.category == "not modelled with experts"
    dense = check_plan(dataclasses.replace(model, moe=None), _plan(), profile)
    assert isinstance(dense, Rejected) and "this model is dense" in dense.reason


def test_enumeration_folds_ep_into_tp_cp_dp() -> None:
    space = SearchSpace(
        tp=(2,), pp=(1,), micro_batch_size=(1,), ep=(1, 2, 4, 8), etp=(1, None),
        zero_stages=(1,), recomputes=(), sequence_parallel=(True,),
    )  # fmt: skip
    space = dataclasses.replace(space, recomputes=space.recomputes or SearchSpace().recomputes[:1])
    plans = list(enumerate_plans(num_gpus=8, global_batch_size=8, space=space, num_layers=4))
    pairs = {(p.ep, p.dims.expert_tensor_parallel_size) for p in plans}
    # tp x dp = 8 ranks: ep x etp must divide 8 (etp None = tp = 2)
    assert pairs == {(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)}
    assert all(p.dims.edp * p.ep * p.dims.expert_tensor_parallel_size == 8 for p in plans)


def test_bad_imbalance_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match="expert_load_imbalance must be a finite number >= 1"):
        _plan(expert_load_imbalance=0.5)


@pytest.mark.skipif(not MOE_RUNS.exists(), reason="shared reference data not present")
def test_moe_backtest_rows() -> None:
    _, rows = read_runs(MOE_RUNS)
    by_id = {r.row_id: r for r in rows}
    hybrid = predict_row(by_id["M0011"])
    assert hybrid.status == "skipped" and "hybrid" in hybrid.note
    qwen = predict_row(by_id["M0008"])  # Qwen3-30B-A3B, 8 GB200, EP8, MBS 4, MXFP8
    assert qwen.status == "ok" and qwen.step_time_error_pct is not None
    assert abs(qwen.step_time_error_pct) < 40
    assert qwen.exposed_comm_s_by_kind["ep_comm"] > 0
    assert qwen.plan is not None and qwen.plan.ep == 8
    deepseek = predict_row(by_id["M0274"])  # fits with the report's recompute
    assert deepseek.status == "ok" and deepseek.plan is not None
    assert deepseek.plan.recompute_modules == "layernorm,mla_up_proj"
    guide = predict_row(by_id["M0222"])  # the guide's layout string, from the row's notes
    assert guide.plan is not None
    assert guide.plan.pipeline_model_parallel_layout == "Et|(tt|)*30L"


def test_activations_do_not_depend_on_ep() -> None:
    # what the memo keys rely on (stored_activations.NOT_IN_ACTIVATIONS lists ep): the rows a
    # rank stores are its T*k*etp received rows whatever ep spreads the experts over
    model = _tiny_moe()
    one, four = _plan(ep=1), _plan(ep=4)
    for rank in range(one.pp):
        assert microbatch_activation_bytes(model, one, rank=rank) == microbatch_activation_bytes(
            model, four, rank=rank
        )
    # and the check can fail: etp changes them (each etp rank holds the group's rows)
    assert microbatch_activation_bytes(
        model, _plan(tp=2, etp=2, sequence_parallel=True), rank=0
    ) != (microbatch_activation_bytes(model, _plan(tp=2, etp=1, sequence_parallel=True), rank=0))


def _deepseek_report_plan(modules: str | None):
    """The DeepSeek-V3 report's layout (arXiv:2412.19437 §3.1-3.2): 2048 H800, PP16, EP64
    over 8 nodes, ZeRO-1, no TP, fp8; 1F1B stands in for DualPipe."""
    return plan_from_fields(
        dp=128, tp=1, pp=16, ep=64, etp=1, micro_batch_size=1, global_batch_size=15360,
        zero_stage=1, precision=Precision.FP8, recompute=Recompute.SELECTIVE,
        recompute_modules=modules, decoder_first_pipeline_num_layers=3,
        decoder_last_pipeline_num_layers=2,
    )  # fmt: skip


def test_deepseek_v3_layout_fits_with_its_stated_recompute() -> None:
    model, profile = MOE_PRESETS["deepseek-v3"](), load_profile("h800-sxm5-80gb")
    capacity = profile.hbm_capacity_bytes
    # §3.2.3: RMSNorm and the MLA up-projections are recomputed; without that it does not fit
    stated = worst_rank_memory(model, _deepseek_report_plan("mla_up_proj,layernorm"), profile)
    assert stated.total_bytes < capacity
    plain = worst_rank_memory(model, _deepseek_report_plan(None), profile)
    assert plain.total_bytes > capacity
    assert plain.activations_bytes - stated.activations_bytes > 20 * 2**30
    # the recompute costs time: the up-projection GEMMs and the norms run again
    fast = evaluate(model, _deepseek_report_plan(None), replace_capacity(profile, 2 * capacity))
    slow = evaluate(model, _deepseek_report_plan("mla_up_proj,layernorm"), profile)
    assert isinstance(fast, Evaluation) and isinstance(slow, Evaluation)
    assert slow.step_time_s > fast.step_time_s


def replace_capacity(profile, capacity: float):
    return dataclasses.replace(profile, hbm_capacity_bytes=capacity)


def test_recompute_modules_are_checked() -> None:
    with pytest.raises(SpecError, match="each of mla_up_proj, layernorm, moe_act"):
        _plan(recompute=Recompute.SELECTIVE, recompute_modules="mla_up_proj,attn")
    with pytest.raises(SpecError, match="needs recompute selective"):
        _plan(recompute_modules="layernorm")
    rejected = check_plan(
        _tiny_moe(),
        _plan(recompute=Recompute.SELECTIVE, recompute_modules="mla_up_proj"),
        load_profile("h100-sxm5-80gb"),
    )
    assert isinstance(rejected, Rejected) and "needs MLA" in rejected.reason


def test_simulate_shows_the_exposed_all_to_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    argv = [
        "simulate", "--model", "qwen3-30b-a3b", "--gpu", "gb200-nvl72", "--gpus", "8",
        "--tp", "1", "--pp", "1", "--ep", "8", "--etp", "1", "--mbs", "1", "--gbs", "16",
        "--zero", "1", "--trace", str(trace),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exposed ep_comm" in out and "exposed_a2a_pct" in out
    assert '"ep_comm' in trace.read_text()
    # a plan file keeps the expert fields
    plan = _plan(
        expert_load_imbalance=1.25, recompute=Recompute.SELECTIVE, recompute_modules="moe_act"
    )
    written = PlanFile(plan=plan, model="tiny", gpu="h100-sxm5-80gb", num_gpus=plan.num_gpus)
    path = write_plan_file(tmp_path / "plan.yaml", written)
    assert read_plan_file(path).plan == plan


def test_measured_actions_are_cut_around_their_blocking_collectives() -> None:
    import pandas as pd

    from plansim.validate.compare import carved_blocking

    rows = [
        (0, "compute", "forward", 0, 0, 0.0, 10.0, 0.0),
        (0, "tp", "ep_comm", 0, 0, 2.0, 3.0, 8.0),
        (0, "tp", "ep_comm", 0, 0, 6.0, 8.0, 8.0),
        (0, "dp", "dp_comm", -1, -1, 10.0, 12.0, 4.0),
    ]
    columns = ["rank", "stream", "kind", "stage", "microbatch", "start_s", "end_s", "bytes"]
    carved = carved_blocking(pd.DataFrame(rows, columns=columns))
    forward = carved[carved["kind"] == "forward"]
    assert list(zip(forward["start_s"], forward["end_s"], strict=True)) == [
        (0.0, 2.0), (3.0, 6.0), (8.0, 10.0),
    ]  # fmt: skip
    assert (carved["kind"] == "ep_comm").sum() == 2 and (carved["kind"] == "dp_comm").sum() == 1
    dense = pd.DataFrame([rows[0], rows[3]], columns=columns)
    assert carved_blocking(dense) is dense  # nothing to cut: the frame itself


def test_plan_flags_for_experts_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "mixtral-8x7b", "--gpu", "h100-sxm5-80gb", "--gpus", "16"]
    assert main([*base, "--gbs", "32", "--ep", "3"]) == 2
    assert "--ep 3: 3 does not divide the 8 routed experts" in capsys.readouterr().err
    assert main([*base, "--gbs", "32", "--expert-load-imbalance", "0.5"]) == 2
    assert "--expert-load-imbalance must be a finite number >= 1" in capsys.readouterr().err
    dense = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    assert main([*dense, "--gbs", "32", "--ep", "2"]) == 2
    assert "need a model with experts; llama3-8b is dense" in capsys.readouterr().err


def test_a_search_memo_keeps_each_schedules_parameter_split_apart() -> None:
    """Ranks hold other stages under a V placement than under the loop one: with one memo
    for both (as a search shares it), each plan's model states equal those computed alone."""
    model = dataclasses.replace(resolve_model("deepseek-v3"), num_layers=64)
    base = {"dp": 8, "tp": 1, "pp": 4, "ep": 8, "vpp": 2, "micro_batch_size": 1}
    plans = [
        plan_from_fields(**base, global_batch_size=64, schedule=schedule)
        for schedule in (Schedule.INTERLEAVED_1F1B, Schedule.DUALPIPE_V)
    ]
    memo: dict[object, object] = {}
    for rank in range(4):
        for plan in plans:
            assert states(model, plan, rank=rank, memo=memo) == states(model, plan, rank=rank)
    assert states(model, plans[0], rank=0) != states(model, plans[1], rank=0)
