"""Safety: protected ports are never switched; the baseline comes back; one run per bench."""

from __future__ import annotations

import pytest

from lumion_hil.harness.errors import BenchInUseError, SafetyError
from lumion_hil.harness.lock import BenchLock
from lumion_hil.harness.session import BenchSession


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


def test_a_bench_is_locked_by_one_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMION_HIL_LOCK_DIR", str(tmp_path))
    with BenchLock("lab bench 1"):
        with pytest.raises(BenchInUseError, match=r"bench 'lab bench 1' is in use by pid \d+"):
            BenchLock("lab bench 1").acquire()
    BenchLock("lab bench 1").acquire().release()


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
