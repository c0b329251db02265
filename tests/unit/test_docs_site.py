"""The documentation site: it builds in strict mode (broken links, anchors and docstring
warnings fail), and what it shows is what its generators (docs/gen/) write from plansim now:
the CLI reference from the argparse parser, the accuracy page and README's accuracy table from
``plansim backtest`` outputs, the command outputs and the schedule table from the commands."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _generator(name: str) -> ModuleType:
    """A script of docs/gen/ imported as a module."""
    path = DOCS / "gen" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"docs_gen_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_in_strict_mode_and_needs_no_network(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install .[docs])")
    pytest.importorskip("material", reason="mkdocs-material is not installed")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] missing")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    pages = list(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
        assert "--8&lt;--" not in text, f"{page}: a snippet was not included"
    api = (site / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    assert 'id="plansim.planner.search.search"' in api  # the docstrings were rendered


def test_the_cli_reference_is_what_the_parser_gives() -> None:
    cli = _generator("cli_reference")
    committed = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert committed == cli.render(), "stale: run .venv/bin/python docs/gen/cli_reference.py"


def test_the_framework_release_page_is_the_release_table() -> None:
    releases = _generator("framework_releases")
    committed = (DOCS / "reference" / "framework-releases.md").read_text(encoding="utf-8")
    assert committed == releases.render(), "stale: run docs/gen/framework_releases.py"
    assert "## `sequence_parallel`" in committed and "| 2023 |" in committed


def test_the_accuracy_page_and_readme_table_are_rendered_from_the_backtest_data() -> None:
    acc = _generator("accuracy")
    rows, summaries = acc._load()
    assert set(rows["file"]) == {f.name for f in acc.FILES}
    assert (DOCS / "accuracy.md").read_text(encoding="utf-8") == acc.page(rows, summaries)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = acc.readme_block(rows, summaries)
    assert f"{acc.BEGIN}\n{block}\n{acc.END}" in readme
    for image in (acc.SCATTER_PNG, acc.FAMILY_PNG):
        assert image.exists(), image


@pytest.mark.slow
def test_the_backtest_data_is_what_plansim_backtest_prints_now() -> None:
    """The public sample and the cheapest published files, back-tested again: the committed
    rows and summary lines (which the page and README tables are rendered from) are the
    command's output now. ``make docs-data`` regenerates every file."""
    acc = _generator("accuracy")
    rows, summaries = acc._load()
    for name in acc.CHEAP:
        runs = acc._file(name)
        if not runs.path.exists():
            pytest.skip(f"{runs.path} is not here")
        fresh, lines = acc.backtest(runs, os.cpu_count() or 1)
        committed = rows[rows["file"] == name].reset_index(drop=True)
        pd.testing.assert_frame_equal(committed, fresh.reset_index(drop=True))
        assert summaries[name] == lines, f"{name}: run docs/gen/accuracy.py run"


@pytest.mark.slow
def test_the_command_outputs_the_docs_show_are_current() -> None:
    examples = _generator("examples")
    assert examples.stale() == [], "stale: run .venv/bin/python docs/gen/examples.py"
    for schedule in examples.PICTURES:
        assert (DOCS / "images" / f"schedule-{schedule}.png").exists()


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("page", ["getting-started.md", "reference/python-api.md"])
def test_the_python_examples_of_the_docs_run(page: str) -> None:
    blocks = _python_blocks(DOCS / page)
    assert blocks
    for block in blocks:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(block, str(DOCS / page), "exec"), {})


def test_the_readme_python_example_is_the_api_page_one() -> None:
    """README's block runs in test_readme_example.py; the API page starts with the same."""
    (readme_block,) = _python_blocks(ROOT / "README.md")
    api_block = _python_blocks(DOCS / "reference" / "python-api.md")[0]
    assert api_block.startswith(readme_block)


def test_readme_and_changelog_links_point_at_files() -> None:
    for name in ("README.md", "CHANGELOG.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (ROOT / target).exists(), f"{name} links to {target}, which is not a file"


def test_the_architecture_page_states_the_enforced_layers_and_the_timeline_schema() -> None:
    from plansim.sim.timeline import COLUMNS, Stream, TimelineKind
    from tests.unit.test_architecture import LAYERS

    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    table = re.findall(r"^\s*\| (\d+) \| (.+?) \|$", page, re.M)
    layers = [tuple(re.findall(r"`([^`]+)`", names)) for _, names in table]
    assert layers == [tuple(layer) for layer in LAYERS]
    for column in COLUMNS:
        assert f"| `{column}` |" in page, column
    for value in [k.value for k in TimelineKind] + [s.value for s in Stream]:
        assert f"`{value}`" in page, value


def test_the_docs_have_no_machine_paths_or_work_history() -> None:
    files = [*DOCS.rglob("*.md"), *DOCS.glob("gen/*.py"), ROOT / "README.md", ROOT / "mkdocs.yml"]
    files += [ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "published_runs" / "README.md"]
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?<![\w.])/(home|work|tmp|Users|root)/", text), path
        assert not re.search(r"\b(session|round|work round)s? \d+", text, re.I), path
