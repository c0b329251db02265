"""The validator trains a small MoE model for real with expert parallelism (CPU, gloo).

A Llama-style decoder of 4 layers whose last 3 have 4 routed experts (top-2) and one shared
expert runs 3 steps with ep 2 alone, under 1F1B pipelining (pp 2) and with an expert-data-
parallel dimension (dp 4 = ep 2 x edp 2) under ZeRO-1 and FSDP2 (ZeRO-3); the losses must
equal the single-process reference within 1e-5 in fp32 (plain SGD: a wrong expert-gradient
scale, 1 instead of 1/ep, moves them by 1.5e-4 to 2.6e-4; AdamW for ZeRO-1, where a missing
edp all-reduce moves them by 3e-4). The measured Timeline has, per MoE layer
and micro-batch, the dispatch and combine all-to-alls in the forward and both again in the
backward, as ``ep_comm`` rows. The layer itself matches a per-token loop in one process.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from plansim.sim.timeline import validate_timeline
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.moe import ExpertCapacity, MoESpec, RouterScore, RouterSpec
from plansim.specs.plan import ParallelPlan, plan_from_fields
from plansim.validate.mlp import activate
from plansim.validate.model import build_model, stage_layers
from plansim.validate.moe_layer import MoELayer, route
from plansim.validate.parallelize import check_supported
from plansim.validate.reference import reference_losses
from plansim.validate.result import ValidateError
from plansim.validate.run_config import RunConfig
from plansim.validate.runner import execute

NUM_STEPS = 3
TOLERANCE = 1e-5

#: Mixtral/Qwen-style routing: softmax over the top-2 logits, one shared expert.
MOE = ModelSpec(
    name="tiny-moe",
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_query_groups=2,
    ffn_hidden_size=128,
    activation=Activation.SWIGLU,
    seq_length=32,
    vocab_size=128,
    tied_embeddings=False,
    normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE,
    add_bias_linear=False,
    moe=MoESpec(
        num_experts=4,
        expert_ffn_hidden_size=256,
        router=RouterSpec(score=RouterScore.SOFTMAX, top_k=2),
        num_shared_experts=1,
        first_k_dense_layers=1,
    ),
)
#: DeepSeek-V3-style routing: sigmoid scores normalised over the top-2, chosen from the best
#: of 2 groups; the shared expert sigmoid-gated (Qwen2-MoE).
MOE_SIGMOID = dataclasses.replace(
    MOE,
    name="tiny-moe-sigmoid",
    moe=dataclasses.replace(
        MOE.moe,  # type: ignore[arg-type]
        router=RouterSpec(score=RouterScore.SIGMOID, top_k=2, num_groups=2, groups_per_token=1),
        shared_expert_gate=True,
    ),
)

PLANS: dict[str, tuple[ModelSpec, ParallelPlan]] = {
    "ep2": (MOE, plan_from_fields(dp=2, tp=1, pp=1, ep=2, micro_batch_size=1, global_batch_size=4)),
    "ep2-pp2-1f1b": (
        MOE_SIGMOID,
        plan_from_fields(dp=2, tp=1, pp=2, ep=2, micro_batch_size=1, global_batch_size=8),
    ),
    # dp 4 = ep 2 x edp 2: experts' gradients averaged over edp, ZeRO-1 shards each set apart.
    # AdamW: under SGD the replicas' mean parameters stay exact without the edp all-reduce
    # (a loss 3e-6 off); AdamW's nonlinear step shows it (3e-4)
    "ep2-edp2-zero1-adamw": (
        MOE,
        plan_from_fields(
            dp=4, tp=1, pp=1, ep=2, micro_batch_size=1, global_batch_size=8, zero_stage=1
        ),
    ),
    # FSDP2: the experts sharded over the edp mesh, the rest over dp
    "ep2-edp2-zero3": (
        MOE_SIGMOID,
        plan_from_fields(
            dp=4, tp=1, pp=1, ep=2, micro_batch_size=1, global_batch_size=8, zero_stage=3
        ),
    ),
}


def _moe_layers_of(model: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    assert model.moe is not None
    return sum(model.moe.is_moe_layer(i) for i in stage_layers(model, plan, stage))


def _check_ep_rows(model: ModelSpec, plan: ParallelPlan, df: pd.DataFrame) -> None:
    """Per (stage, micro-batch): dispatch + combine of each MoE layer inside the forward, and
    their backward all-to-alls inside the backward, layers in reverse, each layer's pair
    sending what its forward pair sent (the backward of a combine sends the dispatch's rows
    back); at most this rank's b * s * k pairs of h floats leave it in a dispatch."""
    assert model.moe is not None
    ep = df[df["kind"] == "ep_comm"]
    assert (ep["stream"] == "tp").all()
    assert (ep["stage"] % plan.pp == ep["rank"]).all()
    pair_bytes = plan.micro_batch_size * model.seq_length * model.moe.top_k * model.hidden_size * 4
    compute = df[(df["stream"] == "compute") & (df["stage"] >= 0)]
    sent: dict[tuple[str, int, int], list[float]] = {}
    for row in compute.itertuples():
        mine = ep[(ep["stage"] == row.stage) & (ep["microbatch"] == row.microbatch)]
        inside = mine[(mine["start_s"] >= row.start_s) & (mine["end_s"] <= row.end_s)]
        assert len(inside) == 2 * _moe_layers_of(model, plan, row.stage)
        sent[(row.kind, row.stage, row.microbatch)] = inside["bytes"].tolist()
    for (kind, stage, mb), forward in sent.items():
        if kind != "forward":
            continue
        layers = [forward[i : i + 2] for i in range(0, len(forward), 2)]
        assert sent[("backward", stage, mb)] == [b for pair in reversed(layers) for b in pair]
        assert sum(forward[::2]) > 0 and max(forward[::2]) <= pair_bytes
    per_action = 4 * sum(_moe_layers_of(model, plan, s) for s in range(plan.num_stages))
    assert len(ep) == per_action * plan.num_microbatches


