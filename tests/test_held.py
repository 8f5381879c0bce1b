"""scripts/held runs a command on every core this process may use but the first, so that what
runs beside it (the alone tests, in scripts/tests) always has a core the command cannot take."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

HELD = str(ROOT / "scripts" / "held")
CORES = [sys.executable, "-c", "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"]


def _cores(first: set[int] | None = None) -> list[int]:
    """The cores a command run through scripts/held may use (from a process held to ``first``)."""
    done = subprocess.run([HELD, *CORES], capture_output=True, text=True, timeout=30,
                          preexec_fn=(lambda: os.sched_setaffinity(0, first)) if first else None)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_command_gets_every_usable_core_but_the_first():
    usable = sorted(os.sched_getaffinity(0))
    assert _cores() == (usable[1:] if len(usable) > 1 else usable)


def test_on_one_core_the_command_runs_as_it_is():
    one = min(os.sched_getaffinity(0))
    assert _cores({one}) == [one]


def test_without_a_command_it_says_how_to_call_it():
    done = subprocess.run([HELD], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage: scripts/held COMMAND" in done.stderr
