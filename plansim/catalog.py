"""Named model presets, each a small factory function citing where its shape comes from.

``resolve_model`` turns a preset name or a path to a local Hugging Face ``config.json`` into a
:class:`~plansim.specs.model.ModelSpec`.

Two registries: :data:`PRESETS`, the dense models, and :data:`MOE_PRESETS`, models with
routed experts (and MLA, MTP modules; parameters and FLOPs: ``plansim.analytic.moe_counts``,
``plansim models NAME``; planned and simulated by ``plansim.analytic.moe_layer``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from plansim.errors import UnknownNameError
from plansim.io.hf_config import read_hf_config
from plansim.specs.mla import MlaSpec
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding
from plansim.specs.moe import MoESpec, RouterScore, RouterSpec

#: Vocabulary of the Megatron GPT runs: GPT-2 BPE (50257) padded, V = 51200 in Narayanan SC21
#: and Korthikanti 2022.
MEGATRON_VOCAB = 51200
#: Llama 3 vocabulary: 128K BPE tokens (Llama 3 paper Table 3) + 256 special tokens = 128256
#: (``vocab_size`` of the Meta-Llama-3 config.json files).
LLAMA3_VOCAB = 128256
#: Llama 1/2 SentencePiece vocabulary (Touvron et al. 2023, Llama 2 §2.1).
LLAMA2_VOCAB = 32000


def _gpt(name: str, *, layers: int, hidden: int, heads: int) -> ModelSpec:
    """A Megatron GPT: MHA, ffn = 4h, GELU, seq 2048, V = 51200, learned positions, tied."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        ffn_hidden_size=4 * hidden,
        activation=Activation.GELU,
        seq_length=2048,
        vocab_size=MEGATRON_VOCAB,
        tied_embeddings=True,
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        add_bias_linear=True,
    )