@pytest.mark.parametrize("name", sorted(PLANS))
def test_moe_plan_trains_like_the_reference(name: str) -> None:
    model, plan = PLANS[name]
    optimizer = "adamw" if name.endswith("-adamw") else "sgd"
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
    )
    measured = execute(config).measured
    ref = reference_losses(
        model,
        global_batch_size=plan.global_batch_size,
        num_steps=NUM_STEPS,
        seed=0,
        optimizer=optimizer,
    )
    assert measured.losses == pytest.approx(ref, abs=TOLERANCE, rel=0)
    assert measured.losses[1] != pytest.approx(measured.losses[0], abs=1e-4)  # it trained
    assert len(measured.timelines) == NUM_STEPS
    for df in measured.timelines:
        validate_timeline(df)
        assert set(df["rank"]) == set(range(plan.pp))
        _check_ep_rows(model, plan, df)


def _per_token(layer: MoELayer, model: ModelSpec, tokens: torch.Tensor) -> torch.Tensor:
    """The MoE layer token by token: gate-weighted routed experts plus the shared expert."""
    assert model.moe is not None and layer.shared is not None
    routing = route(layer.router(tokens), model.moe.router)
    ex = layer.experts
    out = torch.zeros_like(tokens)
    for t, x in enumerate(tokens):
        for j, e in enumerate(routing.indices[t].tolist()):
            up = x @ ex.up_weight[e] + (ex.up_bias[e] if ex.up_bias is not None else 0.0)
            gate = None if ex.gate_weight is None else x @ ex.gate_weight[e]
            y = activate(model.activation, up, gate) @ ex.down_weight[e]
            y = y + (ex.down_bias[e] if ex.down_bias is not None else 0.0)
            out[t] += routing.gates[t, j] * y
    shared = layer.shared(tokens)
    if layer.shared_gate is not None:
        shared = torch.sigmoid(layer.shared_gate(tokens)) * shared
    return out + shared


#: GELU experts with biases (GPT-style), next to the two SwiGLU models.
MOE_GELU = dataclasses.replace(
    MOE, name="tiny-moe-gelu", activation=Activation.GELU, add_bias_linear=True
)


