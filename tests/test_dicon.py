"""The DiCon GP600-class serial matrix: what the driver sends and what it makes of the answers, as
dialogues on a serial port in memory; then the same dialogues against its emulator on a
pseudo-terminal through pyserial; then what only the emulator shows."""

from __future__ import annotations

import pytest

from conftest import BENCHES
from dialogue import expect_dialogue, on_the_wire
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.dicon import DiconMatrix
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.emulators.scpi_transports import PtyLineServer, TcpScpiServer
from lumion_hil.instruments.protocols import Identity, InstrumentError, InstrumentIOError

NO_ERROR = ("SYST:ERR?", "+0, No Error")
ALL_PARKED = [(f"X1 CH {i}?", f"{i},0") for i in range(1, 17)]


def dicon(instrument, timeout_s: float = 0.05) -> DiconMatrix:
    """The driver over a serial port in memory; a short deadline, for the silent cases."""
    return DiconMatrix("ocs", "/dev/ttyUSB0", ingress=16, egress=16, timeout_s=timeout_s,
                       opener=instrument.serial_for_url)


def dicon_at(port: str, timeout_s: float = 2.0) -> DiconMatrix:
    return DiconMatrix("ocs", port, ingress=16, egress=16, timeout_s=timeout_s)


# -- dialogues --------------------------------------------------------------------------------------

IDENTIFY = [("*IDN?", "Dicon Fiberoptics Inc, GP600, 19A0M10D0117, 7.0")]


def test_identify():
    with expect_dialogue(dicon, IDENTIFY) as switch:
        assert switch.identify() == Identity("Dicon Fiberoptics Inc", "GP600", "19A0M10D0117", "7.0")


def test_read_size_is_what_the_matrix_reports_not_what_it_was_opened_with():
    with expect_dialogue(dicon, [("X1 DIM?", "8,24")]) as switch:
        assert switch.read_size() == (8, 24)


CONNECT = [("X1 CH 3 6", None), NO_ERROR, ("X1 CH 3?", "3,6")]


def test_connect_moves_the_input_then_waits_on_the_error_queue_then_reads_back():
    """Bench egress 22 is wire output 6 (16 inputs); the answer to SYST:ERR? comes once the
    mirror has settled."""
    with expect_dialogue(dicon, CONNECT) as switch:
        switch.connect([(3, 22)])


DISCONNECT = [("X1 CH 3 0", None), NO_ERROR, ("X1 CH 3?", "3,0")]


def test_disconnect_parks_the_input_on_output_0():
    with expect_dialogue(dicon, DISCONNECT) as switch:
        switch.disconnect([(3, 22)])


CONNECTIONS = [(q, "3,6" if q == "X1 CH 3?" else r) for q, r in ALL_PARKED]


def test_connections_ask_every_input_and_leave_out_the_parked():
    with expect_dialogue(dicon, CONNECTIONS) as switch:
        assert switch.connections() == {3: 22}


PARK_ALL = [("X1 CH * 0", None), NO_ERROR, *ALL_PARKED]


def test_park_all_then_reads_every_input_back():
    with expect_dialogue(dicon, PARK_ALL) as switch:
        switch.disconnect_all()


def test_a_read_back_that_differs_is_an_error_naming_both_outputs():
    with expect_dialogue(dicon, [("X1 CH 3 6", None), NO_ERROR, ("X1 CH 3?", "3,0")]) as switch:
        with pytest.raises(InstrumentError, match=r"^ocs: 'X1 CH 3 6': read back output 0, expected 6$"):
            switch.connect([(3, 22)])


def test_a_refused_move_is_an_error_naming_what_the_switch_said():
    with expect_dialogue(dicon, [("X1 CH 3 6", None), ("SYST:ERR?", "-200, Execution error; busy"),
                                 NO_ERROR]) as switch:
        with pytest.raises(InstrumentError, match=r"^ocs: 'X1 CH 3 6': instrument reported: -200 Execution "
                                                  r"error; busy$"):
            switch.connect([(3, 22)])


def test_a_garbled_read_back_is_an_error_and_the_line_is_resynchronised_before_the_next_command():
    """After a reply that is not one, a late answer may still come: the next command first asks
    *IDN? and reads up to its answer."""
    with expect_dialogue(dicon, [("X1 CH 3 6", None), NO_ERROR, ("X1 CH 3?", "ERR"),
                                 ("*IDN?", "Dicon Fiberoptics Inc, GP600, 19A0M10D0117, 7.0"),
                                 *CONNECT]) as switch:
        with pytest.raises(InstrumentIOError, match=r"^ocs: 'X1 CH 3\?': unexpected reply .*\(reply: 'ERR'\)$"):
            switch.connect([(3, 22)])
        switch.connect([(3, 22)])


