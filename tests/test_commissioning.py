"""Commissioning a bench (harness/commissioning): the fibre walk, the bench file's patch, the
light budget and the drafted bench file, each on an emulated bench with the mistakes a lab makes
(fibres swapped at the patch panel, a weak transmitter, a dirty connector) and on the clean one.

The walk and the budget read the bench only through the drivers and the agents; the emulated
world's truth (its events, its emulation settings) is read here, to judge what they found."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lumion_hil.harness.commissioning.budget import measure_budget
from lumion_hil.harness.commissioning.walk import find_fibres, nics_of
from lumion_hil.harness.commissioning.wiring import compare, patched_text
from lumion_hil.harness.config import load_bench, parse_bench
from lumion_hil.harness.defects import DefectError, apply_defects
from lumion_hil.harness.session import BenchSession
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.gpu_host.client import AgentClient
from lumion_hil.instruments.identify import identify

from conftest import BENCHES, query_scpi, serve_bench

SUITES = Path(__file__).resolve().parent.parent / "test_suites"
DEFAULT = BENCHES / "emulated.yaml"


def _cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lumion_hil", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def _walk(bench):
    with BenchSession.open(bench) as session:
        found = find_fibres(session, nics_of(bench))
        world = session.world
    return found, world


def _switch_commands_touching(world, ports) -> list:
    return [e for e in world.events_of("switch.command")
            if any(set(pair) & set(ports) for pair in e.detail.get("pairs", []))]


# --- the walk and the patch ----------------------------------------------------------------------


def test_on_the_clean_bench_the_walk_finds_every_fibre_where_the_file_says():
    bench = load_bench(DEFAULT, time_scale=0.2)
    found, world = _walk(bench)
    assert compare(bench, found) == []
    assert set(found.transmitters) == set(found.receivers) == {n.key for n in nics_of(bench)}
    # the meter taps, and their loss against the switch's monitor: the tap the bench file states
    taps = {(t.instrument, t.channel): t for t in found.taps}
    for det in bench.detectors:
        if det.instrument != bench.topology.switch:
            assert taps[(det.instrument, det.channel)].port == det.port
            assert taps[(det.instrument, det.channel)].tap_loss_db == pytest.approx(det.tap_loss_db, abs=0.3)
    assert world.violations == []
    assert world.connections() == dict(bench.safety.baseline)  # closing put the baseline back


def test_two_swapped_fibres_are_named_exactly_and_patched():
    bench = load_bench(DEFAULT, time_scale=0.2, defects=["swapped_fibres=host1.p0,host3.p0"])
    found, _ = _walk(bench)
    differences = compare(bench, found)
    named = {d.text for d in differences if d.path[0] == "topology"}
    assert named == {"host1.p0 transmits into port 7; the bench file says 3",
                     "host1.p0 receives from port 23; the bench file says 19",
                     "host3.p0 transmits into port 3; the bench file says 7",
                     "host3.p0 receives from port 19; the bench file says 23"}
    baseline = {d.path[2]: d.value for d in differences if d.path[:2] == ("safety", "baseline")}
    assert baseline == {2: [7, 22], 3: [6, 23]}  # host1.p0 <-> host2.p1 follows host1.p0's fibres
    text = DEFAULT.read_text()
    patched = patched_text(text, differences)
    fixed = parse_bench(patched, "patched")
    assert (fixed.host("host1").nics[0].tx_port, fixed.host("host1").nics[0].rx_port) == (7, 23)
    assert (fixed.host("host3").nics[0].tx_port, fixed.host("host3").nics[0].rx_port) == (3, 19)
    assert "# the ring host0 -> host1 -> host2 -> host0" in patched  # comments kept
    assert len(patched.splitlines()) == len(text.splitlines())


def test_on_a_switch_without_monitors_a_meter_through_a_test_circuit_finds_the_swapped_fibres():
    bench = load_bench(BENCHES / "emulated-serial.yaml", time_scale=0.2, defects=["swapped_fibres=host0.p1,host3.p1"])
    found, world = _walk(bench)
    named = {d.text for d in compare(bench, found) if d.path[0] == "topology"}
    assert named == {"host0.p1 transmits into port 8; the bench file says 2",
                     "host0.p1 receives from port 24; the bench file says 18",
                     "host3.p1 transmits into port 2; the bench file says 8",
                     "host3.p1 receives from port 18; the bench file says 24"}
    assert all(t.input_dbm is None for t in found.transmitters.values())  # no monitor: not measured
    assert world.violations == []


def test_a_bench_with_protected_ports_never_has_them_commanded():
    """Protected: host3.p0's transmit port and host3.p1's receive port (and the bench's own 16,
    32). Neither is commanded (the world's record of every switch command), the two NICs behind
    them are reported as not walkable, and the rest are found."""
    text = DEFAULT.read_text().replace("protected_ports: [16, 32]", "protected_ports: [7, 16, 24, 32]")
    bench = parse_bench(text, "protected", time_scale=0.2)
    found, world = _walk(bench)
    assert _switch_commands_touching(world, [7, 16, 24, 32]) == []
    assert world.violations == []
    assert "protected" in " ".join(found.not_found["host3.p0"])
    assert set(found.transmitters) == {n.key for n in nics_of(bench)} - {"host3.p0"}
    assert set(found.receivers) == {n.key for n in nics_of(bench)} - {"host3.p1"}  # its port 24 is protected
    assert "host3.p1" in found.not_found
    assert compare(bench, found)  # what could not be walked is said


def test_wiring_from_the_command_line_prints_the_differences_and_writes_the_patch(tmp_path):
    clean = _cli("bench", "wiring", str(DEFAULT), "--time-scale", "0.2")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "every fibre is where the bench file says" in clean.stdout
    out = tmp_path / "patched.yaml"
    swapped = _cli("bench", "wiring", str(DEFAULT), "--time-scale", "0.2", "--defect",
                   "swapped_fibres=host0.p1,host2.p1", "-o", str(out))
    assert swapped.returncode == 1, swapped.stdout + swapped.stderr
    assert "host0.p1 transmits into port 6; the bench file says 2" in swapped.stdout
    assert "+        - {name: p1, rate_gbps: 10, launch_dbm: -1.0, tx_port: 6, rx_port: 22" in swapped.stdout
    assert _cli("bench", "check", str(out)).returncode == 0


# --- Ctrl-C mid-walk, and the patch against the recovery suite, on a served bench -----------------


def test_ctrl_c_mid_walk_leaves_the_switch_at_its_baseline_and_every_transmitter_on(tmp_path):
    with serve_bench(DEFAULT, tmp_path, 1.0) as (bench_out, switch, baseline):
        proc = subprocess.Popen([sys.executable, "-m", "lumion_hil", "bench", "wiring", str(bench_out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)})
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "receiver host0.p0" in line:  # the walk has taken the baseline down and is lighting ports
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, "".join(seen) + out + err
        assert "receiver host3.p1" not in out  # stopped mid-walk
        assert query_scpi(switch, b":OXC:SWIT:CONN:STAT?") == baseline
        inputs = query_scpi(switch, b":PMON:POW? (@1,2,3,4,5,6,7,8)").strip("()").split(",")
        assert all(float(v) > -10 for v in inputs), inputs  # every transmitter lit again


@pytest.mark.alone  # runs the recovery suite, which judges timing against the emulator's ground truth
def test_the_patch_for_swapped_fibres_makes_the_recovery_suite_pass_where_the_file_failed(tmp_path):
    def recovery(bench_file: Path) -> subprocess.CompletedProcess:
        return _cli("run", "--bench", str(bench_file), "--no-report", "--results", str(tmp_path / bench_file.stem),
                    "-k", "test_recovery_time and gpu_failure", "-x", "-q",
                    env={**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}, timeout=600)

    with serve_bench(DEFAULT, tmp_path, 0.2, "--defect", "swapped_fibres=host1.p0,host3.p0") as (bench_out, _, _):
        before = recovery(bench_out)
        assert before.returncode == 1, before.stdout[-3000:] + before.stderr[-2000:]
        assert "no path from host1 to host2" in before.stdout  # the ring's fibres are another host's
        patched = tmp_path / "patched.yaml"
        wiring = _cli("bench", "wiring", str(bench_out), "-o", str(patched),
                      env={**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)})
        assert wiring.returncode == 1, wiring.stdout + wiring.stderr
        named = [line.strip() for line in wiring.stdout.splitlines() if "the bench file says" in line]
        assert sorted(named) == ["host1.p0 receives from port 23; the bench file says 19",
                                 "host1.p0 transmits into port 7; the bench file says 3",
                                 "host3.p0 receives from port 19; the bench file says 23",
                                 "host3.p0 transmits into port 3; the bench file says 7"]
        after = recovery(patched)
        assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-2000:]


# --- the light budget ----------------------------------------------------------------------------


def _budget(bench):
    with BenchSession.open(bench) as session:
        budget = measure_budget(session)
        world = session.world
    return budget, world


def test_a_weak_transmitter_and_a_dirty_connector_are_named_within_0_3_db_of_the_truth():
    bench = load_bench(DEFAULT, time_scale=0.2, defects=["weak_transmitter=2.6@host1.p0", "lossy_connector=1.7@21"])
    budget, world = _budget(bench)
    truth_tx = bench.host("host1").emulation.tx_shortfall_db["p0"]  # the emulator's truth, to judge with
    truth_port = bench.switch.emulation.port_loss_db[21]
    named = {(f.kind, f.subject): f for f in budget.findings}
    assert set(named) == {("transmitter", "host1.p0"), ("port", "port 21")}, [f.text for f in budget.findings]
    assert named[("transmitter", "host1.p0")].measured_db == pytest.approx(truth_tx, abs=0.3)
    assert named[("port", "port 21")].measured_db == pytest.approx(truth_port, abs=0.3)
    assert "host2.p0's receive side" in named[("port", "port 21")].text
    # worst first: the weak transmitter into the dirty connector
    worst = budget.paths[0]
    assert (worst.tx, worst.egress) == ("host1.p0", 21)
    assert [p.margin_db for p in budget.paths] == sorted(p.margin_db for p in budget.paths)
    assert len(budget.paths) == 8 * 6  # every transmitter to every other host's receiver
    assert world.violations == []
    assert world.connections() == dict(bench.safety.baseline)


def test_the_clean_bench_budget_names_nothing_and_matches_the_stated_losses():
    bench = load_bench(DEFAULT, time_scale=0.2)
    budget, world = _budget(bench)
    assert budget.findings == [], [f.text for f in budget.findings]
    for path in budget.paths:  # the light the bench file says each transmitter gives
        nic = next(n for h, n in bench.nic_ports() if f"{h.name}.{n.name}" == path.tx)
        assert path.input_dbm == pytest.approx(nic.launch_dbm - nic.tx_fibre_loss_db, abs=0.3)
    assert budget.shared_loss_db == pytest.approx(bench.switch.emulation.insertion_loss_db
                                                  + bench.topology.connector_loss_db, abs=0.3)


def test_budget_from_the_command_line_exits_1_and_names_the_weak_transmitter(tmp_path):
    out = tmp_path / "budget.json"
    proc = _cli("bench", "budget", str(DEFAULT), "--time-scale", "0.2", "--defect", "weak_transmitter=4@host2.p1",
                "--json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "host2.p1: 4.0" in proc.stdout
    assert [f["subject"] for f in json.loads(out.read_text())["findings"]] == ["host2.p1"]


# --- discover: from the served addresses and the hosts to a bench file that runs -----------------


def test_discover_drafts_a_bench_file_that_check_accepts_and_the_circuit_suite_passes_on(tmp_path):
    with serve_bench(DEFAULT, tmp_path, 0.2) as (bench_out, _, _):
        served = yaml.safe_load(bench_out.read_text())  # only to know what was served, as emulate prints it
        resources = [spec["resource"] for spec in served["instruments"].values()]
        hosts = [f"{h['name']}={h['address']}" for h in served["topology"]["hosts"]]
        draft = tmp_path / "draft.yaml"
        env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}
        proc = _cli("bench", "discover", *[a for r in resources for a in ("-i", r)], "--no-scan",
                    *[a for h in hosts for a in ("-H", h)], "--protect", "16,32", "-o", str(draft), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        text = draft.read_text()
        assert "# read: *IDN? -> Polatis" in text and "# measured: transmits into port" in text
        assert "# assumption:" in text
        check = _cli("bench", "check", str(draft))
        assert check.returncode == 0, check.stdout + check.stderr
        drafted = load_bench(draft)
        truth = load_bench(bench_out)
        for host in truth.topology.hosts:  # every NIC where the served world has it
            for nic in host.nics:
                got = next(n for n in drafted.host(host.name).nics if n.name == nic.name)
                assert (got.tx_port, got.rx_port) == (nic.tx_port, nic.rx_port)
                assert got.launch_dbm == pytest.approx(nic.launch_dbm - nic.tx_fibre_loss_db, abs=0.3)
        run = _cli("run", "--bench", str(draft), "--no-report", "--results", str(tmp_path / "results"),
                   "-k", "circuit", "-q", env=env)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert " passed" in run.stdout


def test_discover_says_what_it_could_not_use(tmp_path):
    proc = _cli("bench", "discover", "-i", "TCPIP0::127.0.0.1::1::SOCKET", "--no-scan", "-H", "h=local",
                "-o", str(tmp_path / "d.yaml"))
    assert proc.returncode == 4
    assert "TCPIP0::127.0.0.1::1::SOCKET: not used:" in proc.stdout
    assert "no optical switch answered" in proc.stderr
    assert not (tmp_path / "d.yaml").exists()


def test_a_serial_matrix_is_identified_by_its_own_identity_and_size():
    bench = load_bench(BENCHES / "emulated-serial.yaml")
    with EmulatedBench(bench) as emulated:
        found = identify(emulated.resources["ocs"])
    assert (found.model, found.ports, found.power_monitors) == ("dicon-matrix", (16, 16), False)
    assert found.how["ports"] == "X1 DIM?"


# --- the emulated mistakes and the agent's transmitter --------------------------------------------


def test_mistake_defects_name_what_is_wrong_with_their_value():
    data = load_bench(DEFAULT).model_dump(mode="json")
    with pytest.raises(DefectError, match="no NIC port 'p7'"):
        apply_defects(dict(data), ["weak_transmitter=3@host1.p7"], emulated=True, bench_name="b")
    with pytest.raises(DefectError, match="two NICs"):
        apply_defects(dict(data), ["swapped_fibres=host1.p0"], emulated=True, bench_name="b")


def test_the_agent_turns_a_transmitter_off_and_back_on_and_restores_it_when_its_session_ends():
    bench = load_bench(DEFAULT, time_scale=0.2, defects=["swapped_fibres=host0.p0,host2.p0"])
    with BenchSession.open(bench) as session:
        host = AgentClient("host0", session.backend.agent_argv(bench.host("host0")))
        host.set_transmitter("p0", False)  # host0.p0's fibre really lands on port 5
        assert session.switch.port_power_dbm([1, 5]) == {1: pytest.approx(-1.3, abs=0.2), 5: pytest.approx(-50, abs=0.2)}
        host.set_transmitter("p0", True)
        assert session.switch.port_power_dbm([5])[5] > -2
        host.set_transmitter("p1", False)
        assert session.world.port_power_dbm(2) is None
        host.close()  # the session ends with p1 dark: the agent lights it again on its way out
        assert session.world.port_power_dbm(2) == pytest.approx(-1.3, abs=0.01)


def test_a_real_hosts_agent_never_darkens_the_loopback():
    from lumion_hil.instruments.gpu_host.links import SysfsLinks

    with pytest.raises(ValueError, match="loopback"):
        SysfsLinks().set_transmitter("lo", False)


def test_the_readme_points_at_a_real_bench_with_the_three_commands_first():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Pointing it at a real bench"):]
    first_block = section[section.index("```sh"):section.index("```", section.index("```sh") + 5)]
    commands = [line.split()[1:3] for line in first_block.splitlines() if line.startswith("lumion-hil ")]
    assert commands == [["bench", "discover"], ["bench", "wiring"], ["bench", "budget"]]
    assert section.index("```sh") < section.index("1.")  # before anything else the section says
