"""Project rules that keep the core light: no torch outside calibrate/validate, matplotlib only
in report/plots, no SimPy in the analytic core (ARCHITECTURE.md)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import plansim

CORE_PREFIXES = ("plansim.specs", "plansim.analytic", "plansim.schedule")


def _modules() -> list[str]:
    names = [
        m.name
        for m in pkgutil.walk_packages(plansim.__path__, prefix="plansim.")
        if not m.name.startswith(("plansim.calibrate", "plansim.validate"))
    ]
    return sorted(set(names) - {"plansim.__main__"})


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_torch_is_not_imported_outside_calibrate_and_validate() -> None:
    modules = _modules()
    assert "plansim.sim.engine" in modules and "plansim.cli" in modules
    loaded = _loaded_after_import(modules)
    assert "torch" not in loaded


def test_analytic_core_is_free_of_simpy_and_matplotlib() -> None:
    core = [m for m in _modules() if m.startswith(CORE_PREFIXES)]
    assert "plansim.analytic.cost" in core
    loaded = _loaded_after_import(core)
    assert "simpy" not in loaded
    assert "matplotlib" not in loaded
    assert "pandas" not in loaded
