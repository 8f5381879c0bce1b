"""The emulated PM100D against what its SCPI reference says and the generic conformance test
cannot see: ranges snap to the meter's own (so drivers that step ranges converge), the current
range is one gain stage with the power range, the user attenuation in every spelling, frequency
measurement of modulated light, and the refusals' error numbers. In process, as
tests/test_conformance.py drives the emulators."""

from __future__ import annotations

import math
import time

import pytest

from conftest import BENCHES
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.thorlabs_pm100 import ThorlabsPM100Emulator
from lumion_hil.instruments.emulators.thorlabs_pm100_tables import CURRENT_RANGES_A, OVER_RANGE, POWER_RANGES_W
from lumion_hil.instruments.emulators.world import World

NO_ERROR = '0,"No error"'


def _meter(lit: bool, time_scale: float = 0.01):
    bench = load_bench(BENCHES / "emulated.yaml", time_scale=time_scale)
    world = World(bench)
    meter = ThorlabsPM100Emulator("pm-usb", bench.instruments["pm-usb"], world, bench)
    if lit:
        world.connect(bench.safety.baseline)
        deadline = time.monotonic() + 5
        while world.port_power_dbm(meter.head.tap.port) is None:  # the switch settles
            assert time.monotonic() < deadline, "no light reached the tap"
            time.sleep(0.001)
    return meter, world


@pytest.fixture
def dark():
    return _meter(lit=False)[0]


@pytest.fixture
def lit():
    return _meter(lit=True)


def ask(meter, line: str) -> str:
    reply = meter.handle_line(line)
    return reply.decode() if isinstance(reply, bytes) else reply


def errors(meter) -> list[str]:
    found = []
    while (reply := ask(meter, "SYST:ERR?")) != NO_ERROR:
        found.append(reply)
    return found


def test_a_range_asked_for_snaps_to_the_smallest_range_that_holds_it(dark):
    dark.handle_line("SENS:CURR:RANG 3e-6")
    assert float(ask(dark, "SENS:CURR:RANG?")) == 5e-6
    assert ask(dark, "SENS:CURR:RANG:AUTO?") == "0"  # choosing a range ends auto ranging
    dark.handle_line("SENSE1:CURRENT:DC:RANGE:UPPER 50 UA")
    assert float(ask(dark, "CURR:RANG?")) == 5e-5
    dark.handle_line("POW:RANG 1.1e-3")
    assert float(ask(dark, "POW:RANG?")) == 2e-3
    dark.handle_line("POW:RANG 1")  # more than the least sensitive range: that one
    assert float(ask(dark, "POW:RANG?")) == POWER_RANGES_W[-1]
    assert float(ask(dark, "POW:RANG? 3e-7")) == 5e-7  # the range that would hold it, unchanged
    assert float(ask(dark, "POW:RANG?")) == POWER_RANGES_W[-1]
    assert (float(ask(dark, "CURR:RANG? MIN")), float(ask(dark, "CURR:RANG? MAX"))) == (2e-8, 2e-2)
    listing = [float(v) for v in ask(dark, "SENS:CURR:RANG? AUTO").split(",")]
    assert listing == sorted(CURRENT_RANGES_A, reverse=True)  # least sensitive first
    assert errors(dark) == []


def test_current_and_power_ranges_are_one_gain_stage(dark):
    dark.handle_line("SENS:CURR:RANG 1e-4")
    assert float(ask(dark, "SENS:POW:RANG?")) == 1e-4
    dark.handle_line("SENS:POW:RANG:AUTO ON")
    assert ask(dark, "SENS:CURR:RANG:AUTO?") == "1"
    dark.handle_line("CURR:RANG DEF")  # the reference takes MIN and MAX only
    dark.handle_line("CURR:RANG -1")
    assert [e.split(",")[0] for e in errors(dark)] == ["-224", "-222"]


