"""Power meters: what the Thorlabs PM100 and Keysight N77xx drivers send and what they make of the
answers, as dialogues in memory; then the same dialogues against their emulators over TCP (and
the N77xx over VXI-11); then the physics only the coupled world can show."""

from __future__ import annotations

import struct
import time

import pytest

from conftest import query_scpi
from dialogue import expect_dialogue, on_the_emulator, on_the_wire
from lumion_hil.harness.binding import open_driver
from lumion_hil.harness.limits import dark_after_disconnect, received_power
from lumion_hil.instruments.keysight_n77xx import KeysightN77xx
from lumion_hil.instruments.protocols import Identity, InstrumentError, OutOfRange
from lumion_hil.instruments.thorlabs_pm100 import ThorlabsPM100
from lumion_hil.instruments.visa import VisaSession, open_resource

PM100_NO_ERROR = ("SYST:ERR?", '0,"No error"')
N77XX_NO_ERROR = (":SYST:ERR?", '+0,"No error"')


def pm100(instrument, timeout_s: float = 0.05) -> ThorlabsPM100:
    """The driver over an instrument in memory; a short deadline, for the silent cases."""
    return pm100_at("USB0::0x1313::0x8078::P0009368::INSTR", timeout_s, instrument.open_resource)


def pm100_at(resource: str, timeout_s: float = 2.0, opener=open_resource) -> ThorlabsPM100:
    return ThorlabsPM100(VisaSession("pm-usb", resource, timeout_s=timeout_s, opener=opener), opc_timeout_s=timeout_s)


def n77xx(instrument, timeout_s: float = 0.05) -> KeysightN77xx:
    return n77xx_at("TCPIP0::pm-lab::5025::SOCKET", timeout_s, instrument.open_resource)


def n77xx_at(resource: str, timeout_s: float = 2.0, opener=open_resource) -> KeysightN77xx:
    session = VisaSession("pm-lab", resource, timeout_s=timeout_s, opener=opener)
    return KeysightN77xx(session, channels=4, opc_timeout_s=timeout_s)


# -- Thorlabs PM100: dialogues ----------------------------------------------------------------------

PM100_IDENTIFY = [("*IDN?", "Thorlabs,PM100D,P0009368,2.4.0")]


def test_pm100_identify():
    with expect_dialogue(pm100, PM100_IDENTIFY) as meter:
        assert meter.identify() == Identity("Thorlabs", "PM100D", "P0009368", "2.4.0")


PM100_SET_WAVELENGTH = [("SENS:CORR:WAV 1310", None), PM100_NO_ERROR]


def test_pm100_set_wavelength_in_nm_then_the_error_queue():
    with expect_dialogue(pm100, PM100_SET_WAVELENGTH) as meter:
        meter.set_wavelength_nm(1310)


PM100_WAVELENGTH = [("SENS:CORR:WAV?", "1.550000E+03")]


def test_pm100_wavelength_is_in_nm():
    with expect_dialogue(pm100, PM100_WAVELENGTH) as meter:
        assert meter.wavelength_nm() == 1550.0


PM100_UNIT_DBM = [("SENS:POW:UNIT DBM", None), PM100_NO_ERROR]


def test_pm100_unit_dbm():
    with expect_dialogue(pm100, PM100_UNIT_DBM) as meter:
        meter.set_unit("dbm")


PM100_AVERAGING = [("SENS:AVER:COUN 10", None), PM100_NO_ERROR]


def test_pm100_averaging_count():
    with expect_dialogue(pm100, PM100_AVERAGING) as meter:
        meter.set_averaging(10)


PM100_AUTO_RANGE = [("SENS:POW:RANG:AUTO ON", None), PM100_NO_ERROR]


def test_pm100_auto_range():
    with expect_dialogue(pm100, PM100_AUTO_RANGE) as meter:
        meter.set_auto_range(True)


PM100_READ_WATTS = [("SENS:POW:UNIT?", "W"), ("MEAS:POW?", "1.000000E-03")]


def test_pm100_asks_the_unit_once_and_turns_a_reading_in_watts_into_dbm():
    with expect_dialogue(pm100, PM100_READ_WATTS + [("MEAS:POW?", "1.000000E-04")]) as meter:
        assert meter.read_dbm() == pytest.approx(0.0)
        assert meter.read_dbm() == pytest.approx(-10.0)


