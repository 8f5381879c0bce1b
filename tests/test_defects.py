"""Every verdict can fail. For each named defect of the emulated bench (or of the controller),
run the suite it should break on a bench with that defect, and check that exactly the expected
verdicts turn red while every other one taken in that run still passes. The README's table of
defects is this one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lumion_hil.harness.defects import CATALOGUE

from conftest import BENCHES, ROOT

SUITES = ROOT / "test_suites"


def three_port_bench(tmp_path) -> Path:
    """The default bench with a third, unused optical port on every host: room for a controller
    to wire a spare around the failed GPU instead of in its place."""
    data = yaml.safe_load((BENCHES / "emulated.yaml").read_text())
    for k, host in enumerate(data["topology"]["hosts"]):
        host["nics"].append({"name": "p2", "rate_gbps": 10, "launch_dbm": -1.0, "tx_port": 9 + k, "rx_port": 25 + k,
                             "tx_fibre_loss_db": 0.3, "rx_fibre_loss_db": 0.3})
    out = tmp_path / "three-port.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def protected_spare_bench(tmp_path) -> Path:
    """The default bench with the spare's first transmitter behind a protected port."""
    text = (BENCHES / "emulated.yaml").read_text().replace("protected_ports: [16, 32]", "protected_ports: [7, 16, 32]")
    out = tmp_path / "protected-spare.yaml"
    out.write_text(text)
    return out


def exploration_bench(tmp_path) -> Path:
    return BENCHES / "exploration.yaml"


# defect, suites (files, -k), time scale, bench, verdicts that must turn red. A verdict is a
# measurement's name, or "test:NAME" for a test whose own assertion is the verdict.
PROOFS = [
    ("slow_switch=10", ["test_circuit_setup.py", "test_light.py"], None, 0.2, None,
     {"switch_completion_time", "light_arrival_time"}),
    ("lossy_connector=8@20", ["test_circuit_setup.py"], "carries_light", 0.2, None, {"received_power", "link_margin"}),
    ("crosstalk=-10", ["test_circuit_setup.py"], "make_and_break", 0.2, None, {"power_after_disconnect"}),
    ("wrong_switch_size=8", ["test_circuit_setup.py"], "matches_bench", 0.2, None, {"test:test_switch_matches_bench"}),
    ("slow_nic_lock=0.5", ["test_link_bringup.py"], None, 0.2, None, {"light_to_carrier_time"}),
    ("slow_nic_lock=3", ["test_link_bringup.py"], None, 0.2, None, {"carrier_up_time", "light_to_carrier_time"}),
    ("flapping_nic=3", ["test_link_bringup.py"], None, 0.2, None, {"carrier_drops_after_up"}),
    ("slow_agent=0.02", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"recovery_measurement_error"}),
    ("slow_controller=2500", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.1, None,
     {"recovery_to_restart", "recovery_to_first_step", "controller_overhead_total"}),
    ("slow_controller=1500", ["test_recovery_time.py"], "migration", 0.1, None, {"migration_over_optical_recovery"}),
    ("slow_controller=600", ["test_collective_bandwidth.py"], None, 0.1, None, {"nccl_resync"}),
    ("early_first_step=200", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_report_error"}),
    ("spare_in_use", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"test:test_recovery_time[gpu_failure]"}),
    ("spare_in_use", ["test_failure_sequences.py"], None, 0.2, None, {"sequences_explored"}),
    ("slow_controller=4000", ["test_failure_sequences.py"], None, 0.02, exploration_bench,
     {"sequence_recovery_time", "sequences_explored"}),
    ("leaves_failed_circuits", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, three_port_bench,
     {"failed_host_circuits_removed"}),
    ("unguarded_protected_port", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2,
     protected_spare_bench, {"protected_ports_untouched"}),
    ("never_degraded", ["test_recovery_time.py"], "degraded", 0.2, None, {"degraded_reported_without_spare"}),
    ("lead_only_restart", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.1, None,
     {"test:test_recovery_time[gpu_failure]"}),
    ("lead_only_restart", ["test_collective_bandwidth.py"], None, 0.1, None,
     {"test:test_busbw_by_size", "test:test_busbw_after_recovery_matches_before",
      "test:test_busbw_ratio_optical_over_electrical", "test:test_no_wrong_results",
      "test:test_time_until_a_collective_completes_again"}),
    ("lead_only_restart", ["test_failure_sequences.py"], None, 0.2, None, {"sequences_explored"}),
    ("slow_link=0.5", ["test_collective_bandwidth.py", "test_training_throughput.py"], None, 0.1, None,
     {"allreduce_busbw_optical_over_electrical", "throughput_optical_over_electrical"}),
    ("slow_link=0.5@host3", ["test_collective_bandwidth.py", "test_training_throughput.py"], None, 0.1, None,
     {"busbw_after_over_before", "throughput_after_over_before", "allreduce_busbw_optical_over_electrical",
      "throughput_optical_over_electrical"}),
    ("silent_data_corruption=host1", ["test_collective_bandwidth.py"], "wrong", 0.1, None,
     {"nccl_wrong_elements_before", "nccl_wrong_elements_after", "nccl_wrong_elements_electrical"}),
]


