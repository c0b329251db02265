"""Model presets, Hugging Face config.json reading and the ``plansim models`` command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from plansim.analytic.params import count_parameters
from plansim.catalog import PRESETS, preset_names, resolve_model
from plansim.cli import main
from plansim.errors import InputFileError, SpecError, UnknownNameError
from plansim.io.hf_config import read_hf_config, supported_model_types
from plansim.specs.model import Activation, ModelSpec, Normalization, PositionEmbedding

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"


# ----------------------------------------------------------------------------- presets


def test_every_preset_builds_and_is_named_after_its_key() -> None:
    assert preset_names() == tuple(PRESETS)
    assert len(preset_names()) == 22
    for name in preset_names():
        model = resolve_model(name)
        assert isinstance(model, ModelSpec)
        assert model.name == name
        assert PRESETS[name].__doc__, f"{name} factory has no docstring citing its source"


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads", "params_billion"),
    [
        # Narayanan et al. SC21 Table 1, reference/published_runs.csv rows T0001-T0010.
        ("megatron-1.7b", 24, 2304, 24, 1.7),
        ("megatron-3.6b", 30, 3072, 32, 3.6),
        ("megatron-7.5b", 36, 4096, 32, 7.5),
        ("megatron-18.4b", 40, 6144, 48, 18.4),
        ("megatron-39.1b", 48, 8192, 64, 39.1),
        ("megatron-76.1b", 60, 10240, 80, 76.1),
        ("megatron-145.6b", 80, 12288, 96, 145.6),
        ("megatron-310.1b", 96, 16384, 128, 310.1),
        ("megatron-529.6b", 105, 20480, 128, 529.6),
        ("megatron-1t", 128, 25600, 160, 1008.0),
    ],
)
def test_megatron_family_matches_narayanan_table1(
    preset: str, layers: int, hidden: int, heads: int, params_billion: float
) -> None:
    m = resolve_model(preset)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (layers, hidden, heads)
    assert (m.ffn_hidden_size, m.seq_length, m.vocab_size) == (4 * hidden, 2048, 51200)
    assert m.activation is Activation.GELU
    assert m.position_embedding is PositionEmbedding.LEARNED
    assert m.tied_embeddings
    # The table gives parameters to one decimal (in billions).
    assert round(count_parameters(m).total / 1e9, 1) == params_billion


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads", "nominal_billion"),
    [
        # Korthikanti et al. 2022 Table 3, published_runs.csv rows T0024-T0031.
        ("korthikanti-22b", 48, 6144, 64, 22),
        ("korthikanti-175b", 96, 12288, 96, 175),
        ("korthikanti-530b", 105, 20480, 128, 530),
        ("korthikanti-1t", 128, 25600, 160, 1000),
    ],
)
def test_korthikanti_table3(
    preset: str, layers: int, hidden: int, heads: int, nominal_billion: int
) -> None:
    m = resolve_model(preset)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (layers, hidden, heads)
    assert count_parameters(m).total / 1e9 == pytest.approx(nominal_billion, rel=0.01)


def test_bloom_176b_is_published_count_minus_embedding_layernorm() -> None:
    # BigScience BLOOM: 176,247,271,424 parameters; ModelSpec has no embedding LayerNorm (2h).
    m = resolve_model("bloom-176b")
    assert count_parameters(m).total == 176_247_271_424 - 2 * 14336
    assert count_parameters(m).position_embedding == 0


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab"),
    [
        ("llama2-7b", 32, 4096, 32, 32, 11008, 4096, 32000),
        ("llama2-13b", 40, 5120, 40, 40, 13824, 4096, 32000),
        ("llama2-70b", 80, 8192, 64, 8, 28672, 4096, 32000),
        ("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256),
        ("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256),
        ("llama3-405b", 126, 16384, 128, 8, 53248, 8192, 128256),
    ],
)
def test_llama_shapes(
    preset: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, vocab: int
) -> None:
    m = resolve_model(preset)
    shape = (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups)
    assert shape == (layers, hidden, heads, kv_heads)
    assert (m.ffn_hidden_size, m.seq_length, m.vocab_size) == (ffn, seq, vocab)
    assert m.activation is Activation.SWIGLU
    assert m.normalization is Normalization.RMSNORM
    assert m.position_embedding is PositionEmbedding.ROPE
    assert not m.add_bias_linear
    assert not m.tied_embeddings


def test_seq_length_override() -> None:
    assert resolve_model("llama3-8b", seq_length=4096).seq_length == 4096
    assert resolve_model("llama3-8b").seq_length == 8192
    with pytest.raises(SpecError, match="seq_length"):
        resolve_model("llama3-8b", seq_length=0)


def test_unknown_preset_lists_the_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        resolve_model("gpt-5")
    assert info.value.known == sorted(preset_names())
    assert "unknown model 'gpt-5'" in str(info.value)
    assert "llama3-8b" in str(info.value)


# ----------------------------------------------------------------------------- HF config.json


@pytest.mark.parametrize(
    ("fixture", "expected_total"),
    [
        ("llama3_8b.json", 8_030_261_248),  # Meta-Llama-3-8B: 8.03B
        ("mistral_7b_v0.1.json", 7_241_732_096),  # Mistral-7B-v0.1: 7.24B
        # Qwen2-7B: 7,615,616,512 less the Q/K/V biases, 28 x (3584 + 2 * 512), not modelled.
        ("qwen2_7b_instruct.json", 7_615_616_512 - 28 * (3584 + 2 * 512)),
        ("gpt2.json", 124_439_808),  # GPT-2 small: 124.4M
        ("gpt_neox_20b.json", 20_554_567_680),  # GPT-NeoX-20B: 20.55B
    ],
)
def test_hf_config_parameter_counts(fixture: str, expected_total: int) -> None:
    assert count_parameters(read_hf_config(FIXTURES / fixture)).total == expected_total


def test_llama3_config_equals_the_preset() -> None:
    from_config = read_hf_config(FIXTURES / "llama3_8b.json")
    assert from_config.name == "meta-llama/Meta-Llama-3-8B"
    assert dataclasses.replace(from_config, name="llama3-8b") == resolve_model("llama3-8b")


def test_gpt2_and_neox_families() -> None:
    gpt2 = read_hf_config(FIXTURES / "gpt2.json")
    assert gpt2.ffn_hidden_size == 4 * 768
    assert gpt2.position_embedding is PositionEmbedding.LEARNED
    assert gpt2.tied_embeddings and gpt2.add_bias_linear
    assert gpt2.seq_length == 1024
    assert gpt2.name == "gpt2"  # no _name_or_path: the file name
    neox = read_hf_config(FIXTURES / "gpt_neox_20b.json")
    assert neox.position_embedding is PositionEmbedding.ROPE
    assert neox.normalization is Normalization.LAYERNORM
    assert neox.add_bias_linear and not neox.tied_embeddings


def test_dropout_is_read_from_each_familys_keys(tmp_path: Path) -> None:
    # GPT-2 trains with 0.1 dropout (resid/embd/attn_pdrop); Llama and NeoX-20B with none
    assert read_hf_config(FIXTURES / "gpt2.json").dropout
    assert not read_hf_config(FIXTURES / "llama3_8b.json").dropout
    assert not read_hf_config(FIXTURES / "gpt_neox_20b.json").dropout
    assert read_hf_config(_write(tmp_path, _llama_config(attention_dropout=0.1))).dropout
    gpt2 = json.loads((FIXTURES / "gpt2.json").read_text(encoding="utf-8"))
    zeros = {**gpt2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    assert not read_hf_config(_write(tmp_path, zeros)).dropout
    with pytest.raises(InputFileError, match=r"key 'attention_dropout' must be a probability"):
        read_hf_config(_write(tmp_path, _llama_config(attention_dropout="high")))


def _write(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


#: Marks a key to delete from a fixture config.
_DROP = object()


def _llama_config(**changes: object) -> dict[str, object]:
    data = json.loads((FIXTURES / "llama3_8b.json").read_text(encoding="utf-8"))
    data.update(changes)
    return {k: v for k, v in data.items() if v is not _DROP}


def test_directory_and_resolve_model_read_config_json(tmp_path: Path) -> None:
    _write(tmp_path, _llama_config(_name_or_path=_DROP))
    by_dir = read_hf_config(tmp_path)
    assert by_dir.name == tmp_path.name
    by_path = resolve_model(str(tmp_path / "config.json"), seq_length=2048)
    assert by_path.seq_length == 2048
    assert by_path.num_query_groups == 8


def test_gpt2_n_inner_and_llama_kv_default(tmp_path: Path) -> None:
    gpt2 = json.loads((FIXTURES / "gpt2.json").read_text(encoding="utf-8"))
    assert read_hf_config(_write(tmp_path, {**gpt2, "n_inner": 1000})).ffn_hidden_size == 1000
    # the real GPT-2 configs say "n_inner": null, which the format defines as 4 x n_embd
    null = read_hf_config(_write(tmp_path, {**gpt2, "n_inner": None}))
    assert null.ffn_hidden_size == 4 * gpt2["n_embd"]
    llama = _llama_config(num_key_value_heads=_DROP)
    assert read_hf_config(_write(tmp_path, llama)).num_query_groups == 32


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "invalid JSON at line 1"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"model_type": "bert"}), "'model_type' is 'bert'; supported: gpt2, gpt_neox"),
        (json.dumps({"hidden_size": 8}), "'model_type' is missing; supported"),
        (json.dumps({"model_type": ["llama"]}), "'model_type' is \\['llama'\\]"),
        (json.dumps(_llama_config(hidden_size=_DROP)), "key 'hidden_size' is missing"),
        (json.dumps(_llama_config(vocab_size="128256")), "key 'vocab_size' must be an integer"),
        (json.dumps(_llama_config(num_hidden_layers=32.0)), "'num_hidden_layers' must be an int"),
        (json.dumps(_llama_config(num_hidden_layers=True)), "'num_hidden_layers' must be an int"),
        (json.dumps(_llama_config(tie_word_embeddings="no")), "'tie_word_embeddings' must be"),
        (json.dumps(_llama_config(hidden_act="gelu")), "'hidden_act' is 'gelu'; supported: silu"),
        (json.dumps(_llama_config(hidden_size=4100)), "hidden_size\\(4100\\) is not divisible"),
        (json.dumps(_llama_config(num_hidden_layers=0)), "num_layers must be a positive"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputFileError, match=match) as info:
        read_hf_config(path)
    assert str(path) in str(info.value)


def test_mistral_needs_num_key_value_heads(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "mistral_7b_v0.1.json").read_text(encoding="utf-8"))
    del data["num_key_value_heads"]
    with pytest.raises(InputFileError, match="'num_key_value_heads' is missing"):
        read_hf_config(_write(tmp_path, data))


def test_missing_or_binary_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read"):
        read_hf_config(tmp_path / "absent.json")
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputFileError, match="not UTF-8"):
        read_hf_config(binary)


def test_supported_model_types() -> None:
    assert supported_model_types() == ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")


# ----------------------------------------------------------------------------- CLI


def test_cli_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "name",
        "params_b",
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "ffn",
        "activation",
        "seq",
        "vocab",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == list(preset_names())
    assert rows["llama3-8b"] == [
        "llama3-8b",
        "8.03",
        "32",
        "4096",
        "32",
        "8",
        "14336",
        "swiglu",
        "8192",
        "128256",
    ]
    assert rows["gpt3-175b"][1] == "174.62"


def test_cli_seq_length_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--seq-length", "4096"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert {row[8] for row in rows} == {"4096"}


def test_cli_shows_one_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", str(FIXTURES / "gpt2.json")]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out
    assert "embedding/position" in out


def test_cli_unknown_preset_exits_2_with_known_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plansim: error: unknown model 'gpt-5'; known: ")
    for name in preset_names():
        assert name in err


def test_cli_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {"model_type": "t5"})
    assert main(["models", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert "supported: gpt2, gpt_neox, llama, mistral, qwen2" in err
