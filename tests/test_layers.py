"""The layering of shared/design.md, checked from the imports themselves (every import statement,
at module level or inside a function): arrows point down only, the harness never imports the
emulators (it names its backend instead, instruments/backend.py), drivers never import the
emulators, nothing below the fixtures imports pytest or allure, and no module imports itself
back through others."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FOLDERS = PYPROJECT["tool"]["setuptools"]["package-dir"]  # package -> folder in the repository

# What each layer may import (its own modules included). Emulators sit beside the harness, not
# below it: both stand on the instruments' protocols and constants.
LAYERS = {
    "root": {"root", "test_suites", "fixtures", "reports", "harness", "instruments", "emulators", "benches"},
    "test_suites": {"test_suites", "fixtures", "reports", "harness", "instruments", "benches"},
    "fixtures": {"fixtures", "reports", "harness", "instruments", "benches"},
    "reports": {"reports", "harness", "instruments"},
    "harness": {"harness", "instruments", "benches"},
    "emulators": {"emulators", "instruments"},
    "instruments": {"instruments"},
    "benches": set(),
}
NO_TEST_FRAMEWORK = {"harness", "instruments", "emulators", "reports"}  # reports: allure only


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[:3] == ["lumion_hil", "instruments", "emulators"]:
        return "emulators"
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "root"


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def test_every_package_folder_is_found():
    assert {"lumion_hil.harness.config", "lumion_hil.instruments.emulators.world", "lumion_hil.fixtures.plugin",
            "lumion_hil.reports.summary", "lumion_hil.cli"} <= set(MODULES)


def test_arrows_point_down_only():
    wrong = []
    for module, imports in sorted(GRAPH.items()):
        layer = _layer(module)
        for target in sorted(i for i in imports if i in MODULES):
            if _layer(target) not in LAYERS[layer]:
                wrong.append(f"{module} ({layer}) imports {target} ({_layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_no_old_top_level_names_and_no_test_framework_below_the_fixtures():
    wrong = []
    for module, imports in sorted(GRAPH.items()):
        for target in sorted(imports):
            top = target.split(".")[0]
            if top in ("harness", "instruments", "fixtures", "reports", "test_suites"):
                wrong.append(f"{module} imports {target}: the project's modules live under lumion_hil")
            if _layer(module) in NO_TEST_FRAMEWORK and (top == "pytest" or (top == "allure" and _layer(module) != "reports")):
                wrong.append(f"{module} ({_layer(module)}) imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_circles():
    edges = {m: {t for t in imports if t in MODULES and t != m} for m, imports in GRAPH.items()}
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert not circles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_checker_sees_a_wrong_arrow(tmp_path):
    """The rules can fail: an emulator importing the harness is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from lumion_hil.harness.config import Bench\n")
    imports = {i for i in _imports(bad) if i in MODULES}
    assert {_layer(i) for i in imports} - LAYERS["emulators"] == {"harness"}


def test_controllers_with_bugs_use_the_extension_points_only():
    """A controller in the tests or in harness/testing.py changes the reference controller only
    through its public surface: no method of a subclass overrides a private one."""
    private = {node.name for node in ast.walk(ast.parse(MODULES["lumion_hil.harness.controller"].read_text()))
               if isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.startswith("__")}
    assert private, "the reference controller has private methods to guard"
    wrong = []
    for path in [MODULES["lumion_hil.harness.testing"], *sorted((ROOT / "tests").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", "")) == "ReferenceController"
                                                      for b in node.bases):
                wrong += [f"{path.name}: {node.name}.{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name in private]
    assert not wrong, "private methods overridden: " + ", ".join(wrong)
