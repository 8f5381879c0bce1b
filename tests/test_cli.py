"""The lumion-hil command: help, typos, emulate, run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import stop_served

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumion_hil", *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("args", [[], ["run"], ["emulate"], ["bench"], ["bench", "check"], ["report"]])
def test_help_everywhere(args):
    proc = _cli(*args, "--help")
    assert proc.returncode == 0 and "Usage:" in proc.stdout and len(proc.stdout) > 200


def test_typo_in_a_command_is_named_with_a_suggestion():
    proc = _cli("emulte")
    assert proc.returncode == 4 and "No such command 'emulte'" in proc.stderr and "emulate" in proc.stderr


def test_typo_in_an_option_is_named_with_a_suggestion():
    proc = _cli("emulate", "--bnch", "x.yaml")
    assert proc.returncode == 4 and "--bnch" in proc.stderr and "--bench" in proc.stderr


def test_run_refuses_a_broken_bench_before_starting_anything():
    proc = _cli("run", "--bench", str(ROOT / "tests" / "bad_benches" / "02-negative-timeout.yaml"), "--no-report")
    assert proc.returncode == 4 and "instruments.ocs.timeout_s" in proc.stderr


def test_emulate_serves_resources_a_separate_visa_session_can_query(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "lumion_hil", "emulate", "--time-scale", "0.1"],
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
        stop_served(proc)
    assert proc.returncode == 0


def test_emulate_prints_the_n77xx_over_vxi11_too():
    proc = subprocess.Popen([sys.executable, "-m", "lumion_hil", "emulate", "--time-scale", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("hosts\t"):
                break
        vxi11 = {n: r for kind, n, r in (line.split("\t") for line in lines if line.startswith("vxi11\t"))}
        assert list(vxi11) == ["pm-lab"] and vxi11["pm-lab"].endswith("::inst0::INSTR"), lines
        client = (f"import pyvisa; m = pyvisa.ResourceManager('@py').open_resource({vxi11['pm-lab']!r}, "
                  "read_termination='\\n', write_termination='\\n', timeout=5000); print(m.query('*IDN?'))")
        out = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("Keysight Technologies,N77"), out.stderr
    finally:
        stop_served(proc)


def test_run_writes_results_record_and_passes_pytest_args(tmp_path):
    proc = _cli("run", "--results", str(tmp_path), "--no-report", "--time-scale", "0.1", "-k", "matches_bench", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert "run record" in proc.stdout
    assert list((tmp_path / "allure-results").glob("*-result.json"))
    assert (tmp_path / "allure-results" / "environment.properties").read_text().startswith("bench=emulated-prototype")


def test_a_run_leaves_nothing_in_the_temp_dir(tmp_path, served):
    """What a run writes beside its results (the agents' job logs, the nccl-tests programs, the
    migration baseline's job log) lives in folders of the run's own, removed when it ends: on the
    default bench and on a served one, nothing is left in the temp dir (TMPDIR, as the run saw it)."""
    bench_out, _, _ = served
    for bench, scaled in ((ROOT / "benches" / "emulated.yaml", ["--time-scale", "0.2"]), (bench_out, [])):
        tmp = tmp_path / f"tmp-{bench.stem}"
        tmp.mkdir()
        proc = _cli("run", "--bench", str(bench), "--results", str(tmp_path / "results"), "--no-report", "-q",
                    *scaled, "-k", "recovery_time and gpu_failure or migration or busbw_by_size",
                    env={**os.environ, "TMPDIR": str(tmp), "LUMION_HIL_LOCK_DIR": str(tmp_path)})
        # its verdicts (timing, beside another test worker) are not this test's to judge: that it ran is
        assert proc.returncode in (0, 1) and (" passed" in proc.stdout or " failed" in proc.stdout), \
            proc.stdout + proc.stderr
        assert sorted(p.name for p in tmp.iterdir()) == [], f"{bench.name}: left in the temp dir"


def test_run_with_no_matching_suite_fails(tmp_path):
    proc = _cli("run", "--results", str(tmp_path), "--no-report", "-k", "no_such_suite_anywhere", "-q")
    assert proc.returncode == 5
    assert "no test was collected" in proc.stderr


def test_a_mistyped_option_changes_nothing_and_says_so(tmp_path):
    kept = tmp_path / "allure-results" / "kept-result.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    proc = _cli("run", "--results", str(tmp_path), "--no-report", "--benhc", "x.yaml")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "unrecognized arguments: --benhc" in proc.stderr
    assert kept.exists(), "a run that did not start wiped the last results"
    assert "run record" not in proc.stdout and not (tmp_path / "records").exists()
    assert "run the suites first" not in proc.stderr


def _readme_exit_codes() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| exit status |"):].split("\n\n")[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {int(code): meaning.strip() for code, meaning in rows}


def test_the_readme_exit_code_table_is_the_one_the_harness_uses():
    from lumion_hil.harness.exit_codes import MEANING

    assert _readme_exit_codes() == {int(code): meaning for code, meaning in MEANING.items()}


def test_each_exit_status_is_what_the_readme_says(tmp_path, served, monkeypatch):
    """0, 1, 4, 5 and 6 measured here; 2 (interrupted) in test_interrupts.py. 3 is a crash of
    the harness itself, which no input should cause."""
    table = _readme_exit_codes()
    bench_out, _, _ = served
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}

    def run(*args, bench=bench_out):
        return _cli("run", "--bench", str(bench), "--results", str(tmp_path / "r"), "--no-report", "-q", *args, env=env)

    assert table[run("-k", "matches_bench").returncode] == "passed"
    import yaml

    data = yaml.safe_load(bench_out.read_text())
    data["limits"]["link_margin_db"]["value"] = 40.0  # no real link has that much margin
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump(data))
    assert table[run("-k", "carries_light", bench=strict).returncode] == "failed"
    assert table[run("--no-such-option").returncode] == "bench or usage error"
    assert table[run(bench=ROOT / "tests" / "bad_benches" / "02-negative-timeout.yaml").returncode] == "bench or usage error"
    assert table[run("-k", "no_such_suite_anywhere").returncode] == "nothing collected"
    from lumion_hil.harness.config import load_bench
    from lumion_hil.harness.lock import BenchLock

    monkeypatch.setenv("LUMION_HIL_LOCK_DIR", str(tmp_path))
    with BenchLock.for_bench(load_bench(bench_out)):
        busy = run("-k", "matches_bench")
    assert table[busy.returncode] == "bench busy", busy.stdout + busy.stderr
    assert "is in use by" in busy.stdout + busy.stderr
