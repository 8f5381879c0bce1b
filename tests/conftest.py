from __future__ import annotations

from pathlib import Path

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from lumion_hil.harness.config import load_bench
from lumion_hil.harness.binding import open_driver
from lumion_hil.instruments.emulators.bench import EmulatedBench

pytest_plugins = ["pytester"]

# labgrid's own pytest plug-in (installed with the labgrid extra) costs about a second of CPU to
# import and is no suite's business (lumion-hil holds places itself): every pytest these tests
# start leaves it out, as `lumion-hil run` does.
if "no:labgrid" not in os.environ.get("PYTEST_ADDOPTS", ""):
    os.environ["PYTEST_ADDOPTS"] = (os.environ.get("PYTEST_ADDOPTS", "") + " -p no:labgrid").strip()

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ROOT / "benches"

# Parts of the machine some tests need: the namespaced bench (root, iproute2, openssh), labgrid,
# the third-party instrument clients, and a browser with the Allure CLI. Where one is missing its
# tests are skipped with the reason, unless the run requires it (LUMION_HIL_REQUIRE, a comma list
# of these or "all"; CI requires them all): then they fail with the reason, so that a part CI is
# meant to test never passes by being left out.
PARTS = {"netns": "the namespaced bench", "places": "labgrid places", "real-clients": "third-party clients",
         "browser": "the HTML report in a browser"}
_REQUIRED = {p.strip() for p in os.environ.get("LUMION_HIL_REQUIRE", "").split(",") if p.strip()}
unknown = _REQUIRED - set(PARTS) - {"all"}
if unknown:
    raise pytest.UsageError(f"LUMION_HIL_REQUIRE: unknown part(s) {sorted(unknown)}; known: {', '.join(PARTS)}, all")


def fastest_of(run, good, tries: int = 3) -> list[float]:
    """``run()`` up to ``tries`` times, stopping at the first figure ``good`` accepts; every figure
    taken, in order. For a figure that a loaded machine can only make worse (a rate through a
    shaper: only lower; a wait for an event: only later): the best of a few is judged, not one,
    so one run slowed by a busy core does not decide, while a defect that makes every run bad
    still does."""
    figures: list[float] = []
    while len(figures) < tries and not (figures and good(figures[-1])):
        figures.append(run())
    return figures


def needs(part: str, available: bool, why: str) -> list:
    """Marks for a test, or a module's ``pytestmark``, that needs a part of the machine (PARTS):
    none where it is there; a skip with ``why`` where it is not; a failure with ``why`` where it
    is not and the run requires it."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; known: {', '.join(PARTS)}")
    if available:
        return []
    if part in _REQUIRED or "all" in _REQUIRED:
        return [pytest.mark.missing_part(part=part, why=why)]
    return [pytest.mark.skip(reason=why)]


def missing(part: str, why: str):
    """Inside a test or fixture that finds a part of the machine missing: skip with ``why``, or
    fail with it where the run requires the part."""
    needed = needs(part, False, why)[0]
    if needed.name == "missing_part":
        pytest.fail(f"this run requires {PARTS[part]} (LUMION_HIL_REQUIRE={part}), and it is missing here: {why}",
                    pytrace=False)
    pytest.skip(why)


def pytest_runtest_setup(item) -> None:
    for mark in item.iter_markers("missing_part"):
        part = mark.kwargs["part"]
        pytest.fail(f"this run requires {PARTS[part]} (LUMION_HIL_REQUIRE={part}), and it is missing here: "
                    f"{mark.kwargs['why']}", pytrace=False)


@functools.cache
def _default_bench(time_scale: float | None):
    return load_bench(BENCHES / "emulated.yaml", time_scale=time_scale)


@pytest.fixture
def bench_cfg():
    """The default bench, parsed once a session (a parse costs about 30 ms of CPU, and some fifty
    tests start from it); each test gets a deep copy of its own."""
    return _default_bench(None).model_copy(deep=True)


@pytest.fixture
def fast_bench_cfg():
    """The default bench at a tenth of real time."""
    return _default_bench(0.1).model_copy(deep=True)


@pytest.fixture
def emulated(bench_cfg):
    with EmulatedBench(bench_cfg) as eb:
        yield eb


@pytest.fixture
def polatis(emulated, bench_cfg):
    driver = open_driver("ocs", bench_cfg.switch, emulated.resources["ocs"])
    yield driver
    driver.close()


def query_scpi(resource: str, command: bytes) -> str:
    port = int(resource.split("::")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(command + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            data += sock.recv(4096)
    return data.decode().strip()


@contextlib.contextmanager
def serve_bench(bench_path, tmp_path, time_scale: float = 0.2, *extra: str):
    """Serve a bench with `lumion-hil emulate` (``extra``: more of its options); yields (served
    bench file, switch resource, the switch's baseline as it answers :OXC:SWIT:CONN:STAT?)."""
    bench_out = tmp_path / f"served-{Path(bench_path).stem}.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "lumion_hil", "emulate", "--bench", str(bench_path), "--time-scale",
                             str(time_scale), "--bench-out", str(bench_out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        switch = next(line for line in proc.stdout if line.startswith("ocs\t")).split("\t")[2].strip()
        deadline = time.monotonic() + 30
        while not bench_out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pairs = sorted(load_bench(bench_out).safety.baseline)
        baseline = f"(@{','.join(str(i) for i, _ in pairs)}),(@{','.join(str(e) for _, e in pairs)})"
        yield bench_out, switch, baseline
    finally:
        stop_served(proc)


def stop_served(proc: subprocess.Popen, within_s: float = 10) -> None:
    """Ctrl-C a served bench and wait for it; killed if it has not stopped within ``within_s``
    (a test's failure never leaves an emulator running)."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def emulated_twin(bench_path, tmp_path) -> Path:
    """A real bench's file with every instrument and host emulated and the emulated job in place
    of its command: the same topology, ports, detectors, limits and safety rules."""
    data = yaml.safe_load(Path(bench_path).read_text())
    for spec in data["instruments"].values():
        spec["resource"] = "emulated"
    for host in data["topology"]["hosts"]:
        host["address"] = "emulated"
    if data.get("job"):
        data["job"].pop("command", None)
    out = tmp_path / f"{Path(bench_path).stem}-twin.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@pytest.fixture
def served(tmp_path):
    """The default bench served by `lumion-hil emulate` at a fifth of real time."""
    with serve_bench(BENCHES / "emulated.yaml", tmp_path) as served_bench:
        yield served_bench
