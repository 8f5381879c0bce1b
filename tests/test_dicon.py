"""The DiCon GP600-class serial matrix: dialogues on a pseudo-terminal through pyserial, the same cases
against its emulator, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from dialogue import SerialDialogue
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.dicon import DiconMatrix
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.protocols import InstrumentError
from conftest import BENCHES

ALL_PARKED = [(f"X1 CH {i}?", f"{i},0") for i in range(1, 17)]
OK = ("SYST:ERR?", "+0, No Error")


@dataclass
class Case:
    name: str
    action: Callable[[DiconMatrix], Any]
    dialogue: list[tuple[str, str | None]]
    check: Callable[[Any], bool] = lambda r: True
    setup: Callable[[Any], None] = lambda world: None
    world_after: Callable[[Any], bool] = field(default=lambda world: True)
    raises: str | None = None
    exact_replies: bool = True
    emulated: bool = True  # False: the emulator cannot be made to misbehave this way


CASES = [
    Case("identify", lambda sw: sw.identify(), [("*IDN?", "Dicon Fiberoptics Inc, GP600, 19A0M10D0117, 7.0")],
         check=lambda i: i.vendor == "Dicon Fiberoptics Inc" and i.model == "GP600", exact_replies=False),
    Case("connect reads back", lambda sw: sw.connect([(3, 22)]), [("X1 CH 3 6", None), OK, ("X1 CH 3?", "3,6")],
         world_after=lambda w: w.connections() == {3: 22} and w.port_power_dbm(22) is not None),
    Case("disconnect parks", lambda sw: sw.disconnect([(3, 22)]), [("X1 CH 3 0", None), OK, ("X1 CH 3?", "3,0")],
         setup=lambda w: w.connect([(3, 22)]), world_after=lambda w: w.connections() == {}),
    Case("connections", lambda sw: sw.connections(),
         [(q, "3,6" if q == "X1 CH 3?" else r) for q, r in ALL_PARKED],
         setup=lambda w: w.connect([(3, 22)]), check=lambda r: r == {3: 22}),
    Case("park all", lambda sw: sw.disconnect_all(), [("X1 CH * 0", None), OK, *ALL_PARKED],
         setup=lambda w: w.connect([(3, 22), (4, 17)]), world_after=lambda w: w.connections() == {}),
    Case("read-back mismatch is an error", lambda sw: sw.connect([(3, 22)]),
         [("X1 CH 3 6", None), OK, ("X1 CH 3?", "3,0")], raises="read back output 0, expected 6", emulated=False),
    Case("a refused move is an error naming what the switch said", lambda sw: sw.connect([(3, 22)]),
         [("X1 CH 3 6", None), ("SYST:ERR?", "-200, Execution error; busy"), OK],
         raises="instrument reported: -200 Execution error; busy", emulated=False),
    Case("error reply is an error", lambda sw: sw.connect([(3, 22)]), [("X1 CH 3 6", None), OK, ("X1 CH 3?", "ERR")],
         raises="unexpected reply", emulated=False),
    Case("a port outside the matrix is refused before anything is sent", lambda sw: sw.connect([(3, 40)]), [],
         raises="40 is not an egress port"),
]


def _open(resource: str, timeout_s: float = 2.0) -> DiconMatrix:
    return DiconMatrix("ocs", resource, ingress=16, egress=16, timeout_s=timeout_s)


def _run(case: Case, switch: DiconMatrix):
    if case.raises:
        with pytest.raises(InstrumentError) as err:
            case.action(switch)
        assert case.raises in str(err.value) and "ocs" in str(err.value)
        return
    result = case.action(switch)
    assert case.check(result), f"unexpected result {result!r}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dialogue(case):
    with SerialDialogue(case.dialogue) as dialogue:
        switch = _open(dialogue.resource)
        try:
            _run(case, switch)
        finally:
            switch.close()
        dialogue.check()


@pytest.fixture
def serial_bench():
    with EmulatedBench(load_bench(BENCHES / "emulated-serial.yaml", time_scale=0.2)) as eb:
        yield eb


@pytest.mark.parametrize("case", [c for c in CASES if c.emulated], ids=lambda c: c.name)
def test_same_case_against_the_emulator(case, serial_bench):
    world, emulator = serial_bench.world, serial_bench.emulators["ocs"]
    case.setup(world)
    log: list[tuple[str, str | None]] = []
    original = emulator.handle_line
    server = serial_bench.servers["ocs"]
    server._handle_line = lambda line: log.append((line, original(line))) or log[-1][1]
    switch = _open(serial_bench.resources["ocs"])
    try:
        _run(case, switch)
    finally:
        switch.close()
    assert [line for line, _ in log] == [s for s, _ in case.dialogue]
    if case.exact_replies:
        assert [r for _, r in log] == [r for _, r in case.dialogue]
    assert case.world_after(world)


def test_silent_switch_times_out_with_a_clear_error(serial_bench):
    serial_bench.emulators["ocs"].faults["stall"] = None
    switch = _open(serial_bench.resources["ocs"], timeout_s=0.3)
    with pytest.raises(InstrumentError, match=r"ocs: 'X1 CH 1\?': no valid reply: timed out"):
        switch.connections()
    switch.close()


def test_missing_serial_port_is_a_clear_error():
    with pytest.raises(InstrumentError, match=r"ocs: 'open /dev/no-such-tty': cannot open the serial port"):
        _open("/dev/no-such-tty")


def test_move_completes_before_the_read_back_answers(serial_bench):
    """The read-back is the completion signal: when connect() returns, the light is there."""
    world = serial_bench.world
    switch = _open(serial_bench.resources["ocs"])
    switch.connect([(1, 20)])
    returned = world.now_ns()
    switch.close()
    (lit,) = world.events_of("circuit.lit")
    assert lit.t_ns <= returned


def test_a_matrix_behind_ser2net_is_opened_by_its_url(serial_bench):
    """A serial matrix on a terminal server (ser2net, a labgrid NetworkSerialPort) is reached
    as socket://HOST:PORT: the same lines over TCP."""
    from lumion_hil.instruments.emulators.scpi_transports import TcpScpiServer

    server = TcpScpiServer(serial_bench.emulators["ocs"]).start()
    try:
        switch = _open(f"socket://127.0.0.1:{server.port}")
        try:
            switch.connect([(3, 20)])
            assert switch.connections()[3] == 20
        finally:
            switch.close()
    finally:
        server.stop()
