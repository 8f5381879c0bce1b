"""Every verdict can fail. For each named defect of the emulated bench (or of the controller),
run the suite it should break on a bench with that defect, and check that exactly the expected
verdicts turn red while every other one taken in that run still passes. The README's table of
defects is this one."""

from __future__ import annotations

import json
import os
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


def two_spare_bench(tmp_path) -> Path:
    """The default bench with a second spare (host4, on ports 9/10 and 25/26): room for a
    controller to wire in the spare it did not choose."""
    data = yaml.safe_load((BENCHES / "emulated.yaml").read_text())
    data["topology"]["hosts"].append({
        "name": "host4", "gpus": [{"index": 0, "model": "NVIDIA RTX 6000 Ada Generation", "role": "spare"}],
        "nics": [{"name": f"p{p}", "rate_gbps": 10, "launch_dbm": -1.0, "tx_port": 9 + p, "rx_port": 25 + p,
                  "tx_fibre_loss_db": 0.3, "rx_fibre_loss_db": 0.3} for p in (0, 1)]})
    out = tmp_path / "two-spare.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def exploration_bench(tmp_path) -> Path:
    return BENCHES / "exploration.yaml"


# defect, suites (files, -k), time scale, bench, verdicts that must turn red. A verdict is a
# measurement's name, or "test:NAME" for a test whose own assertion is the verdict. Every run
# judges something beside the red verdicts (a suite or test that should stay green is added
# where the defect stops everything else), so that "nothing else turned red" shows something.
PROOFS = [
    ("slow_switch=10", ["test_circuit_setup.py", "test_light.py"], None, 0.2, None,
     {"switch_completion_time", "light_arrival_time"}),
    ("lossy_connector=8@20", ["test_circuit_setup.py"], "carries_light", 0.2, None, {"received_power", "link_margin"}),
    ("crosstalk=-10", ["test_circuit_setup.py"], "make_and_break", 0.2, None, {"power_after_disconnect"}),
    ("wrong_switch_size=8", ["test_circuit_setup.py"], "matches_bench or carries_light", 0.2, None,
     {"test:test_switch_matches_bench"}),
    ("slow_nic_lock=0.5", ["test_link_bringup.py"], None, 0.2, None, {"light_to_carrier_time"}),
    ("slow_nic_lock=3", ["test_link_bringup.py"], None, 0.2, None, {"carrier_up_time", "light_to_carrier_time"}),
    # Receivers less sensitive than the light that reaches them: the light (judged against the
    # lab's limit) stays green, the link and the recovery go red.
    ("insensitive_receiver=-3", ["test_link_bringup.py", "test_circuit_setup.py", "test_recovery_time.py"],
     "carries_light or test_link or (test_recovery_time and gpu_failure)", 0.2, None,
     {"carrier_up_time", "test:test_recovery_time[gpu_failure]"}),
    ("insensitive_receiver=-3@host3", ["test_link_bringup.py", "test_circuit_setup.py", "test_recovery_time.py"],
     "carries_light or test_link or (test_recovery_time and gpu_failure)", 0.2, None,
     {"test:test_recovery_time[gpu_failure]"}),
    ("flapping_nic=3", ["test_link_bringup.py"], None, 0.2, None, {"carrier_drops_after_up"}),
    # Three recoveries, each its own decision, as a night judges five: one recovery's twelve stamps
    # were too spread to decide (+21 ms, undecided) once in 9 tellings beside a busy core, and 5
    # times in 48 beside the namespaced suites with other tests; with two, both were undecided in 1
    # and 2 of 20 proofs beside a busy core (perf/flakes.py).
    ("slow_agent=0.02", ["test_recovery_time.py"], "test_recovery_time and (gpu_failure or process_kill or fibre_cut)",
     0.2, None, {"recovery_measurement_error"}),
    ("slow_controller=3000", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.1, None,
     {"recovery_to_restart", "recovery_to_restart_lumion", "recovery_to_first_step", "controller_overhead_total"}),
    # 300 ms slower than the reference, against the 250 ms software budget, at every time scale.
    ("slow_controller=300", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 1.0, None,
     {"controller_overhead_total"}),
    ("slow_controller=300", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_overhead_total"}),
    ("slow_controller=300", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.02, None,
     {"controller_overhead_total", "recovery_to_restart", "recovery_to_restart_lumion"}),
    ("no_phases", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_report_phases"}),
    ("wrong_failed_host", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_report_failed_host"}),
    ("wrong_rank_map", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_report_rank_map"}),
    ("slow_controller=1500", ["test_recovery_time.py"], "migration or degraded", 0.1, None,
     {"migration_over_optical_recovery"}),
    ("slow_controller=1000", ["test_collective_bandwidth.py"], None, 0.1, None, {"nccl_resync"}),
    ("early_first_step=200", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_report_error"}),
    ("spare_in_use", ["test_recovery_time.py"], "test_recovery_time and (gpu_failure or process_kill)", 0.2, None,
     {"test:test_recovery_time[gpu_failure]"}),
    ("spare_in_use", ["test_failure_sequences.py"], None, 0.2, None, {"sequences_explored"}),
    ("slow_controller=4000", ["test_failure_sequences.py", "test_circuit_setup.py"], None, 0.02, exploration_bench,
     {"sequence_recovery_time", "sequences_explored"}),
    # The ci profile on the exploration bench fades transmitters into the margin zone, from what
    # the receivers' detectors read: a controller that never reads the light is caught there.
    ("ignores_fading_light", ["test_failure_sequences.py"], None, 0.02, exploration_bench,
     {"paths_not_reached"}),
    ("leaves_failed_circuits", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, three_port_bench,
     {"failed_host_circuits_removed"}),
    ("unguarded_protected_port", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2,
     protected_spare_bench, {"protected_ports_untouched"}),
    # A beam parked on a protected port and taken away again: the switch reads back clean, the
    # world's record of every beam moved does not.
    ("touches_protected_port", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"protected_ports_untouched"}),
    # The job restarted first (a fair overlap), the rewiring left until 400 ms after the job is
    # ready: the job's start-up is physics, its wait in the first collective for links that
    # are not up is the controller's, at every time scale. LUMION's restart (the job running
    # again) is late too. At real time it dawdles 600 ms: after 400 the job runs again 1.24 s after
    # the fault (its 0.5 s start-up, the dawdle, 0.3 s of rewiring and lock), within the 1.25 s
    # of LUMION's limit once the ranks start forked, a verdict left to the harness's own speed.
    ("restart_first_dawdle=600", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 1.0, None,
     {"controller_overhead_total", "recovery_to_restart_lumion"}),
    ("restart_first_dawdle", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.2, None,
     {"controller_overhead_total", "recovery_to_restart_lumion"}),
    ("restart_first_dawdle", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 0.02, None,
     {"controller_overhead_total", "recovery_to_restart_lumion"}),
    # Another spare wired in, lit and locked first, then taken out: physics the final plan did
    # not need (four connections and a lock, about 0.3 s at real time) is overhead.
    ("wrong_spare_first", ["test_recovery_time.py"], "test_recovery_time and gpu_failure", 1.0, two_spare_bench,
     {"controller_overhead_total"}),
    ("never_degraded", ["test_recovery_time.py"], "degraded or process_kill", 0.2, None,
     {"degraded_reported_without_spare"}),
    ("lead_only_restart", ["test_recovery_time.py"], "gpu_failure or degraded", 0.1, None,
     {"test:test_recovery_time[gpu_failure]"}),
    ("lead_only_restart", ["test_collective_bandwidth.py", "test_circuit_setup.py"], None, 0.1, None,
     {"test:test_busbw_by_size", "test:test_busbw_after_recovery_matches_before",
      "test:test_busbw_ratio_optical_over_electrical", "test:test_no_wrong_results",
      "test:test_time_until_a_collective_completes_again"}),
    ("lead_only_restart", ["test_failure_sequences.py"], None, 0.2, None, {"sequences_explored"}),
    ("slow_link=0.5", ["test_collective_bandwidth.py", "test_training_throughput.py"], None, 0.1, None,
     {"allreduce_busbw_optical_over_electrical", "throughput_optical_over_electrical",
      "throughput_optical_over_electrical_lumion", "allreduce_busbw_ratio_over_bench_prediction",
      "throughput_ratio_over_bench_prediction"}),
    ("slow_link=0.5@host3", ["test_collective_bandwidth.py", "test_training_throughput.py"], None, 0.1, None,
     {"busbw_after_over_before", "throughput_after_over_before", "allreduce_busbw_optical_over_electrical",
      "throughput_optical_over_electrical", "throughput_optical_over_electrical_lumion",
      "allreduce_busbw_ratio_over_bench_prediction", "throughput_ratio_over_bench_prediction"}),
    ("silent_data_corruption=host1", ["test_collective_bandwidth.py"], "wrong or after_recovery", 0.1, None,
     {"nccl_wrong_elements_before", "nccl_wrong_elements_after", "nccl_wrong_elements_electrical"}),
]


# Verdicts a defect must leave measured and green: what the harness measures from outside does
# not depend on the controller's account of it.
STILL_GREEN = {
    "insensitive_receiver=-3": {"received_power", "link_margin", "light_arrival_time"},
    "insensitive_receiver=-3@host3": {"received_power", "link_margin", "carrier_up_time", "light_to_carrier_time"},
    "no_phases": {"controller_overhead_total", "recovery_to_restart", "failed_host_circuits_removed"},
    "wrong_failed_host": {"failed_host_circuits_removed", "controller_overhead_total"},
    "wrong_rank_map": {"recovery_to_first_step", "recovery_measurement_error", "controller_overhead_total"},
    "restart_first_dawdle": {"recovery_to_restart", "recovery_measurement_error", "protected_ports_untouched"},
    "touches_protected_port": {"controller_overhead_total", "failed_host_circuits_removed"},
}


# Verdicts a defect (at any time scale, or at the one keyed) may turn red beside its own, as the random stories fall: a controller blind
# to fading light never detects margin_low (paths_not_reached, always red, judged by the shard
# that ends last); a story that fades a transmitter into the margin zone also breaks a promise
# when one is drawn, in the shard that draws it (sequences_explored, or that shard's test).
MAY_TURN_RED: dict[str | tuple[str, float], set[str]] = {"ignores_fading_light": {"sequences_explored", "sequence_recovery_time",
                                         "test:test_failure_sequences[shard0]", "test:test_failure_sequences[shard1]"},
                # the wasted 0.3 s may take the job's running again past LUMION's ~1 s at real time
                "wrong_spare_first": {"recovery_to_restart_lumion"},
                # 300 ms on a recovery of about 0.2 s at a fifth of real time puts the job's running
                # again at LUMION's bound there (1 s x 0.2 x 1.25 + 0.25 s = 0.5 s): 0.517 s once in a
                # clean-clone CI run; where it lands is the defect's size, not noise to hide
                "slow_controller=300": {"recovery_to_restart_lumion"},
                # at a fiftieth of real time (only) the 400 ms dawdle is 20 s of the bench's time
                # against the first step's 25.6 s: with the harness's own (unscaled) time the first
                # step lands at its bound (0.770 s against 0.762 s once, in the flake benchmark beside
                # a busy core); the defect's size decides it, not noise to hide
                ("restart_first_dawdle", 0.02): {"recovery_to_first_step"}}

# The value a defect's red verdict must take, where the defect says how large it is: (verdict,
# at least, at most). The dawdle past the job's start-up (400 ms) is all overhead, and no more
# than the dawdle and the software budget (the reference controller's own time).
MAGNITUDE = {"restart_first_dawdle": ("controller_overhead_total", 0.4, 0.4 + 0.25),
             "restart_first_dawdle=600": ("controller_overhead_total", 0.6, 0.6 + 0.25),
             "wrong_spare_first": ("controller_overhead_total", 0.3, 0.3 + 0.25)}

# Options beyond the bench, the scale and -k that a defect's proofs run with (the suites other than
# the failure sequences ignore the explore options). The failure sequences' broken stories are
# not shrunk (--explore-no-shrink): each telling of one waits out a deadline (a fade goes unseen;
# a recovery takes 4 s; the lead rank waits for peers that never start), and shrinking told them
# again and again (the fading-light proof for minutes).
EXTRA = {"ignores_fading_light": ["--explore", "ci", "--explore-sequences", "15", "--explore-no-shrink"],
         "slow_controller=4000": ["--explore-no-shrink"], "lead_only_restart": ["--explore-no-shrink"]}


def run_with_defect(tmp_path, defect, suites, k, scale, bench_factory):
    bench = bench_factory(tmp_path) if bench_factory else BENCHES / "emulated.yaml"
    record = tmp_path / "records" / "record.jsonl"  # run in tmp_path: its results (stories, examples) there too
    cmd = [sys.executable, "-m", "pytest", *(str(SUITES / s) for s in suites), "-p", "no:cacheprovider", "--rootdir",
           str(SUITES), "--bench", str(bench), "--time-scale", str(scale), "--defect", defect, "--run-record",
           str(record), "-q", "-p", "no:randomly", *EXTRA.get(defect, [])]
    if k:
        cmd += ["-k", k]
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return proc, lines


def _alone(proof) -> list:
    """A proof that runs the recovery suite, or at real time, judges timing against ground truth
    (recovery_measurement_error, controller_overhead_total among the verdicts that must stay
    green): scripts/tests runs it alone. The others may share the machine with another test; those
    that tell stories at a fiftieth of real time on one worker of their own (marked scaled)."""
    _, suites, _, scale, *_ = proof
    if "test_recovery_time.py" in suites or scale >= 1.0:
        return [pytest.mark.alone]
    return [pytest.mark.scaled] if scale < 0.1 else []  # stories at a fiftieth of real time: a core to themselves


@pytest.mark.parametrize("defect,suites,k,scale,bench_factory,red",
                         [pytest.param(*p, marks=_alone(p)) for p in PROOFS], ids=[p[0] for p in PROOFS])
def test_the_defect_turns_its_verdict_red_and_nothing_else(tmp_path, defect, suites, k, scale, bench_factory, red):
    proc, lines = run_with_defect(tmp_path, defect, suites, k, scale, bench_factory)
    output = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert lines[0]["defects"] == [defect], lines[0]
    measurements = [m for m in lines if m["type"] == "measurement"]
    failed = {m["name"] for m in measurements if m["verdict"] == "fail"}
    failed |= {f"test:{t['test'].split('::')[-1]}" for t in lines if t["type"] == "test" and t["outcome"] in
               ("failed", "error") and not any(m["test"] == t["test"] and m["verdict"] == "fail" for m in measurements)}
    assert red <= failed, f"{defect}: expected {sorted(red)} to turn red, red were {sorted(failed)}\n{output}"
    assert failed <= red | MAY_TURN_RED.get(defect, set()) | MAY_TURN_RED.get((defect, scale), set()), \
        f"{defect}: turned red beyond {sorted(red)}: {sorted(failed - red)}\n{output}"
    assert proc.returncode == 1, output
    judged = [m for m in measurements if m["low"] is not None or m["high"] is not None]
    assert any(m["verdict"] != "fail" for m in judged), \
        f"{defect}: no verdict stayed green in the run, so 'nothing else' shows nothing\n{output}"
    green = {m["name"] for m in judged if m["verdict"] != "fail"}
    still = STILL_GREEN.get(defect, STILL_GREEN.get(defect.split("=")[0], set()))
    assert still <= green, f"{defect}: should still be measured and green: {sorted(still - green)}\n{output}"
    if defect in MAGNITUDE:
        name, low, high = MAGNITUDE[defect]
        values = [m["value"] for m in measurements if m["name"] == name]
        assert values and all(low <= v <= high for v in values), \
            f"{defect}: {name} {values}, expected about the defect's own size ({low:g} .. {high:g})\n{output}"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> list[dict]:
    """The run record of every suite on the default bench (at a tenth of real time)."""
    tmp = tmp_path_factory.mktemp("full-run")
    record = tmp / "records" / "record.jsonl"  # run in tmp: its results (stories, examples) there too
    cmd = [sys.executable, "-m", "pytest", str(SUITES), "-p", "no:cacheprovider", "--rootdir", str(SUITES), "--bench",
           str(BENCHES / "emulated.yaml"), "--time-scale", "0.1", "--run-record", str(record), "-q", "-p", "no:randomly"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp,
                          env={**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.alone  # a full run whose every verdict must pass, timing ones included
def test_every_verdict_has_a_defect_that_turns_it_red(full_run):
    """The verdicts are those a full run judged (a measurement with a limit), wherever they are
    declared: not a list kept by hand, nor a search of the suites' sources."""
    judged = {m["name"] for m in full_run if m["type"] == "measurement" and (m["low"] is not None or m["high"] is not None)}
    assert len(judged) > 20, f"the full run judged only {sorted(judged)}"
    proven = {name for *_, red in PROOFS for name in red}
    missing = judged - proven
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
