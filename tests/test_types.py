"""The type checker holds over every module of the package (scripts/typecheck: mypy with
pyproject.toml's settings, the package as Python imports it), with no blanket ignore: every
``# type: ignore`` names the error it stands for, and no module is left out of the check."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FOLDERS = PYPROJECT["tool"]["setuptools"]["package-dir"]


def _package_files() -> list[Path]:
    return sorted(p for folder in FOLDERS.values() for p in (ROOT / folder).rglob("*.py"))


def test_the_package_type_checks_clean():
    done = subprocess.run([str(ROOT / "scripts" / "typecheck")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert "No module named mypy" not in done.stdout + done.stderr, \
        "mypy is not installed: scripts/setup installs it (the typecheck extra of pyproject.toml)"
    assert done.returncode == 0, f"scripts/typecheck found errors:\n{done.stdout}{done.stderr}"
    assert re.search(r"Success: no issues found in \d+ source files", done.stdout), done.stdout


def test_no_blanket_ignores():
    bare = [f"{p.relative_to(ROOT)}:{n}" for p in _package_files()
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"#\s*type:\s*ignore(?!\[)", line)]
    assert not bare, f"a `# type: ignore` names the error it stands for ([code]): {bare}"
    settings = [PYPROJECT["tool"]["mypy"], *PYPROJECT["tool"]["mypy"].get("overrides", [])]
    skipped = [s for s in settings if s.get("ignore_errors") or s.get("follow_imports") == "skip"]
    assert not skipped, f"pyproject.toml leaves modules out of the type check: {skipped}"
