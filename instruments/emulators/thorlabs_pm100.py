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

The emulator is in parts: its numbers, ranges and refused commands (thorlabs_pm100_tables.py),
how it measures (thorlabs_pm100_measuring.py: the gain stage, the corrections, the measurement
system); this module holds the command tree, the console's state and its clock.
"""

from __future__ import annotations

import datetime
import math
import random

from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    HEADER_SUFFIX_OUT_OF_RANGE,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    Number,
    ScpiError,
    boolean,
    choice,
    no_args,
    parse_number,
)
from lumion_hil.instruments.emulators.thorlabs_pm100_measuring import PM100Measuring
from lumion_hil.instruments.emulators.thorlabs_pm100_tables import (
    ADAPTERS,
    AVERAGING,
    BEAM_MM,
    BRIGHTNESS,
    CONFIGURATIONS,
    CONTRAST,
    CURRENT_RANGES_A,
    FREQUENCY_RANGE_HZ,
    INPUT_LOSS,
    OTHER_SENSORS,
    PM400_ONLY,
    POWER_RANGES_W,
    RANGING,
    REFERENCE_A,
    REFERENCE_W,
    THRESHOLD_PCT,
    WAVELENGTH,
    ZERO_A,
    nr3,
)


class ThorlabsPM100Emulator(PM100Measuring):
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

    # -- the SENSe subsystem's one channel ----------------------------------------------------

    def sense(self, pattern: str, handler) -> None:
        """A SENSe command: ``[:SENSe[n]]`` in front, and the one channel's suffix checked."""
        def on_channel(args: str, channel: int = 1, *_):
            if channel != 1:
                raise ScpiError(*HEADER_SUFFIX_OUT_OF_RANGE)
            return handler(args)
        self.command("[:SENSe[n]]" + pattern, on_channel)

    # -- what a photodiode cannot do ---------------------------------------------------------

    def _refuse_other_sensors(self) -> None:
        for error, patterns in (*OTHER_SENSORS.items(), *PM400_ONLY.items()):
            for pattern in patterns:
                self.refuse(pattern, error)

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
