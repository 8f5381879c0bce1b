"""The Polatis driver: what it sends and what it makes of the answers, as dialogues in memory;
then the same dialogues against its emulator over TCP; then what only a live emulator shows
(two clients, light after the switching time)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from dialogue import expect_dialogue, on_the_emulator, on_the_wire
from lumion_hil.instruments.polatis import PolatisSwitch
from lumion_hil.instruments.protocols import Identity, InstrumentError, InstrumentIOError, PortState
from lumion_hil.instruments.visa import VisaSession, open_resource

NO_ERROR = (":SYST:ERR:ALL?", '0,"No error"')


def polatis(instrument, timeout_s: float = 0.05) -> PolatisSwitch:
    """The driver over an instrument in memory; a short deadline, for the silent cases."""
    return polatis_at("TCPIP0::ocs.lab::5025::SOCKET", timeout_s, instrument.open_resource)


def polatis_at(resource: str, timeout_s: float = 2.0, opener=open_resource) -> PolatisSwitch:
    session = VisaSession("ocs", resource, timeout_s=timeout_s, opener=opener)
    return PolatisSwitch(session, power_monitors=True, opc_timeout_s=timeout_s)


# -- dialogues --------------------------------------------------------------------------------------

IDENTIFY = [("*IDN?", "Polatis,I-OST-24x24-LU1-DMHNS,002414,6.5.2.18")]


def test_identify():
    with expect_dialogue(polatis, IDENTIFY) as switch:
        assert switch.identify() == Identity("Polatis", "I-OST-24x24-LU1-DMHNS", "002414", "6.5.2.18")


SIZE = [(":OXC:SWIT:SIZE?", "16,16")]


def test_size_is_ingress_and_egress_counts():
    with expect_dialogue(polatis, SIZE) as switch:
        assert switch.size() == (16, 16)


NO_CONNECTIONS = [(":OXC:SWIT:CONN:STAT?", "(@),(@)")]


def test_no_connections_are_two_empty_channel_lists():
    with expect_dialogue(polatis, NO_CONNECTIONS) as switch:
        assert switch.connections() == {}


CONNECTIONS = [(":OXC:SWIT:CONN:STAT?", "(@1,2),(@20,21)")]


def test_connections_pair_the_two_channel_lists():
    with expect_dialogue(polatis, CONNECTIONS) as switch:
        assert switch.connections() == {1: 20, 2: 21}


CONNECT = [(":OXC:SWIT:CONN:ADD (@3,4),(@22,17);*OPC?", "1"), NO_ERROR]


def test_connect_sends_every_pair_in_one_command_and_waits_for_completion():
    with expect_dialogue(polatis, CONNECT) as switch:
        switch.connect([(3, 22), (4, 17)])


DISCONNECT = [(":OXC:SWIT:CONN:SUB (@3),(@22);*OPC?", "1"), NO_ERROR]


def test_disconnect():
    with expect_dialogue(polatis, DISCONNECT) as switch:
        switch.disconnect({3: 22})


DISCONNECT_ALL = [(":OXC:SWIT:DISC:ALL;*OPC?", "1"), NO_ERROR]


def test_disconnect_all():
    with expect_dialogue(polatis, DISCONNECT_ALL) as switch:
        switch.disconnect_all()


CONNECTED_PORT = [(":OXC:SWIT:CONN:PORT? 3", "22")]


def test_connected_to_names_the_peer():
    with expect_dialogue(polatis, CONNECTED_PORT) as switch:
        assert switch.connected_to(3) == 22


UNCONNECTED_PORT = [(":OXC:SWIT:CONN:PORT? 5", "")]


def test_an_unconnected_port_answers_empty_and_is_none():
    with expect_dialogue(polatis, UNCONNECTED_PORT) as switch:
        assert switch.connected_to(5) is None


PORT_STATES = [(":OXC:SWIT:PORT:STAT? (@1,2)", "(E,D)")]


def test_port_states_in_the_order_asked():
    with expect_dialogue(polatis, PORT_STATES) as switch:
        assert switch.port_states([1, 2]) == {1: PortState.ENABLED, 2: PortState.DISABLED}


SHUTTER = [(":OXC:SWIT:PORT:DIS (@5)", None), NO_ERROR]


def test_shutting_a_port_is_a_set_command_then_the_error_queue():
    with expect_dialogue(polatis, SHUTTER) as switch:
        switch.disable_ports([5])


POWER_MONITORS = [(":PMON:POW? (@1,20)", "(-1.30,-50.00)")]


def test_power_monitors_read_each_port_asked():
    with expect_dialogue(polatis, POWER_MONITORS) as switch:
        assert switch.port_power_dbm([1, 20]) == {1: -1.3, 20: -50.0}


PROBE_MONITORS = [(":PMON:POW? (@1);*OPC?", "(-1.30);1"), ("*CLS", None)]


def test_a_unit_with_power_monitors_answers_the_monitor_query_beside_opc():
    with expect_dialogue(polatis, PROBE_MONITORS) as switch:
        assert switch.probe_power_monitors() is True


def test_a_unit_without_power_monitors_answers_only_opc_and_the_error_it_queued_is_cleared():
    with expect_dialogue(polatis, [(":PMON:POW? (@1);*OPC?", "1"), ("*CLS", None)]) as switch:
        assert switch.probe_power_monitors() is False


CONFLICT = [(":OXC:SWIT:CONN:ADD (@1),(@21);*OPC?", "1"), (":SYST:ERR:ALL?", '-221,"Settings conflict"')]


def test_a_refused_connect_is_an_error_naming_what_the_switch_reported_and_is_not_sent_again():
    with expect_dialogue(polatis, CONFLICT) as switch:
        with pytest.raises(InstrumentError, match=r"^ocs: ':OXC:SWIT:CONN:ADD \(@1\),\(@21\)': instrument "
                                                  r"reported: -221 Settings conflict$"):
            switch.connect([(1, 21)])


OUT_OF_RANGE = [(":OXC:SWIT:CONN:ADD (@1),(@99);*OPC?", "1"), (":SYST:ERR:ALL?", '-222,"Data out of range"')]


def test_a_port_the_switch_does_not_have_is_its_error():
    with expect_dialogue(polatis, OUT_OF_RANGE) as switch:
        with pytest.raises(InstrumentError, match="^ocs: .*-222 Data out of range"):
            switch.connect([(1, 99)])


def test_a_connect_whose_answer_is_lost_is_read_back_and_only_what_is_missing_sent_again():
    with expect_dialogue(polatis, [
        (":OXC:SWIT:CONN:ADD (@3,4),(@22,17);*OPC?", None),  # no answer in time: done or not?
        (":OXC:SWIT:CONN:STAT?", "(@3),(@22)"),  # on a new connection: half of it was done
        (":OXC:SWIT:CONN:ADD (@4),(@17);*OPC?", "1"),
        NO_ERROR,
    ]) as switch:
        switch.connect([(3, 22), (4, 17)])
        assert switch.session.reconnects == 1


def test_a_switch_command_found_done_on_read_back_is_not_sent_again():
    with expect_dialogue(polatis, [
        (":OXC:SWIT:DISC:ALL;*OPC?", b"1"),  # cut short: no line ending before the deadline
        (":OXC:SWIT:CONN:STAT?", "(@),(@)"),
    ]) as switch:
        switch.disconnect_all()


def test_a_connect_that_cannot_be_read_back_says_both_failures():
    with expect_dialogue(polatis, [(":OXC:SWIT:CONN:ADD (@3),(@22);*OPC?", None),
                                   (":OXC:SWIT:CONN:STAT?", None)]) as switch:
        with pytest.raises(InstrumentIOError, match=r"^ocs: ':OXC:SWIT:CONN:ADD \(@3\),\(@22\)': no valid reply: "
                                                    r"timed out .*; the state could not be read back \(no valid"):
            switch.connect([(3, 22)])


@pytest.mark.parametrize("command,reply", [(":OXC:SWIT:SIZE?", "16;16"), (":OXC:SWIT:SIZE?", "sixteen,16"),
                                           (":OXC:SWIT:SIZE?", ""), (":OXC:SWIT:CONN:STAT?", "(@1,2),(@17)")])
def test_a_malformed_reply_is_an_error_naming_the_command_and_the_reply(command, reply):
    with expect_dialogue(polatis, [(command, reply)]) as switch:
        with pytest.raises(InstrumentIOError) as err:
            switch.size() if command == ":OXC:SWIT:SIZE?" else switch.connections()
    assert str(err.value).startswith(f"ocs: {command!r}: unexpected reply") and repr(reply) in str(err.value)


def test_a_silent_switch_is_a_timeout_naming_the_command():
    with expect_dialogue(polatis, [(":OXC:SWIT:SIZE?", None)]) as switch:
        with pytest.raises(InstrumentIOError, match=r"^ocs: ':OXC:SWIT:SIZE\?': no valid reply: timed out"):
            switch.size()


def test_a_dead_switch_is_a_clear_error_when_opened():
    """Over a real socket: the opener's probe is what finds nothing listening."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(InstrumentError, match=rf"^ocs: 'open TCPIP0::127.0.0.1::{port}::SOCKET': cannot open "
                                              "the instrument: Connection refused$"):
        polatis_at(f"TCPIP0::127.0.0.1::{port}::SOCKET", timeout_s=0.2)


