"""Emulated Thorlabs PM100D over the world, with the command tree of Thorlabs' SCPI references
for the PM100D / PM100USB / PM400 consoles (transcribed in manuals/thorlabs-pm100.yaml, with
each command's state) as third-party clients use it (pymeasure's ThorlabsPM100USB, the
ThorlabsPM100 package): optional nodes (``[:SENSe[n]]``, ``[:SCALar]``, ``[:DC]``,
``[:IMMediate]``...), MIN/MAX/DEF on settings and on their queries, units on numbers.

Transport: the real meter is USBTMC; pyvisa-py reaches USB only through a real device, so the
emulator serves the same SCPI set as a raw TCP socket (TCPIP0::127.0.0.1::<port>::SOCKET). The
driver needs only a message session and runs unchanged on either.

Physics: one reading integrates the light for ``averaging x 1 ms`` (about 1 kHz with averaging 1,
the reference's update rate) from the moment the query arrives. The sensor is an S155C-class
InGaAs photodiode: 800-1700 nm, up to 20 mW, with a head temperature sensor (the flags its
SYST:SENS:IDN? reports) (assumptions: its datasheet's figures). The user attenuation (CORRection:LOSS) is added back to readings, as for a filter in
front of the sensor. The zero (CORR:COLL:ZERO) is measured and reported, not subtracted: the
emulated photodiode has no dark current beyond its floor.

Ranges: the meter has one gain stage; a range is chosen as a current (CURRent:RANGe, in A) or
a power (POWer:RANGe, in W), and whatever is asked is snapped to the smallest of the meter's
ranges that holds it (the reference: the range that fits the value best; MIN the most sensitive,
MAX the least), as the reference says the meter rounds values it only takes from a set. Assumption (no
source was found for the gain levels): 1-2-5 steps, 20 nA to 20 mA (19 ranges; SCPI-99's L125
stepping), and the power ranges the same values at a nominal 1 A/W, 20 nW to 20 mW (the sensor's
maximum). Choosing a range ends auto ranging; with auto
ranging on, every measurement picks the range that holds it. A reading above the range in use
is the 9.9E37 over-range value (SCPI-99 7.2.1.5), as under the ``out_of_range`` fault.
Wavelengths snap to whole nm and averaging to whole counts (rounded).

Frequency (MEASure:FREQuency?, CONFigure:FREQuency): the light at the tap is sampled every 1 ms
over a 0.5 s gate (both assumptions), compared with the peak-detector threshold (a percentage of
the range in use) and its rising edges counted; CW light reads 0 Hz, as the reference says.
Head temperature: a constant 23 degC, its NTC 10 kOhm at 25 degC with beta 3988 K (assumptions:
the bench models no temperature).

Refused: what needs a thermopile, pyroelectric or four-quadrant sensor (energy, voltage,
accelerator, beam position) answers -221 Settings conflict, as the console does with a
photodiode attached; a responsivity set is refused likewise (only adapters without a head
EEPROM take one). The PM400-only commands (array mode, external NTC and environment sensor, GPIO,
LAN, customer calibration) answer -241 Hardware missing: the reference documents every header a
PM100D is sent, so none answers -113 Undefined header.

Power-on state (after ``power_loss`` or ``*RST``; *RST leaves the status registers and the
error queue, as the reference and IEEE 488.2 say): unit W, averaging 1, auto range on, 1550 nm
(assumption: a PM100D comes back at the sensor's default wavelength).
"""

from __future__ import annotations

import datetime
import math
import random
import time

from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    DATA_STALE,
    HARDWARE_MISSING,
    HEADER_SUFFIX_OUT_OF_RANGE,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    SETTINGS_CONFLICT,
    Number,
    ScpiError,
    boolean,
    choice,
    keyword,
    no_args,
    parse_number,
)

