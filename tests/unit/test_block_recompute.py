"""Megatron-LM's block recompute (``--recompute-method block --recompute-num-layers N``):
only the first N layers of every model chunk are recomputed; the others keep their
activations. Plan checks, memory (oracle: N x full-recompute bytes + (c - N) x no-recompute
bytes per chunk, from ``layer_activations``), the stage's recompute time (N x one layer's),
HFU, the planner's options and the CLI.

Model: megatron-1.7b (24 layers) on pp 2: a chunk of 12 layers.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from plansim.analytic.activations import layer_activations
from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.flops import hardware_flops_per_step, layer_forward_flops
from plansim.analytic.stored_activations import microbatch_activation_bytes
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.planner.enumerate import SearchSpace, block_recompute_options, enumerate_plans
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.plan import ParallelPlan, Recompute, plan_from_fields

MODEL = resolve_model("megatron-1.7b")
PROFILE = load_profile("a100-sxm4-80gb")


def _plan(recompute: Recompute = Recompute.FULL, block: int | None = None) -> ParallelPlan:
    return plan_from_fields(
        dp=1,
        tp=1,
        pp=2,
        micro_batch_size=2,
        global_batch_size=8,
        recompute=recompute,
        recompute_num_layers=block,
    )


def _stored(recompute: Recompute) -> float:
    return layer_activations(
        MODEL, micro_batch_size=2, tp=1, sequence_parallel=False, recompute=recompute, flash=True
    ).stored_bytes


def test_plan_checks_and_labels() -> None:
    plan = _plan(block=3)
    assert plan.recompute_label == "full-block3" and "full-block3" in plan.label()
    assert [plan.recomputed_layers(c) for c in (12, 3, 2, 0)] == [3, 3, 2, 0]
    assert _plan().recomputed_layers(12) == 12 and _plan().recompute_label == "full"
    assert _plan(Recompute.SELECTIVE).recomputed_layers(12) == 0
    with pytest.raises(SpecError, match=r"recompute_num_layers\(3\) needs recompute full"):
        _plan(Recompute.SELECTIVE, block=3)
    with pytest.raises(SpecError, match="recompute_num_layers"):
        _plan(block=0)


def test_activations_are_n_full_layers_plus_the_rest_whole() -> None:
    # rank 1: no embedding term; bf16 stores Korthikanti's 16-bit bytes
    full, none = _stored(Recompute.FULL), _stored(Recompute.NONE)
    got = microbatch_activation_bytes(MODEL, _plan(block=3), rank=1)
    assert got == pytest.approx(3 * full + 9 * none)
    assert microbatch_activation_bytes(MODEL, _plan(), rank=1) == pytest.approx(12 * full)
    assert microbatch_activation_bytes(MODEL, _plan(Recompute.NONE), rank=1) == pytest.approx(
        12 * none
    )


def _recompute_s(plan: ParallelPlan) -> float:
    work = build_pipeline_work(MODEL, plan, PROFILE)
    return sum(seg.duration_s for seg in work.stages[1].backward if seg.kind == "recompute")


def test_only_the_recomputed_layers_pay_a_forward_again() -> None:
    whole = _recompute_s(_plan())
    assert whole > 0
    assert _recompute_s(_plan(block=3)) == pytest.approx(whole * 3 / 12)
    assert _recompute_s(_plan(block=12)) == pytest.approx(whole)  # a whole chunk: full
    slow, part, fast = (
        evaluate(MODEL, p, PROFILE) for p in (_plan(), _plan(block=3), _plan(Recompute.NONE))
    )
    assert isinstance(slow, Evaluation) and isinstance(part, Evaluation)
    assert isinstance(fast, Evaluation)
    assert fast.step_time_s < part.step_time_s < slow.step_time_s
    assert fast.peak_memory_bytes > part.peak_memory_bytes > slow.peak_memory_bytes


def test_hfu_counts_the_recomputed_layers_only() -> None:
    base = hardware_flops_per_step(MODEL, global_batch_size=8, recompute=Recompute.NONE)
    per_layer = layer_forward_flops(MODEL, micro_batch_size=8)
    got = hardware_flops_per_step(
        MODEL, global_batch_size=8, recompute=Recompute.FULL, recomputed_layers=6
    )
    assert got == pytest.approx(base + 6 * per_layer)
    part = evaluate(MODEL, _plan(block=3), PROFILE)
    assert isinstance(part, Evaluation)
    # 2 chunks x 3 layers of 24 recomputed
    assert part.hfu / part.mfu == pytest.approx((base + 6 * per_layer) / base, rel=1e-9)


def test_planner_offers_block_options_after_full() -> None:
    assert block_recompute_options(12) == (3, 6, 9)
    assert block_recompute_options(2) == (1,) and block_recompute_options(1) == ()
    space = SearchSpace(tp=(1,), pp=(2,), dp=(1,), micro_batch_size=(2,), vpps=(1,))
    labels = {
        p.recompute_label
        for p in enumerate_plans(num_gpus=2, global_batch_size=8, space=space, num_layers=24)
    }
    assert {"full-block3", "full-block6", "full-block9", "full", "none"} <= labels
    off = dataclasses.replace(space, partial_recompute=False)
    labels = {
        p.recompute_label
        for p in enumerate_plans(num_gpus=2, global_batch_size=8, space=off, num_layers=24)
    }
    assert not any("block" in label for label in labels)


def test_cli_takes_megatrons_flag_and_refuses_it_without_full(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "2"]
    args += ["--tp", "1", "--pp", "2", "--mbs", "2", "--gbs", "8", "--format", "json"]
    assert main([*args, "--recompute", "full", "--recompute-num-layers", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    part = evaluate(MODEL, _plan(block=3), PROFILE)
    assert isinstance(part, Evaluation)
    assert doc["step_time_s"] == pytest.approx(part.step_time_s)
    assert doc["plan"]["recompute"] == "full" and doc["plan"]["recompute_num_layers"] == 3
    assert main([*args, "--recompute", "selective", "--recompute-num-layers", "3"]) == 2
    assert "recompute_num_layers(3) needs recompute full" in capsys.readouterr().err


def test_validate_checkpoints_only_the_first_n_blocks_of_a_stage() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from plansim.validate.model import build_model, split_stage
    from plansim.validate.parallelize import apply_recompute

    spec = dataclasses.replace(
        MODEL,
        num_layers=6,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=64,
        seq_length=8,
        vocab_size=64,
    )
    plan = plan_from_fields(
        dp=1,
        tp=1,
        pp=2,
        micro_batch_size=1,
        global_batch_size=2,
        recompute=Recompute.FULL,
        recompute_num_layers=2,
    )
    stage = split_stage(build_model(spec, seed=0), spec, plan, 1)
    apply_recompute(stage, plan)
    wrapped = [isinstance(b, CheckpointWrapper) for b in stage.blocks.values()]
    assert wrapped == [True, True, False]
