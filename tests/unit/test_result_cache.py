"""The persistent result cache (plansim.io.result_cache): keyed on code and inputs, never
stale, and a search through it gives what the search gives without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import InputFileError
from plansim.io.profiles import load_profile
from plansim.io.result_cache import CACHE_DIR_ENV, ResultCache, cache_from, code_version
from plansim.planner.context import SearchContext
from plansim.planner.enumerate import SearchSpace
from plansim.planner.search import SearchResult, search
from plansim.specs.plan import Precision, Recompute

MODEL = resolve_model("llama2-7b")
PROFILE = load_profile("h100-sxm5-80gb")
SPACE = SearchSpace(
    tp=(1, 2),
    pp=(1, 2),
    micro_batch_size=(1, 2),
    zero_stages=(1,),
    recomputes=(Recompute.NONE, Recompute.FULL),
    precision=Precision.BF16,
)


def _search(cache: ResultCache | None, *, top_k: int = 3) -> SearchResult:
    return search(
        MODEL, PROFILE, num_gpus=8, global_batch_size=16, space=SPACE, top_k=top_k, cache=cache
    )


def _summary(result: SearchResult) -> list[tuple[str, float, float]]:
    return [(e.plan.label(), e.step_time_s, e.peak_memory_bytes) for e in result.ranked]


def test_entries_round_trip_under_their_inputs_and_code(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "c", version="v1")
    key = cache.key("simulation", MODEL, PROFILE, 3)
    assert cache.get(key) is None and cache.misses == 1
    cache.put(key, {"step_time_s": 1.5})
    assert cache.get(key) == {"step_time_s": 1.5} and cache.hits == 1
    # another input, kind or code version names another entry
    assert cache.key("simulation", MODEL, PROFILE, 4) != key
    assert cache.key("search", MODEL, PROFILE, 3) != key
    assert ResultCache(tmp_path / "c", version="v2").key("simulation", MODEL, PROFILE, 3) != key


def test_an_unreadable_entry_is_a_miss_and_is_rewritten(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path, version="v1")
    key = cache.key("simulation", 1)
    cache.put(key, [1, 2, 3])
    (entry,) = tmp_path.rglob("*.pickle.z")
    entry.write_bytes(entry.read_bytes()[:5])  # cut short
    assert cache.get(key) is None
    cache.put(key, [1, 2, 3])
    assert cache.get(key) == [1, 2, 3]


def test_the_code_version_follows_every_source_file(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    before = code_version(package)
    assert code_version(package) == before
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert code_version(package) != before
    assert len(code_version()) == 64


def test_the_folder_comes_from_the_option_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    assert cache_from(None) is None
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    from_env = cache_from(None)
    assert from_env is not None and from_env.directory == tmp_path / "env"
    given = cache_from(tmp_path / "opt")
    assert given is not None and given.directory == tmp_path / "opt"
    (tmp_path / "file").write_text("")
    with pytest.raises(InputFileError, match="not a folder"):
        ResultCache(tmp_path / "file")


def test_a_search_through_the_cache_equals_one_without_and_is_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _search(None)
    cache = ResultCache(tmp_path, version="test")
    first = _search(cache)
    assert _summary(first) == _summary(plain)
    assert first.rejection_counts == plain.rejection_counts
    assert first.num_simulated == plain.num_simulated

    _forbid_simulation(monkeypatch)
    again = _search(cache)  # the whole search read back
    assert _summary(again) == _summary(plain)
    assert again.rejection_counts == plain.rejection_counts
    fewer = _search(cache, top_k=2)  # another search: its plans were all simulated before
    assert _summary(fewer)[:2] == _summary(plain)[:2]


def test_another_code_version_simulates_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _search(ResultCache(tmp_path, version="old"))
    calls: list[str] = []
    original = SearchContext.simulate

    def simulate(self: SearchContext, plan: object, **kwargs: float) -> object:
        calls.append(str(plan))
        return original(self, plan, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SearchContext, "simulate", simulate)
    _search(ResultCache(tmp_path, version="new"))
    assert calls


def _forbid_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    def simulate(*_: object, **__: object) -> None:  # the planner calls methods by name
        raise AssertionError("simulated again")

    monkeypatch.setattr(SearchContext, "simulate", simulate)


PLAN_ARGS = ["plan", "--model", "llama2-7b", "--gpu", "h100-sxm5-80gb", "--gpus", "8"]
PLAN_ARGS += ["--gbs", "16", "--tp", "1,2", "--pp", "1,2", "--top", "3", "--jobs", "1"]


def test_plan_with_a_cache_dir_prints_the_same_and_reads_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    assert main(PLAN_ARGS) == 0
    plain = capsys.readouterr().out
    assert main([*PLAN_ARGS, "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == plain
    assert list(tmp_path.rglob("search-*.pickle.z")) and list(tmp_path.rglob("simulation-*"))
    _forbid_simulation(monkeypatch)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))  # the environment names the same folder
    assert main(PLAN_ARGS) == 0
    assert capsys.readouterr().out == plain


def test_sweep_cells_search_through_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    args = ["sweep", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    args += ["--gbs", "16,32", "--jobs", "1", "--cache-dir", str(tmp_path / "cache")]
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main([*args, "--out", str(first)]) == 0
    _forbid_simulation(monkeypatch)
    assert main([*args, "--out", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    capsys.readouterr()


def test_a_cache_dir_that_is_a_file_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    assert main([*PLAN_ARGS, "--cache-dir", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "exists and is not a folder" in err and "Traceback" not in err
