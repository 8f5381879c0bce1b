"""Thorlabs PM100D / PM100USB / PM400 optical power meter (SCPI over USBTMC).

Real meters are USB0::0x1313::0x8078::<serial>::INSTR (0x8072 PM100USB, 0x8075 PM400); the
driver only needs a message session, so it runs unchanged over the emulator's TCP socket.
One channel. No hardware-timed logging: traces are polled (the trace says so).
"""

from __future__ import annotations

import math

from lumion_hil.instruments.protocols import Identity, OutOfRange, PowerMeter, Reading, watts_to_dbm
from lumion_hil.instruments.scpi import ScpiInstrument, parse_identity, query


OVER_RANGE_ABOVE = 1e20


def parse_reading(reply: str) -> Reading:
    text = reply.strip()
    upper = text.upper().lstrip("+")
    if upper in ("INFINITY", "INF"):
        return OutOfRange("over", text)
    if upper in ("-INFINITY", "-INF"):
        return OutOfRange("under", text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    if abs(value) > OVER_RANGE_ABOVE:  # SCPI's "no value" 9.9E37: never a power
        return OutOfRange("over", text)
    return value


def parse_unit(reply: str) -> str:
    unit = reply.strip().upper()
    if unit not in ("W", "DBM"):
        raise ValueError("expected W or DBM")
    return unit


class ThorlabsPM100(ScpiInstrument, PowerMeter):
    channels = 1
    error_query = "SYST:ERR?"

    identity = query("*IDN?", parse_identity, "vendor, model, serial, firmware")
    unit = query("SENS:POW:UNIT?", parse_unit, "W or DBM")
    sensor = query("SYST:SENS:IDN?", str, "sensor name, serial, calibration date, type, subtype, flags")
    averaging = query("SENS:AVER:COUN?", lambda r: int(float(r)), "samples averaged per reading")

    def __init__(self, session, **kw):
        super().__init__(session, **kw)
        self._unit: str | None = None

    def identify(self) -> Identity:
        return self.identity

    def _check_channel(self, channel: int) -> None:
        if channel != 1:
            raise ValueError(f"{self.name}: a PM100 has one channel, not {channel}")

    def set_unit(self, unit: str) -> None:
        unit = unit.upper()
        if unit not in ("W", "DBM"):
            raise ValueError(f"{self.name}: unit must be W or DBM, not {unit!r}")
        self.send(f"SENS:POW:UNIT {unit}")
        self._unit = unit

    def set_wavelength_nm(self, wavelength_nm: float, channel: int = 1) -> None:
        self._check_channel(channel)
        self.send(f"SENS:CORR:WAV {wavelength_nm:g}")

    def wavelength_nm(self, channel: int = 1) -> float:
        self._check_channel(channel)
        return self.ask("SENS:CORR:WAV?", float)

    def set_averaging(self, count: int) -> None:
        if not 1 <= count <= 100000:
            raise ValueError(f"{self.name}: averaging count {count} out of 1..100000")
        self.send(f"SENS:AVER:COUN {int(count)}")

    def set_auto_range(self, on: bool = True) -> None:
        self.send(f"SENS:POW:RANG:AUTO {'ON' if on else 'OFF'}")

    def zero(self) -> None:
        """Dark-current zero: cover the sensor first."""
        self.send("SENS:CORR:COLL:ZERO")

    def read_dbm(self, channel: int = 1) -> Reading:
        self._check_channel(channel)
        if self._unit is None:
            self._unit = self.unit
        value = self.ask("MEAS:POW?", parse_reading)
        if isinstance(value, OutOfRange) or self._unit == "DBM":
            return value
        return watts_to_dbm(value) if value > 0 else OutOfRange("under", f"{value} W")