def _llama(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    seq: int,
    vocab: int,
) -> ModelSpec:
    """A Llama: SwiGLU, RMSNorm, RoPE, no linear biases, untied output layer, no dropout (the
    Meta Llama config.json files: ``attention_dropout`` 0.0 and no hidden dropout)."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=kv_heads,
        ffn_hidden_size=ffn,
        activation=Activation.SWIGLU,
        seq_length=seq,
        vocab_size=vocab,
        tied_embeddings=False,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        add_bias_linear=False,
        dropout=False,
    )


def gpt3_175b() -> ModelSpec:
    """GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d_model 12288, 96 heads, n_ctx
    2048); V = 51200 as in the Megatron runs (Narayanan SC21 Eq. 2 gives 174.6B)."""
    return _gpt("gpt3-175b", layers=96, hidden=12288, heads=96)


def _megatron(label: str, layers: int, hidden: int, heads: int) -> Callable[[], ModelSpec]:
    def factory() -> ModelSpec:
        return _gpt(f"megatron-{label}", layers=layers, hidden=hidden, heads=heads)

    factory.__name__ = f"megatron_{label.replace('.', '_')}"
    factory.__doc__ = (
        f"Megatron GPT {label.upper()}: Narayanan et al. SC21 Table 1 weak-scaling row "
        f"({layers} layers, h {hidden}, {heads} heads; reference/published_runs.csv T0001-T0010)."
    )
    return factory


def _korthikanti(label: str, layers: int, hidden: int, heads: int) -> Callable[[], ModelSpec]:
    def factory() -> ModelSpec:
        return _gpt(f"korthikanti-{label}", layers=layers, hidden=hidden, heads=heads)

    factory.__name__ = f"korthikanti_{label}"
    factory.__doc__ = (
        f"GPT {label.upper()} of Korthikanti et al. 2022 Table 3 ({layers} layers, h {hidden}, "
        f"{heads} heads; reference/published_runs.csv T0024-T0031)."
    )
    return factory


def bloom_176b() -> ModelSpec:
    """BLOOM 176B: BigScience 2022 (arXiv:2211.05100) Table 3 and bigscience/bloom
    config.json (n_layer 70, hidden_size 14336, n_head 112, vocab_size 250880, seq 2048).

    ALiBi positions carry no parameters; ModelSpec has no ALIBI member, so ROPE stands in as
    "no position parameters". BLOOM's embedding LayerNorm (2h) is not modelled: the count is
    28,672 below the published 176,247,271,424.
    """
    return ModelSpec(
        name="bloom-176b",
        num_layers=70,
        hidden_size=14336,
        num_attention_heads=112,
        num_query_groups=112,
        ffn_hidden_size=4 * 14336,
        activation=Activation.GELU,
        seq_length=2048,
        vocab_size=250880,
        tied_embeddings=True,
        normalization=Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.ROPE,
        add_bias_linear=True,
    )


def llama2_7b() -> ModelSpec:
    """Llama 2 7B: Touvron et al. 2023 (arXiv:2307.09288) Table 1 (4k context) and
    meta-llama/Llama-2-7b-hf config.json (32 layers, h 4096, 32 heads, ffn 11008)."""
    return _llama(
        "llama2-7b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn=11008,
        seq=4096,
        vocab=LLAMA2_VOCAB,
    )


def llama2_13b() -> ModelSpec:
    """Llama 2 13B: Touvron et al. 2023 Table 1 and meta-llama/Llama-2-13b-hf config.json
    (40 layers, h 5120, 40 heads, ffn 13824)."""
    return _llama(
        "llama2-13b",
        layers=40,
        hidden=5120,
        heads=40,
        kv_heads=40,
        ffn=13824,
        seq=4096,
        vocab=LLAMA2_VOCAB,
    )


def llama2_70b() -> ModelSpec:
    """Llama 2 70B: Touvron et al. 2023 Table 1 (GQA) and meta-llama/Llama-2-70b-hf
    config.json (80 layers, h 8192, 64 heads, 8 KV heads, ffn 28672)."""
    return _llama(
        "llama2-70b",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=28672,
        seq=4096,
        vocab=LLAMA2_VOCAB,
    )


def llama3_8b() -> ModelSpec:
    """Llama 3 8B: Llama 3 paper (arXiv:2407.21783) Table 3 and the Meta-Llama-3-8B model
    card / config.json (32 layers, h 4096, 32 heads, 8 KV heads, ffn 14336, 8k context)."""
    return _llama(
        "llama3-8b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        seq=8192,
        vocab=LLAMA3_VOCAB,
    )


def llama3_70b() -> ModelSpec:
    """Llama 3 70B: Llama 3 paper Table 3 and the Meta-Llama-3-70B model card / config.json
    (80 layers, h 8192, 64 heads, 8 KV heads, ffn 28672, 8k context)."""
    return _llama(
        "llama3-70b",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=28672,
        seq=8192,
        vocab=LLAMA3_VOCAB,
    )


def llama3_405b() -> ModelSpec:
    """Llama 3 405B: Llama 3 paper Table 3 and the Llama-3.1-405B model card / config.json
    (126 layers, h 16384, 128 heads, 8 KV heads, ffn 53248); seq 8192, the pre-training
    length before long-context training (paper §3.4)."""
    return _llama(
        "llama3-405b",
        layers=126,
        hidden=16384,
        heads=128,
        kv_heads=8,
        ffn=53248,
        seq=8192,
        vocab=LLAMA3_VOCAB,
    )


#: Megatron SC21 weak-scaling family: (label, layers, hidden, heads), published_runs.csv.
_MEGATRON_FAMILY = (
    ("1.7b", 24, 2304, 24),
    ("3.6b", 30, 3072, 32),
    ("7.5b", 36, 4096, 32),
    ("18.4b", 40, 6144, 48),
    ("39.1b", 48, 8192, 64),
    ("76.1b", 60, 10240, 80),
    ("145.6b", 80, 12288, 96),
    ("310.1b", 96, 16384, 128),
    ("529.6b", 105, 20480, 128),
    ("1t", 128, 25600, 160),
)

#: Korthikanti et al. 2022 Table 3: (label, layers, hidden, heads).
_KORTHIKANTI_FAMILY = (
    ("22b", 48, 6144, 64),
    ("175b", 96, 12288, 96),
    ("530b", 105, 20480, 128),
    ("1t", 128, 25600, 160),
)

#: Preset name -> factory.
PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "gpt3-175b": gpt3_175b,
    **{f"megatron-{row[0]}": _megatron(*row) for row in _MEGATRON_FAMILY},
    **{f"korthikanti-{row[0]}": _korthikanti(*row) for row in _KORTHIKANTI_FAMILY},
    "bloom-176b": bloom_176b,
    "llama2-7b": llama2_7b,
    "llama2-13b": llama2_13b,
    "llama2-70b": llama2_70b,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "llama3-405b": llama3_405b,
}


def _moe_model(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    seq: int,
    vocab: int,
    moe: MoESpec,
    **extra: object,
) -> ModelSpec:
    """A MoE decoder as the Llama-style families build it: SwiGLU experts, RMSNorm, RoPE,
    no dropout, untied, no linear biases unless ``extra`` says otherwise (``kv_channels``,
    ``mla``, ``mtp_num_layers``, ``tied_embeddings``, ``add_bias_linear``)."""
    fields: dict[str, object] = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": kv_heads,
        "ffn_hidden_size": ffn,
        "activation": Activation.SWIGLU,
        "seq_length": seq,
        "vocab_size": vocab,
        "tied_embeddings": False,
        "normalization": Normalization.RMSNORM,
        "position_embedding": PositionEmbedding.ROPE,
        "add_bias_linear": False,
        "dropout": False,
        "moe": moe,
        **extra,
    }
    return ModelSpec(**fields)  # type: ignore[arg-type]


#: DeepSeek-V2/V3 and Kimi K2 MLA widths: q_lora_rank 1536, kv_lora_rank 512,
#: qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128 (config_671B.json and
#: config_236B.json of deepseek-ai/DeepSeek-V3 ``inference/configs``).
DEEPSEEK_MLA = MlaSpec(
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
)


def deepseek_v3() -> ModelSpec:
    """DeepSeek-V3 (671B total, 37B active): deepseek-ai/DeepSeek-V3
    ``inference/configs/config_671B.json`` (dim 7168, inter_dim 18432, moe_inter_dim 2048,
    61 layers, 3 dense, 128 heads, 256 routed + 1 shared experts, 8 activated, 8 expert groups
    with 4 per token, sigmoid scores, vocab 129280) and the Hugging Face config
    (``num_nextn_predict_layers`` 1; the gate's ``e_score_correction_bias``); report
    arXiv:2412.19437 §4.2: sequence 4K in pre-training, one MTP module (§2.2)."""
    router = RouterSpec(
        score=RouterScore.SIGMOID, top_k=8, bias=True, num_groups=8, groups_per_token=4
    )
    moe = MoESpec(
        num_experts=256,
        expert_ffn_hidden_size=2048,
        router=router,
        num_shared_experts=1,
        first_k_dense_layers=3,
    )
    return _moe_model(
        "deepseek-v3",
        layers=61,
        hidden=7168,
        heads=128,
        kv_heads=128,
        ffn=18432,
        seq=4096,
        vocab=129280,
        moe=moe,
        mla=DEEPSEEK_MLA,
        mtp_num_layers=1,
    )


def deepseek_v2() -> ModelSpec:
    """DeepSeek-V2 (236B total, 21B active, arXiv:2405.04434 §3.1.2): deepseek-ai/DeepSeek-V3
    ``inference/configs/config_236B.json`` (dim 5120, inter_dim 12288, moe_inter_dim 1536,
    60 layers, 1 dense, 128 heads, 160 routed + 2 shared experts, 6 activated, 8 groups with 3
    per token, softmax scores, vocab 102400); sequence 4K in pre-training (paper §3.1.2)."""
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=6, num_groups=8, groups_per_token=3)
    moe = MoESpec(
        num_experts=160,
        expert_ffn_hidden_size=1536,
        router=router,
        num_shared_experts=2,
        first_k_dense_layers=1,
    )
    return _moe_model(
        "deepseek-v2",
        layers=60,
        hidden=5120,
        heads=128,
        kv_heads=128,
        ffn=12288,
        seq=4096,
        vocab=102400,
        moe=moe,
        mla=DEEPSEEK_MLA,
    )


def kimi_k2() -> ModelSpec:
    """Kimi K2 (1.04T total, 32B active): the model summary of MoonshotAI/Kimi-K2 README.md
    (61 layers with 1 dense, hidden 7168, expert width 2048, 64 heads, 384 experts, 8 selected,
    1 shared, MLA, SwiGLU, vocabulary 160K) and the moonshotai/Kimi-K2 config.json
    (DeepSeek-V3's architecture: intermediate_size 18432, vocab_size 163840, MLA widths as
    DeepSeek-V3, sigmoid scores with ``noaux_tc`` bias, ``n_group`` 1, no MTP module). Seq 4096:
    the pre-training context window before long-context activation (Kimi K2 technical
    report, arXiv:2507.20534)."""
    router = RouterSpec(score=RouterScore.SIGMOID, top_k=8, bias=True)
    moe = MoESpec(
        num_experts=384,
        expert_ffn_hidden_size=2048,
        router=router,
        num_shared_experts=1,
        first_k_dense_layers=1,
    )
    return _moe_model(
        "kimi-k2",
        layers=61,
        hidden=7168,
        heads=64,
        kv_heads=64,
        ffn=18432,
        seq=4096,
        vocab=163840,
        moe=moe,
        mla=DEEPSEEK_MLA,
    )


def _qwen3_moe(
    name: str, *, layers: int, hidden: int, heads: int, ffn: int, expert_ffn: int
) -> ModelSpec:
    """A Qwen3 MoE model: 128 experts with 8 activated and 4 KV heads (Qwen3 technical report
    arXiv:2505.09388 Table 2), no shared experts, softmax router, head_dim 128, vocab 151936,
    untied (the config.json files); sequence 4096, the general pre-training stage's (§3.2)."""
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=8)
    moe = MoESpec(num_experts=128, expert_ffn_hidden_size=expert_ffn, router=router)
    return _moe_model(
        name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=4,
        ffn=ffn,
        seq=4096,
        vocab=151936,
        moe=moe,
        kv_channels=128,
    )


