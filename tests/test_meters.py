"""Power meters: byte-level dialogues, the same cases against their emulators over TCP, then
the physics only the coupled world can show."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from dialogue import DialogueServer
from lumion_hil.harness.binding import open_driver
from lumion_hil.harness.limits import dark_after_disconnect, received_power
from lumion_hil.instruments.keysight_n77xx import KeysightN77xx
from lumion_hil.instruments.protocols import InstrumentError, OutOfRange
from lumion_hil.instruments.thorlabs_pm100 import ThorlabsPM100
from lumion_hil.instruments.visa import VisaSession

NO_ERROR = '0,"No error"'  # Thorlabs' empty error queue
KS_NO_ERROR = '+0,"No error"'  # Keysight's


@dataclass
class Case:
    name: str
    action: Callable[[Any], Any]
    dialogue: list[tuple[str, str | None]]
    check: Callable[[Any], bool] = lambda r: True
    exact_replies: bool = True
    raises: str | None = None
    setup: Callable[[Any], None] = lambda emulator: None  # puts the emulator in the dialogue's state
    emulator_check: Callable[[Any], bool] | None = None  # where the dialogue's reply is made up


THORLABS = [
    Case("identify", lambda m: m.identify(), [("*IDN?", "Thorlabs,PM100D,P0009368,2.4.0")],
         check=lambda i: i.vendor == "Thorlabs" and i.model == "PM100D", exact_replies=False),
    Case("set wavelength", lambda m: m.set_wavelength_nm(1310), [("SENS:CORR:WAV 1310", None), ("SYST:ERR?", NO_ERROR)]),
    Case("wavelength", lambda m: m.wavelength_nm(), [("SENS:CORR:WAV?", "1.550000E+03")], check=lambda r: r == 1550.0),
    Case("unit dBm", lambda m: m.set_unit("dbm"), [("SENS:POW:UNIT DBM", None), ("SYST:ERR?", NO_ERROR)]),
    Case("averaging", lambda m: m.set_averaging(10), [("SENS:AVER:COUN 10", None), ("SYST:ERR?", NO_ERROR)]),
    Case("auto range", lambda m: m.set_auto_range(True), [("SENS:POW:RANG:AUTO ON", None), ("SYST:ERR?", NO_ERROR)]),
    Case("reading in W is turned into dBm", lambda m: m.read_dbm(),
         [("SENS:POW:UNIT?", "W"), ("MEAS:POW?", "1.000000E-03")],
         check=lambda r: r == pytest.approx(0.0), exact_replies=False,
         emulator_check=lambda r: isinstance(r, float) and r < -50),  # nothing connected: dark
    Case("error queue", lambda m: m.set_unit("W") or m.send("SENS:BOGUS 1"),
         [("SENS:POW:UNIT W", None), ("SYST:ERR?", NO_ERROR), ("SENS:BOGUS 1", None),
          ("SYST:ERR?", '-113,"Undefined header"'), ("SYST:ERR?", NO_ERROR)],
         raises="-113 Undefined header"),
]

KEYSIGHT = [
    Case("identify", lambda m: m.identify(), [("*IDN?", "Keysight Technologies,N7744A,MY12345678,1.0.0")],
         check=lambda i: i.model == "N7744A", exact_replies=False),
    Case("set wavelength", lambda m: m.set_wavelength_nm(1310, 2), [(":SENS2:POW:WAV 1310nm", None), (":SYST:ERR?", KS_NO_ERROR)]),
    Case("wavelength", lambda m: m.wavelength_nm(3), [(":SENS3:POW:WAV?", "+1.55000000E-006")],
         check=lambda r: r == pytest.approx(1550.0)),
    Case("averaging time", lambda m: m.set_averaging_time_s(0.001, 1), [(":SENS1:POW:ATIME 0.001s", None), (":SYST:ERR?", KS_NO_ERROR)]),
    Case("reading", lambda m: m.read_dbm(4), [(":SENS4:POW:UNIT?", "+0"), (":READ4:CHAN1:POW?", "-7.00000000E+001")],
         check=lambda r: isinstance(r, float) and r < -60, exact_replies=False),
    Case("unit switched to dBm first", lambda m: m.read_dbm(1),
         [(":SENS1:POW:UNIT?", "+1"), (":SENS1:POW:UNIT 0", None), (":SYST:ERR?", KS_NO_ERROR),
          (":READ1:CHAN1:POW?", "-7.00000000E+001")],
         check=lambda r: isinstance(r, float), exact_replies=False,
         setup=lambda emulator: setattr(emulator.channels[1], "unit", 1)),
    Case("channel out of range", lambda m: m.read_dbm(5), [], raises="channel 5 out of 1..4"),
]


def _thorlabs(resource, timeout_s=2.0):
    return ThorlabsPM100(VisaSession("pm-usb", resource, timeout_s=timeout_s))


def _keysight(resource, timeout_s=2.0):
    return KeysightN77xx(VisaSession("pm-lab", resource, timeout_s=timeout_s), channels=4)


def _run(case, meter, check=None):
    check = check or case.check
    if case.raises:
        with pytest.raises((InstrumentError, ValueError)) as err:
            case.action(meter)
        assert case.raises in str(err.value) and meter.name in str(err.value)
        return
    result = case.action(meter)
    assert check(result), f"unexpected result {result!r}"


def _dialogue(case, opener):
    steps = [(s.encode() + b"\n", None if r is None else r.encode() + b"\n") for s, r in case.dialogue]
    with DialogueServer(steps) as server:
        meter = opener(server.resource)
        try:
            _run(case, meter)
        finally:
            meter.close()
        server.check()


def _against_emulator(case, opener, emulated, name):
    server = emulated.servers[name]
    case.setup(emulated.emulators[name])
    meter = opener(emulated.resources[name])
    try:
        server.wire_log.clear()
        _run(case, meter, case.emulator_check)
    finally:
        meter.close()
    assert [line for line, _ in server.wire_log] == [s for s, _ in case.dialogue]
    if case.exact_replies:
        assert [r for _, r in server.wire_log] == [r for _, r in case.dialogue]


@pytest.mark.parametrize("case", THORLABS, ids=lambda c: c.name)
def test_thorlabs_dialogue(case):
    _dialogue(case, _thorlabs)


@pytest.mark.parametrize("case", THORLABS, ids=lambda c: c.name)
def test_thorlabs_same_case_against_emulator(case, emulated):
    _against_emulator(case, _thorlabs, emulated, "pm-usb")


@pytest.mark.parametrize("case", KEYSIGHT, ids=lambda c: c.name)
def test_keysight_dialogue(case):
    _dialogue(case, _keysight)


@pytest.mark.parametrize("case", KEYSIGHT, ids=lambda c: c.name)
def test_keysight_same_case_against_emulator(case, emulated):
    _against_emulator(case, _keysight, emulated, "pm-lab")


@pytest.mark.parametrize("reply,direction", [("INFINITY", "over"), ("-INFINITY", "under"), ("+INF", "over")])
def test_thorlabs_out_of_range_is_not_a_float(reply, direction):
    steps = [(b"SENS:POW:UNIT?\n", b"DBM\n"), (b"MEAS:POW?\n", reply.encode() + b"\n")]
    with DialogueServer(steps) as server:
        meter = _thorlabs(server.resource)
        value = meter.read_dbm()
        meter.close()
    assert isinstance(value, OutOfRange) and value.direction == direction
    with pytest.raises(TypeError):
        value < -10  # noqa: B015 - it must not compare like a number


def test_keysight_sentinel_is_out_of_range():
    steps = [(b":SENS1:POW:UNIT?\n", b"+0\n"), (b":READ1:CHAN1:POW?\n", b"+9.91000000E+037\n")]
    with DialogueServer(steps) as server:
        meter = _keysight(server.resource)
        value = meter.read_dbm(1)
        meter.close()
    assert isinstance(value, OutOfRange) and value.direction == "over"


def test_keysight_logging_dialogue_reads_a_float32_block():
    samples = [-70.0, -70.1, -13.5, -13.6]
    payload = struct.pack("<4f", *samples)
    block = b"#2" + str(len(payload)).encode() + payload + b"\n"
    steps = [(b":SENS2:POW:UNIT?\n", b"+0\n"), (b":TRIG2:INP IGN\n", None), (b":SYST:ERR?\n", b'+0,"No error"\n'),
             (b":SENS2:FUNC:PAR:LOGG 4,0.001s\n", None), (b":SYST:ERR?\n", b'+0,"No error"\n'),
             (b":SENS2:FUNC:STAT LOGG,STAR;*OPC?\n", b"1\n"), (b":SYST:ERR?\n", b'+0,"No error"\n'),
             (b":SENS2:FUNC:STAT?\n", b"LOGGING_STABILITY,COMPLETE\n"), (b":SENS2:FUNC:RES?\n", block)]
    with DialogueServer(steps) as server:
        meter = _keysight(server.resource)
        trace = meter.trace(2, duration_s=0.004, interval_s=0.001)
        meter.close()
        server.check()
    assert trace.method == "hardware-logging" and len(trace.times_ns) == 4
    assert trace.values_dbm == pytest.approx(samples, abs=1e-4)
    assert trace.times_ns[1] - trace.times_ns[0] == 1_000_000


# --- physics through the coupled world -------------------------------------------------------------


@pytest.fixture
def meters(emulated, bench_cfg):
    opened = {name: open_driver(name, bench_cfg.instruments[name], emulated.resources[name]) for name in ("pm-lab", "pm-usb")}
    yield opened
    for meter in opened.values():
        meter.close()


def test_connect_seen_only_after_switching_time_and_disconnect_is_dark(emulated, meters):
    world, meter = emulated.world, meters["pm-lab"]
    t_cmd = world.now_ns()
    world.connect([(4, 17)])  # host1.p1 -> host0.p0, tapped by pm-lab channel 1
    early = meter.read_dbm(1)
    assert world.now_ns() < t_cmd + 50_000_000, "read before the beam settled"
    assert early < -60
    world.wait_settled()
    lit = meter.read_dbm(1)
    expected = -1.0 - 0.3 - 0.5 - 1.5 - 10.0  # launch, tx fibre, connectors, switch, 10 dB tap
    assert lit == pytest.approx(expected, abs=0.15)
    world.disconnect([(4, 17)])
    assert meter.read_dbm(1) < -60


def test_extra_loss_on_a_path_reads_lower_by_that_loss(emulated, meters):
    world, meter = emulated.world, meters["pm-usb"]
    world.connect([(2, 21)])
    world.wait_settled()
    before = sum(meter.read_dbm() for _ in range(5)) / 5
    world.set_extra_loss(21, 3.0)
    after = sum(meter.read_dbm() for _ in range(5)) / 5
    assert before - after == pytest.approx(3.0, abs=0.06)  # noise 0.02 dB per reading


def test_wrong_wavelength_setting_misreads(emulated, meters):
    world, meter = emulated.world, meters["pm-usb"]
    world.connect([(2, 21)])
    world.wait_settled()
    right = sum(meter.read_dbm() for _ in range(5)) / 5
    meter.set_wavelength_nm(1550)
    wrong = sum(meter.read_dbm() for _ in range(5)) / 5
    assert right - wrong == pytest.approx(0.46, abs=0.06)


def test_logging_trace_shows_the_transition_where_the_world_recorded_it(emulated, meters):
    world, meter = emulated.world, meters["pm-lab"]
    interval_s = 0.001
    handle = meter.start_trace(2, duration_s=0.2, interval_s=interval_s)
    time.sleep(0.02)
    world.connect([(5, 18)])  # lit 50 ms later, tapped by channel 2
    trace = meter.finish_trace(handle)
    (lit,) = world.events_of("circuit.lit")
    seen = trace.first_at_or_above(-30.0)
    assert seen is not None
    tolerance = int(interval_s * 1e9) + trace.start_uncertainty_ns
    assert abs(seen - lit.t_ns) <= tolerance, (seen - lit.t_ns) / 1e6
    assert all(v < -60 for t, v in zip(trace.times_ns, trace.values_dbm) if t < lit.t_ns - tolerance)


def test_out_of_range_fault_fails_a_power_verdict_and_passes_a_darkness_one(emulated, meters, bench_cfg):
    emulated.emulators["pm-lab"].faults["out_of_range"] = None
    value = meters["pm-lab"].read_dbm(1)
    assert isinstance(value, OutOfRange) and value.direction == "over"
    assert not received_power(bench_cfg).measure(value).passed
    assert not dark_after_disconnect(bench_cfg).measure(value).passed  # over range is not dark
    assert dark_after_disconnect(bench_cfg).measure(OutOfRange("under")).passed


@pytest.mark.parametrize("case", KEYSIGHT, ids=lambda c: c.name)
def test_keysight_same_case_over_vxi11(case, emulated):
    """The N77xx as Keysight's tools address it, TCPIP0::<host>::inst0::INSTR (VXI-11; the
    emulator serves the port mapper where it can bind port 111, else pyvisa-py's
    TCPIP0::<host>,<port>::inst0::INSTR): the driver's cases pass as over the raw socket."""
    case.setup(emulated.emulators["pm-lab"])
    meter = _keysight(emulated.vxi11["pm-lab"].resource)
    try:
        _run(case, meter, case.emulator_check)
    finally:
        meter.close()


def test_light_read_over_vxi11_is_the_worlds(emulated, bench_cfg):
    meter = open_driver("pm-lab", bench_cfg.instruments["pm-lab"], emulated.vxi11["pm-lab"].resource)
    try:
        world = emulated.world
        world.connect([(4, 17)])
        world.wait_settled()
        assert meter.read_dbm(1) == pytest.approx(-1.0 - 0.3 - 0.5 - 1.5 - 10.0, abs=0.15)
        world.disconnect([(4, 17)])
        assert meter.read_dbm(1) < -60
    finally:
        meter.close()