def test_a_port_outside_the_matrix_is_refused_before_anything_is_sent():
    with expect_dialogue(dicon, []) as switch:
        with pytest.raises(InstrumentError, match=r"^ocs: 'connect 3->40': 40 is not an egress port$"):
            switch.connect([(3, 40)])


def test_a_silent_switch_is_a_timeout_naming_the_command():
    with expect_dialogue(dicon, [("X1 CH 1?", None)]) as switch:
        with pytest.raises(InstrumentIOError, match=r"^ocs: 'X1 CH 1\?': no valid reply: timed out"):
            switch.connections()


def test_a_missing_serial_port_is_a_clear_error():
    with pytest.raises(InstrumentError, match=r"ocs: 'open /dev/no-such-tty': cannot open the serial port"):
        dicon_at("/dev/no-such-tty")


# -- the same dialogues against the emulator, on a pseudo-terminal ----------------------------------
# The dialogues above are written from the command set a published GP600 driver uses, and so,
# apart from the driver, is the emulator: here the driver talks to it through pyserial and the
# line must carry the dialogue's commands and replies.


@pytest.fixture(scope="module")
def serial_cfg():
    return load_bench(BENCHES / "emulated-serial.yaml", time_scale=0.2)


@pytest.fixture
def serial_bench(serial_cfg):
    with EmulatedBench(serial_cfg) as eb:
        yield eb


@pytest.fixture
def wire() -> list[tuple[str, str | None]]:
    return []


@pytest.fixture
def ocs(serial_bench, wire):
    """The driver on the bench's emulated matrix, served on a pseudo-terminal of its own as the
    bench serves it, logging each line it handles with its answer to ``wire``."""
    emulator = serial_bench.emulators["ocs"]

    def handle(line: str) -> str | None:
        reply = emulator.handle_line(line)
        wire.append((line, reply))
        return reply

    server = PtyLineServer(handle, "ocs", eol=b"\r\n", faults=emulator.faults, power_on=emulator.power_on,
                           any_eol=True).start()
    switch = dicon_at(server.resource)
    yield switch
    switch.close()
    server.stop()


def test_emulator_identify(ocs, wire):
    with on_the_wire(wire, IDENTIFY, exact_replies=False):  # the serial number is the emulator's own
        identity = ocs.identify()
    assert (identity.vendor, identity.model) == ("Dicon Fiberoptics Inc", "GP600")


def test_emulator_read_size(ocs, wire):
    with on_the_wire(wire, [("X1 DIM?", "16,16")]):
        ocs.read_size()


def test_emulator_connect(ocs, wire, serial_bench):
    with on_the_wire(wire, CONNECT):
        ocs.connect([(3, 22)])
    assert serial_bench.world.connections() == {3: 22} and serial_bench.world.port_power_dbm(22) is not None


def test_emulator_disconnect(ocs, wire, serial_bench):
    serial_bench.world.connect([(3, 22)])
    with on_the_wire(wire, DISCONNECT):
        ocs.disconnect([(3, 22)])
    assert serial_bench.world.connections() == {}


def test_emulator_connections(ocs, wire, serial_bench):
    serial_bench.world.connect([(3, 22)])
    with on_the_wire(wire, CONNECTIONS):
        ocs.connections()


def test_emulator_park_all(ocs, wire, serial_bench):
    serial_bench.world.connect([(3, 22), (4, 17)])
    with on_the_wire(wire, PARK_ALL):
        ocs.disconnect_all()
    assert serial_bench.world.connections() == {}


# -- what only the emulator shows -------------------------------------------------------------------


def test_move_completes_before_the_read_back_answers(serial_bench):
    """The read-back is the completion signal: when connect() returns, the light is there."""
    world = serial_bench.world
    switch = dicon_at(serial_bench.resources["ocs"])
    switch.connect([(1, 20)])
    returned = world.now_ns()
    switch.close()
    (lit,) = world.events_of("circuit.lit")
    assert lit.t_ns <= returned


def test_a_matrix_behind_ser2net_is_opened_by_its_url(serial_bench):
    """A serial matrix on a terminal server (ser2net, a labgrid NetworkSerialPort) is reached
    as socket://HOST:PORT: the same lines over TCP."""
    server = TcpScpiServer(serial_bench.emulators["ocs"]).start()
    try:
        switch = dicon_at(f"socket://127.0.0.1:{server.port}")
        try:
            switch.connect([(3, 20)])
            assert switch.connections()[3] == 20
        finally:
            switch.close()
    finally:
        server.stop()