@pytest.mark.parametrize("quantity", ["CURR", "POW"])
def test_range_steps_down_and_up_one_gain_level(dark, quantity):
    """The PM100D2-series reference (V 1.0.5.58): UP and DOWN switch to the next less or more
    sensitive gain, where there is one; either ends auto ranging."""
    dark.handle_line(f"SENS:{quantity}:RANG 1e-4")
    first = float(ask(dark, f"SENS:{quantity}:RANG?"))
    dark.handle_line(f"SENS:{quantity}:RANG:AUTO ON")
    dark.handle_line(f"SENS:{quantity}:RANG DOWN")
    smaller = float(ask(dark, f"SENS:{quantity}:RANG?"))
    assert smaller < first and ask(dark, f"SENS:{quantity}:RANG:AUTO?") == "0"
    assert float(ask(dark, f"SENS:{quantity}:RANG? {smaller * 1.01:.6E}")) == first  # the next one up holds more
    dark.handle_line(f"SENSE1:{quantity}:DC:RANGE:UPPER UP")
    assert float(ask(dark, f"SENS:{quantity}:RANG?")) == first
    dark.handle_line(f"SENS:{quantity}:RANG MIN")
    dark.handle_line(f"SENS:{quantity}:RANG DOWN")  # no more sensitive gain: stays
    assert float(ask(dark, f"SENS:{quantity}:RANG?")) == float(ask(dark, f"SENS:{quantity}:RANG? MIN"))
    dark.handle_line(f"SENS:{quantity}:RANG MAX")
    dark.handle_line(f"SENS:{quantity}:RANG UP")
    assert float(ask(dark, f"SENS:{quantity}:RANG?")) == float(ask(dark, f"SENS:{quantity}:RANG? MAX"))
    assert errors(dark) == []
    dark.handle_line(f"SENS:{quantity}:RANG? UP")  # the query takes a value, MIN, MAX or AUTO only
    assert [e.split(",")[0] for e in errors(dark)] == ["-224"]


def test_a_range_change_pauses_measuring_while_the_gain_settles():
    """The reference: changing the range interrupts the measurement for up to 10 ms while the
    analogue stage settles, and bit 2 of the Operation condition register says ranging. At
    full time scale, so that the 10 ms are longer than the commands around them."""
    meter, world = _meter(lit=False, time_scale=1.0)
    assert int(ask(meter, "STAT:OPER:COND?")) & 4 == 0
    changed = world.now_ns()
    meter.handle_line("SENS:POW:RANG MAX")
    assert int(ask(meter, "STAT:OPER:COND?")) & 4
    ask(meter, "MEAS:POW?")
    assert world.now_ns() - changed >= 10_000_000 + 1_000_000  # the settling, then one 1 ms sample
    assert int(ask(meter, "STAT:OPER:COND?")) & 4 == 0
    assert int(ask(meter, "STAT:OPER?")) & 4  # the event register kept that it ranged
    assert int(ask(meter, "STAT:OPER?")) == 0  # and reading it cleared it


def test_the_vendor_example_turns_auto_ranging_on_without_a_quantity(dark):
    """Thorlabs' own pyvisa example writes SENS:RANGE:AUTO ON, which its reference does not
    list (it writes SENS:POW:RANG:AUTO): the emulator follows the example (one gain stage)."""
    dark.handle_line("SENS:POW:RANG 1e-3")
    dark.handle_line("SENS:RANGE:AUTO ON")
    assert ask(dark, "SENS:POW:RANG:AUTO?") == "1" and errors(dark) == []


def test_a_driver_stepping_ranges_down_reaches_the_bottom(dark):
    """Down a tenth at a time until the range is the most sensitive one: the meter's own ranges
    end the loop (a meter keeping any number it is given never equals its MIN exactly)."""
    bottom = float(ask(dark, "SENS:POW:RANG? MIN"))
    dark.handle_line("SENS:POW:RANG MAX")
    seen = []
    for _ in range(20):
        current = float(ask(dark, "SENS:POW:RANG?"))
        seen.append(current)
        if current == bottom:
            break
        dark.handle_line(f"SENS:POW:RANG {current / 10:.6E}")
    assert seen[-1] == bottom and seen == sorted(seen, reverse=True) and len(seen) <= 8
    assert errors(dark) == []


