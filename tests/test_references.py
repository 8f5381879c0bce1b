"""References the code and the docs make stay true: a ``module:Name`` in any tracked file names
something that imports, and a path of the project's own files (``harness/fidelity.py``) names a
file that exists. Paths inside other projects (a vendor's script, a published log's repository)
are cited with their repository beside them, and are listed here by name."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "instruments", "fixtures", "reports", "test_suites", "tests", "perf", "scripts", "lumion_hil",
           "docs", "benches")
SOURCES = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh")
_PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(FOLDERS) + r")/[\w/.-]+\.(?:py|yaml|md|sh|json)\b")
_OBJECT = re.compile(r"\blumion_hil(?:\.\w+)+:\w+(?:\.\w+)*")
# Paths that are other projects' files (each cited beside its repository where it appears), or
# a name for the reader's own file.
ELSEWHERE = {
    "benches/my-lab.yaml",  # the README's name for a lab's own bench file
    "instruments/Optical_switches/Dicon.py", "instruments/optical/DiConGP600.py",  # third-party DiCon drivers
    "instruments/optical/KeysightN7745C.py", "instruments/thorlabs/thorlabspm100usb.py",  # third-party drivers
    "tests/README.md", "tests/aws-batch/README.md",  # nccl-tests logs' repositories (SOURCES.md)
    "tests/slurm/topology-aware-nccl-tests/README.md",
}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    here = Path(__file__).resolve()  # its own examples of wrong references below
    return [ROOT / name for name in out.stdout.splitlines()
            if name.endswith(SOURCES) and (ROOT / name).is_file() and (ROOT / name).resolve() != here]


def _references(pattern: re.Pattern) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in _tracked():
        for match in pattern.findall(path.read_text(encoding="utf-8", errors="replace")):
            found.setdefault(match.rstrip("."), set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_project_path_named_in_code_or_docs_exists():
    missing = {name: sorted(where) for name, where in _references(_PATH).items()
               if name not in ELSEWHERE and not (ROOT / name).exists()}
    assert not missing, f"paths named that do not exist (file: where named): {missing}"


def test_every_module_colon_name_imports():
    wrong = {}
    for ref, where in _references(_OBJECT).items():
        module, _, name = ref.partition(":")
        try:
            found = importlib.import_module(module)
            for part in name.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as exc:
            wrong[ref] = f"{type(exc).__name__}: {exc} (named in {', '.join(sorted(where))})"
    assert not wrong, f"module:Name references that do not resolve: {wrong}"


def test_the_checks_see_a_wrong_reference(tmp_path):
    # the patterns find what they are for (a check that finds nothing would pass on anything)
    text = "see ``lumion_hil.harness.nowhere:Gone`` and harness/nowhere.py; not instruments/x.pyc"
    assert _OBJECT.findall(text) == ["lumion_hil.harness.nowhere:Gone"]
    assert _PATH.findall(text) == ["harness/nowhere.py"]
