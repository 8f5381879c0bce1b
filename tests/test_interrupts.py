"""Stopping a run as a lab does (Ctrl-C, CI's SIGTERM): `lumion-hil run` is started as a real
child process against a served bench and signalled in the middle of a recovery. The switch must
read back its baseline, no process of the run may survive, the record must end with an
`interrupted` line, and the exit status must be the documented one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lumion_hil.harness.config import load_bench
from lumion_hil.harness.exit_codes import ExitCode
from lumion_hil.harness.interrupts import Interrupts, RunInterrupted

from conftest import query_scpi as _query


def _processes_of(run_id: str) -> list[int]:
    """Every live process that carries this run's marker in its environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"LUMION_HIL_RUN={run_id}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _interrupt_mid_recovery(tmp_path, served, signals: list[int]):
    bench_out, switch, baseline = served
    run_id = f"test-{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path), "LUMION_HIL_RUN": run_id}
    results = tmp_path / "results"
    run = subprocess.Popen([sys.executable, "-m", "lumion_hil", "run", "--bench", str(bench_out), "--results", str(results),
                            "--no-report", "-k", "recovery_time and gpu_failure", "-q", "-p", "no:randomly"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        for wanted in (True, False):  # the run restores the baseline, then its recovery rewires the switch
            while (_query(switch, b":OXC:SWIT:CONN:STAT?") == baseline) != wanted:
                assert run.poll() is None, f"the run ended early: {run.stdout.read().decode()[-3000:]}"
                assert time.monotonic() < deadline, "the recovery never started"
                time.sleep(0.002)
        for k, signum in enumerate(signals):
            if k:
                time.sleep(0.05)
            run.send_signal(signum)  # what a terminal's Ctrl-C or CI's cancel reaches: the wrapper
        output = run.communicate(timeout=120)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
    records = list((results / "records").glob("run-*.jsonl"))
    assert len(records) == 1, output
    lines = [json.loads(line) for line in records[0].read_text().splitlines()]
    return run.returncode, output, lines, _query(switch, b":OXC:SWIT:CONN:STAT?"), baseline, _processes_of(run_id)


@pytest.mark.parametrize("signals", [[signal.SIGINT], [signal.SIGTERM], [signal.SIGINT, signal.SIGINT]],
                         ids=["ctrl-c", "sigterm", "two-ctrl-c"])
def test_a_signal_mid_recovery_restores_the_baseline_and_ends_the_record(tmp_path, served, signals):
    status, output, lines, switch_now, baseline, survivors = _interrupt_mid_recovery(tmp_path, served, signals)
    assert status == ExitCode.INTERRUPTED == 2, output[-3000:]
    assert switch_now == baseline, f"the switch was left at {switch_now}\n{output[-3000:]}"
    assert survivors == [], f"processes of the run still alive: {survivors}"
    assert lines[-1]["type"] == "end" and lines[-1]["outcome"] == "interrupted", lines[-1]
    assert lines[-1]["signal"] == signal.Signals(signals[0]).name
    tests = [line for line in lines if line["type"] == "test"]
    assert [t["outcome"] for t in tests] == ["interrupted"], tests
    assert "interrupted; the bench was restored to its baseline" in output


def test_interrupts_wait_for_a_critical_section_and_the_second_signal_only_hurries():
    interrupts = Interrupts()
    with pytest.raises(RunInterrupted, match="SIGINT"):
        with interrupts.armed():
            with interrupts.critical():
                interrupts._on_signal(signal.SIGINT, None)  # arrives mid-command: held back
                finished_command = True
            raise AssertionError("not reached: raised as the critical section ends")
    assert finished_command
    interrupts._on_signal(signal.SIGINT, None)
    assert interrupts.hurry.is_set() and interrupts.wait_s(10.0) == 0.5
    outside = Interrupts()
    outside._on_signal(signal.SIGTERM, None)  # between tests: noted, not raised
    assert outside.requested == "SIGTERM"
    with outside.shield():
        pass
    with pytest.raises(RunInterrupted, match="SIGTERM"):
        with outside.armed():  # the next test does not start
            pass