PM100_ERROR_QUEUE = [("SENS:POW:UNIT W", None), PM100_NO_ERROR, ("SENS:BOGUS 1", None),
                     ("SYST:ERR?", '-113,"Undefined header"'), PM100_NO_ERROR]


def test_pm100_reads_its_error_queue_to_the_end_and_names_what_it_held():
    with expect_dialogue(pm100, PM100_ERROR_QUEUE) as meter:
        meter.set_unit("W")
        with pytest.raises(InstrumentError, match=r"^pm-usb: 'SENS:BOGUS 1': instrument reported: -113 Undefined "
                                                  r"header$"):
            meter.send("SENS:BOGUS 1")


@pytest.mark.parametrize("reply,direction", [("INFINITY", "over"), ("-INFINITY", "under"), ("+INF", "over")])
def test_pm100_out_of_range_is_not_a_float(reply, direction):
    with expect_dialogue(pm100, [("SENS:POW:UNIT?", "DBM"), ("MEAS:POW?", reply)]) as meter:
        value = meter.read_dbm()
    assert isinstance(value, OutOfRange) and value.direction == direction
    with pytest.raises(TypeError):
        value < -10  # noqa: B015 - it must not compare like a number


def test_pm100_no_light_in_watts_is_under_range_not_minus_infinity():
    with expect_dialogue(pm100, [("SENS:POW:UNIT?", "W"), ("MEAS:POW?", "0.000000E+00")]) as meter:
        value = meter.read_dbm()
    assert isinstance(value, OutOfRange) and value.direction == "under"


# -- Keysight N77xx: dialogues ----------------------------------------------------------------------

N77XX_IDENTIFY = [("*IDN?", "Keysight Technologies,N7744A,MY12345678,1.0.0")]


def test_n77xx_identify():
    with expect_dialogue(n77xx, N77XX_IDENTIFY) as meter:
        assert meter.identify() == Identity("Keysight Technologies", "N7744A", "MY12345678", "1.0.0")


N77XX_SET_WAVELENGTH = [(":SENS2:POW:WAV 1310nm", None), N77XX_NO_ERROR]


def test_n77xx_set_wavelength_on_a_port_with_its_unit():
    with expect_dialogue(n77xx, N77XX_SET_WAVELENGTH) as meter:
        meter.set_wavelength_nm(1310, 2)


N77XX_WAVELENGTH = [(":SENS3:POW:WAV?", "+1.55000000E-006")]


def test_n77xx_wavelength_comes_in_metres():
    with expect_dialogue(n77xx, N77XX_WAVELENGTH) as meter:
        assert meter.wavelength_nm(3) == pytest.approx(1550.0)


N77XX_AVERAGING_TIME = [(":SENS1:POW:ATIME 0.001s", None), N77XX_NO_ERROR]


def test_n77xx_averaging_time_in_seconds():
    with expect_dialogue(n77xx, N77XX_AVERAGING_TIME) as meter:
        meter.set_averaging_time_s(0.001, 1)


N77XX_READ = [(":SENS4:POW:UNIT?", "+0"), (":READ4:CHAN1:POW?", "-7.00000000E+001")]


def test_n77xx_reads_a_port_once_its_unit_is_known_to_be_dbm():
    with expect_dialogue(n77xx, N77XX_READ + [(":READ4:CHAN1:POW?", "-6.90000000E+001")]) as meter:
        assert meter.read_dbm(4) == -70.0
        assert meter.read_dbm(4) == -69.0


N77XX_UNIT_TO_DBM = [(":SENS1:POW:UNIT?", "+1"), (":SENS1:POW:UNIT 0", None), N77XX_NO_ERROR,
                     (":READ1:CHAN1:POW?", "-7.00000000E+001")]


def test_n77xx_switches_a_port_reading_watts_to_dbm_before_reading():
    with expect_dialogue(n77xx, N77XX_UNIT_TO_DBM) as meter:
        assert meter.read_dbm(1) == -70.0


N77XX_INSTALLED = [(f":SLOT{slot}:EMPT?", "+0") for slot in range(1, 5)] + [(":SLOT5:EMPT?", "+1")]


