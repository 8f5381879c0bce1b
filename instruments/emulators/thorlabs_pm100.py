"""Emulated Thorlabs PM100D over the world.

Transport: the real meter is USBTMC; pyvisa-py reaches USB only through a real device, so the
emulator serves the same SCPI set as a raw TCP socket (TCPIP0::127.0.0.1::<port>::SOCKET). The
driver needs only a message session and runs unchanged on either.

Physics: one reading integrates the light for ``averaging x 1 ms`` (about 1 kHz with averaging 1,
the reference's update rate) from the moment the query arrives. Out of range: with the fault
``out_of_range`` switched on, readings are ``INFINITY`` (over) as the real meter answers.
"""

from __future__ import annotations

import random
import time

from instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from instruments.emulators.scpi import DATA_OUT_OF_RANGE, ILLEGAL_PARAMETER, MISSING_PARAMETER, ScpiDevice, ScpiError, parse_number

SAMPLE_S = 0.001


class ThorlabsPM100Emulator(ScpiDevice):
    def __init__(self, name: str, spec, world, bench, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.world = world
        taps = taps_for(bench, name)
        self.head = PhotodiodeChannel(world, taps.get(1), noise_db=spec.emulation.noise_db,
                                      dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=random.Random(seed))
        self.unit = "W"  # the meter's power-on default
        self.averaging = 1
        self.auto_range = True
        self.last_reading: float | None = None
        self.identity = f"Thorlabs,PM100D,EMU{seed:05d},2.4.0"
        self.command("*IDN?", lambda a: self.identity)
        self.command("*RST", self._reset)
        self.command("*OPC?", lambda a: "1")
        self.command(":SYSTem:SENSor:IDN?", lambda a: "S155C,EMU00001,01-Jan-2026,1,18,289")
        self.command(":SENSe:POWer:UNIT", self._set_unit)
        self.command(":SENSe:POWer:UNIT?", lambda a: self.unit)
        self.command(":SENSe:CORRection:WAVelength", self._set_wavelength)
        self.command(":SENSe:CORRection:WAVelength?", lambda a: f"{self.head.wavelength_nm:g}")
        self.command(":SENSe:AVERage:COUNt", self._set_averaging)
        self.command(":SENSe:AVERage:COUNt?", lambda a: str(self.averaging))
        self.command(":SENSe:POWer:RANGe:AUTO", self._set_auto_range)
        self.command(":SENSe:POWer:RANGe:AUTO?", lambda a: "1" if self.auto_range else "0")
        self.command(":SENSe:CORRection:COLLect:ZERO", lambda a: None)
        self.command(":CONFigure:POWer", lambda a: None)
        self.command(":INITiate", self._initiate)
        self.command(":FETCh?", self._fetch)
        self.command(":MEASure:POWer?", self._measure)
        self.command(":READ?", self._measure)

    def _reset(self, args: str) -> None:
        self.unit, self.averaging, self.auto_range = "W", 1, True
        self.head.wavelength_nm = 1550.0

    def _set_unit(self, args: str) -> None:
        unit = args.strip().upper()
        if unit not in ("W", "DBM"):
            raise ScpiError(*ILLEGAL_PARAMETER)
        self.unit = unit

    def _set_wavelength(self, args: str) -> None:
        nm = parse_number(args)
        if not 400 <= nm <= 1800:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        self.head.wavelength_nm = nm

    def _set_averaging(self, args: str) -> None:
        count = int(parse_number(args))
        if not 1 <= count <= 100000:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        self.averaging = count

    def _set_auto_range(self, args: str) -> None:
        value = args.strip().upper()
        if value not in ("ON", "OFF", "1", "0"):
            raise ScpiError(*ILLEGAL_PARAMETER if value else MISSING_PARAMETER)
        self.auto_range = value in ("ON", "1")

    def _take(self) -> float:
        window_ns = self.world.scaled_ns(self.averaging * SAMPLE_S)
        t0 = self.world.now_ns()
        time.sleep(window_ns / 1e9)  # the meter integrates light for this long before it answers
        return self.head.read_dbm(t0, t0 + window_ns)

    def _format(self, dbm: float) -> str:
        if "out_of_range" in self.faults:
            return "INFINITY"
        if self.unit == "DBM":
            return f"{dbm:.4f}"
        return f"{10 ** (dbm / 10) / 1000:.6E}"

    def _initiate(self, args: str) -> None:
        self.last_reading = self._take()

    def _fetch(self, args: str) -> str:
        if self.last_reading is None:
            raise ScpiError(-230, "Data corrupt or stale")
        return self._format(self.last_reading)

    def _measure(self, args: str) -> str:
        self.last_reading = self._take()
        return self._format(self.last_reading)
