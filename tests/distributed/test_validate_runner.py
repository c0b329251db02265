"""The validator's runner trains for real (CPU, gloo) and matches a single-process reference.

Every plan runs 3 steps of a tiny model and must reproduce the reference losses within 1e-5
in fp32. Plain SGD everywhere (Adam would hide a wrong gradient scale), AdamW for one plan
(ZeRO-1's usual partner). The measured Timeline follows the schema and has one forward and
one backward per (stage, micro-batch) on the rank that holds the stage. Faults: a rank that
dies or hangs ends the run with an error naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from plansim.schedule.builders import build_actions
from plansim.sim.timeline import validate_timeline
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.plan import ParallelPlan, Precision, Recompute, Schedule, plan_from_fields
from plansim.validate.executed_fsdp import runs_per_step
from plansim.validate.reference import reference_losses
from plansim.validate.result import ValidateError
from plansim.validate.run_config import RunConfig
from plansim.validate.runner import execute, run_plan
from plansim.validate.worker import FAULT_ENV, FAULT_EXIT_STATUS

NUM_STEPS = 3
TOLERANCE = 1e-5

#: Llama-style: GQA (4 heads, 2 KV groups), SwiGLU, RMSNorm, RoPE, no biases, untied.
LLAMA = ModelSpec(
    name="tiny-llama",
    num_layers=4,
    hidden_size=32,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=64,
    activation=Activation.SWIGLU,
    seq_length=16,
    vocab_size=128,
    tied_embeddings=False,
    normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE,
    add_bias_linear=False,
)
#: GPT-style: MHA, GELU, LayerNorm, learned positions, biases, tied embeddings.
GPT = ModelSpec(
    name="tiny-gpt",
    num_layers=4,
    hidden_size=32,
    num_attention_heads=4,
    num_query_groups=4,
    ffn_hidden_size=128,
    activation=Activation.GELU,
    seq_length=16,
    vocab_size=128,
    tied_embeddings=True,
)

PLANS = {
    "tp2": (LLAMA, plan_from_fields(dp=1, tp=2, pp=1, micro_batch_size=2, global_batch_size=4)),
    "tp2-sp-full": (
        GPT,
        plan_from_fields(
            dp=1,
            tp=2,
            pp=1,
            micro_batch_size=2,
            global_batch_size=4,
            sequence_parallel=True,
            recompute=Recompute.FULL,
        ),
    ),
    "pp2-1f1b": (
        LLAMA,
        plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4),
    ),
    # Megatron-LM's block method: the first of each stage's 2 layers recomputed
    "pp2-full-block1": (
        GPT,
        plan_from_fields(
            dp=1,
            tp=1,
            pp=2,
            micro_batch_size=1,
            global_batch_size=4,
            recompute=Recompute.FULL,
            recompute_num_layers=1,
        ),
    ),
    # uneven split (Megatron-LM --decoder-first-pipeline-num-layers): layers 1 and 3
    "pp2-uneven": (
        LLAMA,
        plan_from_fields(
            dp=1,
            tp=1,
            pp=2,
            micro_batch_size=1,
            global_batch_size=4,
            decoder_first_pipeline_num_layers=1,
        ),
    ),
    # the embedding and the loss count as layers: 4 + 2 slots over pp 2 x vpp 3 stages, the
    # first stage holding only the embedding and the last only the head and loss
    "pp2-vpp3-embedding-loss-in-split": (
        GPT,
        plan_from_fields(
            dp=1,
            tp=1,
            pp=2,
            vpp=3,
            micro_batch_size=1,
            global_batch_size=4,
            schedule=Schedule.INTERLEAVED_1F1B,
            account_for_embedding_in_pipeline_split=True,
            account_for_loss_in_pipeline_split=True,
        ),
    ),
    "pp2-interleaved": (
        GPT,
        plan_from_fields(
            dp=1,
            tp=1,
            pp=2,
            vpp=2,
            micro_batch_size=1,
            global_batch_size=4,
            schedule=Schedule.INTERLEAVED_1F1B,
        ),
    ),
    "dp2-zero1-adamw": (
        LLAMA,
        plan_from_fields(dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=4, zero_stage=1),
    ),
    "dp2-zero2": (
        GPT,
        plan_from_fields(dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=4, zero_stage=2),
    ),
    "dp2-zero3-selective": (
        LLAMA,
        plan_from_fields(
            dp=2,
            tp=1,
            pp=1,
            micro_batch_size=1,
            global_batch_size=4,
            zero_stage=3,
            recompute=Recompute.SELECTIVE,
        ),
    ),
    # hybrid sharding: FSDP2 on a 2-D (replicate 2 x shard 2) mesh over 4 ranks
    "dp4-hsdp2-zero3": (
        GPT,
        plan_from_fields(
            dp=4, tp=1, pp=1, micro_batch_size=1, global_batch_size=8, zero_stage=3, dp_shard=2
        ),
    ),
    # FSDP2 under pipelining: gathered once per step, reduced after the last backward
    "dp2-pp2-zero3": (
        GPT,
        plan_from_fields(dp=2, tp=1, pp=2, micro_batch_size=1, global_batch_size=8, zero_stage=3),
    ),
    "dp2-pp2-zb-h1-zero3": (
        GPT,
        plan_from_fields(
            dp=2,
            tp=1,
            pp=2,
            micro_batch_size=1,
            global_batch_size=4,
            zero_stage=3,
            schedule=Schedule.ZB_H1,
        ),
    ),
}


def _optimizer(name: str) -> str:
    """SGD everywhere (it sees a wrong gradient scale), AdamW where the name says so."""
    return "adamw" if name.endswith("-adamw") else "sgd"


def _run(
    model: ModelSpec, plan: ParallelPlan, optimizer: str = "sgd", dtype: str = "fp32"
) -> object:
    config = RunConfig(
        model=model,
        plan=plan,
        backend="gloo",
        device="cpu",
        num_processes=plan.num_gpus,
        num_steps=NUM_STEPS,
        num_warmup_steps=0,
        timeout_s=150.0,
        optimizer=optimizer,
        dtype=dtype,
    )
    return execute(config)


def _check_losses(
    model: ModelSpec, plan: ParallelPlan, losses: tuple[float, ...], optimizer: str = "sgd"
) -> None:
    ref = reference_losses(
        model,
        global_batch_size=plan.global_batch_size,
        num_steps=NUM_STEPS,
        seed=0,
        optimizer=optimizer,
    )
    assert len(losses) == NUM_STEPS
    assert losses == pytest.approx(ref, abs=TOLERANCE, rel=0)
    assert losses[1] != pytest.approx(losses[0], abs=1e-4)  # the model did train


def _check_timelines(plan: ParallelPlan, timelines: tuple[pd.DataFrame, ...]) -> None:
    split = plan.schedule is Schedule.ZB_H1
    backward_kinds = ("backward_input", "backward_weight") if split else ("backward",)
    for df in timelines:
        validate_timeline(df)
        assert set(df["rank"]) == set(range(plan.pp))
        assert df["start_s"].min() == 0.0
        compute = df[(df["stream"] == "compute") & (df["stage"] >= 0)]
        assert (compute["stage"] % plan.pp == compute["rank"]).all()
        for kind in ("forward", *backward_kinds):
            rows = compute[compute["kind"] == kind]
            keys = sorted(zip(rows["stage"], rows["microbatch"], strict=True))
            stages, num_mb = range(plan.num_stages), range(plan.num_microbatches)
            expected = [(s, j) for s in stages for j in num_mb]
            assert keys == expected, kind
        assert (df["kind"] == "optimizer").sum() == plan.pp
        _check_executed_order(plan, compute)


def _check_executed_order(plan: ParallelPlan, compute: pd.DataFrame) -> None:
    """Each rank ran its actions in the order of the simulator's action lists."""
    letters = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
    lists = build_actions(
        plan.schedule, num_ranks=plan.pp, num_microbatches=plan.num_microbatches, vpp=plan.vpp
    )
    for rank, actions in enumerate(lists):
        rows = compute[compute["rank"] == rank].sort_values("start_s")
        ran = [
            f"{s}{letters[k]}{j}"
            for k, s, j in zip(rows["kind"], rows["stage"], rows["microbatch"], strict=True)
        ]
        assert ran == [str(a) for a in actions], rank


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_trains_like_the_reference(name: str) -> None:
    model, plan = PLANS[name]
    outcome = _run(model, plan, _optimizer(name))
    measured = outcome.measured  # type: ignore[attr-defined]
    _check_losses(model, plan, measured.losses, _optimizer(name))
    _check_timelines(plan, measured.timelines)
    assert len(measured.step_times_s) == NUM_STEPS and min(measured.step_times_s) > 0
    # CPU ranks on Linux: each step's largest run-queue wait fraction over the ranks
    assert len(measured.run_queue_fractions) == NUM_STEPS
    assert all(0.0 <= f <= 1.0 for f in measured.run_queue_fractions)
    assert len(measured.peak_memory_bytes) == plan.pp
    assert min(measured.peak_memory_bytes) > 0
    if runs_per_step(plan):  # one REDUCE_GRAD per stage and step, as the twin prices it
        for df in measured.timelines:
            reductions = df[df["kind"] == "dp_comm"].groupby("rank").size().to_dict()
            assert reductions == {r: plan.vpp for r in range(plan.pp)}
    for check in outcome.schedule_check:  # type: ignore[attr-defined]
        assert check["matches"] in (True, None), check
    if plan.schedule is Schedule.INTERLEAVED_1F1B:  # our lists are torch's own class's order
        checks = outcome.schedule_check  # type: ignore[attr-defined]
        assert [c["schedule"] for c in checks] == ["ScheduleInterleaved1F1B"] * plan.pp
        assert all(c["matches"] is True for c in checks)