def qwen3_235b_a22b() -> ModelSpec:
    """Qwen3-235B-A22B (235B total, 22B active): Qwen/Qwen3-235B-A22B config.json (94 layers,
    hidden 4096, 64 heads, 4 KV heads, head_dim 128, moe_intermediate_size 1536, 128 experts,
    8 per token; intermediate_size 12288 is unused: every layer has experts), as
    reference/moe_runs.csv rows M0009-M0010 and Megatron-MoE-ModelZoo's
    ``Qwen3-235B-A22B.yaml`` (``--kv-channels 128``)."""
    return _qwen3_moe(
        "qwen3-235b-a22b", layers=94, hidden=4096, heads=64, ffn=12288, expert_ffn=1536
    )


def qwen3_30b_a3b() -> ModelSpec:
    """Qwen3-30B-A3B (30.5B total, 3.3B active): Qwen/Qwen3-30B-A3B config.json (48 layers,
    hidden 2048, 32 heads, 4 KV heads, head_dim 128, moe_intermediate_size 768, 128 experts,
    8 per token; intermediate_size 6144 unused), as reference/moe_runs.csv rows
    M0007-M0008."""
    return _qwen3_moe("qwen3-30b-a3b", layers=48, hidden=2048, heads=32, ffn=6144, expert_ffn=768)


