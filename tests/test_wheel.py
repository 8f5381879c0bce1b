"""The package as a lab installs it: the built wheel in a fresh virtual environment beside
InstrumentKit (which installs as ``instruments``) and PyMeasure, used from outside the checkout.
It needs the package index (pip installs the wheel's dependencies); CI has it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# On one pytest-xdist worker (scripts/tests: --dist loadgroup): the wheel and its venv are built once.
pytestmark = pytest.mark.xdist_group("wheel")

ROOT = Path(__file__).resolve().parent.parent


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")  # once per worker, even where xdist runs other modules' tests between these
def installed(tmp_path_factory):
    """(venv's bin folder, a working folder outside the checkout). The wheel is built from a copy
    of the checkout: setuptools builds in the source's own build/ folder, which another build
    (a second worker, a developer's) would share."""
    base = tmp_path_factory.mktemp("wheel")
    wheels = base / "dist"
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "node_modules", "results", "build",
                                                                 "__pycache__", "*.egg-info", ".hypothesis"))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)], timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(wheels.glob("lumion_hil-*.whl"))
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    # --no-compile: pip byte-compiles every module it installs (pandas, numpy, matplotlib: about 15 s
    # of processor); Python compiles what the tests import, as it imports it.
    pip = _run([python, "-m", "pip", "install", "-q", "--no-compile", str(wheel), "pymeasure"], timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # InstrumentKit's only release on the index (0.6.0) pins what Python 3.11 cannot take: enum34
    # (it would shadow the standard library's enum) and ruamel.yaml 0.15 (does not build). Labs
    # install it as below; what matters here is its `instruments` package beside ours.
    kit = _run([python, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "instrumentkit"], timeout=300)
    assert kit.returncode == 0, kit.stdout + kit.stderr
    deps = _run([python, "-m", "pip", "install", "-q", "--no-compile", "quantities", "future", "python-vxi11",
                 "python-usbtmc", "pyusb", "ruamel.yaml"], timeout=600)
    assert deps.returncode == 0, deps.stdout + deps.stderr
    outside = base / "lab"
    outside.mkdir()
    return venv / "bin", outside


def test_the_wheel_holds_one_package_of_the_projects_name(installed):
    bin_dir, outside = installed
    probe = ("import instruments, pymeasure, lumion_hil, lumion_hil.instruments.polatis, lumion_hil.benches, os;"
             "print(os.path.dirname(instruments.__file__)); print(lumion_hil.instruments.__file__);"
             "print(lumion_hil.benches.bench_file()); import instruments.thorlabs")
    proc = _run([str(bin_dir / "python"), "-c", probe], cwd=outside, timeout=120)
    assert proc.returncode == 0, proc.stderr
    theirs, ours, bench = proc.stdout.split()
    site = Path(theirs).parent
    assert Path(theirs) == site / "instruments", "InstrumentKit's instruments is importable as it is"
    assert Path(ours).is_relative_to(site / "lumion_hil") and not str(ROOT) in ours
    assert Path(bench).is_file() and Path(bench).is_relative_to(site / "lumion_hil" / "benches")
    # nothing of ours at the top level but lumion_hil
    ours_top = {p.name for p in site.iterdir()} & {"harness", "fixtures", "reports", "test_suites", "benches"}
    assert not ours_top, f"top-level folders that would shadow a lab's packages: {ours_top}"


def test_emulate_serves_the_default_bench_from_outside_the_checkout(installed):
    bin_dir, outside = installed
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.Popen([str(bin_dir / "lumion-hil"), "emulate", "--time-scale", "0.1"], cwd=outside, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        until = time.monotonic() + 60
        while time.monotonic() < until:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("hosts\t"):
                break
        resources = dict(line.split("\t")[0::2] for line in lines if line.count("\t") == 2)
        assert "ocs" in resources, "".join(lines) + proc.stderr.read() if proc.poll() is not None else "".join(lines)
        idn = _run([str(bin_dir / "python"), "-c",
                    "import pyvisa, sys; r = pyvisa.ResourceManager('@py').open_resource(sys.argv[1], "
                    "read_termination='\\n', write_termination='\\n', timeout=5000); print(r.query('*IDN?'))",
                    resources["ocs"].strip()], cwd=outside, timeout=60)
        assert idn.returncode == 0 and "polatis" in idn.stdout.lower(), idn.stdout + idn.stderr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_run_circuit_suites_from_outside_the_checkout(installed):
    bin_dir, outside = installed
    env = dict(os.environ, PYTHONPATH="")
    env.pop("LUMION_HIL_BENCH", None)
    proc = _run([str(bin_dir / "lumion-hil"), "run", "-k", "circuit", "--no-report",
                 "--results", str(outside / "results"), "-q"], cwd=outside, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout.split("passed")[-1]
    records = list((outside / "results" / "records").glob("run-*.jsonl"))
    assert records, "the run record is written where the lab ran it"