def test_a_driver_fitting_the_range_to_the_light_settles(lit):
    meter, _ = lit
    meter.handle_line("SENS:POW:UNIT W")
    meter.handle_line("SENS:POW:RANG MAX")
    ranges = []
    for _ in range(6):
        power = float(ask(meter, "MEAS:POW?"))
        assert power < OVER_RANGE / 10
        meter.handle_line(f"SENS:POW:RANG {power * 1.2:.6E}")
        ranges.append(float(ask(meter, "SENS:POW:RANG?")))
        if len(ranges) > 1 and ranges[-1] == ranges[-2]:
            break
    assert ranges[-1] == ranges[-2] and ranges[-1] in POWER_RANGES_W
    assert power <= ranges[-1]


def test_light_above_a_manual_range_is_over_range_and_auto_ranging_follows_it(lit):
    meter, _ = lit
    meter.handle_line("SENS:POW:RANG MIN")
    assert float(ask(meter, "MEAS:POW?")) == OVER_RANGE
    assert float(ask(meter, "MEAS:CURR?")) == OVER_RANGE
    meter.handle_line("SENS:POW:RANG:AUTO ON")
    power = float(ask(meter, "MEAS:POW?"))
    chosen = float(ask(meter, "SENS:POW:RANG?"))
    assert 1e-6 < power <= chosen and chosen in POWER_RANGES_W
    assert chosen == min(r for r in POWER_RANGES_W if r >= power)
    current = float(ask(meter, "MEAS:CURR?"))
    responsivity = float(ask(meter, "SENS:CORR:POW?"))
    assert current == pytest.approx(power * responsivity, rel=0.05)


@pytest.mark.parametrize("spelling", ["SENS:CORR", "CORR:LOSS", "CORR:LOSS:INP", "CORR:MAGN", "SENS1:CORR:LOSS:INP:MAGN"])
def test_the_user_attenuation_in_every_spelling(lit, spelling):
    meter, _ = lit
    meter.handle_line("SENS:POW:UNIT DBM")
    before = float(ask(meter, "MEAS:POW?"))
    meter.handle_line(f"{spelling} 3")
    assert float(ask(meter, f"{spelling}?")) == 3.0
    after = float(ask(meter, "MEAS:POW?"))
    assert after - before == pytest.approx(3.0, abs=0.3)
    assert float(ask(meter, "CORR? MAX")) == 60.0 and float(ask(meter, "CORR? DEF")) == 0.0
    assert errors(meter) == []


def test_frequency_of_cw_light_is_zero_and_of_modulated_light_its_rate():
    # At a fifth of real time: the modulation below (10 bench seconds) lasts 2 s, far longer than
    # it takes to schedule it on a loaded machine (at 0.01 it lasted 0.1 s, and a CI run's meter
    # gated after it had ended: 0 Hz), and the gate (0.1 s) falls inside it.
    meter, world = _meter(lit=True, time_scale=0.2)
    assert float(ask(meter, "MEAS:FREQ?")) == 0.0
    assert ask(meter, "CONF?") == "FREQ"
    ingress = next(i for i, e in world.connections().items() if e == meter.head.tap.port)
    rate_hz = 20.0  # on and off 20 times a (bench) second, through the whole gate and after it
    half_ns = world.scaled_ns(0.5 / rate_hz)
    start = world.now_ns()
    for k in range(int(2 * rate_hz * 10)):
        world.set_source(ingress, k % 2 == 1, start + k * half_ns)
    measured = float(ask(meter, "MEAS:FREQ?"))
    assert measured == pytest.approx(rate_hz, abs=4.0)
    meter.handle_line("SENS:PEAK 99")  # a threshold above the light: no edges
    meter.handle_line("SENS:POW:RANG MAX")
    assert float(ask(meter, "MEAS:FREQ?")) == 0.0
    assert errors(meter) == []


def test_settings_snap_to_what_the_meter_takes(dark):
    dark.handle_line("SENS:CORR:WAV 1310.4")
    assert float(ask(dark, "SENS:CORR:WAV?")) == 1310.0
    dark.handle_line("SENS:AVER 2.5")
    assert ask(dark, "SENS:AVER?") == "3"
    dark.handle_line("SENS:PEAK 33.3")
    assert ask(dark, "SENS:PEAK?") == "33"
    assert float(ask(dark, "SENS:CORR:POW? 1310")) == pytest.approx(0.9)
    assert errors(dark) == []