def _mixtral(name: str, *, layers: int, hidden: int, heads: int, ffn: int, seq: int) -> ModelSpec:
    """A Mixtral: 8 experts of the dense width, 2 per token, softmax router, 8 KV heads,
    vocab 32000 (Mixtral paper arXiv:2401.04088 Table 1)."""
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=2)
    moe = MoESpec(num_experts=8, expert_ffn_hidden_size=ffn, router=router)
    return _moe_model(
        name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=8,
        ffn=ffn,
        seq=seq,
        vocab=32000,
        moe=moe,
    )


def mixtral_8x7b() -> ModelSpec:
    """Mixtral 8x7B (46.7B total, 12.9B active): arXiv:2401.04088 Table 1 (dim 4096, 32
    layers, head_dim 128, hidden_dim 14336, 32 heads, 8 KV heads, context 32768, vocab 32000,
    8 experts, top 2) and mistralai/Mixtral-8x7B-v0.1 config.json; pre-trained with a 32k
    context (§1)."""
    return _mixtral("mixtral-8x7b", layers=32, hidden=4096, heads=32, ffn=14336, seq=32768)


def mixtral_8x22b() -> ModelSpec:
    """Mixtral 8x22B (141B total, 39B active; Mistral's announcement, 64K context):
    mistralai/Mixtral-8x22B-v0.1 config.json (56 layers, hidden 6144, 48 heads, 8 KV heads,
    intermediate_size 16384, max_position_embeddings 65536), as Megatron-MoE-ModelZoo's
    ``Mixtral-8x22B.yaml``. Vocab 32000 as Mixtral 8x7B's; the v0.3 tokenizer has 32768
    (+9.4M parameters, 0.007%)."""
    return _mixtral("mixtral-8x22b", layers=56, hidden=6144, heads=48, ffn=16384, seq=65536)


