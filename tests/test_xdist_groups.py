"""scripts/tests relies on pytest-xdist's ``--dist loadgroup`` to keep the tests that share one
costly fixture (the built wheel, a labgrid coordinator) on one worker. With some pytest and
pytest-xdist pairs the mark is dropped without a word (pytest-xdist issue 1386) and each worker
builds the fixture again; this says so instead of the suite silently taking longer."""

from __future__ import annotations

import re
import subprocess
import sys


def test_tests_marked_with_one_xdist_group_run_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.xdist_group('shared')\n"
        + "".join(f"def test_{i}(): pass\n" for i in range(6)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                           str(tmp_path / "test_grouped.py")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = set(re.findall(r"\[(gw\d+)\].*PASSED", proc.stdout))
    assert len(workers) == 1, (f"one xdist_group ran on {sorted(workers)}: this pytest and pytest-xdist do not "
                               f"group (pytest-xdist issue 1386); pin pytest as pyproject.toml's test extra says\n"
                               + proc.stdout)
