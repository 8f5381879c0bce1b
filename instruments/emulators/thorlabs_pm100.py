"""Emulated Thorlabs PM100D over the world, with the command tree of Thorlabs' PM100D SCPI
reference as third-party clients use it (pymeasure's ThorlabsPM100USB, the ThorlabsPM100
package): optional nodes (``[:SENSe]``, ``[:SCALar]``, ``[:DC]``, ``[:IMMediate]``...),
MIN/MAX/DEF on settings and on their queries, units on numbers.

Transport: the real meter is USBTMC; pyvisa-py reaches USB only through a real device, so the
emulator serves the same SCPI set as a raw TCP socket (TCPIP0::127.0.0.1::<port>::SOCKET). The
driver needs only a message session and runs unchanged on either.

Physics: one reading integrates the light for ``averaging x 1 ms`` (about 1 kHz with averaging 1,
the reference's update rate) from the moment the query arrives. The sensor is an S155C-class
InGaAs photodiode: 800-1700 nm, up to 20 mW (assumptions: its datasheet's figures). Out of
range (fault ``out_of_range``): readings are the 9.9E37 over-range value. Power-on state (after
``power_loss`` or ``*RST``): unit W, averaging 1, auto range on, 1550 nm (assumption: a
PM100D comes back at the sensor's default wavelength).
"""

from __future__ import annotations

import math
import random
import time

from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from lumion_hil.instruments.emulators.scpi import (
    DATA_STALE,
    SETTINGS_CONFLICT,
    Number,
    ScpiDevice,
    ScpiError,
    boolean,
    choice,
    no_args,
)

SAMPLE_S = 0.001
OVER_RANGE = 9.9e37  # what SCPI instruments send for a value they cannot give (SCPI-99 7.2.1.5)
WAVELENGTH = Number(800.0, 1700.0, 1550.0, "M", units={"NM": 1.0, "UM": 1e3})
AVERAGING = Number(1, 100000, 1, integer=True)
RANGE_W = Number(2e-8, 0.02, 0.02, "W")
INPUT_LOSS = Number(-60.0, 60.0, 0.0, "DB")
REFERENCE_W = Number(0.0, 0.02, 0.0, "W")
BEAM_MM = Number(0.01, 50.0, 9.5, "M", units={"MM": 1.0})
BRIGHTNESS = Number(0.0, 1.0, 1.0)
CONTRAST = Number(0.0, 1.0, 0.5)


def nr3(value: float) -> str:
    """SCPI's NR3 format, as the PM100 answers numbers: 1.550000E+03."""
    return f"{value:.6E}"


