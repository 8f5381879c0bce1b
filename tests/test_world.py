"""The emulated world's physics: switching time, light, loss, shutters, ground truth."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.world import World, WorldError
from conftest import BENCHES

MS = 1_000_000


class FakeClock:
    def __init__(self):
        self.t = 10**12

    def __call__(self):
        return self.t


@pytest.fixture
def world(bench_cfg):
    return World(bench_cfg, clock_ns=FakeClock())


def test_light_arrives_after_the_switching_time_not_before(world):
    t0 = world.now_ns()
    done = world.connect([(1, 20)])
    assert done == t0 + 50 * MS
    assert world.port_power_dbm(20, t0 + 50 * MS - 1) is None
    expected = -1.0 - 0.3 - 1.5 - 0.5  # launch - tx fibre - insertion - connectors
    assert world.port_power_dbm(20, t0 + 50 * MS) == pytest.approx(expected)
    assert world.received_dbm(20, t0 + 50 * MS) == pytest.approx(expected - 0.3)
    (lit,) = world.events_of("circuit.lit")
    assert lit.t_ns == t0 + 50 * MS


def test_connections_settle_one_after_another(world):
    t0 = world.now_ns()
    world.connect([(1, 20), (4, 17), (3, 22)])
    assert [e.t_ns - t0 for e in world.events_of("circuit.lit")] == [50 * MS, 100 * MS, 150 * MS]
    world.now_ns.t += 10 * MS
    world.connect([(5, 18)])  # queued behind the first command
    assert world.events_of("circuit.lit", "5->18")[0].t_ns == t0 + 200 * MS


def test_time_scale_shortens_switching(bench_cfg):
    fast = World(load_bench(BENCHES / "emulated.yaml", time_scale=0.1), clock_ns=FakeClock())
    t0 = fast.now_ns()
    assert fast.connect([(1, 20)]) - t0 == 5 * MS


def test_disconnect_is_dark_at_once_and_cancels_pending_light(world):
    t0 = world.now_ns()
    world.connect([(1, 20)])
    world.now_ns.t += 20 * MS  # still switching
    world.disconnect([(1, 20)])
    assert world.port_power_dbm(20, t0 + 60 * MS) is None
    assert world.events_of("circuit.lit") == []
    (dark,) = world.events_of("circuit.dark")
    assert dark.detail["was_lit"] is False


def test_conflicts_and_ranges_are_refused(world):
    world.connect([(1, 20)])
    with pytest.raises(WorldError, match="already connected"):
        world.connect([(1, 21)])
    with pytest.raises(WorldError, match="already connected"):
        world.connect([(2, 20)])
    with pytest.raises(WorldError, match="not an egress"):
        world.connect([(2, 5)])
    with pytest.raises(WorldError, match="not connected"):
        world.disconnect([(2, 21)])
    world.connect([(1, 20)])  # the same pair again is no change


def test_extra_loss_shutters_and_sources(world):
    world.connect([(1, 20)])
    world.now_ns.t += 60 * MS
    base = world.port_power_dbm(20)
    world.set_extra_loss(20, 3.0)
    assert world.port_power_dbm(20) == pytest.approx(base - 3.0)
    world.set_extra_loss(20, math.inf)  # a cut fibre
    assert world.port_power_dbm(20) is None
    world.set_extra_loss(20, 0.0)
    world.set_port_state(1, "D")
    assert world.port_power_dbm(20) is None
    world.set_port_state(1, "E")
    world.set_source(1, False)
    assert world.port_power_dbm(20) is None and world.port_power_dbm(1) is None


def test_history_answers_for_the_past(world):
    t0 = world.now_ns()
    world.connect([(1, 20)])
    world.now_ns.t += 100 * MS
    world.disconnect([(1, 20)])
    assert world.port_power_dbm(20, t0 + 75 * MS) is not None
    assert world.port_power_dbm(20) is None


def test_protected_ports_touched_show_as_violations(world):
    world.connect([(16, 20)])
    assert world.events_of("safety.violation")


class SwitchPhysics(RuleBasedStateMachine):
    """Random switch commands: the world's invariants hold whatever the sequence."""

    def __init__(self):
        super().__init__()
        self.world = World(load_bench(BENCHES / "emulated.yaml"), clock_ns=FakeClock())
        self.expected: dict[int, int] = {}

    @rule(ingress=st.integers(1, 8), egress=st.integers(17, 24))
    def connect(self, ingress, egress):
        conflict = (ingress in self.expected and self.expected[ingress] != egress) or (
            egress in self.expected.values() and self.expected.get(ingress) != egress)
        try:
            self.world.connect([(ingress, egress)])
        except WorldError:
            assert conflict
        else:
            assert not conflict
            self.expected[ingress] = egress

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def disconnect(self, data):
        ingress = data.draw(st.sampled_from(sorted(self.expected)))
        self.world.disconnect([(ingress, self.expected.pop(ingress))])

    @rule(ms=st.integers(0, 400))
    def wait(self, ms):
        self.world.now_ns.t += ms * MS

    @invariant()
    def configured_is_what_was_asked(self):
        assert self.world.connections() == self.expected

    @invariant()
    def light_only_where_settled_and_never_more_than_launched(self):
        now = self.world.now_ns()
        for egress in range(17, 25):
            power = self.world.port_power_dbm(egress)
            feeding = [i for i, e in self.expected.items() if e == egress]
            if power is not None:
                assert feeding, f"light at {egress} with nothing connected"
                circuit = next(c for c in self.world.circuits if c.egress == egress and c.live_at(now))
                assert circuit.lit_ns <= now
                assert power <= self.world.sources[feeding[0]].launch_dbm


TestSwitchPhysics = SwitchPhysics.TestCase
TestSwitchPhysics.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


class _RacingClock(FakeClock):
    """A clock that moves on by ``step`` every time it is read (a loaded machine: time passes
    between any two questions)."""

    def __init__(self, step: int = 0):
        super().__init__()
        self.step = step

    def __call__(self):
        t = self.t
        self.t += self.step
        return t


@pytest.mark.alone  # a wake-up judged in wall time
def test_a_link_coming_up_between_two_questions_still_wakes_its_waiter(bench_cfg):
    """The agent's netlink wait: the link's state and its next change are read at one instant.
    Read apart, a link coming up in between left nothing to wait for, and the wait lasted to its
    timeout (a recovery's link phase once took its whole 2 s deadline)."""
    from lumion_hil.instruments.emulators.world_service import WorldService

    clock = _RacingClock()
    world = World(bench_cfg, clock_ns=clock)
    world.connect([(1, 20)])
    transitions = world.link_transitions("host1", "p1", clock.t + 10**10)
    up = next(t for t, state in transitions if state == "up")
    clock.t, clock.step = up - 1, MS  # locked when asked, up by the next reading of the clock
    service = WorldService(world).start()
    try:
        started = time.monotonic()
        seen = service.rpc_wait_link(host="host1", nic="p1", up=True, timeout_s=2.0)
        assert not seen["timed_out"] and seen["link"]["carrier"] == 1, seen
        assert time.monotonic() - started < 0.5
    finally:
        service.stop()
