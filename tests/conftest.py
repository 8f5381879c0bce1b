from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import load_bench
from harness.binding import open_driver
from instruments.emulators.bench import EmulatedBench

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ROOT / "benches"


@pytest.fixture
def bench_cfg():
    return load_bench(BENCHES / "emulated.yaml")


@pytest.fixture
def fast_bench_cfg():
    """The default bench at a tenth of real time."""
    return load_bench(BENCHES / "emulated.yaml", time_scale=0.1)


@pytest.fixture
def emulated(bench_cfg):
    with EmulatedBench(bench_cfg) as eb:
        yield eb


@pytest.fixture
def polatis(emulated, bench_cfg):
    driver = open_driver("ocs", bench_cfg.switch, emulated.resources["ocs"])
    yield driver
    driver.close()
