"""The README's Python API example runs as printed (documentation that cannot drift)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], str(README), "exec"), {})
    header = out.getvalue().splitlines()[0].split()
    assert header == ["tp", "pp", "dp", "mbs", "zero", "step_time_s", "mfu_pct", "peak_mem_gib"]
    assert len(out.getvalue().splitlines()) == 6  # five ranked plans