def test_n77xx_counts_its_ports_up_to_the_first_empty_slot():
    with expect_dialogue(n77xx, N77XX_INSTALLED) as meter:
        assert meter.installed_channels() == 4


def test_n77xx_a_port_it_does_not_have_is_refused_before_anything_is_sent():
    with expect_dialogue(n77xx, []) as meter:
        with pytest.raises(ValueError, match=r"^pm-lab: channel 5 out of 1\.\.4$"):
            meter.read_dbm(5)


def test_n77xx_over_range_sentinel_is_out_of_range():
    with expect_dialogue(n77xx, [(":SENS1:POW:UNIT?", "+0"), (":READ1:CHAN1:POW?", "+9.91000000E+037")]) as meter:
        value = meter.read_dbm(1)
    assert isinstance(value, OutOfRange) and value.direction == "over"


def _float32_block(samples: list[float]) -> bytes:
    """An IEEE 488.2 definite-length block: #, the count of length digits, the length, the bytes."""
    payload = struct.pack(f"<{len(samples)}f", *samples)
    length = str(len(payload)).encode()
    return b"#" + str(len(length)).encode() + length + payload + b"\n"


def test_n77xx_logging_is_timed_by_the_meter_and_read_as_a_float32_block():
    samples = [-70.0, -70.1, -13.5, -13.6]
    with expect_dialogue(n77xx, [
        (":SENS2:POW:UNIT?", "+0"),
        (":TRIG2:INP IGN", None), N77XX_NO_ERROR,
        (":SENS2:FUNC:PAR:LOGG 4,0.001s", None), N77XX_NO_ERROR,
        (":SENS2:FUNC:STAT LOGG,STAR;*OPC?", "1"), N77XX_NO_ERROR,
        (":SENS2:FUNC:STAT?", "LOGGING_STABILITY,PROGRESS"),  # asked again until it is done
        (":SENS2:FUNC:STAT?", "LOGGING_STABILITY,COMPLETE"),
        (":SENS2:FUNC:RES?", _float32_block(samples)),
    ]) as meter:
        trace = meter.trace(2, duration_s=0.004, interval_s=0.001)
    assert trace.method == "hardware-logging" and len(trace.times_ns) == 4
    assert trace.values_dbm == pytest.approx(samples, abs=1e-4)
    assert trace.times_ns[1] - trace.times_ns[0] == 1_000_000


def test_n77xx_a_logging_result_short_of_samples_is_an_error():
    with expect_dialogue(n77xx, [
        (":SENS1:POW:UNIT?", "+0"),
        (":TRIG1:INP IGN", None), N77XX_NO_ERROR,
        (":SENS1:FUNC:PAR:LOGG 4,0.001s", None), N77XX_NO_ERROR,
        (":SENS1:FUNC:STAT LOGG,STAR;*OPC?", "1"), N77XX_NO_ERROR,
        (":SENS1:FUNC:STAT?", "LOGGING_STABILITY,COMPLETE"),
        (":SENS1:FUNC:RES?", _float32_block([-70.0, -70.0])),
    ]) as meter:
        with pytest.raises(InstrumentError, match=r"^pm-lab: ':SENS1:FUNC:RES\?': expected 4 samples, got 2$"):
            meter.trace(1, duration_s=0.004, interval_s=0.001)


# -- the same dialogues against the emulators, over TCP ---------------------------------------------
# The dialogues above are written from the programming guides, and so, apart from the drivers,
# are the emulators: here each driver talks to its emulator over a socket and the wire must carry
# the dialogue's commands and, where the instrument's answer is fixed, its replies.


pm_usb, pm_usb_wire = on_the_emulator("pm-usb", pm100_at, driver="pm_usb", wire="pm_usb_wire")
pm_lab, pm_lab_wire = on_the_emulator("pm-lab", n77xx_at, driver="pm_lab", wire="pm_lab_wire")


def test_emulator_pm100_identify(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_IDENTIFY, exact_replies=False):  # the serial number is the emulator's own
        identity = pm_usb.identify()
    assert (identity.vendor, identity.model) == ("Thorlabs", "PM100D")


def test_emulator_pm100_set_wavelength(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_SET_WAVELENGTH):
        pm_usb.set_wavelength_nm(1310)