def gpt_oss_120b() -> ModelSpec:
    """gpt-oss-120b (116.83B total, 5.13B active, model card arXiv:2508.10925 Table 1):
    openai/gpt-oss-120b config.json (36 layers, hidden 2880, 64 heads of head_dim 64, 8 KV
    heads, 128 experts of intermediate_size 2880, 4 per token, vocab 201088, untied;
    ``attention_bias`` true, experts and router with biases), as reference/moe_runs.csv rows
    M0005-M0006, whose sequence length (4096) it takes. Every layer has experts; its
    alternating 128-token sliding-window attention and attention sinks are not modelled."""
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=4, bias=True)
    moe = MoESpec(num_experts=128, expert_ffn_hidden_size=2880, router=router)
    return _moe_model(
        "gpt-oss-120b",
        layers=36,
        hidden=2880,
        heads=64,
        kv_heads=8,
        ffn=2880,
        seq=4096,
        vocab=201088,
        moe=moe,
        kv_channels=64,
        add_bias_linear=True,
    )


def _llama4(name: str, *, experts: int, interval: int) -> ModelSpec:
    """A Llama 4 text model: meta-llama/Llama-4-{Scout-17B-16E, Maverick-17B-128E} config.json
    ``text_config`` (48 layers, hidden 5120, 40 heads, 8 KV heads, head_dim 128, experts and
    the shared expert of intermediate_size 8192, dense layers of intermediate_size_mlp 16384,
    1 expert per token with a sigmoid score, vocab 202048, untied). Seq 8192: the configs
    give no pre-training length; override it with ``--seq-length``. The vision encoder is
    not modelled."""
    router = RouterSpec(score=RouterScore.SIGMOID, top_k=1)
    moe = MoESpec(
        num_experts=experts,
        expert_ffn_hidden_size=8192,
        router=router,
        num_shared_experts=1,
        layer_interval=interval,
    )
    return _moe_model(
        name,
        layers=48,
        hidden=5120,
        heads=40,
        kv_heads=8,
        ffn=16384,
        seq=8192,
        vocab=202048,
        moe=moe,
    )


def llama4_scout() -> ModelSpec:
    """Llama 4 Scout (109B total, 17B active): 16 experts in every layer
    (``interleave_moe_layer_step`` 1)."""
    return _llama4("llama4-scout", experts=16, interval=1)


