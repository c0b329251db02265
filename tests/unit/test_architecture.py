"""Project rules that keep the core light: no torch outside calibrate/validate, matplotlib only
in report/plots, no SimPy in the analytic core (docs/architecture.md)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


# --------------------------------------------------------------------------- import graph
#: The layers of plansim, lowest first: a module may import from its own layer and the
#: layers below it, never from one above. Pure core low (errors, units, specs, io, the
#: analytic model and the schedules), then the engine, the planner and the reports; the torch
#: code (calibrate, validate: validate runs plans on calibrated profiles) and the command
#: line on top. Each name is a top-level module or package of plansim ("plansim" is the
#: package's own __init__).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("plansim", "errors", "units"),
    ("specs",),
    ("io",),
    ("catalog",),
    ("schedule",),
    ("analytic",),
    ("sim",),
    ("planner",),
    ("report",),
    ("export",),
    ("calibrate",),
    ("validate",),
    ("commands",),
    ("cli", "__main__"),
)


@dataclass(frozen=True)
class _Edge:
    """``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} -> {self.imported}"


def _module_files() -> dict[str, tuple[Path, bool]]:
    """Every module of plansim by dotted name -> (its file, whether it is a package)."""
    root = Path(plansim.__file__).parent
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, function-level ones included, outside ``if TYPE_CHECKING:``
    blocks (their ``else:`` branches count)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _imports(node)


def _targets(node: ast.Import | ast.ImportFrom, *, module: str, is_package: bool) -> list[str]:
    """Dotted names ``node`` imports: a module, or for ``from M import x`` the submodule
    ``M.x`` when there is one, else ``M``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def _import_graph() -> list[_Edge]:
    """Edges between plansim modules (each importer -> imported pair once, first line)."""
    modules = _module_files()
    root = Path(plansim.__file__).parent.parent
    edges: dict[tuple[str, str], _Edge] = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _imports(tree):
            names = _targets(node, module=module, is_package=is_package)
            if isinstance(node, ast.ImportFrom):  # M.x if it is a module, else M
                found = [n for n in names[:-1] if n in modules]
                names = found or names[-1:]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module and (module, name) not in edges:
                    rel = path.relative_to(root).as_posix()
                    edges[(module, name)] = _Edge(module, name, rel, node.lineno)
    return list(edges.values())


def _cycles(edges: list[_Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, []).append(e.imported)
        graph.setdefault(e.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _layer(module: str) -> int:
    """Index in LAYERS of the top-level module or package ``module`` belongs to."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else parts[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: plansim.{top} is in no layer of LAYERS; add it there")


def test_import_graph_is_found() -> None:
    edges = _import_graph()
    pairs = {(e.importer, e.imported) for e in edges}
    assert ("plansim.sim.engine", "plansim.schedule.actions") in pairs
    assert ("plansim.analytic.comm", "plansim.specs.hardware") in pairs
    # a function-level import counts (the runner imports the torch worker when it launches)
    assert ("plansim.validate.runner", "plansim.validate.worker") in pairs


def test_no_import_cycle_between_modules() -> None:
    edges = _import_graph()
    cycles = _cycles(edges)
    lines = []
    for members in cycles:
        inside = set(members)
        lines.append("cycle: " + ", ".join(members))
        lines += [f"  {e}" for e in edges if e.importer in inside and e.imported in inside]
    assert not cycles, "import cycles between plansim modules:\n" + "\n".join(lines)


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [e for e in _import_graph() if _layer(e.imported) > _layer(e.importer)]
    order = " < ".join(", ".join(layer) for layer in LAYERS)
    assert not upward, (
        f"imports from a higher layer (layers, lowest first: {order}):\n"
        + "\n".join(f"  {e}" for e in upward)
    )
