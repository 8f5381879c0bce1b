"""The lumion-hil command: help, typos, emulate, run."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("args", [[], ["run"], ["emulate"], ["bench"], ["bench", "check"], ["report"]])
def test_help_everywhere(args):
    proc = _cli(*args, "--help")
    assert proc.returncode == 0 and "Usage:" in proc.stdout and len(proc.stdout) > 200


def test_typo_in_a_command_is_named_with_a_suggestion():
    proc = _cli("emulte")
    assert proc.returncode == 2 and "No such command 'emulte'" in proc.stderr and "emulate" in proc.stderr


def test_typo_in_an_option_is_named_with_a_suggestion():
    proc = _cli("emulate", "--bnch", "x.yaml")
    assert proc.returncode == 2 and "--bnch" in proc.stderr and "--bench" in proc.stderr


def test_run_refuses_a_broken_bench_before_starting_anything():
    proc = _cli("run", "--bench", str(ROOT / "tests" / "bad_benches" / "02-negative-timeout.yaml"), "--no-report")
    assert proc.returncode == 2 and "instruments.ocs.timeout_s" in proc.stderr


def test_emulate_serves_resources_a_separate_visa_session_can_query(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "harness", "emulate", "--time-scale", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "emulating bench 'emulated-prototype'" in line
        name, model, resource = proc.stdout.readline().rstrip("\n").split("\t")
        assert (name, model) == ("ocs", "polatis") and resource.startswith("TCPIP0::127.0.0.1::")
        client = textwrap.dedent(f"""
            import pyvisa
            rm = pyvisa.ResourceManager("@py")
            ocs = rm.open_resource("{resource}", read_termination="\\n", write_termination="\\n", timeout=5000)
            print(ocs.query("*IDN?"))
            print(ocs.query(":oxc:swit:conn:add (@1),(@20);*OPC?"))
            print(ocs.query(":oxc:swit:conn:stat?"))
            print(ocs.query(":SYST:ERR:ALL?"))
        """)
        out = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        idn, opc, state, errors = out.stdout.split("\n")[:4]
        assert idn.startswith("Polatis,") and opc == "1" and state == "(@1),(@20)" and errors == '0,"No error"'
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_run_writes_results_record_and_passes_pytest_args(tmp_path):
    proc = _cli("run", "--results", str(tmp_path), "--no-report", "--time-scale", "0.1", "-k", "matches_bench", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert "run record" in proc.stdout
    assert list((tmp_path / "allure-results").glob("*-result.json"))
    assert (tmp_path / "allure-results" / "environment.properties").read_text().startswith("bench=emulated-prototype")


def test_run_with_no_matching_suite_fails(tmp_path):
    proc = _cli("run", "--results", str(tmp_path), "--no-report", "-k", "no_such_suite_anywhere", "-q")
    assert proc.returncode == 5
    assert "no suite was collected" in proc.stderr