SAMPLE_S = 0.001
OVER_RANGE = 9.9e37  # what SCPI instruments send for a value they cannot give (SCPI-99 7.2.1.5)
WAVELENGTH = Number(800.0, 1700.0, 1550.0, "M", units={"NM": 1.0, "UM": 1e3})
AVERAGING = Number(1, 100000, 1)
# The gain levels, most sensitive first (assumption: 1-2-5 steps, 20 nA to 20 mA; see the docstring).
CURRENT_RANGES_A = tuple(float(f"{m}e{e}") for e in range(-8, -1) for m in (1, 2, 5))[1:-1]
POWER_RANGES_W = CURRENT_RANGES_A  # the same gain levels in W, at a nominal 1 A/W
INPUT_LOSS = Number(-60.0, 60.0, 0.0, "DB")
REFERENCE_W = Number(0.0, 0.02, 0.0, "W")
REFERENCE_A = Number(0.0, CURRENT_RANGES_A[-1], 0.0, "A")
ZERO_A = Number(-1e-6, 1e-6, 0.0, "A")
BEAM_MM = Number(0.01, 50.0, 9.5, "M", units={"MM": 1.0})
BRIGHTNESS = Number(0.0, 1.0, 1.0)
CONTRAST = Number(0.0, 1.0, 0.5)
RANGE_SETTLE_S = 0.010  # the reference: a range change interrupts measuring for up to 10 ms
RANGING = 4  # STATus:OPERation:CONDition bit 2: ranging ongoing (the reference)
THRESHOLD_PCT = Number(1, 99, 50)  # peak detector / frequency threshold, % of the range in use
FREQUENCY_GATE_S = 0.5
FREQUENCY_SAMPLES = 500
FREQUENCY_RANGE_HZ = (1.0, 100e3)  # assumption: 1 Hz to the input stage's HI bandwidth
FILTERED_BANDWIDTH_HZ = 15.0  # the PM100D manual's LO bandwidth
HEAD_TEMPERATURE_C = 23.0
NTC_R0_OHM, NTC_BETA_K = 10e3, 3988.0
ADAPTERS = ("PHOTodiode", "THERmal", "PYRo", "PDA", "Q4", "LUMinance")
# CONFigure? answers (the PM400 reference's abbreviations)
CONFIGURATIONS = {"POW": "POW", "CURR": "CURR", "PDEN": "POWDENS", "FREQ": "FREQ", "TEMP": "TEMP", "RES": "RES"}


def nr3(value: float) -> str:
    """SCPI's NR3 format, as the PM100 answers numbers: 1.550000E+03."""
    return f"{value:.6E}"


def _conflict(what: str) -> tuple[int, str]:
    return SETTINGS_CONFLICT[0], f"Settings conflict; {what}"


NOT_ENERGY = _conflict("not an energy sensor")
NOT_THERMOPILE = _conflict("not a thermopile sensor")
NOT_THERMAL_OR_PYRO = _conflict("not a thermopile or pyroelectric sensor")
NOT_QUADRANT = _conflict("not a four quadrant thermopile sensor")
HAS_EEPROM = _conflict("sensor responsivity comes from its EEPROM: set the wavelength")


def _missing(what: str) -> tuple[int, str]:
    return HARDWARE_MISSING[0], f"Hardware missing; {what}"


# The PM400's hardware the reference documents and a PM100D has not: its headers are known
# (never -113), the hardware is missing.
PM400_ONLY = {
    _missing("no LAN"): ("SYSTem:COMMunicate:LAN:HOSTname", "SYSTem:COMMunicate:LAN:HOSTname?"),
    _missing("no external NTC or environment sensor"): (
        "[:SENSe[n]]:CORRection:COEFficient:BETA", "[:SENSe[n]]:CORRection:COEFficient:BETA?",
        "[:SENSe[n]]:CORRection:COEFficient:RESistance", "[:SENSe[n]]:CORRection:COEFficient:RESistance?",
        "[:SENSe[n]]:DIGital:DATA?", "[:SENSe[n]]:HUMidity:DATA?", "[:SENSe[n]]:RESistance:DATA?",
        "[:SENSe[n]]:TEMPerature:DATA?", "[:SENSe[n]]:VOLTage:DATA?"),
    _missing("no customer calibration slots"): (
        "[:SENSe[n]]:CORRection:CSET:POINts", "[:SENSe[n]]:CORRection:CSET:PREamble",
        "[:SENSe[n]]:CORRection:CSET[m]:DEFine", "[:SENSe[n]]:CORRection:CSET[m]:POINts?",
        "[:SENSe[n]]:CORRection:CSET[m]:PREamble?", "[:SENSe[n]]:CORRection:CSET[m]:STATe",
        "[:SENSe[n]]:CORRection:CSET[m]:STATe?"),
    _missing("no GPIO pins"): ("SOURce:DIGital:DATA", "SOURce:DIGital:DATA?", "SOURce:DIGital:ENABle",
                               "SOURce:DIGital:ENABle?"),
    _missing("no array buffer"): ("CONFigure:ARRay[:POWer]", "CONFigure:ARRay:CURRent", "CONFigure:ARRay:PDENsity",
                                  "FETCh:ARRay?", "MEASure:ARRay[:POWer]?", "MEASure:ARRay:CURRent?",
                                  "MEASure:ARRay:PDENsity?"),
}


