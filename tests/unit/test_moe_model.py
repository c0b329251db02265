"""Models with routed experts, MLA and MTP modules: the specs, their validation, the counts
against published totals, the refusal to plan or simulate them, and dense models unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.analytic.flops import model_flops_per_step, model_flops_per_token
from plansim.analytic.moe_counts import (
    AttentionCore,
    count_moe_parameters,
    forward_flops_per_token,
    mla_params_per_layer,
)
from plansim.analytic.moe_counts import (
    model_flops_per_token as moe_model_flops_per_token,
)
from plansim.analytic.params import count_parameters
from plansim.catalog import (
    MOE_PRESETS,
    PRESETS,
    UnknownModelError,
    moe_preset_names,
    preset_names,
    resolve_model,
)
from plansim.cli import main
from plansim.errors import SpecError, UnknownNameError
from plansim.planner.evaluate import check_plan
from plansim.specs.mla import MlaSpec
from plansim.specs.model import (
    Activation,
    ModelSpec,
    Normalization,
    PositionEmbedding,
    require_dense,
    unsimulated_features,
)
from plansim.specs.moe import ExpertCapacity, MoESpec, RouterScore, RouterSpec
from plansim.specs.plan import plan_from_fields
from plansim.validate.compare import spec_dict
from tests.unit.synthetic import round_profile

#: The fields a ModelSpec had before experts, MLA and MTP modules were described.
DENSE_FIELDS = (
    "name",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "activation",
    "seq_length",
    "vocab_size",
    "tied_embeddings",
    "normalization",
    "position_embedding",
    "add_bias_linear",
    "dropout",
)


def _router(top_k: int = 2, **kw: object) -> RouterSpec:
    return RouterSpec(score=RouterScore.SOFTMAX, top_k=top_k, **kw)  # type: ignore[arg-type]


def _moe(**kw: object) -> MoESpec:
    fields: dict[str, object] = {"num_experts": 4, "expert_ffn_hidden_size": 6, "router": _router()}
    fields.update(kw)
    return MoESpec(**fields)  # type: ignore[arg-type]


def tiny_moe(**overrides: object) -> ModelSpec:
    """h 8, 2 heads, 2 KV groups, 3 layers (the first dense, ffn 16), 4 experts of width 6,
    top 2, 1 shared of width 4, SwiGLU, RMSNorm, RoPE, no biases, untied, V 10, s 4."""
    fields: dict[str, object] = {
        "name": "tiny-moe",
        "num_layers": 3,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_query_groups": 2,
        "ffn_hidden_size": 16,
        "activation": Activation.SWIGLU,
        "seq_length": 4,
        "vocab_size": 10,
        "tied_embeddings": False,
        "normalization": Normalization.RMSNORM,
        "position_embedding": PositionEmbedding.ROPE,
        "add_bias_linear": False,
        "dropout": False,
        "moe": _moe(num_shared_experts=1, shared_expert_ffn_hidden_size=4, first_k_dense_layers=1),
    }
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- dense unchanged


@pytest.mark.parametrize("name", preset_names())
def test_dense_presets_keep_their_fields_and_counts(name: str) -> None:
    model = resolve_model(name)
    assert (model.kv_channels, model.moe, model.mla, model.mtp_num_layers) == (None,) * 4
    assert unsimulated_features(model) == ()
    assert model.query_size == model.hidden_size
    assert model.head_dim == model.hidden_size // model.num_attention_heads
    # the layer-kind counts reproduce the dense ones exactly (derived two ways)
    counts = count_moe_parameters(model)
    assert counts.total == counts.active == count_parameters(model).total
    assert counts.num_moe_layers == 0 and counts.expert_fraction == 0
    assert float(moe_model_flops_per_token(model)) == model_flops_per_token(model)
    # comparison.json (validate) writes exactly the fields it wrote before
    assert tuple(spec_dict(model)) == DENSE_FIELDS


def test_dense_field_order_and_defaults_are_unchanged() -> None:
    names = [f.name for f in dataclasses.fields(ModelSpec)]
    assert names[: len(DENSE_FIELDS)] == list(DENSE_FIELDS)
    assert names[len(DENSE_FIELDS) :] == ["kv_channels", "moe", "mla", "mtp_num_layers"]
    defaults = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
    assert defaults["normalization"] is Normalization.LAYERNORM
    assert defaults["position_embedding"] is PositionEmbedding.LEARNED
    assert defaults["add_bias_linear"] is True and defaults["dropout"] is True


def test_dense_preset_registry_is_unchanged() -> None:
    assert len(PRESETS) == 22
    assert not set(PRESETS) & set(MOE_PRESETS)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: _router(top_k=0), r"moe\.router\.top_k must be a positive integer, got 0"),
        (lambda: RouterSpec(score="softmax", top_k=2), r"moe\.router\.score='softmax'"),  # type: ignore[arg-type]
        (lambda: _router(bias=1), r"moe\.router\.bias=1 is not allowed"),
        (
            lambda: _router(num_groups=2, groups_per_token=3),
            r"groups_per_token\(3\) exceeds moe\.router\.num_groups\(2\)",
        ),
        (lambda: _moe(router=_router(top_k=5)), r"top_k\(5\) exceeds moe\.num_experts\(4\)"),
        (
            lambda: _moe(router=_router(num_groups=3)),
            r"num_experts\(4\) is not divisible by moe\.router\.num_groups\(3\)",
        ),
        (
            lambda: _moe(router=_router(top_k=3, num_groups=2)),
            r"top_k\(3\) exceeds the 2 experts of moe\.router\.groups_per_token\(1\) groups of 2",
        ),
        (lambda: _moe(num_experts=0), r"moe\.num_experts must be a positive integer, got 0"),
        (lambda: _moe(num_shared_experts=-1), r"num_shared_experts must be a non-negative"),
        (lambda: _moe(first_k_dense_layers=True), r"first_k_dense_layers must be a non-negative"),
        (lambda: _moe(layer_interval=0), r"moe\.layer_interval must be a positive integer"),
        (
            lambda: _moe(shared_expert_ffn_hidden_size=4),
            r"shared_expert_ffn_hidden_size\(4\) / moe\.shared_expert_gate\(False\) describe "
            r"shared experts, and moe\.num_shared_experts is 0",
        ),
        (lambda: _moe(router="top2"), r"moe\.router must be a RouterSpec, got 'top2'"),
        (lambda: _moe(capacity="dropless"), r"moe\.capacity='dropless' is not allowed"),
        (
            lambda: _moe(capacity_factor=1.25),
            r"moe\.capacity_factor\(1\.25\) needs moe\.capacity 'capacity-factor'",
        ),
        (
            lambda: _moe(capacity=ExpertCapacity.CAPACITY_FACTOR),
            r"needs a finite moe\.capacity_factor > 0, got None",
        ),
        (
            lambda: _moe(capacity=ExpertCapacity.CAPACITY_FACTOR, capacity_factor=float("inf")),
            r"needs a finite moe\.capacity_factor > 0, got inf",
        ),
        (
            lambda: MlaSpec(
                q_lora_rank=0, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2
            ),
            r"mla\.q_lora_rank must be a positive integer, got 0",
        ),
        (
            lambda: tiny_moe(moe=_moe(first_k_dense_layers=3)),
            r"moe\.first_k_dense_layers\(3\) and moe\.layer_interval\(1\) leave no expert layer "
            r"among model\.num_layers\(3\)",
        ),
        (lambda: tiny_moe(moe="experts"), r"model\.moe must be a MoESpec or None, got 'experts'"),
        (lambda: tiny_moe(kv_channels=0), r"model\.kv_channels must be a positive integer"),
        (lambda: tiny_moe(mtp_num_layers=0), r"model\.mtp_num_layers must be a positive"),
        (
            lambda: tiny_moe(mla=_mla(), num_query_groups=1),
            r"model\.num_query_groups\(1\) must equal model\.num_attention_heads\(2\)",
        ),
        (lambda: tiny_moe(mla=_mla(), kv_channels=4), r"model\.kv_channels\(4\) is set"),
        (lambda: tiny_moe(mla=_mla(), add_bias_linear=True), r"add_bias_linear is True with"),
        (lambda: tiny_moe(mla="mla"), r"model\.mla must be a MlaSpec or None, got 'mla'"),
        (lambda: tiny_moe(hidden_size=9), r"hidden_size\(9\) is not divisible"),
    ],
)
def test_invalid_specs_name_every_value(build: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        build()  # type: ignore[operator]


def _mla(q_lora_rank: int | None = 3) -> MlaSpec:
    return MlaSpec(
        q_lora_rank=q_lora_rank,
        kv_lora_rank=4,
        qk_nope_head_dim=2,
        qk_rope_head_dim=1,
        v_head_dim=3,
    )


def test_own_head_width_lifts_the_hidden_divisibility_check() -> None:
    # gpt-oss: 2880 wide, 64 heads of 64 (queries 4096 wide)
    model = tiny_moe(hidden_size=9, kv_channels=4)
    assert (model.head_dim, model.query_size, model.kv_size) == (4, 8, 8)
    assert tiny_moe(hidden_size=9, mla=_mla()).mla is not None


def test_capacity_factor_and_spec_dict_of_nested_specs() -> None:
    moe = _moe(capacity=ExpertCapacity.CAPACITY_FACTOR, capacity_factor=1.25)
    doc = spec_dict(tiny_moe(moe=moe, mtp_num_layers=1))
    assert doc["moe"]["capacity"] == "capacity-factor" and doc["moe"]["capacity_factor"] == 1.25
    assert doc["moe"]["router"] == {
        "score": "softmax",
        "top_k": 2,
        "bias": False,
        "num_groups": 1,
        "groups_per_token": 1,
    }
    assert doc["mtp_num_layers"] == 1 and "mla" not in doc and "kv_channels" not in doc


def test_moe_layer_pattern() -> None:
    maverick = resolve_model("llama4-maverick").moe
    assert maverick is not None
    assert maverick.moe_layer_indices(48) == tuple(range(1, 48, 2))  # HF moe_layers
    assert maverick.num_moe_layers(48) == 24
    v3 = resolve_model("deepseek-v3").moe
    assert v3 is not None
    assert v3.moe_layer_indices(61) == tuple(range(3, 61)) and v3.num_moe_layers(61) == 58
    mixed = _moe(first_k_dense_layers=2, layer_interval=3)
    assert mixed.moe_layer_indices(12) == (4, 7, 10) and mixed.num_moe_layers(12) == 3


# ----------------------------------------------------------------------------- counts by hand


def test_tiny_moe_counts_worked_by_hand() -> None:
    model = tiny_moe()
    counts = count_moe_parameters(model)
    h, v = 8, 10
    attention = 2 * h * h + 2 * h * h  # Q, O 8x8; K, V 8 x (2 groups x 4)
    expert = 3 * h * 6  # SwiGLU: gate, up, down
    assert counts.dense_layer.attention == attention == 256
    assert counts.dense_layer.mlp == 3 * h * 16 == 384
    assert counts.moe_layer.router == h * 4 == 32
    assert counts.moe_layer.expert == expert == 144
    assert counts.moe_layer.shared_experts == 3 * h * 4 == 96
    norms = 2 * h
    dense_layer = attention + norms + 384
    moe_layer = attention + norms + 32 + 4 * expert + 96
    assert (counts.num_dense_layers, counts.num_moe_layers) == (1, 2)
    assert counts.total == dense_layer + 2 * moe_layer + 2 * v * h + h
    active_moe = moe_layer - 2 * expert  # 2 of the 4 experts run
    assert counts.active == dense_layer + 2 * active_moe + 2 * v * h + h
    assert counts.active_without_input_embedding == counts.active - v * h
    assert counts.expert_fraction == 2 * 4 * expert / counts.total
    forward = forward_flops_per_token(model)
    s = 4
    assert forward.attention_projections == 3 * 2 * attention
    assert forward.attention_core == 3 * (2 * s * h + 2 * s * h)
    assert forward.dense_mlp == 2 * 384
    assert forward.router == 2 * 2 * h * 4
    assert forward.routed_experts == 2 * 2 * 2 * expert
    assert forward.shared_experts == 2 * 2 * 96
    assert forward.logits == 2 * h * v
    causal = forward_flops_per_token(model, attention_core=AttentionCore.CAUSAL)
    assert causal.attention_core == forward.attention_core // 2
    assert causal.total == forward.total - forward.attention_core // 2
    assert moe_model_flops_per_token(model) == 3 * forward.total


def test_biases_router_bias_and_shared_gate() -> None:
    moe = _moe(
        router=_router(bias=True),
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=4,
        shared_expert_gate=True,
    )
    model = tiny_moe(
        add_bias_linear=True, moe=moe, kv_channels=2, normalization=Normalization.LAYERNORM
    )
    layer = count_moe_parameters(model).moe_layer
    h, q, kv = 8, 2 * 2, 2 * 2
    assert layer.attention == 2 * h * q + 2 * h * kv + (q + 2 * kv) + h
    assert layer.expert == 3 * h * 6 + 2 * 6 + h  # gate and up biases 6 each, down h
    assert layer.router == h * 4 + 4 + h  # the gate, its bias, the shared-expert gate
    assert layer.shared_experts == 3 * h * 4 + 2 * 4 + h
    assert layer.norms == 2 * 2 * h  # LayerNorm: weight and bias


def test_mla_counts_worked_by_hand() -> None:
    model = tiny_moe(mla=_mla())
    h, a = 8, 2
    query = h * 3 + 3 + 3 * a * (2 + 1)  # wq_a, q_norm, wq_b
    kv = h * (4 + 1) + 4 + 4 * a * (2 + 3)  # wkv_a, kv_norm, wkv_b
    out = a * 3 * h  # wo
    assert mla_params_per_layer(model) == query + kv + out
    no_latent = tiny_moe(mla=_mla(q_lora_rank=None))
    assert mla_params_per_layer(no_latent) == h * a * 3 + kv + out
    forward = forward_flops_per_token(model)
    assert forward.attention_projections == 3 * 2 * (query + kv + out - 3 - 4)  # no norm GEMMs
    assert forward.attention_core == 3 * (2 * 4 * a * 3 + 2 * 4 * a * 3)  # d_qk 3, d_v 3
    with pytest.raises(ValueError, match="has no MLA"):
        mla_params_per_layer(tiny_moe())


def test_deepseek_v3_mla_block_and_mtp_module() -> None:
    model = resolve_model("deepseek-v3")
    h, a = 7168, 128
    mla = (
        h * 1536
        + 1536
        + 1536 * a * 192
        + h * (512 + 64)
        + 512
        + 512 * a * (128 + 128)
        + a * 128 * h
    )
    assert mla_params_per_layer(model) == mla == 187_107_328
    counts = count_moe_parameters(model)
    # README_WEIGHTS.md: the MTP module holds 11.5B unique parameters (its MoE layer
    # 11.51B + the 2h x h projection + 3 norms) ...
    assert counts.mtp_module == counts.moe_layer.total + 2 * h * h + 3 * h
    assert counts.mtp_module / 1e9 == pytest.approx(11.5, rel=0.01 + 0.05 / 11.5)
    assert counts.total_with_mtp == counts.total + counts.mtp_module
    # ... and the Hugging Face checkpoint (685B) stores its embedding and head once more
    stored = counts.total_with_mtp + counts.embedding + counts.output_layer
    assert stored / 1e9 == pytest.approx(685, rel=0.01 + 0.5 / 685)


# ----------------------------------------------------------------------------- published totals

#: (preset, published total, active, each in billions with half a unit of its last digit,
#: active convention, source). Conventions: "both" counts the embedding and the output head
#: in the active parameters, "unembedding" only the head (gpt-oss model card), "either" when
#: the publisher does not say. Tolerance: half a unit of the published last digit (the
#: rounding) + 1% for what counting conventions and this model leave out (norms after the
#: sublayers, QK norms, attention sinks, vision encoders, vocabulary padding).
PUBLISHED = [
    # DeepSeek-V3 report arXiv:2412.19437 §4.2 / README_WEIGHTS.md: 671B without the MTP module
    ("deepseek-v3", (671, 0.5), (37, 0.5), "both"),
    # DeepSeek-V2 arXiv:2405.04434 §3.1.2
    ("deepseek-v2", (236, 0.5), (21, 0.5), "both"),
    # Kimi K2 report arXiv:2507.20534 (1.04T total; the README rounds to 1T / 32B)
    ("kimi-k2", (1040, 5), (32, 0.5), "either"),
    # Qwen3 technical report arXiv:2505.09388 Table 2 and the model cards
    ("qwen3-235b-a22b", (235, 0.5), (22, 0.5), "either"),
    ("qwen3-30b-a3b", (30.5, 0.05), (3.3, 0.05), "either"),
    # Mixtral arXiv:2401.04088 §2.1 (46.7B / 12.9B); Mistral's 8x22B announcement
    ("mixtral-8x7b", (46.7, 0.05), (12.9, 0.05), "both"),
    ("mixtral-8x22b", (141, 0.5), (39, 0.5), "either"),
    # gpt-oss model card arXiv:2508.10925 Table 1: 116.83B total, 5.13B active
    ("gpt-oss-120b", (116.83, 0.005), (5.13, 0.005), "unembedding"),
    # Meta's Llama 4 model cards: 109B / 17B and 400B / 17B (vision encoder included there)
    ("llama4-scout", (109, 0.5), (17, 0.5), "either"),
    ("llama4-maverick", (400, 0.5), (17, 0.5), "either"),
    # xai-org/grok-1 README: 314B parameters
    ("grok-1", (314, 0.5), None, "either"),
]

CONVENTION_MARGIN = 0.01


def _tolerance(published: tuple[float, float]) -> float:
    value, half_unit = published
    return half_unit / value + CONVENTION_MARGIN


@pytest.mark.parametrize(("preset", "total", "active", "convention"), PUBLISHED)
def test_counts_match_published_totals(
    preset: str,
    total: tuple[float, float],
    active: tuple[float, float] | None,
    convention: str,
) -> None:
    counts = count_moe_parameters(resolve_model(preset))
    assert counts.total / 1e9 == pytest.approx(total[0], rel=_tolerance(total))
    if active is None:
        return
    candidates = {
        "both": [counts.active],
        "unembedding": [counts.active_without_input_embedding],
        "either": [counts.active, counts.active_without_input_embedding],
    }[convention]
    tol = _tolerance(active)
    assert any(abs(c / 1e9 / active[0] - 1) <= tol for c in candidates), (
        [c / 1e9 for c in candidates],
        active,
    )


def test_counts_exact_where_the_publisher_gives_more_digits() -> None:
    # gpt-oss model card Table 1: 116.83B total, 5.13B active (unembedding, not embedding)
    oss = count_moe_parameters(resolve_model("gpt-oss-120b"))
    assert round(oss.total / 1e9, 2) == 116.83
    assert round(oss.active_without_input_embedding / 1e9, 2) == 5.13
    # Mixtral paper: 46.7B total, 12.9B active per token (both embedding tables counted)
    mixtral = count_moe_parameters(resolve_model("mixtral-8x7b"))
    assert (round(mixtral.total / 1e9, 1), round(mixtral.active / 1e9, 1)) == (46.7, 12.9)
    # DeepSeek-V3: 671B; README_WEIGHTS's 36.7B active "including 0.9B for Embedding and 0.9B
    # for the output Head" is 2.3% below `active` (one 0.93B table apart): not matched exactly
    v3 = count_moe_parameters(resolve_model("deepseek-v3"))
    assert round(v3.total / 1e9) == 671
    assert round(v3.embedding / 1e9, 1) == round(v3.output_layer / 1e9, 1) == 0.9


#: Megatron-Bridge model GFLOP per token (model TFLOP/s / tokens/s, reference/moe_SOURCES.md
#: "Consistency checks"), counting MTP where said, at the rows' sequence length 4096
#: (moe_runs.csv); Grok-1 (dgxc rows, not in the shared sample) at its preset's 8192.
BRIDGE_GFLOP_PER_TOKEN = [
    ("deepseek-v3", True, 260),
    ("deepseek-v3", False, 249),  # the 25.11 rows "w/o MTP"
    ("qwen3-235b-a22b", False, 148),
    ("qwen3-30b-a3b", False, 23),
    ("kimi-k2", False, 204),
    ("grok-1", False, 521),
]


@pytest.mark.parametrize(("preset", "with_mtp", "gflop"), BRIDGE_GFLOP_PER_TOKEN)
def test_model_flops_match_megatron_bridge_with_causal_attention(
    preset: str, with_mtp: bool, gflop: float
) -> None:
    seq = 8192 if preset == "grok-1" else 4096
    model = resolve_model(preset, seq_length=seq)
    causal = moe_model_flops_per_token(
        model, with_mtp=with_mtp, attention_core=AttentionCore.CAUSAL
    )
    assert causal / 1e9 == pytest.approx(gflop, rel=0.01)
    full = moe_model_flops_per_token(model, with_mtp=with_mtp)
    assert full / 1e9 > gflop * 1.03  # the full-sequence convention is 4-21% above Bridge's


def test_forward_flops_are_two_per_active_matmul_weight_plus_attention() -> None:
    # 6N + attention (Kaplan et al. 2020 §2.1): for every preset the GEMM FLOPs are twice the
    # active weights outside the lookup tables and norms, plus the attention core
    for name in moe_preset_names():
        model = resolve_model(name)
        counts, forward = count_moe_parameters(model), forward_flops_per_token(model)
        weights = (forward.total - forward.attention_core) / 2
        assert weights <= counts.active_without_input_embedding
        assert weights == pytest.approx(counts.active_without_input_embedding, rel=0.002)


# ----------------------------------------------------------------------------- the refusal


@pytest.mark.parametrize("name", moe_preset_names())
def test_every_moe_preset_is_planned_and_the_dense_counts_refuse_it(name: str) -> None:
    model = resolve_model(name)
    assert MOE_PRESETS[name].__doc__, f"{name} factory has no docstring citing its source"
    assert model.name == name
    plan = plan_from_fields(dp=1, tp=1, pp=1, micro_batch_size=1, global_batch_size=1)
    check_plan(model, plan, round_profile())  # a result (rejected or not), not an error
    # the dense counts refuse, rather than count the experts as one dense MLP
    with pytest.raises(SpecError, match="routed experts"):
        count_parameters(model)
    with pytest.raises(SpecError, match="routed experts"):
        model_flops_per_step(model, global_batch_size=1)


def test_dense_count_refusal_names_every_feature() -> None:
    with pytest.raises(SpecError) as info:
        require_dense(resolve_model("deepseek-v3"))
    assert str(info.value) == (
        "deepseek-v3 has 256 routed experts, Multi-head Latent Attention and 1 MTP module: "
        "the dense counts do not cover expert layers, MLA or MTP modules "
        "(plansim.analytic.moe_counts counts them)"
    )
    with pytest.raises(SpecError, match=r"attention num_attention_heads\(64\) x kv_channels"):
        require_dense(resolve_model("gpt-oss-120b"))
    # a head width equal to h / a is no feature
    dense = dataclasses.replace(resolve_model("llama3-8b"), kv_channels=128)
    require_dense(dense)


def test_cli_plans_a_model_with_experts(capsys: pytest.CaptureFixture[str]) -> None:
    plan = ["plan", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
    assert main([*plan, "--gbs", "64", "--jobs", "1", "--pp", "1", "--top", "3"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.strip().startswith("rank"))
    assert {"ep", "etp", "edp", "exposed_a2a_pct"} <= set(header.split())
    assert "layout does not divide the experts" in out or "rejected" in out


# ----------------------------------------------------------------------------- catalog and CLI


def test_unknown_model_names_the_moe_presets_too() -> None:
    with pytest.raises(UnknownNameError) as info:
        resolve_model("deepseek-v4")
    assert isinstance(info.value, UnknownModelError)
    assert info.value.known == sorted(preset_names())
    assert info.value.described == sorted(moe_preset_names())
    assert "with experts: " in str(info.value)
    assert "deepseek-v3" in str(info.value) and "llama3-8b" in str(info.value)


def test_cli_models_deepseek_v3_shows_total_and_active(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["name", "total_b", "active_b", "layers", "moe_layers"]
    assert lines[1].split()[:5] == ["deepseek-v3", "671.03", "37.55", "61", "58"]
    rows = {line.split()[0]: line.split()[1] for line in lines[3:] if line and line[0] != "n"}
    assert rows["total"] == "671,026,419,200"
    assert rows["active"] == "37,552,297,472"
    assert rows["moe_layer/routed_experts"] == f"{256 * 44_040_192:,d}"
    assert rows["mtp/modules"] == "1"
    assert "forward/routed_experts" in rows and "model_flops_per_token" in rows
    assert not lines[-1].startswith("note:")


def test_cli_models_moe_lists_the_moe_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--moe", "--seq-length", "2048"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == list(moe_preset_names())
    assert rows["llama4-maverick"][1:6] == ["400.71", "17.18", "48", "24", "128"]
    assert {row[12] for row in rows.values()} == {"2048"}
    assert main(["models", "--moe", "grok-1"]) == 2
    assert "--moe lists the presets with experts" in capsys.readouterr().err