class ThorlabsPM100Emulator(ScpiDevice):
    def __init__(self, name: str, spec, world, bench, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.world = world
        taps = taps_for(bench, name)
        self.head = PhotodiodeChannel(world, taps.get(1), noise_db=spec.emulation.noise_db,
                                      dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=random.Random(seed))
        self.identity = f"Thorlabs,PM100D,EMU{seed:05d},2.4.0"
        self.power_on()
        c = self.command
        c("*IDN?", lambda a: self.identity)
        c("*RST", self._reset)
        c("*OPC?", lambda a: "1")
        c(":SYSTem:SENSor:IDN?", lambda a: "S155C,EMU00001,01-Jan-2026,1,18,289")
        c(":SYSTem:VERSion?", lambda a: "1999.0")
        c(":SYSTem:BEEPer[:IMMediate]", lambda a: None)
        c(":SYSTem:BEEPer:STATe", lambda a: setattr(self, "beeper", boolean(a)))
        c(":SYSTem:BEEPer:STATe?", lambda a: "1" if self.beeper else "0")
        c(":SYSTem:LFRequency", self._set_line_frequency)
        c(":SYSTem:LFRequency?", lambda a: str(self.line_frequency))
        c(":SYSTem:DATE?", lambda a: time.strftime("%Y,%m,%d"))
        c(":SYSTem:TIME?", lambda a: time.strftime("%H,%M,%S"))
        c("[:SENSe]:CORRection:WAVelength", lambda a: self._set("wavelength_nm", WAVELENGTH.parse(a)))
        c("[:SENSe]:CORRection:WAVelength?", lambda a: nr3(WAVELENGTH.query(a, self.wavelength_nm)))
        c("[:SENSe]:CORRection:LOSS[:INPut][:MAGNitude]", lambda a: self._set("input_loss_db", INPUT_LOSS.parse(a)))
        c("[:SENSe]:CORRection:LOSS[:INPut][:MAGNitude]?", lambda a: nr3(INPUT_LOSS.query(a, self.input_loss_db)))
        c("[:SENSe]:CORRection:BEAMdiameter", lambda a: self._set("beam_mm", BEAM_MM.parse(a)))
        c("[:SENSe]:CORRection:BEAMdiameter?", lambda a: nr3(BEAM_MM.query(a, self.beam_mm)))
        c("[:SENSe]:CORRection:COLLect:ZERO[:INITiate]", self._zero)
        c("[:SENSe]:CORRection:COLLect:ZERO:ABORt", lambda a: no_args(a))
        c("[:SENSe]:CORRection:COLLect:ZERO:STATe?", lambda a: "0")  # the zero is done at once here
        c("[:SENSe]:CORRection:COLLect:ZERO:MAGNitude?", lambda a: nr3(self.zero_w))
        c("[:SENSe]:CORRection:POWer[:PDIOde][:RESPonse]?", lambda a: nr3(self._responsivity()))
        c("[:SENSe]:AVERage[:COUNt]", lambda a: self._set("averaging", AVERAGING.parse(a)))
        c("[:SENSe]:AVERage[:COUNt]?", lambda a: str(int(AVERAGING.query(a, self.averaging))))
        c("[:SENSe]:POWer[:DC]:RANGe:AUTO", lambda a: self._set("auto_range", boolean(a)))
        c("[:SENSe]:POWer[:DC]:RANGe:AUTO?", lambda a: "1" if self.auto_range else "0")
        c("[:SENSe]:POWer[:DC]:RANGe[:UPPer]", self._set_range)
        c("[:SENSe]:POWer[:DC]:RANGe[:UPPer]?", lambda a: nr3(RANGE_W.query(a, self.range_w)))
        c("[:SENSe]:POWer[:DC]:UNIT", lambda a: self._set("unit", choice(a, "W", "DBM").upper()))
        c("[:SENSe]:POWer[:DC]:UNIT?", lambda a: self.unit)
        c("[:SENSe]:POWer[:DC]:REFerence", lambda a: self._set("reference_w", REFERENCE_W.parse(a)))
        c("[:SENSe]:POWer[:DC]:REFerence?", lambda a: nr3(REFERENCE_W.query(a, self.reference_w)))
        c("[:SENSe]:POWer[:DC]:REFerence:STATe", lambda a: self._set("relative", boolean(a)))
        c("[:SENSe]:POWer[:DC]:REFerence:STATe?", lambda a: "1" if self.relative else "0")
        c("INPut:PDIOde:FILTer[:LPASs][:STATe]", lambda a: self._set("filter", boolean(a)))
        c("INPut:PDIOde:FILTer[:LPASs][:STATe]?", lambda a: "1" if self.filter else "0")
        c("INPut:ADAPter[:TYPE]?", lambda a: "PHOTodiode")
        c("DISPlay:BRIGhtness", lambda a: self._set("brightness", BRIGHTNESS.parse(a)))
        c("DISPlay:BRIGhtness?", lambda a: nr3(BRIGHTNESS.query(a, self.brightness)))
        c("DISPlay:CONTrast", lambda a: self._set("contrast", CONTRAST.parse(a)))
        c("DISPlay:CONTrast?", lambda a: nr3(CONTRAST.query(a, self.contrast)))
        c("CONFigure[:SCALar][:POWer]", lambda a: self._set("configured", "POW"))
        c("CONFigure?", lambda a: self.configured)
        c("CONFigure[:SCALar]:ENERgy", self._not_this_sensor)
        c("INITiate[:IMMediate]", self._initiate)
        c("ABORt", lambda a: no_args(a))
        c("FETCh?", self._fetch)
        c("READ?", self._measure)
        c("MEASure[:SCALar][:POWer]?", self._measure)
        c("MEASure[:SCALar][:POWer]", self._initiate)  # measure now, FETCh? later (the ThorlabsPM100 package's way)
        c("MEASure[:SCALar]:ENERgy?", self._not_this_sensor)
        c("MEASure[:SCALar]:CURRent[:DC]?", self._measure_current)
        self.status_registers("OPERation", "QUEStionable", "MEASurement", "AUXiliary")

    def power_on(self) -> None:
        super().power_on()
        self.unit, self.averaging, self.auto_range, self.range_w = "W", 1, True, RANGE_W.default
        self.wavelength_nm, self.input_loss_db, self.beam_mm = WAVELENGTH.default, 0.0, BEAM_MM.default
        self.reference_w, self.relative, self.filter, self.zero_w = 0.0, False, False, 0.0
        self.beeper, self.line_frequency, self.brightness, self.contrast = True, 50, 1.0, 0.5
        self.configured = "POW"
        self.last_reading: float | None = None
        self.head.wavelength_nm = self.wavelength_nm

    def _set(self, attribute: str, value) -> None:
        setattr(self, attribute, value)
        if attribute == "wavelength_nm":
            self.head.wavelength_nm = value

    def _reset(self, args: str) -> None:
        no_args(args)
        self.power_on()

    def _set_line_frequency(self, args: str) -> None:
        self.line_frequency = int(Number(50, 60, 50, integer=True).parse(args))
        if self.line_frequency not in (50, 60):
            raise ScpiError(-224, "Illegal parameter value")

    def _set_range(self, args: str) -> None:
        self.range_w = RANGE_W.parse(args)
        self.auto_range = False  # choosing a range ends auto ranging, as on the meter

    def _responsivity(self) -> float:
        # InGaAs: about 0.9 A/W at 1310 nm to 1.0 A/W at 1550 nm (the photodiode model's slope)
        return 0.9 + (self.wavelength_nm - 1310.0) * (0.1 / 240.0)

    def _zero(self, args: str) -> None:
        no_args(args)
        self.zero_w = 10 ** (self.head.read_dbm(self.world.now_ns(), self.world.now_ns()) / 10) / 1000 \
            if self.head.tap is None else 0.0

    def _not_this_sensor(self, args: str) -> None:
        raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; not an energy sensor")

    def _take(self) -> float:
        window_ns = self.world.scaled_ns(self.averaging * SAMPLE_S)
        t0 = self.world.now_ns()
        time.sleep(window_ns / 1e9)  # the meter integrates light for this long before it answers
        # The meter adds the declared input loss back (an attenuator in front of the sensor).
        return self.head.read_dbm(t0, t0 + window_ns) + self.input_loss_db

    def _format(self, dbm: float) -> str:
        if "out_of_range" in self.faults:
            return nr3(OVER_RANGE)
        watts = 10 ** (dbm / 10) / 1000
        if self.relative:
            if self.unit == "DBM":
                reference_dbm = -999.0 if self.reference_w <= 0 else 10 * math.log10(self.reference_w * 1000)
                return nr3(dbm - reference_dbm)
            watts -= self.reference_w
        return nr3(dbm if self.unit == "DBM" else watts)

    def _initiate(self, args: str) -> None:
        no_args(args)
        self.last_reading = self._take()

    def _fetch(self, args: str) -> str:
        if self.last_reading is None:
            raise ScpiError(*DATA_STALE)
        return self._format(self.last_reading)

    def _measure(self, args: str) -> str:
        self.last_reading = self._take()
        return self._format(self.last_reading)

    def _measure_current(self, args: str) -> str:
        watts = 10 ** (self._take() / 10) / 1000
        return nr3(watts * self._responsivity())
