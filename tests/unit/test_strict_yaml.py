"""Input YAML (profiles, plan files) refuses duplicate keys and aliases with the line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plansim.errors import InputFileError
from plansim.io.hf_config import read_hf_config
from plansim.io.plan_file import PlanFile, plan_file_text, read_plan_file
from plansim.io.profiles import load_profile
from plansim.io.runs import read_runs
from plansim.io.strict_yaml import StrictYamlError, strict_load
from plansim.specs.plan import plan_from_fields

REPO = Path(__file__).resolve().parents[2]


def test_a_plain_document_loads_as_safe_load_gives_it() -> None:
    assert strict_load("a: 1\nb: [1, 2.5, null]\nc: {d: x, e: true}\n") == {
        "a": 1,
        "b": [1, 2.5, None],
        "c": {"d": "x", "e": True},
    }


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("a: 1\na: 2\n", "duplicate key 'a'", 2),
        ("top:\n  latency_us: 1\n  latency_us: 2\n", "duplicate key 'latency_us'", 3),
        ("x: &A [1, 2]\ny: *A\n", "an alias (*name) repeats an anchored value", 1),
    ],
)
def test_duplicates_and_aliases_are_refused_with_their_line(
    text: str, message: str, line: int
) -> None:
    with pytest.raises(StrictYamlError) as info:
        strict_load(text)
    assert message in str(info.value)
    assert info.value.problem_mark is not None and info.value.problem_mark.line + 1 == line


def test_an_alias_bomb_is_refused_at_once() -> None:
    levels = ["a: &a [" + ", ".join(["x"] * 10) + "]"]
    for i in range(1, 9):  # 10^9 strings if expanded
        name, prev = chr(97 + i), chr(96 + i)
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    start = time.perf_counter()
    with pytest.raises(StrictYamlError, match="alias"):
        strict_load("\n".join(levels) + "\n")
    assert time.perf_counter() - start < 1.0


def test_a_profile_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    text = (REPO / "hardware_profiles" / "a100-sxm4-80gb.yaml").read_text()
    first = next(line for line in text.splitlines() if line.startswith("hbm_bandwidth"))
    path = tmp_path / "twice.yaml"
    path.write_text(text + first + "\n")
    with pytest.raises(InputFileError, match=r"malformed YAML: duplicate key 'hbm_bandwidth"):
        load_profile(str(path))
    assert load_profile("a100-sxm4-80gb").name == "a100-sxm4-80gb"  # the shipped one loads


def test_a_plan_file_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    plan = plan_from_fields(dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=2)
    text = plan_file_text(PlanFile(plan=plan, model="gpt3-175b", gpu="h100", num_gpus=2))
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("  batch:\n", "  batch:\n    micro_batch_size: 2\n", 1))
    with pytest.raises(InputFileError, match="duplicate key 'micro_batch_size'"):
        read_plan_file(path)


def test_a_hugging_face_config_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "llama", "hidden_size": 4096, "hidden_size": 8192, '
        '"num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 14336, '
        '"vocab_size": 128256, "max_position_embeddings": 8192}'
    )
    with pytest.raises(InputFileError, match="duplicate key 'hidden_size' in a JSON object"):
        read_hf_config(path)


def test_a_runs_csv_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    lines = (REPO.parent / "shared" / "reference" / "published_runs.csv").read_text().splitlines()
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([lines[0] + ",tp", *lines[1:3]]) + "\n")
    with pytest.raises(InputFileError, match="column\\(s\\) tp appear more than once"):
        read_runs(path)
    header, rows = read_runs(REPO.parent / "shared" / "reference" / "published_runs.csv")
    assert len(rows) == 39 and header.count("tp") == 1
