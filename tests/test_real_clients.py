"""Real third-party clients of the instruments, unchanged, against the emulators over pyvisa-py:
pymeasure's ThorlabsPM100USB and the ThorlabsPM100 package drive the emulated PM100 through
their public APIs; pyvisa is opened the way real scripts open it."""

from __future__ import annotations

import time

import pytest
import pyvisa

from conftest import BENCHES, needs
from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.bench import EmulatedBench

try:
    import pymeasure.instruments.thorlabs as pymeasure_thorlabs
    from ThorlabsPM100 import ThorlabsPM100
    CLIENTS = ""
except ImportError as exc:
    CLIENTS = f"the third-party clients are not installed ({exc}): scripts/setup installs them"
pytestmark = needs("real-clients", not CLIENTS, CLIENTS)


@pytest.fixture(scope="module")
def bench():
    with EmulatedBench(load_bench(BENCHES / "emulated.yaml", time_scale=0.1)) as emulated:
        emulated.world.connect(emulated.bench.safety.baseline)
        emulated.world.wait_settled()  # light on every tapped receiver before any test reads it
        yield emulated


@pytest.fixture
def pm100(bench):
    bench.emulators["pm-usb"].power_on()  # every test starts from the meter's power-on state
    return bench.resources["pm-usb"]


def test_pymeasure_thorlabs_pm100usb(pm100, bench):
    meter = pymeasure_thorlabs.ThorlabsPM100USB(pm100, visa_library="@py", read_termination="\n",
                                               write_termination="\n", timeout=5000)
    try:
        assert meter.sensor_name == "S155C" and meter.is_power_sensor and meter.wavelength_settable
        assert (meter.wavelength_min, meter.wavelength_max) == (800.0, 1700.0)
        meter.wavelength = 1310
        assert meter.wavelength == 1310.0
        meter.wavelength = 2000  # pymeasure clamps to the range the meter reports
        assert meter.wavelength == 1700.0
        meter.wavelength = 1310
        power_w = meter.power  # light through the 10 dB tap of host2.p0's receive fibre
        assert 1e-5 < power_w < 1e-3
        with pytest.raises(AttributeError, match="not an energy sensor"):
            meter.energy
        assert meter.id.startswith("Thorlabs,PM100D")
        assert meter.check_errors() == []
    finally:
        meter.adapter.close()


def _resource(address: str):
    rm = pyvisa.ResourceManager("@py")
    return rm.open_resource(address, read_termination="\n", write_termination="\n", timeout=5000)


def test_thorlabspm100_package(pm100):
    inst = _resource(pm100)
    try:
        meter = ThorlabsPM100(inst=inst)
        assert meter.sense.power.dc.unit == "W"
        meter.sense.power.dc.unit = "DBM"  # 'Sense:Power:Dc:UNIT DBM'
        assert meter.sense.power.dc.unit == "DBM"
        meter.sense.correction.wavelength = 1310
        assert meter.sense.correction.wavelength == 1310.0
        assert (meter.sense.correction.minimum_wavelength, meter.sense.correction.maximum_wavelength) == (800.0, 1700.0)
        meter.sense.average.count = 5
        assert meter.sense.average.count == 5
        meter.sense.power.dc.range.auto = "ON"
        assert meter.sense.power.dc.range.auto == 1
        meter.sense.power.dc.range.upper = 0.001
        assert meter.sense.power.dc.range.upper == 0.001 and meter.sense.power.dc.range.auto == 0
        dbm = meter.read  # 'READ?' in dBm now
        assert -30 < dbm < 0
        meter.measure.scalar.power()  # 'Measure:Scalar:POWer', then 'FETCh?'
        assert -30 < meter.fetch < 0
        meter.sense.correction.loss.input.magnitude = 3
        assert meter.sense.correction.loss.input.magnitude == 3.0
        assert inst.query("SYST:ERR?") == '0,"No error"'
        meter.system.beeper.immediate()
    finally:
        inst.close()


def test_pyvisa_with_its_default_write_termination(bench):
    """Many scripts leave pyvisa's defaults: commands end in CR LF. A raw socket carries no
    end-of-message mark (unlike GPIB, USBTMC or VXI-11), so with a real instrument's socket as with
    this one a script must give the read termination: only that is set."""
    rm = pyvisa.ResourceManager("@py")
    meter = rm.open_resource(bench.resources["pm-lab"], timeout=2000)
    try:
        assert meter.write_termination == "\r\n"
        meter.read_termination = "\n"
        assert meter.query("*IDN?").strip().startswith("Keysight Technologies,N7744A")
        assert meter.query(":SENS1:POW:UNIT?").strip() == "+0"
        block = meter.query_binary_values(":FETC:POW:ALL?", datatype="f", is_big_endian=False)
        assert len(block) == 4
        assert meter.query(":SYST:ERR?").strip() == '+0,"No error"'
    finally:
        meter.close()


def test_pyvisa_as_scripts_open_it_and_binary_blocks(bench):
    """Default terminations from the resource string alone would leave reads waiting; scripts set
    them, then read logging blocks with query_binary_values."""
    meter = _resource(bench.resources["pm-lab"])
    try:
        meter.write(":SENS1:FUNC:PAR:LOGG 10,1ms")
        assert meter.query(":SENS1:FUNC:STAT LOGG,STAR;*OPC?") == "1"
        deadline = time.monotonic() + 5  # 10 samples of 1 ms: a script polls the state, as here
        while (state := meter.query(":SENS1:FUNC:STAT?")) != "LOGGING_STABILITY,COMPLETE":
            assert state == "LOGGING_STABILITY,PROGRESS" and time.monotonic() < deadline, state
        values = meter.query_binary_values(":SENS1:FUNC:RES?", datatype="f", is_big_endian=False)
        assert len(values) == 10 and all(-30 < v < 10 for v in values)
        block = meter.query_binary_values(":FETC:POW:ALL?", datatype="f", is_big_endian=False)
        assert len(block) == 4
        assert meter.query(":SYST:ERR?") == '+0,"No error"'
    finally:
        meter.close()
