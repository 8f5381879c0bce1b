"""Safety: protected ports are never switched; the baseline comes back; one run per bench."""

from __future__ import annotations

import pytest

from lumion_hil.harness.errors import BenchInUseError, SafetyError
from lumion_hil.harness.lock import BenchLock
from lumion_hil.harness.session import BenchSession
from lumion_hil.instruments.protocols import AgentGone


def test_protected_port_is_refused_even_when_it_is_the_only_path(bench_cfg):
    with BenchSession.open(bench_cfg) as session:
        switch = session.switch
        with pytest.raises(SafetyError, match=r"port\(s\) \[16\] are protected"):
            switch.connect([(16, 20)])
        with pytest.raises(SafetyError, match="protected"):
            switch.disable_ports([32])
        switch.disconnect_all()
        assert switch.connections() == {}
        assert session.world.events_of("safety.violation") == []


def test_restore_keeps_what_sits_on_protected_ports(bench_cfg):
    with BenchSession.open(bench_cfg) as session:
        session.world.connect([(16, 32)])  # something outside the harness uses the protected pair
        session.world.events.clear()
        session.switch.disconnect([(1, 20)])
        session.switch.restore_baseline()
        assert session.switch.connections() == {**dict(bench_cfg.safety.baseline), 16: 32}
        assert session.world.events_of("safety.violation") == []


def test_open_and_close_restore_the_baseline(bench_cfg):
    session = BenchSession.open(bench_cfg)
    baseline = dict(bench_cfg.safety.baseline)
    assert session.switch.connections() == baseline
    session.switch.disconnect([(1, 20)])
    session.switch.connect([(7, 20)])
    world = session.world
    session.close()
    assert world.connections() == baseline


def test_close_runs_every_step_even_if_one_fails(bench_cfg):
    session = BenchSession.open(bench_cfg)
    server = session.backend.servers["ocs"]
    session.backend.emulators["ocs"].faults["drop"] = None  # the switch stops answering
    with pytest.raises(Exception):
        session.close()
    assert not session.drivers, "drivers closed"
    assert server._server.socket.fileno() == -1, "emulators stopped"


def test_put_back_restores_the_baseline_even_where_an_agent_is_gone(bench_cfg):
    """A story's clean-up (the suites', the explorer's): an agent that is gone cannot stop its
    job, and still every repair is made and the switch goes back to the baseline; the agent's
    failure is raised after them."""
    session = BenchSession.open(bench_cfg)
    try:
        session.switch.disconnect([(1, 20)])
        session.switch.connect([(7, 20)])
        gone = session.hosts["host1"]
        gone._proc.kill()
        gone._proc.wait()
        repaired = []
        with pytest.raises(AgentGone, match="host1"):
            session.put_back(lambda: repaired.append("fault"))
        assert repaired == ["fault"]
        assert session.world.connections() == dict(bench_cfg.safety.baseline)
    finally:
        with pytest.raises(AgentGone, match="host1"):  # the job it cannot stop, said again; the rest closes
            session.close()
    assert not session.hosts and not session.drivers


def test_a_bench_is_locked_by_one_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMION_HIL_LOCK_DIR", str(tmp_path))
    with BenchLock("lab bench 1"):
        with pytest.raises(BenchInUseError, match=r"bench 'lab bench 1' is in use by pid \d+"):
            BenchLock("lab bench 1").acquire()
    BenchLock("lab bench 1").acquire().release()


