"""The Polatis driver: byte-level dialogues, then the same cases against its emulator over TCP,
then what only a live emulator can show (two clients, light after the switching time)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from dialogue import DialogueServer
from lumion_hil.instruments.polatis import PolatisSwitch
from lumion_hil.instruments.protocols import InstrumentError, PortState
from lumion_hil.instruments.visa import VisaSession

OK = (":SYST:ERR:ALL?", '0,"No error"')


@dataclass
class Case:
    name: str
    action: Callable[[PolatisSwitch], Any]
    dialogue: list[tuple[str, str | None]]
    check: Callable[[Any], bool] = lambda result: True
    setup: Callable[[Any], None] = lambda world: None  # puts the emulated world in the same state
    raises: str | None = None
    exact_replies: bool = True  # False where the emulator's reply carries noise or identity
    world_after: Callable[[Any], bool] = field(default=lambda world: True)


CASES = [
    Case("identify", lambda sw: sw.identify(),
         [("*IDN?", "Polatis,I-OST-24x24-LU1-DMHNS,002414,6.5.2.18")],
         check=lambda idn: idn.vendor == "Polatis" and idn.firmware == "6.5.2.18", exact_replies=False),
    Case("size", lambda sw: sw.size(), [(":OXC:SWIT:SIZE?", "16,16")], check=lambda r: r == (16, 16)),
    Case("no connections", lambda sw: sw.connections(), [(":OXC:SWIT:CONN:STAT?", "(@),(@)")],
         check=lambda r: r == {}),
    Case("connections", lambda sw: sw.connections(), [(":OXC:SWIT:CONN:STAT?", "(@1,2),(@20,21)")],
         setup=lambda w: w.connect([(1, 20), (2, 21)]), check=lambda r: r == {1: 20, 2: 21}),
    Case("connect waits for completion", lambda sw: sw.connect([(3, 22), (4, 17)]),
         [(":OXC:SWIT:CONN:ADD (@3,4),(@22,17);*OPC?", "1"), OK],
         world_after=lambda w: w.connections() == {3: 22, 4: 17} and w.port_power_dbm(17) is not None),
    Case("disconnect", lambda sw: sw.disconnect({3: 22}),
         [(":OXC:SWIT:CONN:SUB (@3),(@22);*OPC?", "1"), OK],
         setup=lambda w: w.connect([(3, 22)]), world_after=lambda w: w.connections() == {}),
    Case("disconnect all", lambda sw: sw.disconnect_all(), [(":OXC:SWIT:DISC:ALL;*OPC?", "1"), OK],
         setup=lambda w: w.connect([(3, 22)]), world_after=lambda w: w.connections() == {}),
    Case("connected port", lambda sw: sw.connected_to(3), [(":OXC:SWIT:CONN:PORT? 3", "22")],
         setup=lambda w: w.connect([(3, 22)]), check=lambda r: r == 22),
    Case("unconnected port", lambda sw: sw.connected_to(5), [(":OXC:SWIT:CONN:PORT? 5", "")],
         check=lambda r: r is None),
    Case("port states", lambda sw: sw.port_states([1, 2]), [(":OXC:SWIT:PORT:STAT? (@1,2)", "(E,D)")],
         setup=lambda w: w.set_port_state(2, "D"),
         check=lambda r: r == {1: PortState.ENABLED, 2: PortState.DISABLED}),
    Case("shutter a port", lambda sw: sw.disable_ports([5]), [(":OXC:SWIT:PORT:DIS (@5)", None), OK],
         world_after=lambda w: w.port_state(5) == "D"),
    Case("power monitors", lambda sw: sw.port_power_dbm([1, 20]), [(":PMON:POW? (@1,20)", "(-1.30,-50.00)")],
         check=lambda r: abs(r[1] - -1.3) < 0.2 and abs(r[20] - -50.0) < 0.2, exact_replies=False),
    Case("conflict is an error", lambda sw: sw.connect([(1, 21)]),
         [(":OXC:SWIT:CONN:ADD (@1),(@21);*OPC?", "1"), (":SYST:ERR:ALL?", '-221,"Settings conflict"')],
         setup=lambda w: w.connect([(1, 20)]), raises="-221 Settings conflict"),
    Case("out of range is an error", lambda sw: sw.connect([(1, 99)]),
         [(":OXC:SWIT:CONN:ADD (@1),(@99);*OPC?", "1"), (":SYST:ERR:ALL?", '-222,"Data out of range"')],
         raises="-222 Data out of range"),
]


def _run(case: Case, switch: PolatisSwitch):
    if case.raises:
        with pytest.raises(InstrumentError) as err:
            case.action(switch)
        assert case.raises in str(err.value) and "ocs" in str(err.value)
        return None
    result = case.action(switch)
    assert case.check(result), f"unexpected result {result!r}"
    return result


def _open(resource: str, **kw) -> PolatisSwitch:
    return PolatisSwitch(VisaSession("ocs", resource, timeout_s=kw.pop("timeout_s", 2.0)), power_monitors=True, **kw)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dialogue(case):
    steps = [(sent.encode() + b"\n", None if reply is None else reply.encode() + b"\n") for sent, reply in case.dialogue]
    with DialogueServer(steps) as server:
        switch = _open(server.resource)
        try:
            _run(case, switch)
        finally:
            switch.close()
        server.check()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_case_against_the_emulator(case, emulated):
    world = emulated.world
    case.setup(world)
    world.wait_settled()
    server = emulated.servers["ocs"]
    switch = _open(emulated.resources["ocs"])
    try:
        server.wire_log.clear()
        _run(case, switch)
    finally:
        switch.close()
    sent = [line for line, _ in server.wire_log]
    assert sent == [s for s, _ in case.dialogue], "the driver sent the emulator what it sends the instrument"
    if case.exact_replies:
        assert [r for _, r in server.wire_log] == [r for _, r in case.dialogue], "the emulator answered as the instrument"
    assert case.world_after(world)


@pytest.mark.parametrize("reply", ["16;16", "sixteen,16", "", "(@1,2),(@17)"])
def test_malformed_replies_are_errors_naming_command_and_reply(reply):
    command = ":OXC:SWIT:SIZE?" if "@" not in reply else ":OXC:SWIT:CONN:STAT?"
    with DialogueServer([(command.encode() + b"\n", reply.encode() + b"\n")]) as server:
        switch = _open(server.resource)
        with pytest.raises(InstrumentError) as err:
            switch.size() if "@" not in reply else switch.connections()
        switch.close()
    text = str(err.value)
    assert "ocs" in text and command in text and repr(reply) in text


def test_silent_instrument_times_out_with_a_clear_error():
    with DialogueServer([(b":OXC:SWIT:SIZE?\n", None)]) as server:
        switch = _open(server.resource, timeout_s=0.3)
        with pytest.raises(InstrumentError, match=r"ocs: ':OXC:SWIT:SIZE\?': no valid reply: timed out"):
            switch.size()
        switch.close()


def test_dead_instrument_is_a_clear_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(InstrumentError, match=rf"ocs: 'open TCPIP0::127.0.0.1::{port}::SOCKET': cannot open"):
        _open(f"TCPIP0::127.0.0.1::{port}::SOCKET")


def test_garbage_from_emulator_fault_is_an_error(polatis, emulated):
    emulated.emulators["ocs"].faults["garbage"] = None
    with pytest.raises(InstrumentError, match="unexpected reply"):
        polatis.size()


def _plain(resource: str) -> socket.socket:
    port = int(resource.split("::")[2])
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _ask(sock: socket.socket, line: str) -> str:
    sock.sendall(line.encode() + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        data += sock.recv(4096)
    return data.decode().strip()


def test_second_client_sees_the_same_state(polatis, emulated):
    polatis.connect([(1, 20), (4, 17)])
    with _plain(emulated.resources["ocs"]) as other:
        assert _ask(other, ":oxc:switch:connect:state?") == "(@1,4),(@20,17)"
        other.sendall(b":OXC:SWITCH:CONNECT:SUBTRACT (@4),(@17)\n")
        assert _ask(other, "*opc?") == "1"
    assert polatis.connections() == {1: 20}


def test_monitor_sees_light_after_the_switching_time_not_before(polatis, emulated):
    """A second client polls the monitor while the driver connects; every reading taken wholly
    before the world's lit instant is dark and every one taken wholly after it is light."""
    world = emulated.world
    readings = []  # (sent_ns, received_ns, dBm)
    stop = threading.Event()

    def poll():
        with _plain(emulated.resources["ocs"]) as other:
            while not stop.is_set():
                sent = time.perf_counter_ns()
                value = float(_ask(other, ":PMON:POW? (@20)").strip("()"))
                readings.append((sent, time.perf_counter_ns(), value))

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.02)
    polatis.connect([(1, 20)])
    time.sleep(0.02)
    stop.set()
    poller.join()
    (lit,) = world.events_of("circuit.lit")
    before = [v for s, r, v in readings if r < lit.t_ns]
    after = [v for s, r, v in readings if s > lit.t_ns]
    assert before and after, "readings on both sides of the switching instant"
    assert max(before) < -40, "dark before the beam settled"
    assert min(after) > -5, "light once it had"
    assert lit.t_ns - world.events_of("switch.command")[0].t_ns == pytest.approx(50e6, rel=0.01)