def llama4_maverick() -> ModelSpec:
    """Llama 4 Maverick (400B total, 17B active): 128 experts in every other layer
    (``interleave_moe_layer_step`` 2: layers 1, 3, ..., 47; Megatron ``--moe-layer-freq
    ([0,1]*24)``), dense layers in between."""
    return _llama4("llama4-maverick", experts=128, interval=2)


def grok_1() -> ModelSpec:
    """Grok-1 (314B): xai-org/grok-1 ``run.py`` (emb_size 6144, 64 layers, 48 query and 8 KV
    heads of key_size 128, widening_factor 8, 8 experts, 2 selected, vocab 128 x 1024,
    sequence_len 8192) and ``model.py`` (``ffn_size``: int(8 x 6144) x 2 // 3 = 32768; tied
    input/output embedding, "here, we use tied weights"). Its experts are GeGLU (gelu gate):
    three matrices like SwiGLU's, which stands in for it (same parameters and FLOPs); its
    post-attention and post-MoE norms (2h per layer) are not modelled."""
    router = RouterSpec(score=RouterScore.SOFTMAX, top_k=2)
    moe = MoESpec(num_experts=8, expert_ffn_hidden_size=32768, router=router)
    return _moe_model(
        "grok-1",
        layers=64,
        hidden=6144,
        heads=48,
        kv_heads=8,
        ffn=32768,
        seq=8192,
        vocab=131072,
        moe=moe,
        tied_embeddings=True,
    )


#: Preset name -> factory, for models with routed experts.
MOE_PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "deepseek-v3": deepseek_v3,
    "deepseek-v2": deepseek_v2,
    "kimi-k2": kimi_k2,
    "qwen3-235b-a22b": qwen3_235b_a22b,
    "qwen3-30b-a3b": qwen3_30b_a3b,
    "mixtral-8x7b": mixtral_8x7b,
    "mixtral-8x22b": mixtral_8x22b,
    "gpt-oss-120b": gpt_oss_120b,
    "llama4-scout": llama4_scout,
    "llama4-maverick": llama4_maverick,
    "grok-1": grok_1,
}


def preset_names() -> tuple[str, ...]:
    """Names of the dense presets (the ones plansim plans and simulates), in catalog order."""
    return tuple(PRESETS)


def moe_preset_names() -> tuple[str, ...]:
    """Names of the presets with routed experts, in catalog order."""
    return tuple(MOE_PRESETS)


class UnknownModelError(UnknownNameError):
    """A model name that is neither a preset nor a path.

    ``known`` lists the dense presets; the message also names the presets with experts
    (``described``), which plansim describes but does not yet plan or simulate.
    """

    def __init__(self, name: str) -> None:
        super().__init__("model", name, preset_names())
        self.described = sorted(MOE_PRESETS)
        self.args = (f"{self.args[0]}; with experts: {', '.join(self.described)}",)


def _looks_like_path(name: str) -> bool:
    return name.endswith(".json") or "/" in name or "\\" in name or Path(name).exists()


def resolve_model(name_or_path: str, *, seq_length: int | None = None) -> ModelSpec:
    """A preset by name, or the model of a local Hugging Face ``config.json``.

    Args:
        name_or_path: a key of PRESETS or MOE_PRESETS, or a path to a config.json (or its
            directory).
        seq_length: training sequence length replacing the preset's (or the config's
            max_position_embeddings); None keeps it. With learned positions this also sizes
            the position-embedding table (ModelSpec has no separate maximum length).

    Returns:
        The model.

    Raises:
        UnknownNameError: neither a preset nor a path; the message lists the presets
            (:class:`UnknownModelError`).
        InputFileError: the config file is missing or malformed.
        SpecError: seq_length is not a positive integer.
    """
    if name_or_path in PRESETS:
        model = PRESETS[name_or_path]()
    elif name_or_path in MOE_PRESETS:
        model = MOE_PRESETS[name_or_path]()
    elif _looks_like_path(name_or_path):
        model = read_hf_config(name_or_path)
    else:
        raise UnknownModelError(name_or_path)
    if seq_length is not None:
        model = dataclasses.replace(model, seq_length=seq_length)
    return model