# -- the same dialogues against the emulator, over TCP ----------------------------------------------
# The dialogues above are written from the programming guide, and so, apart from the driver, is
# the emulator: here the driver talks to the emulator over a socket and the wire must carry the
# dialogue's commands and, where the instrument's answer is fixed, its replies. A dialogue that
# shares a mistake with the driver fails here.


ocs, wire = on_the_emulator("ocs", polatis_at, driver="ocs", wire="wire")


def test_emulator_identify(ocs, wire):
    with on_the_wire(wire, IDENTIFY, exact_replies=False):  # the serial number is the emulator's own
        identity = ocs.identify()
    assert identity.vendor == "Polatis" and identity.firmware == "6.5.2.18"


def test_emulator_size(ocs, wire):
    with on_the_wire(wire, SIZE):
        ocs.size()


def test_emulator_no_connections(ocs, wire):
    with on_the_wire(wire, NO_CONNECTIONS):
        ocs.connections()


def test_emulator_connections(ocs, wire, emulated):
    emulated.world.connect([(1, 20), (2, 21)])
    with on_the_wire(wire, CONNECTIONS):
        ocs.connections()


def test_emulator_connect(ocs, wire, emulated):
    with on_the_wire(wire, CONNECT):
        ocs.connect([(3, 22), (4, 17)])
    assert emulated.world.connections() == {3: 22, 4: 17} and emulated.world.port_power_dbm(17) is not None