def run_with_defect(tmp_path, defect, suites, k, scale, bench_factory):
    bench = bench_factory(tmp_path) if bench_factory else BENCHES / "emulated.yaml"
    record = tmp_path / "record.jsonl"
    cmd = [sys.executable, "-m", "pytest", *(str(SUITES / s) for s in suites), "-p", "no:cacheprovider", "--rootdir",
           str(SUITES), "--bench", str(bench), "--time-scale", str(scale), "--defect", defect, "--run-record",
           str(record), "-q", "-p", "no:randomly"]
    if k:
        cmd += ["-k", k]
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return proc, lines


@pytest.mark.parametrize("defect,suites,k,scale,bench_factory,red", PROOFS, ids=[p[0] for p in PROOFS])
def test_the_defect_turns_its_verdict_red_and_nothing_else(tmp_path, defect, suites, k, scale, bench_factory, red):
    proc, lines = run_with_defect(tmp_path, defect, suites, k, scale, bench_factory)
    output = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert lines[0]["defects"] == [defect], lines[0]
    measurements = [m for m in lines if m["type"] == "measurement"]
    failed = {m["name"] for m in measurements if m["verdict"] == "fail"}
    failed |= {f"test:{t['test'].split('::')[-1]}" for t in lines if t["type"] == "test" and t["outcome"] in
               ("failed", "error") and not any(m["test"] == t["test"] and m["verdict"] == "fail" for m in measurements)}
    assert red <= failed, f"{defect}: expected {sorted(red)} to turn red, red were {sorted(failed)}\n{output}"
    assert failed <= red, f"{defect}: turned red beyond {sorted(red)}: {sorted(failed - red)}\n{output}"
    assert proc.returncode == 1, output
    judged = [m for m in measurements if m["low"] is not None or m["high"] is not None]
    assert any(m["verdict"] != "fail" for m in judged) or len(red) == len(failed), "nothing else was judged"


def _verdicts_in_suites() -> set[str]:
    """Every judged measurement the suites take, by name (an f-string's name ends in "*")."""
    names = set()
    specs = (ROOT / "harness" / "limits.py").read_text()
    for source in SUITES.glob("test_*.py"):
        text = source.read_text()
        for m in re.finditer(r'Spec\(\s*f?"([\w{}]+)"', text):
            rest = text[m.end():]
            stop = min((i for i in (rest.find("Spec("), rest.find("measure(")) if i >= 0), default=len(rest))
            if re.search(r"\.(at_most|at_least|in_range)\(", rest[:stop]):
                names.add(re.sub(r"\{\w+\}", "*", m.group(1)))
        names |= set(re.findall(r'(?:upper_limit|about)\(\s*"(\w+)"', text))
        for function in re.findall(r"limits\.(\w+)\(", text):
            if f"def {function}(" in specs:
                body = specs[specs.index(f"def {function}("):]
                names |= set(re.findall(r'Spec\("(\w+)"', body[:body.find("\ndef ", 1)]))
    return names


def test_every_verdict_has_a_defect_that_turns_it_red():
    proven = {name for *_, red in PROOFS for name in red}
    measured = _verdicts_in_suites()
    missing = {n for n in measured if not any(p == n or (n.endswith("*") and p.startswith(n[:-1])) for p in proven)}
    assert not missing, f"verdicts no defect turns red: {sorted(missing)}"
    assert set(d.split("=")[0] for d, *_ in PROOFS) <= set(CATALOGUE)


def test_the_readme_table_lists_every_proof():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| defect |"):].split("\n\n")[0]
    for defect, *_, red in PROOFS:
        row = next((line for line in table.splitlines() if f"`{defect}`" in line), None)
        assert row is not None, f"README's defect table has no row for {defect}"
        for name in red:
            assert name.removeprefix("test:").split("[")[0] in row, f"README: {defect} row does not name {name}"