class ThorlabsPM100Emulator(ScpiDevice):
    def __init__(self, name: str, spec, world, bench, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.world = world
        taps = taps_for(bench, name)
        self.head = PhotodiodeChannel(world, taps.get(1), noise_db=spec.emulation.noise_db,
                                      dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=random.Random(seed),
                                      offset_db=spec.emulation.offset_db)
        self.identity = f"Thorlabs,PM100D,EMU{seed:05d},2.4.0"
        self.clock_offset_s = 0.0
        self.power_on()
        c, s = self.command, self.sense
        # IEEE 488.2 (the rest are the base class's)
        c("*IDN?", lambda a: self.identity)
        c("*RST", self._reset)
        c("*OPC?", lambda a: "1")
        # SYSTem
        c(":SYSTem:SENSor:IDN?", lambda a: "S155C,EMU00001,01-Jan-2026,1,18,289")
        c(":SYSTem:VERSion?", lambda a: "1999.0")
        c(":SYSTem:BEEPer[:IMMediate]", lambda a: no_args(a) or None)
        c(":SYSTem:BEEPer:STATe", lambda a: setattr(self, "beeper", boolean(a)))
        c(":SYSTem:BEEPer:STATe?", lambda a: "1" if self.beeper else "0")
        c(":SYSTem:LFRequency", self._set_line_frequency)
        c(":SYSTem:LFRequency?", lambda a: str(self.line_frequency))
        c(":SYSTem:DATE", self._set_date)
        c(":SYSTem:DATE?", lambda a: self._clock().strftime("%Y,%m,%d"))
        c(":SYSTem:TIME", self._set_time)
        c(":SYSTem:TIME?", lambda a: self._clock().strftime("%H,%M,%S"))
        c(":CALibration:STRing?", lambda a: no_args(a) or "01-Jan-2026")
        # DISPlay
        c("DISPlay:BRIGhtness", lambda a: self._set("brightness", BRIGHTNESS.parse(a)))
        c("DISPlay:BRIGhtness?", lambda a: nr3(BRIGHTNESS.query(a, self.brightness)))
        c("DISPlay:CONTrast", lambda a: self._set("contrast", CONTRAST.parse(a)))
        c("DISPlay:CONTrast?", lambda a: nr3(CONTRAST.query(a, self.contrast)))
        # INPut
        c("INPut[:PDIode]:FILTer[:LPASs][:STATe]", lambda a: self._set("filter", boolean(a)))
        c("INPut[:PDIode]:FILTer[:LPASs][:STATe]?", lambda a: "1" if self.filter else "0")
        c("INPut:ADAPter[:TYPE]", lambda a: self._set("adapter", choice(a, *ADAPTERS)))
        c("INPut:ADAPter[:TYPE]?", lambda a: no_args(a) or self.adapter)
        # SENSe: corrections
        s(":CORRection:WAVelength", lambda a: self._set("wavelength_nm", float(round(WAVELENGTH.parse(a)))))
        s(":CORRection:WAVelength?", lambda a: nr3(WAVELENGTH.query(a, self.wavelength_nm)))
        s(":CORRection[:LOSS[:INPut]][:MAGNitude]", lambda a: self._set("input_loss_db", INPUT_LOSS.parse(a)))
        s(":CORRection[:LOSS[:INPut]][:MAGNitude]?", lambda a: nr3(INPUT_LOSS.query(a, self.input_loss_db)))
        s(":CORRection:BEAMdiameter", lambda a: self._set("beam_mm", BEAM_MM.parse(a)))
        s(":CORRection:BEAMdiameter?", lambda a: nr3(BEAM_MM.query(a, self.beam_mm)))
        s(":CORRection:COLLect:ZERO[:INITiate]", self._zero)
        s(":CORRection:COLLect:ZERO:ABORt", lambda a: no_args(a) or None)
        s(":CORRection:COLLect:ZERO:STATe?", lambda a: no_args(a) or "0")  # the zero is done at once here
        s(":CORRection:COLLect:ZERO:MAGNitude", lambda a: self._set("zero_a", ZERO_A.parse(a)))
        s(":CORRection:COLLect:ZERO:MAGNitude?", lambda a: nr3(ZERO_A.query(a, self.zero_a)))
        s(":CORRection:POWer[:PDIode][:RESPonse]?", self._responsivity_query)
        s(":AVERage[:COUNt]", lambda a: self._set("averaging", int(math.floor(AVERAGING.parse(a) + 0.5))))
        s(":AVERage[:COUNt]?", lambda a: str(int(AVERAGING.query(a, self.averaging))))
        # SENSe: ranges (one gain stage, chosen as a current or as a power)
        s(":POWer[:DC]:RANGe:AUTO", lambda a: self._set("auto_range", boolean(a)))
        s(":POWer[:DC]:RANGe:AUTO?", lambda a: no_args(a) or ("1" if self.auto_range else "0"))
        s(":POWer[:DC]:RANGe[:UPPer]", lambda a: self._set_range(a, POWER_RANGES_W, "W"))
        s(":POWer[:DC]:RANGe[:UPPer]?", lambda a: self._range_query(a, POWER_RANGES_W, "W"))
        s(":RANGe:AUTO", lambda a: self._set("auto_range", boolean(a)))  # Thorlabs' pyvisa example; not in the reference
        s(":CURRent[:DC]:RANGe:AUTO", lambda a: self._set("auto_range", boolean(a)))
        s(":CURRent[:DC]:RANGe:AUTO?", lambda a: no_args(a) or ("1" if self.auto_range else "0"))
        s(":CURRent[:DC]:RANGe[:UPPer]", lambda a: self._set_range(a, CURRENT_RANGES_A, "A"))
        s(":CURRent[:DC]:RANGe[:UPPer]?", lambda a: self._range_query(a, CURRENT_RANGES_A, "A"))
        # SENSe: units, relative (delta) mode
        s(":POWer[:DC]:UNIT", lambda a: self._set("unit", choice(a, "W", "DBM").upper()))
        s(":POWer[:DC]:UNIT?", lambda a: no_args(a) or self.unit)
        s(":POWer[:DC]:REFerence", lambda a: self._set("reference_w", REFERENCE_W.parse(a)))
        s(":POWer[:DC]:REFerence?", lambda a: nr3(REFERENCE_W.query(a, self.reference_w)))
        s(":POWer[:DC]:REFerence:STATe", lambda a: self._set("relative", boolean(a)))
        s(":POWer[:DC]:REFerence:STATe?", lambda a: no_args(a) or ("1" if self.relative else "0"))
        s(":CURRent[:DC]:REFerence", lambda a: self._set("reference_a", REFERENCE_A.parse(a)))
        s(":CURRent[:DC]:REFerence?", lambda a: nr3(REFERENCE_A.query(a, self.reference_a)))
        s(":CURRent[:DC]:REFerence:STATe", lambda a: self._set("relative_current", boolean(a)))
        s(":CURRent[:DC]:REFerence:STATe?", lambda a: no_args(a) or ("1" if self.relative_current else "0"))
        # SENSe: frequency, peak detector, sensor
        s(":FREQuency:RANGe[:UPPer]?", lambda a: no_args(a) or nr3(self._bandwidth_hz()))
        s(":FREQuency:RANGe:LOWer?", lambda a: no_args(a) or nr3(FREQUENCY_RANGE_HZ[0]))
        s(":PEAKdetector[:THReshold]", lambda a: self._set("threshold_pct", int(math.floor(THRESHOLD_PCT.parse(a) + 0.5))))
        s(":PEAKdetector[:THReshold]?", lambda a: str(int(THRESHOLD_PCT.query(a, self.threshold_pct))))
        s(":REInit", self._reinit_command)
        # the SCPI measurement system
        c("ABORt", self._abort)
        c("CONFigure?", lambda a: no_args(a) or CONFIGURATIONS[self.configured])
        c("CONFigure[:SCALar][:POWer]", lambda a: self._configure(a, "POW"))
        c("CONFigure[:SCALar]:CURRent[:DC]", lambda a: self._configure(a, "CURR"))
        c("CONFigure[:SCALar]:PDENsity", lambda a: self._configure(a, "PDEN"))
        c("CONFigure[:SCALar]:FREQuency", lambda a: self._configure(a, "FREQ"))
        c("CONFigure[:SCALar]:TEMPerature", lambda a: self._configure(a, "TEMP"))
        c("CONFigure[:SCALar]:RESistance", lambda a: self._configure(a, "RES"))
        c("INITiate[:IMMediate]", self._initiate)
        c("INITiate:CONTinuous", self._initiate_continuous)
        c("FETCh?", self._fetch)
        c("FETCh:STATe?", lambda a: no_args(a) or ("1" if self.last is not None or self.continuous else "0"))
        c("READ?", self._read)
        c("MEASure[:SCALar][:POWer]?", lambda a: self._measure(a, "POW"))
        # measure now, FETCh? later (the ThorlabsPM100 package's way)
        c("MEASure[:SCALar][:POWer]", self._configure_and_initiate)
        c("MEASure[:SCALar]:CURRent[:DC]?", lambda a: self._measure(a, "CURR"))
        c("MEASure[:SCALar]:PDENsity?", lambda a: self._measure(a, "PDEN"))
        c("MEASure[:SCALar]:FREQuency?", lambda a: self._measure(a, "FREQ"))
        c("MEASure[:SCALar]:TEMPerature?", lambda a: self._measure(a, "TEMP"))
        c("MEASure[:SCALar]:RESistance?", lambda a: self._measure(a, "RES"))
        self.status_registers("OPERation", "QUEStionable", "MEASurement", "AUXiliary")
        self._refuse_other_sensors()

    # -- what a photodiode cannot do ---------------------------------------------------------

    def sense(self, pattern: str, handler) -> None:
        """A SENSe command: ``[:SENSe[n]]`` in front, and the one channel's suffix checked."""
        def on_channel(args: str, channel: int = 1, *_):
            if channel != 1:
                raise ScpiError(*HEADER_SUFFIX_OUT_OF_RANGE)
            return handler(args)
        self.command("[:SENSe[n]]" + pattern, on_channel)

    def _refuse_other_sensors(self) -> None:
        r = self.refuse
        for pattern in ("CONFigure[:SCALar]:ENERgy", "CONFigure[:SCALar]:EDENsity", "MEASure[:SCALar]:ENERgy?",
                        "MEASure[:SCALar]:EDENsity?", "[:SENSe[n]]:ENERgy:RANGe[:UPPer]",
                        "[:SENSe[n]]:ENERgy:RANGe[:UPPer]?", "[:SENSe[n]]:ENERgy:REFerence",
                        "[:SENSe[n]]:ENERgy:REFerence?", "[:SENSe[n]]:ENERgy:REFerence:STATe",
                        "[:SENSe[n]]:ENERgy:REFerence:STATe?", "[:SENSe[n]]:CORRection:ENERgy[:PYRO][:RESPonse]",
                        "[:SENSe[n]]:CORRection:ENERgy[:PYRO][:RESPonse]?"):
            r(pattern, NOT_ENERGY)
        for pattern in ("INPut:THERmopile:ACCelerator[:STATe]", "INPut:THERmopile:ACCelerator[:STATe]?",
                        "INPut:THERmopile:ACCelerator:AUTO", "INPut:THERmopile:ACCelerator:AUTO?",
                        "INPut:THERmopile:ACCelerator:TAU", "INPut:THERmopile:ACCelerator:TAU?",
                        "[:SENSe[n]]:CORRection:POWer:THERmopile[:RESPonse]",
                        "[:SENSe[n]]:CORRection:POWer:THERmopile[:RESPonse]?"):
            r(pattern, NOT_THERMOPILE)
        for pattern in ("CONFigure[:SCALar]:VOLTage[:DC]", "MEASure[:SCALar]:VOLTage[:DC]?",
                        "[:SENSe[n]]:VOLTage[:DC]:RANGe[:UPPer]", "[:SENSe[n]]:VOLTage[:DC]:RANGe[:UPPer]?",
                        "[:SENSe[n]]:VOLTage[:DC]:RANGe:AUTO", "[:SENSe[n]]:VOLTage[:DC]:RANGe:AUTO?",
                        "[:SENSe[n]]:VOLTage[:DC]:REFerence", "[:SENSe[n]]:VOLTage[:DC]:REFerence?",
                        "[:SENSe[n]]:VOLTage[:DC]:REFerence:STATe", "[:SENSe[n]]:VOLTage[:DC]:REFerence:STATe?"):
            r(pattern, NOT_THERMAL_OR_PYRO)
        for pattern in ("CONFigure[:SCALar]:POSition", "CONFigure[:SCALar]:Q4Voltage", "MEASure[:SCALar]:POSition?",
                        "MEASure[:SCALar]:Q4Voltage?", "[:SENSe[n]]:POSition:REFerence",
                        "[:SENSe[n]]:POSition:REFerence?", "[:SENSe[n]]:POSition:REFerence:COLLect[:INITiate]",
                        "[:SENSe[n]]:POSition:REFerence:COLLect:ABORt"):
            r(pattern, NOT_QUADRANT)
        r("[:SENSe[n]]:CORRection:POWer[:PDIode][:RESPonse]", HAS_EEPROM)
        for error, patterns in PM400_ONLY.items():
            for pattern in patterns:
                r(pattern, error)

    # -- state ---------------------------------------------------------------------------------

    def power_on(self) -> None:
        super().power_on()
        self._defaults()

    def _defaults(self) -> None:
        """The settings *RST and power-on restore (not the status registers: *CLS clears those)."""
        self.unit, self.averaging, self.auto_range = "W", 1, True
        self.gain = len(CURRENT_RANGES_A) - 1  # the least sensitive range until a measurement picks one
        self.wavelength_nm, self.input_loss_db, self.beam_mm = WAVELENGTH.default, 0.0, BEAM_MM.default
        self.reference_w, self.relative, self.filter, self.zero_a = 0.0, False, False, 0.0
        self.reference_a, self.relative_current = 0.0, False
        self.beeper, self.line_frequency, self.brightness, self.contrast = True, 50, 1.0, 0.5
        self.threshold_pct, self.adapter = int(THRESHOLD_PCT.default), "PHOTodiode"
        self.configured = "POW"
        self.continuous = False
        self.last: tuple[str, float] | None = None  # (configuration, raw value) of the last INITiate
        self.settled_at_ns = 0  # the gain stage settles after a range change (world time)
        self.head.wavelength_nm = self.wavelength_nm

    def _set(self, attribute: str, value) -> None:
        setattr(self, attribute, value)
        if attribute == "wavelength_nm":
            self.head.wavelength_nm = value

    def _reset(self, args: str) -> None:
        no_args(args)
        self._defaults()  # the reference: "To reset the SCPI registers use CLS"
        self.set_condition("OPERation", RANGING, False)

    def _reinit(self) -> None:
        """Sensor unplugged and plugged back: what belongs to the sensor returns to its defaults."""
        self.last, self.continuous = None, False
        self.reference_w = self.reference_a = self.zero_a = 0.0
        self.relative = self.relative_current = False

    def _reinit_command(self, args: str) -> None:
        no_args(args)
        self._reinit()

    def _set_line_frequency(self, args: str) -> None:
        value = int(Number(50, 60, 50, integer=True).parse(args))
        if value not in (50, 60):
            raise ScpiError(*ILLEGAL_PARAMETER)
        self.line_frequency = value

    def _clock(self) -> datetime.datetime:
        return datetime.datetime.now() + datetime.timedelta(seconds=self.clock_offset_s)

    @staticmethod
    def _integers(args: str, count: int) -> list[int]:
        parts = [p.strip() for p in args.split(",")] if args.strip() else []
        if len(parts) < count:
            raise ScpiError(*MISSING_PARAMETER)
        if len(parts) > count:
            raise ScpiError(-108, "Parameter not allowed")
        out = []
        for part in parts:
            value = parse_number(part)
            if value != int(value):
                raise ScpiError(-104, "Data type error")
            out.append(int(value))
        return out

    def _set_date(self, args: str) -> None:
        year, month, day = self._integers(args, 3)
        now = self._clock()
        try:
            wanted = now.replace(year=year, month=month, day=day)
        except ValueError:
            raise ScpiError(*DATA_OUT_OF_RANGE) from None
        self.clock_offset_s += (wanted - now).total_seconds()

    def _set_time(self, args: str) -> None:
        hour, minute, second = self._integers(args, 3)
        now = self._clock()
        try:
            wanted = now.replace(hour=hour, minute=minute, second=second, microsecond=0)
        except ValueError:
            raise ScpiError(*DATA_OUT_OF_RANGE) from None
        self.clock_offset_s += (wanted - now).total_seconds()

    # -- ranges ---------------------------------------------------------------------------------

    @staticmethod
    def _fit(table: tuple[float, ...], value: float) -> int:
        """The most sensitive range that holds ``value`` (the least sensitive for more)."""
        for index, top in enumerate(table):
            if value <= top * (1 + 1e-9):
                return index
        return len(table) - 1

    def _range_index(self, args: str, table: tuple[float, ...], unit: str, *, query: bool) -> int | None:
        text = args.strip()
        if not text:
            if query:
                return None
            raise ScpiError(*MISSING_PARAMETER)
        word = keyword(text)
        if word == "MIN":
            return 0
        if word == "MAX":
            return len(table) - 1
        if word == "DEF":
            raise ScpiError(*ILLEGAL_PARAMETER)  # the reference lists MIN and MAX only
        step = text.upper()
        if step in ("UP", "DOWN"):  # the next less or more sensitive gain, where there is one (PM100D2 reference)
            if query:
                raise ScpiError(*ILLEGAL_PARAMETER)  # the query takes a value, MIN, MAX or AUTO
            return min(self.gain + 1, len(table) - 1) if step == "UP" else max(self.gain - 1, 0)
        value = parse_number(text, unit)
        if value < 0:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        return self._fit(table, value)

    def _set_range(self, args: str, table: tuple[float, ...], unit: str) -> None:
        index = self._range_index(args, table, unit, query=False)
        assert index is not None  # None only for a query without an argument
        self.gain = index
        self.auto_range = False  # choosing a range ends auto ranging, as on the meter
        self.settled_at_ns = self.world.now_ns() + self.world.scaled_ns(RANGE_SETTLE_S)
        self.set_condition("OPERation", RANGING, True)

    def _settle(self) -> None:
        """Measuring waits while the gain stage settles after a range change; then the ranging
        condition ends."""
        wait_ns = self.settled_at_ns - self.world.now_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)
        self.set_condition("OPERation", RANGING, False)

    def handle_line(self, line: str):
        if self.status["OPERation"]["CONDition"] & RANGING and self.world.now_ns() >= self.settled_at_ns:
            self.set_condition("OPERation", RANGING, False)
        return super().handle_line(line)

    def _range_query(self, args: str, table: tuple[float, ...], unit: str) -> str:
        if args.strip().upper() == "AUTO":  # every range, least sensitive first
            return ",".join(nr3(v) for v in reversed(table))
        index = self._range_index(args, table, unit, query=True)
        return nr3(table[self.gain if index is None else index])

    def _bandwidth_hz(self) -> float:
        return FILTERED_BANDWIDTH_HZ if self.filter else FREQUENCY_RANGE_HZ[1]

    # -- corrections ------------------------------------------------------------------------------

    def _responsivity(self, wavelength_nm: float | None = None) -> float:
        # InGaAs: about 0.9 A/W at 1310 nm to 1.0 A/W at 1550 nm (the photodiode model's slope)
        nm = self.wavelength_nm if wavelength_nm is None else wavelength_nm
        return 0.9 + (nm - 1310.0) * (0.1 / 240.0)

    def _responsivity_query(self, args: str) -> str:
        text = args.strip()
        word = keyword(text) if text else None
        if not text:
            return nr3(self._responsivity())
        if word == "MIN":
            return nr3(self._responsivity(WAVELENGTH.minimum))
        if word == "MAX":
            return nr3(self._responsivity(WAVELENGTH.maximum))
        if word == "DEF":
            return nr3(self._responsivity(WAVELENGTH.default))
        nm = parse_number(text, "M", units=WAVELENGTH.units)  # the curve at a wavelength in nm
        if not WAVELENGTH.minimum <= nm <= WAVELENGTH.maximum:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        return nr3(self._responsivity(nm))

    def _zero(self, args: str) -> None:
        no_args(args)
        dark_w = 10 ** (self.head.read_dbm(self.world.now_ns(), self.world.now_ns()) / 10) / 1000
        self.zero_a = dark_w * self._responsivity() if self.head.tap is None else 0.0

    # -- measuring ------------------------------------------------------------------------------

    def _take(self) -> float:
        """The sensor's power in dBm, integrated over the averaging window (the user attenuation
        not yet added); with auto ranging the range that holds it becomes the range in use."""
        self._settle()
        window_ns = self.world.scaled_ns(self.averaging * SAMPLE_S)
        t0 = self.world.now_ns()
        time.sleep(window_ns / 1e9)  # the meter integrates light for this long before it answers
        dbm = self.head.read_dbm(t0, t0 + window_ns)
        if self.auto_range:
            self.gain = self._fit(POWER_RANGES_W, 10 ** (dbm / 10) / 1000)
        return dbm

    def _frequency(self) -> float:
        """Rising edges of the light through the threshold over the gate, per second."""
        gate_ns = self.world.scaled_ns(FREQUENCY_GATE_S)
        t0 = self.world.now_ns()
        time.sleep(gate_ns / 1e9)
        if self.head.tap is None:
            return 0.0
        samples = []
        for i in range(FREQUENCY_SAMPLES):
            dbm = self.world.port_power_dbm(self.head.tap.port, int(t0 + (i + 0.5) * gate_ns / FREQUENCY_SAMPLES))
            samples.append(0.0 if dbm is None else 10 ** ((dbm - self.head.tap.loss_db) / 10) / 1000)
        if self.auto_range:  # the range follows the signal's peaks
            self.gain = self._fit(POWER_RANGES_W, max(samples))
        threshold_w = self.threshold_pct / 100 * POWER_RANGES_W[self.gain]
        high = [w > threshold_w for w in samples]
        edges = sum(1 for before, now in zip(high, high[1:]) if now and not before)
        return edges / FREQUENCY_GATE_S

    def _acquire(self, configuration: str) -> tuple[str, float]:
        if configuration == "FREQ":
            return configuration, self._frequency()
        if configuration in ("TEMP", "RES"):
            return configuration, HEAD_TEMPERATURE_C
        return configuration, self._take()

    def _format(self, reading: tuple[str, float]) -> str:
        configuration, value = reading
        if configuration in ("FREQ", "TEMP"):
            return nr3(value)
        if configuration == "RES":
            kelvin, kelvin0 = value + 273.15, 25.0 + 273.15
            return nr3(NTC_R0_OHM * math.exp(NTC_BETA_K * (1 / kelvin - 1 / kelvin0)))
        if "out_of_range" in self.faults:
            return nr3(OVER_RANGE)
        sensor_w = 10 ** (value / 10) / 1000
        if configuration == "CURR":
            amps = sensor_w * self._responsivity()
            if amps > CURRENT_RANGES_A[self.gain] * (1 + 1e-9):
                return nr3(OVER_RANGE)
            return nr3(amps - self.reference_a if self.relative_current else amps)
        if sensor_w > POWER_RANGES_W[self.gain] * (1 + 1e-9):
            return nr3(OVER_RANGE)
        dbm = value + self.input_loss_db  # the meter adds the declared input loss back (an attenuator in front)
        watts = 10 ** (dbm / 10) / 1000
        if configuration == "PDEN":
            area_cm2 = math.pi * (self.beam_mm / 20) ** 2
            return nr3(watts / area_cm2)
        if self.relative:
            if self.unit == "DBM":
                reference_dbm = -999.0 if self.reference_w <= 0 else 10 * math.log10(self.reference_w * 1000)
                return nr3(dbm - reference_dbm)
            watts -= self.reference_w
        return nr3(dbm if self.unit == "DBM" else watts)

    def _abort(self, args: str) -> None:
        no_args(args)
        self.continuous, self.last = False, None

    def _configure(self, args: str, configuration: str) -> None:
        no_args(args)
        self.configured, self.continuous, self.last = configuration, False, None

    def _initiate(self, args: str) -> None:
        no_args(args)
        self.last = self._acquire(self.configured)

    def _configure_and_initiate(self, args: str) -> None:
        self._configure(args, "POW")
        self._initiate(args)

    def _initiate_continuous(self, args: str) -> None:
        no_args(args)
        self.continuous = True

    def _fetch(self, args: str) -> str:
        no_args(args)  # an offset is for the PM400's scope mode only
        if self.continuous:
            self.last = self._acquire(self.configured)
        if self.last is None:
            raise ScpiError(*DATA_STALE)
        return self._format(self.last)

    def _read(self, args: str) -> str:
        no_args(args)
        self.last = self._acquire(self.configured)
        return self._format(self.last)

    def _measure(self, args: str, configuration: str) -> str:
        no_args(args)
        self.configured, self.continuous = configuration, False
        self.last = self._acquire(configuration)
        return self._format(self.last)
