"""The runner's inputs, model and scaling, without launching ranks (fast)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from plansim.catalog import resolve_model
from plansim.specs.model import Activation, ModelSpec
from plansim.specs.plan import ParallelPlan, Schedule, plan_from_fields
from plansim.validate.model import build_model, scale_model, split_stage, synthetic_batches
from plansim.validate.parallelize import check_supported
from plansim.validate.result import ValidateError
from plansim.validate.run_config import RunConfig

TINY = ModelSpec(
    name="tiny",
    num_layers=4,
    hidden_size=32,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=64,
    activation=Activation.SWIGLU,
    seq_length=16,
    vocab_size=128,
    tied_embeddings=True,
)
PLAN = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)


def _config(**changes: object) -> RunConfig:
    fields: dict[str, object] = {
        "model": TINY,
        "plan": PLAN,
        "backend": "gloo",
        "device": "cpu",
        "num_processes": 2,
        "num_steps": 3,
    }
    return RunConfig(**(fields | changes))  # type: ignore[arg-type]


def test_runner_module_does_not_import_torch() -> None:
    code = "import sys, plansim.validate.runner; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend": "mpi"}, "backend 'mpi'; choose one of: gloo, nccl"),
        ({"device": "tpu"}, "device 'tpu'; choose one of: cpu, cuda"),
        ({"backend": "nccl"}, "backend nccl needs device cuda"),
        ({"num_processes": 4}, r"num_processes\(4\) != plan dp\*tp\*pp\*cp = 2"),
        ({"num_steps": 0}, r"num_steps\(0\) must be >= 1"),
        ({"num_warmup_steps": -1}, r"num_warmup_steps\(-1\) must be >= 0"),
        ({"dtype": "fp16"}, "dtype 'fp16'; choose one of: fp32, bf16"),
        (
            {
                "dtype": "bf16",
                "plan": plan_from_fields(
                    dp=2, tp=1, pp=1, zero_stage=1, micro_batch_size=1, global_batch_size=2
                ),
            },
            r"plan.zero_stage 1 with dtype bf16: ZeroRedundancyOptimizer",
        ),
        ({"optimizer": "lamb"}, "optimizer 'lamb'; choose one of: adamw, sgd"),
        ({"timeout_s": 0.0}, r"timeout_s\(0.0\) must be > 0"),
    ],
)
def test_run_config_names_the_bad_field(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidateError, match=message):
        _config(**changes)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (
            plan_from_fields(dp=1, tp=1, pp=1, cp=2, micro_batch_size=1, global_batch_size=2),
            r"plan.cp\(2\) > 1 is not supported",
        ),
        (
            plan_from_fields(
                dp=2, tp=2, pp=1, zero_stage=1, micro_batch_size=1, global_batch_size=2
            ),
            "zero_stage 1 with tp > 1 is not supported",
        ),
        (
            plan_from_fields(
                dp=1,
                tp=1,
                pp=3,
                micro_batch_size=1,
                global_batch_size=3,
                decoder_first_pipeline_num_layers=3,
                decoder_last_pipeline_num_layers=3,
            ),
            r"model.num_layers\(4\) with decoder_first_pipeline_num_layers\(3\) .* -2 layers left",
        ),
        (
            plan_from_fields(dp=1, tp=1, pp=3, micro_batch_size=1, global_batch_size=3),
            r"num_layers\(4\) is not divisible by pp\(3\) \* vpp\(1\) = 3",
        ),
        (
            plan_from_fields(dp=1, tp=4, pp=1, micro_batch_size=1, global_batch_size=1),
            r"num_query_groups\(2\) is not divisible by tp\(4\)",
        ),
        (
            plan_from_fields(
                dp=4, tp=2, pp=1, micro_batch_size=1, global_batch_size=4, zero_stage=3, dp_shard=2
            ),
            r"plan.dp_shard\(2\) \(hybrid sharding\) is supported by the validator with "
            r"zero_stage 3 and tp 1 only \(got zero_stage 3, tp 2\)",
        ),
    ],
)
def test_unsupported_plans_are_rejected_clearly(plan: ParallelPlan, message: str) -> None:
    with pytest.raises(ValidateError, match=message):
        check_supported(TINY, plan)


def test_stages_split_the_model_and_tied_copies_start_equal() -> None:
    model = build_model(TINY, seed=0)
    first, last = (split_stage(model, TINY, PLAN, s) for s in (0, 1))
    assert list(first.blocks) == ["0", "1"] and list(last.blocks) == ["2", "3"]
    assert first.head is None and last.embedding is None
    assert last.head is not None and first.embedding is not None
    tied_copy, tied = last.head.output.weight, first.embedding.tokens.weight
    assert tied_copy is not tied and torch.equal(tied_copy, tied)
    batch = next(synthetic_batches(TINY, global_batch_size=4, seed=0))
    assert torch.equal(batch.tokens[:, 1:], batch.targets[:, :-1])
    assert torch.equal(model(batch.tokens), last(first(batch.tokens)))


def test_initialisation_is_deterministic() -> None:
    a, b = build_model(TINY, seed=3), build_model(TINY, seed=3)
    c = build_model(TINY, seed=4)
    pairs = list(zip(a.parameters(), b.parameters(), strict=True))
    assert all(torch.equal(x, y) for x, y in pairs)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_scale_model_keeps_what_the_plan_needs() -> None:
    llama = resolve_model("llama3-70b")
    plan = plan_from_fields(
        dp=1,
        tp=2,
        pp=2,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=4,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    scaled = scale_model(
        llama,
        plan=plan,
        max_layers=6,
        max_hidden_size=256,
        max_seq_length=64,
        max_vocab_size=512,
    )
    m = scaled.model
    assert m.num_layers == 4  # a multiple of pp * vpp = 4, <= 6
    assert 128 <= m.hidden_size <= 256  # head width shrinks: 2 groups x 8 heads must fit
    assert m.num_attention_heads // m.num_query_groups == (
        llama.num_attention_heads // llama.num_query_groups
    )
    assert m.num_query_groups % 2 == 0 and m.ffn_hidden_size % 2 == 0
    assert (m.seq_length, m.vocab_size) == (64, 512)
    assert f"num_layers {llama.num_layers} -> 4" in scaled.changes
    check_supported(m, plan)
    unchanged = scale_model(TINY, plan=PLAN, max_layers=8)
    assert unchanged.model == TINY and unchanged.changes == ()
    with pytest.raises(ValidateError, match=r"max_layers\(1\) is below pp\(2\)"):
        scale_model(TINY, plan=PLAN, max_layers=1)


def test_scaled_width_keeps_the_ffn_ratio() -> None:
    gpt = dataclasses.replace(resolve_model("gpt3-175b"), name="gpt")
    scaled = scale_model(gpt, plan=PLAN, max_hidden_size=512).model
    assert scaled.ffn_hidden_size == 4 * scaled.hidden_size


def test_nccl_process_groups_are_bound_to_the_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL gets the rank's current CUDA device (``device_id``), gloo none: without it NCCL
    guesses the GPU from the global rank and warns that a mapping can hang."""
    import torch
    import torch.distributed as dist

    from plansim.validate import worker

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append(k))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    kwargs = {"rank": 0, "world": 1, "init_method": "env://", "timeout_s": 5.0}
    worker.init_process_group(backend="nccl", **kwargs)
    worker.init_process_group(backend="gloo", **kwargs)
    assert calls[0]["device_id"] == torch.device("cuda", 3)
    assert "device_id" not in calls[1]