#: bf16 runs (``plansim.validate.mixed_precision``) against the fp32 reference: bf16 rounding
#: moved these losses by at most 8e-4; a learning step off by 2x or 1/2 (a gradient scaled
#: twice, or lost) moves them by 4e-3 or more by the third step.
BF16_TOLERANCE = 2e-3
BF16 = Precision.BF16
#: The fp32 plans above that the bf16 runs repeat: Megatron-LM's recipe on DTensors (tp2),
#: under pipelining (main gradients take 1/m of each micro-batch's; tied embeddings over the
#: pipeline sum their fp32 main gradients), and FSDP2's MixedPrecisionPolicy with and without
#: pipelining.
BF16_REPEATS = ("tp2", "pp2-1f1b", "pp2-interleaved", "dp2-zero3-selective", "dp2-pp2-zero3")
BF16_PLANS = {
    name: (PLANS[name][0], PLANS[name][1].with_fields(precision=BF16)) for name in BF16_REPEATS
} | {
    # the DP all-reduce of the fp32 main gradients, tied embeddings, full recompute
    "dp2-full": (
        GPT,
        plan_from_fields(
            dp=2,
            tp=1,
            pp=1,
            micro_batch_size=1,
            global_batch_size=4,
            recompute=Recompute.FULL,
            precision=BF16,
        ),
    ),
    # zero bubble: the weight-gradient step assigns .grad itself, folded in after the step
    "pp2-zb-h1": (
        GPT,
        plan_from_fields(
            dp=1,
            tp=1,
            pp=2,
            micro_batch_size=1,
            global_batch_size=4,
            schedule=Schedule.ZB_H1,
            precision=BF16,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(BF16_PLANS))
def test_bf16_plan_trains_like_the_fp32_reference(name: str) -> None:
    """Losses within bf16's rounding of the fp32 reference (its memory against plansim's:
    ``tests/unit/test_validate_cli.py``; its bytes a parameter: ``test_mixed_precision.py``)."""
    model, plan = BF16_PLANS[name]
    measured = _run(model, plan, "sgd", dtype="bf16").measured  # type: ignore[attr-defined]
    ref = reference_losses(
        model,
        global_batch_size=plan.global_batch_size,
        num_steps=NUM_STEPS,
        seed=0,
        optimizer="sgd",
    )
    assert measured.losses == pytest.approx(ref, abs=BF16_TOLERANCE, rel=0)
    assert measured.losses[1] != pytest.approx(measured.losses[0], abs=1e-4)


def test_dp2_pp2_tp2_on_8_ranks() -> None:
    plan = plan_from_fields(dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=4)
    outcome = _run(LLAMA, plan)
    measured = outcome.measured  # type: ignore[attr-defined]
    _check_losses(LLAMA, plan, measured.losses)
    _check_timelines(plan, measured.timelines)
    assert measured.num_processes == 8


def test_a_dying_rank_ends_the_run_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "die:1")
    model, plan = PLANS["dp2-zero1-adamw"]
    config = RunConfig(
        model=model,
        plan=plan,
        backend="gloo",
        device="cpu",
        num_processes=2,
        num_steps=3,
        num_warmup_steps=0,
        timeout_s=120.0,
    )
    start = time.monotonic()
    pattern = rf"rank 1 died \(exit status {FAULT_EXIT_STATUS}\)"
    with pytest.raises(ValidateError, match=pattern) as info:
        run_plan(config)
    assert time.monotonic() - start < config.timeout_s
    ranks = getattr(info.value, "ranks", ())  # RunFailed: each rank's report for failure.json
    assert ranks[1]["status"] == "died" and ranks[1]["exit_status"] == FAULT_EXIT_STATUS


def test_a_hung_rank_ends_the_run_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "hang:1:0")
    model, plan = PLANS["dp2-zero1-adamw"]
    config = RunConfig(
        model=model,
        plan=plan,
        backend="gloo",
        device="cpu",
        num_processes=2,
        num_steps=3,
        num_warmup_steps=0,
        timeout_s=20.0,
    )
    start = time.monotonic()
    with pytest.raises(ValidateError, match=r"timed out after 20 s") as info:
        run_plan(config)
    assert time.monotonic() - start < config.timeout_s + 10.0
    message = str(info.value)
    assert "Hung rank(s): 1 " in message
    assert "rank 0: last progress 'step 0'" in message


_TORCHRUN_SCRIPT = """
import json, os, sys
from plansim.specs.plan import plan_from_fields
from plansim.validate.run_config import RunConfig
from plansim.validate.runner import run_plan
sys.path.insert(0, {tests!r})
from test_validate_runner import LLAMA

plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)
config = RunConfig(model=LLAMA, plan=plan, backend="gloo", device="cpu", num_processes=2,
                   num_steps=3, num_warmup_steps=0, timeout_s=60.0, optimizer="sgd")
run = run_plan(config)
if os.environ["RANK"] == "0":
    with open(sys.argv[1], "w") as f:
        json.dump({{"losses": run.losses, "ranks": len(run.peak_memory_bytes)}}, f)
"""


def test_under_torchrun_each_process_is_a_rank(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(_TORCHRUN_SCRIPT.format(tests=str(Path(__file__).parent)))
    out = tmp_path / "out.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), str(out)]
    subprocess.run(command, check=True, timeout=180, capture_output=True)
    result = json.loads(out.read_text())
    _check_losses(LLAMA, PLANS["pp2-1f1b"][1], tuple(result["losses"]))
    assert result["ranks"] == 2