def test_the_measurement_system(dark):
    assert ask(dark, "FETC:STAT?") == "0"
    dark.handle_line("FETC?")
    assert errors(dark) == ['-230,"Data corrupt or stale"']
    dark.handle_line("CONF:CURR")
    dark.handle_line("INIT")
    assert ask(dark, "FETC:STAT?") == "1" and ask(dark, "CONF?") == "CURR"
    assert float(ask(dark, "FETC?")) < 1e-6
    dark.handle_line("CONF:TEMP")
    assert float(ask(dark, "READ?")) == pytest.approx(23.0)
    assert 5e3 < float(ask(dark, "MEAS:RES?")) < 20e3
    assert ask(dark, "CONF?") == "RES"
    dark.handle_line("SENS:CORR:BEAM 10")
    density = float(ask(dark, "MEAS:PDEN?"))
    assert ask(dark, "CONF?") == "POWDENS" and density > 0
    dark.handle_line("ABOR")
    dark.handle_line("FETC?")
    assert [e.split(",")[0] for e in errors(dark)] == ["-230"]


@pytest.mark.parametrize("line,code", [
    ("MEAS:ENER?", -221), ("CONF:ENER", -221), ("SENS:ENER:RANG MAX", -221), ("INP:THER:ACC:TAU 1", -221),
    ("MEAS:VOLT?", -221), ("SENS:VOLT:REF:STAT ON", -221), ("MEAS:POS?", -221), ("SENS:CORR:POW 0.9", -221),
    ("CONF:ARR 10,100", -241), ("SOUR:DIG:DATA 0", -241), ("SENS:TEMP:DATA?", -241), ("SENS:BOGUS 1", -113),
    ("SENS2:CORR:WAV 1310", -114),
])
def test_refusals_answer_the_reference_error(dark, line, code):
    assert ask(dark, line) is None
    found = errors(dark)
    assert len(found) == 1 and int(found[0].split(",")[0]) == code


def test_clock_and_line_frequency(dark):
    dark.handle_line("SYST:DATE 2031,2,28")
    assert ask(dark, "SYST:DATE?") == "2031,02,28"
    dark.handle_line("SYST:TIME 23,59,0")
    assert ask(dark, "SYST:TIME?").startswith("23,59,")
    dark.handle_line("SYST:DATE 2031,2,30")
    dark.handle_line("SYST:LFR 55")
    assert [e.split(",")[0] for e in errors(dark)] == ["-222", "-224"]
    dark.handle_line("SYST:LFR 60")
    assert ask(dark, "SYST:LFR?") == "60"
    assert not math.isnan(float(ask(dark, "FREQ:RANG?")))


def test_rst_resets_settings_not_the_status_registers(dark):
    """The reference: *RST resets SCPI and sensor parameters; to reset the SCPI registers use
    *CLS (and IEEE 488.2 10.32: *RST leaves the status byte, the enable masks and the error
    queue). It cleared the error queue and the masks and raised power-on."""
    assert int(ask(dark, "*ESR?")) & 128  # power on, read once
    dark.handle_line("*ESE 36;*SRE 32;SENS:POW:UNIT DBM")
    dark.handle_line("SENS:NOSUCH 1")  # a command error: -113, ESR bit 5
    dark.handle_line("*RST")
    assert ask(dark, "SENS:POW:UNIT?") == "W"  # the settings are back at their defaults
    assert (ask(dark, "*ESE?"), ask(dark, "*SRE?")) == ("36", "32")
    assert int(ask(dark, "*STB?")) & (4 | 32 | 64) == 4 | 32 | 64  # an error queued, ESB, and MSS through *SRE
    assert ask(dark, "*ESR?") == "32"  # the command error; no power-on
    assert [e.split(",")[0] for e in errors(dark)] == ["-113"]


def test_no_documented_command_is_an_undefined_header():
    """Every header of Thorlabs' reference is known to the emulated meter: implemented, or
    refused for the hardware or sensor it lacks (tests/test_conformance.py checks that each
    refusal is answered with the error named here), never -113 Undefined header."""
    from lumion_hil.instruments.emulators import conformance

    manual = conformance.load("thorlabs-pm100")
    undefined = [c.command for c in manual.commands if c.state == "refused" and c.refused_with == -113]
    assert undefined == [] and len(manual.commands) >= 176  # the reference's 176 and the PM100D manual's own
