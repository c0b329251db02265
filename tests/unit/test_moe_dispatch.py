"""The MoE token dispatcher: Megatron-Core's all-to-all against DeepEP's node-deduplicated
dispatch (DeepSeek-V3 arXiv 2412.19437 §3.2.2), its pricing, CLI, export and back-test."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from plansim.analytic.layer_cost import layer_pass_times
from plansim.analytic.moe_layer import (
    TOKEN_ELEMENT_BYTES,
    dedup_traffic,
    dispatch_message_bytes,
    expected_nodes_per_token,
)
from plansim.analytic.ranks import layout_groups
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.export.megatron import megatron_arguments
from plansim.io.profiles import load_profile
from plansim.specs.execution import MoeTokenDispatcher
from plansim.specs.plan import Precision, plan_from_fields

DEEPSEEK = resolve_model("deepseek-v3", seq_length=4096)
H800 = load_profile("h800-sxm5-80gb")


def _plan(dispatcher: MoeTokenDispatcher, *, ep: int = 64, precision: Precision = Precision.BF16):
    return plan_from_fields(
        tp=1,
        pp=16,
        dp=128,
        ep=ep,
        micro_batch_size=1,
        global_batch_size=2048,
        zero_stage=1,
        precision=precision,
        decoder_first_pipeline_num_layers=3,
        decoder_last_pipeline_num_layers=2,
        moe_token_dispatcher_type=dispatcher,
    )


def test_a_token_reaches_four_of_eight_nodes_under_deepseeks_group_limit() -> None:
    # 8 groups, 4 a token (n_group / topk_group), one group a node: C(7,4)/C(8,4) = 1/2 missed
    assert expected_nodes_per_token(DEEPSEEK, num_nodes=8) == pytest.approx(4.0)
    # without the group limit: 8 of 256 experts, 32 a node
    free = resolve_model("qwen3-235b-a22b")
    moe = free.moe
    assert moe is not None and moe.router.num_groups == 1
    missed = math.comb(moe.num_experts - moe.num_experts // 8, moe.top_k)
    missed /= math.comb(moe.num_experts, moe.top_k)
    assert expected_nodes_per_token(free, num_nodes=8) == pytest.approx(8 * (1 - missed))


def test_deduplication_halves_deepseeks_network_bytes() -> None:
    plan = _plan(MoeTokenDispatcher.DEEPEP)
    dedup = dedup_traffic(
        DEEPSEEK, plan, num_nodes=8, members_per_node=8, element_bytes=TOKEN_ELEMENT_BYTES
    )
    # all-to-all: 8 rows a token, 56 of 64 ranks on other nodes; deduplicated: 4 nodes x 7/8
    alltoall_network = dispatch_message_bytes(DEEPSEEK, plan) * 56 / 64
    assert dedup.network_bytes == pytest.approx(alltoall_network / 2)


def _ep_seconds(plan: object) -> tuple[float, float]:
    groups = layout_groups(plan, gpus_per_node=H800.gpus_per_node)  # type: ignore[arg-type]
    times = layer_pass_times(DEEPSEEK, plan, H800, groups, moe_layer=True)  # type: ignore[arg-type]
    return times.ep_forward_s, times.ep_backward_s


def test_deepep_is_faster_across_nodes_and_the_same_inside_one() -> None:
    across_a2a = _ep_seconds(_plan(MoeTokenDispatcher.ALLTOALL))
    across_dedup = _ep_seconds(_plan(MoeTokenDispatcher.DEEPEP))
    assert across_dedup[0] < 0.6 * across_a2a[0] and across_dedup[1] < 0.6 * across_a2a[1]
    inside = [_ep_seconds(_plan(d, ep=8)) for d in MoeTokenDispatcher]
    assert inside[0] == inside[1]
    # fp8 training dispatches fp8 activations forward; gradients go back in bf16
    fp8 = _ep_seconds(_plan(MoeTokenDispatcher.DEEPEP, precision=Precision.FP8))
    assert fp8[0] < fp8[1] == pytest.approx(across_dedup[1])


def test_megatron_export_names_the_dispatcher() -> None:
    deepep = megatron_arguments(_plan(MoeTokenDispatcher.DEEPEP), DEEPSEEK)
    at = deepep.index("--moe-token-dispatcher-type")
    assert deepep[at + 1] == "flex" and "--moe-enable-deepep" in deepep
    plain = megatron_arguments(_plan(MoeTokenDispatcher.ALLTOALL), DEEPSEEK)
    at = plain.index("--moe-token-dispatcher-type")
    assert plain[at + 1] == "alltoall" and "--moe-enable-deepep" not in plain


def test_the_flag_needs_a_model_with_experts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "megatron-1.7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    assert main([*argv, "--gbs", "64", "--moe-token-dispatcher-type", "deepep"]) == 2
    assert "need a model with experts" in capsys.readouterr().err


def test_deepseeks_own_run_is_backtested_with_its_dispatch_and_dualpipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """M0274 (DeepSeek-V3 on 2,048 H800s, HAI-LLM with DualPipe): the stated framework sets
    the node-deduplicated dispatcher and DualPipe (as DualPipeV over 32 stages)."""
    runs = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "moe_runs.csv"
    table = pd.read_csv(runs)
    row = tmp_path / "m0274.csv"
    table[table["row_id"] == "M0274"].to_csv(row, index=False)
    assert main(["backtest", str(row), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("M0274"))
    assert " ok " in line and "deepep" in line and "dualpipev" in line
