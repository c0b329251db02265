"""Executes notebooks/quickstart.ipynb end to end and checks its key outputs.

The notebook is a consumer of the package (docs/architecture.md, "notebooks/"): it must run on the
installed plansim in a fresh Jupyter kernel and show the ranked table, the rejections, the two
Gantt charts and the memory breakdown. Cells are found by their metadata tag, not position.
The stored notebook carries no outputs (nothing machine-specific is committed).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
QUICKSTART = NOTEBOOKS / "quickstart.ipynb"
#: Probe run first in the executed copy: which interpreter the "python3" kernel runs, and
#: whether it imports plansim.
_PROBE = "import sys\n\nprint(sys.prefix)\nimport plansim"
_SCHEDULES = ("zb-h1", "interleaved-1f1b", "1f1b", "gpipe")


def _tagged(nb: Any, tag: str) -> Any:
    cells = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag!r}, found {len(cells)}"
    return cells[0]


def _text(cell: Any) -> str:
    """Everything a cell printed or returned, as text (stream text, text/plain, text/html)."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        data = out.get("data", {})
        parts += [data[mime] for mime in ("text/plain", "text/html") if mime in data]
    return "\n".join(parts)


def _has_png(cell: Any) -> bool:
    return any("image/png" in out.get("data", {}) for out in cell.outputs)


@pytest.fixture(scope="module")
def executed() -> Any:
    nb = nbformat.read(QUICKSTART, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_PROBE, metadata={"tags": ["probe"]}))
    client = nbclient.NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        allow_errors=True,  # keep going, so that each test below reports what it checks
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    return nb


def test_stored_notebook_has_no_outputs() -> None:
    nb = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(not c.outputs and c.execution_count is None for c in code)


def _errors(cell: Any) -> list[str]:
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


def test_kernel_runs_this_interpreter_and_imports_plansim(executed: Any) -> None:
    probe = _tagged(executed, "probe")
    prefix = _text(probe).strip().splitlines()[0]
    assert Path(prefix).resolve() == Path(sys.prefix).resolve(), (
        f"the python3 kernel runs the Python in {prefix}, not the one running the tests "
        f"({sys.prefix}); install ipykernel into this environment"
    )
    assert not _errors(probe)


def test_notebook_runs_without_errors(executed: Any) -> None:
    failed = [
        f"cell {c.id}: {'; '.join(_errors(c))}"
        for c in executed.cells
        if c.cell_type == "code" and _errors(c)
    ]
    assert not failed, "\n".join(failed)


def test_ranked_table_and_rejections(executed: Any) -> None:
    ranked = _text(_tagged(executed, "ranked-table"))
    assert "step_time_s" in ranked and "peak_mem_gib" in ranked
    assert any(s in ranked for s in _SCHEDULES)
    rejections = _text(_tagged(executed, "rejections"))
    assert "out of memory" in rejections and "GiB available" in rejections


def test_figures_and_memory_breakdown(executed: Any) -> None:
    for tag in ("gantt-best", "gantt-worse", "memory-bars", "memory-over-time", "pareto"):
        assert _has_png(_tagged(executed, tag)), f"cell {tag!r} shows no PNG figure"
    memory = _text(_tagged(executed, "memory-table"))
    for component in ("activations", "optimizer", "weights", "gradients", "total"):
        assert component in memory
    worse = _text(_tagged(executed, "worse-summary"))
    assert "1f1b" in worse and "bubble" in worse
    assert "MFU" in _text(_tagged(executed, "answer"))


def test_what_the_answer_rests_on(executed: Any) -> None:
    text = _text(_tagged(executed, "sensitivity"))
    for label in ("GEMM and attention rate", "NVLink collective bandwidth", "elasticity"):
        assert label in text
    assert "sum of elasticities" in text
    assert "curves read outside their measured points" in text or "read inside" in text
    assert "ranking under single-term profile errors" in text
    assert "the top 5 plans simulated again" in text


def test_the_whole_run(executed: Any) -> None:
    """The whole-run section trains 1e12 tokens on the best plan and reports days, GPU-hours,
    goodput (with its Monte Carlo check) and energy."""
    text = _text(_tagged(executed, "whole_run"))
    assert "1e+12 tokens:" in text and "GPU-hours" in text
    assert "goodput" in text and "Monte Carlo" in text and "MWh" in text
