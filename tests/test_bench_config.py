"""Bench files: valid ones load, every broken one is refused with its field, line and reason."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lumion_hil.harness.config import Bench, bench_json_schema, load_bench, parse_bench
from lumion_hil.harness.errors import BenchFileError

HERE = Path(__file__).resolve().parent
BAD = sorted((HERE / "bad_benches").glob("*.yaml"))
GOOD = sorted((HERE.parent / "benches").glob("*.yaml"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumion_hil", *args], capture_output=True, text=True, timeout=60)


def test_there_are_at_least_ten_distinct_broken_benches():
    assert len(BAD) >= 10
    assert len({p.read_text() for p in BAD}) == len(BAD)


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_shipped_benches_are_valid(path):
    proc = _cli("bench", "check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "ok: bench" in proc.stdout


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_broken_bench_is_refused_with_field_and_reason(path):
    field, reason = (s.strip() for s in path.read_text().splitlines()[0].removeprefix("# expect:").split("|"))
    proc = _cli("bench", "check", str(path))
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if field in line and reason in line]
    assert lines, f"expected a line naming {field!r} and {reason!r}; got:\n{proc.stderr}"
    assert str(path) in lines[0], "the error names the file"


def test_error_names_the_line():
    path = HERE / "bad_benches" / "02-negative-timeout.yaml"
    with pytest.raises(BenchFileError) as err:
        load_bench(path)
    (problem,) = err.value.problems
    line_text = path.read_text().splitlines()[problem.line - 1]
    assert "timeout_s: -1" in line_text


def test_every_problem_is_reported_not_just_the_first():
    text = (HERE.parent / "benches" / "emulated.yaml").read_text()
    text = text.replace("    timeout_s: 5\n", "    timeout_s: 0\n").replace("  opc_s: 10 ", "  opc_s: -3 ")
    with pytest.raises(BenchFileError) as err:
        parse_bench(text, "two-problems.yaml")
    paths = {p.path for p in err.value.problems}
    assert {"instruments.ocs.timeout_s", "deadlines.opc_s"} <= paths


def test_missing_file_is_a_clear_error():
    proc = _cli("bench", "check", "no/such/bench.yaml")
    assert proc.returncode == 1
    assert "no/such/bench.yaml" in proc.stderr and "file not found" in proc.stderr


def test_schema_is_exported_from_the_models():
    schema = json.loads(bench_json_schema())
    assert set(Bench.model_fields) <= set(schema["properties"])
    proc = _cli("bench", "schema")
    assert proc.returncode == 0 and json.loads(proc.stdout) == schema


def test_time_scale_override(bench_cfg):
    fast = load_bench(HERE.parent / "benches" / "emulated.yaml", time_scale=0.1)
    assert fast.emulator.time_scale == 0.1
    assert bench_cfg.emulator.time_scale == 1.0


def test_every_number_in_the_shipped_benches_says_where_it_came_from():
    """Latencies, powers and losses carry a comment: a source, or 'assumption'."""
    keys = re.compile(r"^\s*(switching_time_s|insertion_loss_db|monitor_floor_dbm|monitor_noise_db|"
                      r"command_latency_s|connector_loss_db):")
    for path in GOOD:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if keys.match(line):
                assert "#" in line, f"{path.name}:{n}: {line.strip()} has no source comment"
