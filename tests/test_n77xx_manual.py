"""The emulated N7744A against its programming guide where the generic conformance test cannot
see: values that snap to the meter's own, units with SI multipliers, the trigger configuration,
the status registers' enable and transition filters, single-measurement logging and the errors
of refused commands."""

from __future__ import annotations

import struct
import time

import pytest

from conftest import BENCHES
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.keysight_n77xx import KeysightN77xxEmulator
from lumion_hil.instruments.emulators.world import World

NO_ERROR = '+0,"No error"'


@pytest.fixture
def meter():
    bench = load_bench(BENCHES / "emulated.yaml", time_scale=0.01)
    name, spec = next((n, s) for n, s in bench.instruments.items() if s.model == "keysight-n77xx")
    return KeysightN77xxEmulator(name, spec, World(bench), bench)


def ask(meter, line: str) -> str:
    reply = meter.handle_line(line)
    return reply.decode("latin-1") if isinstance(reply, bytes) else reply


def errors(meter) -> list[int]:
    found = []
    while (reply := meter.handle_line(":SYST:ERR?")) != NO_ERROR:
        found.append(int(reply.split(",")[0]))
    return found


@pytest.mark.parametrize("given,seconds", [("100US", 1e-4), ("100 us", 1e-4), ("1MS", 1e-3), ("1.4ms", 1e-3),
                                           ("1.6E-3", 2e-3), ("0.3S", 0.2), ("4 s", 5.0), ("700000NS", 5e-4),
                                           ("MAX", 10.0), ("MIN", 1e-4)])
def test_averaging_time_takes_si_multipliers_and_snaps_to_the_meters_steps(meter, given, seconds):
    meter.handle_line(f":SENS1:POW:ATIM {given}")
    assert errors(meter) == []
    assert float(ask(meter, ":SENS1:POW:ATIM?")) == pytest.approx(seconds)


@pytest.mark.parametrize("given", ["10US", "11S", "1 KG"])
def test_averaging_time_outside_the_meter_is_refused(meter, given):
    meter.handle_line(f":SENS1:POW:ATIM {given}")
    assert errors(meter) in ([-222], [-131])
    assert float(ask(meter, ":SENS1:POW:ATIM?")) == pytest.approx(1e-4)


@pytest.mark.parametrize("given,dbm", [("-20DBM", -20), ("-24", -20), ("-26", -30), ("3", 0), ("12", 10),
                                       ("-34", -30), ("-12000MDBM", -10), ("MIN", -30), ("DEF", 10)])
def test_range_rounds_to_the_closest_multiple_of_ten(meter, given, dbm):
    meter.handle_line(f":SENS2:POW:RANG {given}")
    assert errors(meter) == []
    assert float(ask(meter, ":SENS2:POW:RANG?")) == dbm
    assert ask(meter, ":SENS2:POW:RANG:AUTO?") == "+0"
    meter.handle_line(":SENS2:POW:RANG -40")
    assert errors(meter) == [-222]


def test_wavelength_units_resolution_and_range(meter):
    meter.handle_line(":SENS1:POW:WAV 1.31UM")
    assert float(ask(meter, ":SENS1:POW:WAV?")) == pytest.approx(1.31e-6)
    meter.handle_line(":SENS1:POW:WAV 1550.123456NM")
    assert meter.channels[1].head.wavelength_nm == 1550.12
    meter.handle_line(":SENS1:POW:WAV 1310")  # a bare number: nm
    assert meter.channels[1].head.wavelength_nm == 1310.0
    meter.handle_line(":SENS:POW:WAV:ALL 1625NM")
    assert ask(meter, ":SENS:POW:WAV:ALL:CSV?") == ",".join(["+1.62500000E-006"] * 4)
    meter.handle_line(":SENS1:POW:WAV 850NM")
    assert errors(meter) == [-222]


def test_reference_in_watts_with_multipliers(meter):
    meter.handle_line(":SENS1:POW:REF TOREF,100UW")
    assert float(ask(meter, ":SENS1:POW:REF? TOREF")) == pytest.approx(-10.0)
    meter.handle_line(":SENS1:POW:REF TOMOD,1.5DB")
    assert float(ask(meter, ":SENS1:POW:REF? TOMOD")) == pytest.approx(1.5)
    assert errors(meter) == []