def test_a_run_locks_what_its_bench_drives_not_its_name(tmp_path, monkeypatch):
    """Two bench files naming one switch are one bench (however its address is spelled); two
    benches served from one file (one name, other addresses) are two; benches that own disjoint
    ports of one switch run side by side, and none while a bench takes the whole switch."""
    from pathlib import Path

    import yaml

    from lumion_hil.harness.config import parse_bench

    monkeypatch.setenv("LUMION_HIL_LOCK_DIR", str(tmp_path))
    lab = yaml.safe_load((Path(__file__).parents[1] / "benches" / "example-lab.yaml").read_text())

    def bench(name: str, switch: str = "TCPIP0::192.0.2.10::5025::SOCKET", hosts: str = "lab.example",
              owned: bool = False, shift: int = 0):
        """The example lab's bench with the switch alone as instrument; ``shift``: its ports that
        many higher; ``owned``: it owns its ports of the switch, and no others."""
        data = {**lab, "name": name, "instruments": {"ocs": {**lab["instruments"]["ocs"], "resource": switch}},
                "detectors": []}
        data["topology"] = {**lab["topology"], "hosts": [
            {**h, "address": h["address"].replace("lab.example", hosts),
             "nics": [{**n, "tx_port": n["tx_port"] + shift, "rx_port": n["rx_port"] + shift} for n in h["nics"]]}
            for h in lab["topology"]["hosts"]]}
        data["safety"] = {**lab["safety"], "baseline": [[i + shift, e + shift] for i, e in lab["safety"]["baseline"]]}
        if owned:
            data["safety"]["owned_ports"] = sorted({p for h in data["topology"]["hosts"] for n in h["nics"]
                                                    for p in (n["tx_port"], n["rx_port"])})
        return BenchLock.for_bench(parse_bench(yaml.safe_dump(data)))

    with bench("lab bench 1"):
        with pytest.raises(BenchInUseError, match=r"bench 'other name': instrument ocs at tcpip::192.0.2.10::5025::SOCKET"
                                                  r" is in use by pid \d+, bench 'lab bench 1'"):
            bench("other name", switch="tcpip::192.0.2.10::5025::SOCKET", hosts="other.example").acquire()
        with pytest.raises(BenchInUseError, match=r"host gpu-a at lab@gpu-a.lab.example is in use"):
            bench("other hosts", switch="TCPIP0::192.0.2.11::5025::SOCKET").acquire()
        bench("lab bench 1", switch="TCPIP0::192.0.2.11::5025::SOCKET", hosts="other.example").acquire().release()
    with bench("left", owned=True, hosts="left.example"):
        bench("right", owned=True, shift=6, hosts="right.example").acquire().release()
        with pytest.raises(BenchInUseError, match=r"port \d+ of ocs .* in use by pid \d+, bench 'left'"):
            bench("left again", owned=True, hosts="again.example").acquire()
        with pytest.raises(BenchInUseError, match=r"instrument ocs .* in use by runs of benches that own some"):
            bench("whole", hosts="whole.example").acquire()


def test_a_bench_on_part_of_a_shared_switch_leaves_the_other_ports_alone(bench_cfg):
    """``safety.owned_ports`` (from a labgrid place's ports tag): ports not the bench's own are
    refused like protected ones, and what stands on them survives a baseline restore."""
    from lumion_hil.harness.safety import GuardedSwitch

    with BenchSession.open(bench_cfg) as session:
        owned = {1, 2, 3, 4, 17, 18, 19, 20}
        guarded = GuardedSwitch(session.switch, bench_cfg.safety.protected_ports, [(1, 20), (4, 17)], owned)
        with pytest.raises(SafetyError, match=r"port\(s\) \[21\] are not this bench's own"):
            guarded.connect([(2, 21)])
        with pytest.raises(SafetyError, match="not this bench's own"):
            guarded.disable_ports([5])
        guarded.restore_baseline()  # the other bench's circuits (5->18, 3->22 ...) stay where they are
        now = session.switch.connections()
        assert {1: 20, 4: 17} == {i: e for i, e in now.items() if i in owned and e in owned}
        assert {(i, e) for i, e in now.items() if {i, e} - owned} == \
            {(i, e) for i, e in bench_cfg.safety.baseline if {i, e} - owned}
        guarded.verify_baseline()


def test_a_bench_whose_ports_are_not_its_own_is_refused(tmp_path):
    from lumion_hil.harness.config import BenchFileError, load_bench

    from conftest import BENCHES

    text = (BENCHES / "emulated.yaml").read_text().replace("safety:\n", "safety:\n  owned_ports: [1, 2, 3, 4, 17, 18, 19, 20]\n")
    bench = tmp_path / "part.yaml"
    bench.write_text(text)
    with pytest.raises(BenchFileError, match=r"port 5 \(host2.p0\) is not one of the bench's own ports 1-4,17-20"):
        load_bench(bench)


class _NoShutters:
    """A switch driver with no port shutters (a DiCon matrix, a mesh): the OpticalSwitch calls only."""

    name = "plain"

    def connections(self):
        return {}


def test_port_shutters_are_a_capability_checked_through_the_recorded_view_and_the_guard():
    from lumion_hil.harness.safety import GuardedSwitch
    from lumion_hil.harness.timeline import Timeline
    from lumion_hil.instruments.polatis import PolatisSwitch
    from lumion_hil.instruments.protocols import NotSupported

    timeline = Timeline()
    plain = GuardedSwitch(timeline.recorded(_NoShutters(), "plain"), protected_ports=[16])
    assert not plain.has_port_shutters and not GuardedSwitch(plain, [16]).has_port_shutters
    with pytest.raises(NotSupported, match="cannot turn a port's light off and on"):
        plain.disable_ports([5])
    with pytest.raises(SafetyError, match="protected"):  # the guard refuses before asking the switch
        plain.disable_ports([16])
    polatis = PolatisSwitch.__new__(PolatisSwitch)  # never opened: only what it is, not what it says
    polatis.name = "ocs"
    shuttered = GuardedSwitch(timeline.recorded(polatis, "ocs"), protected_ports=[16])
    assert shuttered.has_port_shutters and GuardedSwitch(shuttered, [16]).has_port_shutters