@pytest.mark.parametrize("model", [MOE, MOE_SIGMOID, MOE_GELU], ids=lambda m: m.name)
def test_moe_layer_equals_a_per_token_loop(model: ModelSpec) -> None:
    net = build_model(model, seed=0)
    layers = [type(b.mlp).__name__ for b in net.blocks.values()]  # type: ignore[union-attr]
    assert layers == ["MLP", "MoELayer", "MoELayer", "MoELayer"]
    layer = net.blocks["1"].mlp  # type: ignore[index]
    assert isinstance(layer, MoELayer)
    x = torch.randn(
        2, model.seq_length, model.hidden_size, generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        got = layer(x).reshape(-1, model.hidden_size)
        want = _per_token(layer, model, x.reshape(-1, model.hidden_size))
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


def test_sigmoid_routing_keeps_to_the_best_group() -> None:
    router = RouterSpec(score=RouterScore.SIGMOID, top_k=2, num_groups=2, groups_per_token=1)
    logits = torch.tensor([[3.0, -1.0, 2.0, 2.5], [0.0, 1.0, -2.0, -3.0]])
    routing = route(logits, router)
    # token 0: group 1 (experts 2, 3) scores higher in sum, although expert 0 is the best
    assert routing.indices.tolist() == [[3, 2], [1, 0]]
    assert torch.allclose(routing.gates.sum(-1), torch.ones(2))


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        (MOE, {"dp": 2, "tp": 2, "ep": 2}, r"tp\(2\) / etp\(None\) > 1 with model.moe"),
        (MOE, {"dp": 3, "ep": 3}, r"num_experts\(4\) is not divisible by plan.ep\(3\)"),
        (
            dataclasses.replace(
                MOE,
                moe=dataclasses.replace(
                    MOE.moe,  # type: ignore[arg-type]
                    capacity=ExpertCapacity.CAPACITY_FACTOR,
                    capacity_factor=1.25,
                ),
            ),
            {"dp": 2, "ep": 2},
            r"capacity 'capacity-factor' is not supported",
        ),
        (dataclasses.replace(MOE, moe=None), {"dp": 2, "ep": 2}, r"model tiny-moe is dense"),
    ],
)
def test_unsupported_expert_layouts_are_rejected(
    model: ModelSpec, fields: dict[str, int], message: str
) -> None:
    base = {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 12}
    plan = plan_from_fields(**(base | fields))
    with pytest.raises(ValidateError, match=message):
        check_supported(model, plan)


def test_validate_cli_compares_an_ep_plan_with_its_simulation(tmp_path) -> None:
    """``plansim validate --plan`` runs ep and etp as planned, and the comparison cuts the
    measured actions around their all-to-alls as the simulation lays them out."""
    import json

    from plansim.cli import main
    from plansim.io.plan_file import PlanFile, write_plan_file
    from plansim.specs.plan import Precision

    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128,
                "max_position_embeddings": 64, "tie_word_embeddings": False,
                "hidden_act": "silu",
            }
        )
    )  # fmt: skip
    plan = plan_from_fields(
        dp=2, tp=1, pp=1, ep=2, etp=1, micro_batch_size=1, global_batch_size=4,
        precision=Precision.FP32,
    )  # fmt: skip
    path = write_plan_file(
        tmp_path / "plan.yaml",
        PlanFile(plan=plan, model=str(config), gpu="cpu-2core-gloo", num_gpus=2, seq_length=32),
    )
    out = tmp_path / "out"
    argv = ["validate", "--plan", str(path), "--backend", "gloo", "--steps", "2", "--out", str(out)]
    assert main(argv) == 0
    measured = pd.read_csv(out / "measured_timeline.csv")
    simulated = pd.read_csv(out / "simulated_timeline.csv")
    assert (measured["kind"] == "ep_comm").sum() == 2 * 2 * 4  # 2 layers, 2 micro-batches
    assert (simulated["kind"] == "ep_comm").any()
    comparison = json.loads((out / "comparison.json").read_text())
    categories = comparison["categories_s"]
    # every measured all-to-all is blocking, as simulated: all of it exposed
    measured_comm = categories["communication"]["measured"]
    assert categories["exposed_communication"]["measured"] == pytest.approx(measured_comm, rel=0.05)