def test_emulator_pm100_wavelength(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_WAVELENGTH):
        pm_usb.wavelength_nm()


def test_emulator_pm100_unit_dbm(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_UNIT_DBM):
        pm_usb.set_unit("dbm")


def test_emulator_pm100_averaging(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_AVERAGING):
        pm_usb.set_averaging(10)


def test_emulator_pm100_auto_range(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_AUTO_RANGE):
        pm_usb.set_auto_range(True)


def test_emulator_pm100_reads_watts(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_READ_WATTS, exact_replies=False):  # a reading carries noise
        value = pm_usb.read_dbm()
    assert isinstance(value, float) and value < -50  # nothing connected: dark


def test_emulator_pm100_error_queue(pm_usb, pm_usb_wire):
    with on_the_wire(pm_usb_wire, PM100_ERROR_QUEUE):
        pm_usb.set_unit("W")
        with pytest.raises(InstrumentError, match="-113 Undefined header"):
            pm_usb.send("SENS:BOGUS 1")


def test_emulator_n77xx_identify(pm_lab, pm_lab_wire):
    with on_the_wire(pm_lab_wire, N77XX_IDENTIFY, exact_replies=False):
        assert pm_lab.identify().model == "N7744A"


def test_emulator_n77xx_set_wavelength(pm_lab, pm_lab_wire):
    with on_the_wire(pm_lab_wire, N77XX_SET_WAVELENGTH):
        pm_lab.set_wavelength_nm(1310, 2)


def test_emulator_n77xx_wavelength(pm_lab, pm_lab_wire):
    with on_the_wire(pm_lab_wire, N77XX_WAVELENGTH):
        pm_lab.wavelength_nm(3)


def test_emulator_n77xx_averaging_time(pm_lab, pm_lab_wire):
    with on_the_wire(pm_lab_wire, N77XX_AVERAGING_TIME):
        pm_lab.set_averaging_time_s(0.001, 1)


def test_emulator_n77xx_installed_channels(pm_lab, pm_lab_wire):
    with on_the_wire(pm_lab_wire, N77XX_INSTALLED):
        pm_lab.installed_channels()


def test_emulator_n77xx_read(pm_lab, pm_lab_wire):
    with on_the_wire(pm_lab_wire, N77XX_READ, exact_replies=False):  # a reading carries noise
        value = pm_lab.read_dbm(4)
    assert isinstance(value, float) and value < -60


def _leave_port_1_reading_watts(resource: str) -> None:
    """As another client (or the front panel) may leave it."""
    assert query_scpi(resource, b":SENS1:POW:UNIT 1;*OPC?") == "1"


def test_emulator_n77xx_unit_to_dbm(pm_lab, pm_lab_wire, emulated):
    _leave_port_1_reading_watts(emulated.resources["pm-lab"])
    with on_the_wire(pm_lab_wire, N77XX_UNIT_TO_DBM, exact_replies=False):
        assert isinstance(pm_lab.read_dbm(1), float)


def test_the_n77xx_driver_works_over_vxi11_as_over_the_socket(emulated):
    """The N77xx as Keysight's tools address it, TCPIP0::<host>::inst0::INSTR (VXI-11; the
    emulator serves the port mapper where it can bind port 111, else pyvisa-py's
    TCPIP0::<host>,<port>::inst0::INSTR): the dialogues' calls give what they give over the raw
    socket."""
    _leave_port_1_reading_watts(emulated.resources["pm-lab"])
    meter = n77xx_at(emulated.vxi11["pm-lab"].resource)
    try:
        assert meter.identify().model == "N7744A"
        meter.set_wavelength_nm(1310, 2)
        assert meter.wavelength_nm(2) == pytest.approx(1310.0)
        assert meter.wavelength_nm(3) == pytest.approx(1550.0)
        meter.set_averaging_time_s(0.001, 1)
        reading = meter.read_dbm(4)
        assert isinstance(reading, float) and reading < -60
        assert isinstance(meter.read_dbm(1), float) and meter.ask(":SENS1:POW:UNIT?") == "+0"
        with pytest.raises(ValueError, match="channel 5 out of 1..4"):
            meter.read_dbm(5)
    finally:
        meter.close()


# -- physics through the coupled world --------------------------------------------------------------


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