def test_emulator_disconnect(ocs, wire, emulated):
    emulated.world.connect([(3, 22)])
    with on_the_wire(wire, DISCONNECT):
        ocs.disconnect({3: 22})
    assert emulated.world.connections() == {}


def test_emulator_disconnect_all(ocs, wire, emulated):
    emulated.world.connect([(3, 22)])
    with on_the_wire(wire, DISCONNECT_ALL):
        ocs.disconnect_all()
    assert emulated.world.connections() == {}


def test_emulator_connected_port(ocs, wire, emulated):
    emulated.world.connect([(3, 22)])
    with on_the_wire(wire, CONNECTED_PORT):
        ocs.connected_to(3)


def test_emulator_unconnected_port(ocs, wire):
    with on_the_wire(wire, UNCONNECTED_PORT):
        ocs.connected_to(5)


def test_emulator_port_states(ocs, wire, emulated):
    emulated.world.set_port_state(2, "D")
    with on_the_wire(wire, PORT_STATES):
        ocs.port_states([1, 2])


def test_emulator_shutter(ocs, wire, emulated):
    with on_the_wire(wire, SHUTTER):
        ocs.disable_ports([5])
    assert emulated.world.port_state(5) == "D"


def test_emulator_power_monitors(ocs, wire):
    """Light enters ingress 1 from its host; egress 20 carries none."""
    with on_the_wire(wire, POWER_MONITORS, exact_replies=False):  # the emulator's readings carry noise
        readings = ocs.port_power_dbm([1, 20])
    assert readings[1] == pytest.approx(-1.3, abs=0.2) and readings[20] == pytest.approx(-50.0, abs=0.2)


def test_emulator_probe_power_monitors(ocs, wire):
    with on_the_wire(wire, PROBE_MONITORS, exact_replies=False):  # the reading carries noise
        assert ocs.probe_power_monitors() is True


def test_emulator_conflict(ocs, wire, emulated):
    emulated.world.connect([(1, 20)])
    with on_the_wire(wire, CONFLICT):
        with pytest.raises(InstrumentError, match="-221 Settings conflict"):
            ocs.connect([(1, 21)])


def test_emulator_out_of_range(ocs, wire):
    with on_the_wire(wire, OUT_OF_RANGE):
        with pytest.raises(InstrumentError, match="-222 Data out of range"):
            ocs.connect([(1, 99)])


def test_garbage_from_the_emulator_is_an_error(polatis, emulated):
    emulated.emulators["ocs"].faults["garbage"] = None
    with pytest.raises(InstrumentError, match="unexpected reply"):
        polatis.size()


# -- what only a live emulator shows ----------------------------------------------------------------


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