def test_trigger_configuration_gates_the_hardware_trigger(meter):
    assert ask(meter, ":TRIG:CONF?") == "+1"  # DEFault: the connectors work
    meter.handle_line(":TRIG1:INP CME;:SENS1:FUNC:PAR:LOGG 5,100US;:SENS1:FUNC:STAT LOGG,STAR")
    meter.handle_line(":TRIG:CONF DIS")
    assert ask(meter, ":TRIG:CONF?") == "+0"
    meter.handle_line(":TRIG NODEA")  # not effective while the connectors are disabled
    assert ask(meter, ":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS" and meter.channels[1].armed
    meter.handle_line(":TRIG:CONF PASS")
    meter.handle_line(":TRIG NODEB")  # the output connector: nothing comes back
    assert meter.channels[1].armed
    meter.handle_line(":TRIG:CONF 3")  # LOOPback: an output trigger comes back in
    meter.handle_line(":TRIG 2")
    assert not meter.channels[1].armed
    time.sleep(0.01)
    assert ask(meter, ":SENS1:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    meter.handle_line(":TRIG:CONF BOGUS")
    assert errors(meter) == [-224]
    meter.handle_line("*RST")
    assert ask(meter, ":TRIG:CONF?") == "+1"


def test_single_measurement_logging_takes_a_sample_per_trigger(meter):
    meter.handle_line(":TRIG2:INP SME;:SENS2:FUNC:PAR:LOGG 3,100US;:SENS2:FUNC:STAT LOGG,STAR")
    assert errors(meter) == []
    for taken in range(3):
        assert ask(meter, ":SENS2:FUNC:RES:IND?") == f"+{taken}"
        assert ask(meter, ":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,PROGRESS"
        meter.handle_line(":TRIG NODEA")
    time.sleep(0.001)
    assert ask(meter, ":SENS2:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    block = meter.handle_line(":SENS2:FUNC:RES?")
    assert block.startswith(b"#212") and len(struct.unpack("<3f", block[4:])) == 3
    part = meter.handle_line(":SENS2:FUNC:RES:BLOC? 1,2")
    assert part == b"#18" + block[8:]


def test_stability_and_minmax_functions(meter):
    meter.handle_line(":SENS3:FUNC:PAR:STAB 2MS,1MS,1MS;:SENS3:FUNC:STAT STAB,STAR")
    assert ask(meter, ":SENS3:FUNC:PAR:STAB?") == "+2.00000000E-003,+1.00000000E-003,+1.00000000E-003"
    time.sleep(0.01)
    assert ask(meter, ":SENS3:FUNC:STAT?") == "LOGGING_STABILITY,COMPLETE"
    assert meter.handle_line(":SENS3:FUNC:RES?").startswith(b"#14")  # one sample: 2 ms / (1 ms + 1 ms)
    meter.handle_line(":SENS4:FUNC:PAR:MINM WIND,10;:SENS4:FUNC:STAT MINM,STAR")
    # The 8163/8164/8166 guide (p. 99): the query answers the short forms CONT, WIND, REFR ("WIND,+10")
    assert ask(meter, ":SENS4:FUNC:PAR:MINM?") == "WIND,+10"
    time.sleep(0.005)
    assert ask(meter, ":SENS4:FUNC:STAT?") == "MINMAX,PROGRESS"
    low, high, current = struct.unpack("<3f", meter.handle_line(":SENS4:FUNC:RES?")[4:])
    assert low <= high and -80 < current < -60  # a dark port
    meter.handle_line(":SENS4:FUNC:STAT MINM,STOP")
    assert ask(meter, ":SENS4:FUNC:STAT?") == "NONE,COMPLETE"
    assert errors(meter) == []


def test_status_registers_enable_and_transition_filters(meter):
    for register in ("OPER", "QUES"):
        meter.handle_line(f":STAT:{register}:ENAB 6")
        assert ask(meter, f":STAT:{register}:ENAB?") == "+6"
    meter.handle_line(":STAT:QUES:ENAB 65536")
    assert errors(meter) == [-222]
    assert ask(meter, ":STAT:OPER:COND?") == "+0"
    meter.handle_line(":SENS1:FUNC:PAR:LOGG 20,1MS;:SENS1:FUNC:STAT LOGG,STAR")
    assert ask(meter, ":STAT:OPER:COND?") == "+2"  # port 1's function runs
    assert int(ask(meter, "*STB?")) & 128  # OPERation's summary, enabled
    meter.handle_line("*SRE 128")
    assert int(ask(meter, "*STB?")) & 64
    assert ask(meter, ":STAT:OPER?") == "+2"
    assert ask(meter, ":STAT:OPER?") == "+0"  # reading the event register clears it
    meter.handle_line(":STAT:OPER:NTR 2")
    time.sleep(0.03)
    assert ask(meter, ":STAT:OPER:COND?") == "+0"
    assert ask(meter, ":STAT:OPER:EVEN?") == "+2"  # the end of the run, through the negative filter
    meter.faults["out_of_range"] = None
    assert ask(meter, ":STAT:QUES:COND?") == "+30"  # every port over range
    assert int(ask(meter, "*STB?")) & 8
    meter.handle_line("*CLS")
    assert ask(meter, ":STAT:QUES?") == "+0" and ask(meter, ":STAT:QUES:ENAB?") == "+6"
    meter.handle_line(":STAT:PRES")
    assert [ask(meter, f":STAT:QUES:{r}?") for r in ("ENAB", "PTR", "NTR")] == ["+0", "+32767", "+0"]


@pytest.mark.parametrize("line,code", [(":SOUR1:WAV 1550NM", -241), (":OUTP1 ON", -241), (":LOCK?", -241),
                                       (":DISP:BRIG 1", -241), (":SLOT1:HEAD1:IDN?", -241),
                                       (":SYST:COMM:ETH:IPAD \"10.0.0.2\"", -221), (":SPEC:REB", -221),
                                       (":TRIG:CONF:EXT 0,0,0", -221), (":SENS1:POW:BOGUS 1", -113)])
def test_refused_commands_answer_the_error_a_real_meter_gives(meter, line, code):
    assert meter.handle_line(line) is None
    assert errors(meter) == [code]


def test_slots_are_the_ports(meter):
    assert ask(meter, ":SLOT1:EMPT?") == "+0" and ask(meter, ":SLOT5:EMPT?") == "+1"
    assert ask(meter, ":SLOT2:IDN?").startswith("Keysight Technologies,N7744A")
    assert meter.handle_line(":READ:POW:ALL:CONF?") == b"#216" + struct.pack("<8H", 1, 1, 2, 1, 3, 1, 4, 1)
    meter.handle_line(":SLOT5:IDN?")
    assert errors(meter) == [-241]
