"""Emulated Keysight N7744A / N7745A multi-port power meter over the world, on raw SCPI/TCP.

The command tree of Keysight's N77xx programming guide: optional nodes
(``:READ[n][:CHANnel[m]][:SCALar]:POWer[:DC]?``), MIN/MAX/DEF, units, compound messages. Per
channel: wavelength, unit (0 or DBM, 1 or W/Watt), averaging time, range and auto range, auto
gain, reference and relative readings, input loss, zero, trigger input and output, and
hardware-timed logging, free-running (trigger input IGNore) or started by the next trigger
(CMEasure; ``:TRIGger NODEA`` is that trigger). Booleans and integers come back as ``+0``/``+1``.
The error queue answers ``+0,"No error"`` when empty, as Keysight instruments do. Logging starts when ``FUNC:STAT LOGG,STAR`` is handled; sample i
averages the light over [start + i*T, start + (i+1)*T] from the world's history, so a trace
shows a switch's transition where the world says it happened. ``FUNC:STAT?`` answers
``LOGGING_STABILITY,PROGRESS`` while it runs and ``LOGGING_STABILITY,COMPLETE`` after
(the strings public scripts wait on; ``NONE,COMPLETE`` when no function ran: assumption).
Averaging and logging times are settings the user chose: they are honoured exactly, never
scaled by the bench's time scale (which shortens the emulator's own latencies only).
Changing a setting of a logging channel stops its run. Over range (fault ``out_of_range``):
readings are the 9.91E37 sentinel.
"""

from __future__ import annotations

import random
import struct
import time

from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from lumion_hil.instruments.emulators.scpi import (
    DATA_OUT_OF_RANGE,
    DATA_STALE,
    HARDWARE_MISSING,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    SETTINGS_CONFLICT,
    Number,
    ScpiDevice,
    ScpiError,
    boolean,
    choice,
    ieee_block,
    keyword,
    no_args,
    parse_number,
)

SENTINEL = 9.91e37


def _flag(on: bool) -> str:
    """Booleans come back as NR1 with a sign, like every integer this meter sends."""
    return "+1" if on else "+0"


def keysight_float(value: float) -> str:
    """-20.0 -> '-2.00000000E+001' (three exponent digits, as the instrument prints)."""
    if value == 0:
        return "+0.00000000E+000"
    mantissa, exponent = f"{value:+.8E}".split("E")
    return f"{mantissa}E{int(exponent):+04d}"


class _Channel:
    def __init__(self, head: PhotodiodeChannel):
        self.head = head
        self.unit = 0
        self.atime_s = 0.0001
        self.auto_range = True
        self.auto_gain = True
        self.range_dbm = 10.0
        self.continuous = False
        self.trigger = "IGN"
        self.trigger_output = "DIS"
        self.armed = False  # logging started, waiting for a trigger (CMEasure)
        self.log_count = 100
        self.log_atime_s = 0.0001
        self.log_start_ns: int | None = None
        self.function = "NONE"
        self.reference = {"TOREF": 0.0, "TOMOD": 0.0}
        self.relative = False
        self.loss_db = 0.0
        self.head.wavelength_nm = 1550.0


WAVELENGTH_M = Number(800e-9, 1700e-9, 1550e-9, "M")
ATIME_S = Number(1e-4, 10.0, 1e-4, "S")
RANGE_DBM = Number(-30.0, 10.0, 10.0, "DBM")
LOSS_DB = Number(-200.0, 200.0, 0.0, "DB")
REFERENCE_DBM = Number(-200.0, 200.0, 0.0, "DBM")


class KeysightN77xxEmulator(ScpiDevice):
    no_error = '+0,"No error"'  # Keysight's form; a clear-errors loop waits for exactly this

    def __init__(self, name: str, spec, world, bench, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.world = world
        self.min_interval_s = spec.emulation.min_sample_interval_s
        rng = random.Random(seed)
        taps = taps_for(bench, name)
        self.channels = {ch: _Channel(PhotodiodeChannel(world, taps.get(ch), noise_db=spec.emulation.noise_db,
                                                        dark_floor_dbm=spec.emulation.dark_floor_dbm, rng=rng))
                         for ch in range(1, spec.channels + 1)}
        self.identity = f"Keysight Technologies,N7744A,EMU{seed:05d},1.0.0"
        c = self.command
        head = "[n][:CHANnel[m]]"
        c("*IDN?", lambda a: self.identity)
        c("*OPC?", lambda a: "1")
        c("*RST", self._reset)
        c(f":READ{head}[:SCALar]:POWer[:DC]?", self._read)
        c(f":FETCh{head}[:SCALar]:POWer[:DC]?", self._read)
        c(f":READ{head}[:SCALar]:POWer:ALL:CSV?", self._all_csv)
        c(f":FETCh{head}[:SCALar]:POWer:ALL:CSV?", self._all_csv)
        c(f":READ{head}[:SCALar]:POWer:ALL?", self._all_block)
        c(f":FETCh{head}[:SCALar]:POWer:ALL?", self._all_block)
        c(f":INITiate{head}[:IMMediate]", lambda a, n, m: self._channel(n, m) and None)
        c(f":INITiate{head}:CONTinuous", self._setter(lambda ch, a: setattr(ch, "continuous", boolean(a))))
        c(f":INITiate{head}:CONTinuous?", lambda a, n, m: _flag(self._channel(n, m).continuous))
        c(f":SENSe{head}:POWer:WAVelength", self._setter(self._set_wavelength))
        c(f":SENSe{head}:POWer:WAVelength?", lambda a, n, m: keysight_float(
            WAVELENGTH_M.query(a, self._channel(n, m).head.wavelength_nm * 1e-9)))
        c(f":SENSe{head}:POWer:UNIT", self._setter(self._set_unit))
        c(f":SENSe{head}:POWer:UNIT?", lambda a, n, m: f"+{self._channel(n, m).unit}")
        c(f":SENSe{head}:POWer:ATIMe", self._setter(self._set_atime))
        c(f":SENSe{head}:POWer:ATIMe?", lambda a, n, m: keysight_float(ATIME_S.query(a, self._channel(n, m).atime_s)))
        c(f":SENSe{head}:POWer:RANGe[:UPPer]", self._setter(self._set_range))
        c(f":SENSe{head}:POWer:RANGe[:UPPer]?", lambda a, n, m: keysight_float(
            RANGE_DBM.query(a, self._channel(n, m).range_dbm)))
        c(f":SENSe{head}:POWer:RANGe:AUTO", self._setter(lambda ch, a: setattr(ch, "auto_range", boolean(a))))
        c(f":SENSe{head}:POWer:RANGe:AUTO?", lambda a, n, m: _flag(self._channel(n, m).auto_range))
        c(f":SENSe{head}:POWer:GAIN:AUTO", self._setter(lambda ch, a: setattr(ch, "auto_gain", boolean(a))))
        c(f":SENSe{head}:POWer:GAIN:AUTO?", lambda a, n, m: _flag(self._channel(n, m).auto_gain))
        c(f":SENSe{head}:POWer:REFerence", self._setter(self._set_reference))
        c(f":SENSe{head}:POWer:REFerence?", self._reference)
        c(f":SENSe{head}:POWer:REFerence:STATe", self._setter(lambda ch, a: setattr(ch, "relative", boolean(a))))
        c(f":SENSe{head}:POWer:REFerence:STATe?", lambda a, n, m: _flag(self._channel(n, m).relative))
        c(f":SENSe{head}:CORRection[:LOSS][:INPut][:MAGNitude]", self._setter(
            lambda ch, a: setattr(ch, "loss_db", LOSS_DB.parse(a))))
        c(f":SENSe{head}:CORRection[:LOSS][:INPut][:MAGNitude]?", lambda a, n, m: keysight_float(
            LOSS_DB.query(a, self._channel(n, m).loss_db)))
        c(f":SENSe{head}:CORRection:COLLect:ZERO", lambda a, n, m: self._channel(n, m) and None)
        c(f":SENSe{head}:CORRection:COLLect:ZERO?", lambda a, n, m: self._channel(n, m) and "+0")
        c(":SENSe:CORRection:COLLect:ZERO:ALL", lambda a: None)
        c(":SENSe:CORRection:COLLect:ZERO:ALL?", lambda a: "+0")
        c(f":TRIGger{head}:INPut", self._setter(self._set_trigger))
        c(f":TRIGger{head}:INPut?", lambda a, n, m: {"IGN": "IGNore", "SME": "SMEasure", "CME": "CMEasure",
                                                      "PAS": "PASSthru"}[self._channel(n, m).trigger])
        c(f":TRIGger{head}:OUTPut", self._setter(self._set_trigger_output))
        c(f":TRIGger{head}:OUTPut?", lambda a, n, m: {"DIS": "DISabled", "AVG": "AVGover", "MEAS": "MEASure",
                                                       "MOD": "MODulation"}[self._channel(n, m).trigger_output])
        c(":TRIGger", self._trigger_now)
        c(f":SENSe{head}:FUNCtion:PARameter:LOGGing", self._setter(self._set_logging))
        c(f":SENSe{head}:FUNCtion:PARameter:LOGGing?", lambda a, n, m: (
            f"+{self._channel(n, m).log_count},{keysight_float(self._channel(n, m).log_atime_s)}"))
        c(f":SENSe{head}:FUNCtion:STATe", self._function)
        c(f":SENSe{head}:FUNCtion:STATe?", self._state)
        c(f":SENSe{head}:FUNCtion:RESult?", self._result)
        c(f":SENSe{head}:FUNCtion:RESult:INDex?", self._result_index)

    def _channel(self, n: int, m: int = 1) -> _Channel:
        if n not in self.channels or m != 1:  # on N77xx the slot number is the port; channel is 1
            raise ScpiError(*HARDWARE_MISSING)
        return self.channels[n]

    # the older call sites name a channel by its slot only
    def _ch(self, n: int) -> _Channel:
        return self._channel(n)

    def power_on(self) -> None:
        super().power_on()
        for channel in getattr(self, "channels", {}).values():
            channel.__init__(channel.head)

    def _setter(self, apply):
        def handler(args: str, n: int, m: int) -> None:
            channel = self._channel(n, m)
            if channel.armed or (channel.log_start_ns is not None and not self._finished(channel)):
                channel.armed, channel.log_start_ns, channel.function = False, None, "NONE"  # a setting stops logging
            apply(channel, args.strip())

        return handler

    def _reset(self, args: str) -> None:
        no_args(args)
        for channel in self.channels.values():
            channel.__init__(channel.head)

    def _set_wavelength(self, ch: _Channel, args: str) -> None:
        if keyword(args) is None and parse_number(args, "M") > 1e-3:  # "1550" with no unit: nm, as the guide allows
            args = f"{parse_number(args)}NM"
        ch.head.wavelength_nm = WAVELENGTH_M.parse(args) * 1e9

    def _set_unit(self, ch: _Channel, args: str) -> None:
        value = args.upper()
        if value not in ("0", "1", "DBM", "W", "WATT"):
            raise ScpiError(*(MISSING_PARAMETER if not value else ILLEGAL_PARAMETER))
        ch.unit = 0 if value in ("0", "DBM") else 1

    def _set_atime(self, ch: _Channel, args: str) -> None:
        seconds = ATIME_S.parse(args)
        if seconds < self.min_interval_s:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.atime_s = seconds

    def _set_range(self, ch: _Channel, args: str) -> None:
        ch.range_dbm = RANGE_DBM.parse(args)
        ch.auto_range = False

    def _set_reference(self, ch: _Channel, args: str) -> None:
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        mode = choice(parts[0], "TOREF", "TOMOD")
        ch.reference[mode] = REFERENCE_DBM.parse(parts[1])

    def _reference(self, args: str, n: int, m: int) -> str:
        return keysight_float(self._channel(n, m).reference[choice(args or "TOREF", "TOREF", "TOMOD")])

    def _set_trigger(self, ch: _Channel, args: str) -> None:
        ch.trigger = {"IGNORE": "IGN", "SMEASURE": "SME", "CMEASURE": "CME", "PASSTHRU": "PAS"}[
            choice(args, "IGNore", "SMEasure", "CMEasure", "PASSthru").upper()]

    def _set_trigger_output(self, ch: _Channel, args: str) -> None:
        ch.trigger_output = {"DISABLED": "DIS", "AVGOVER": "AVG", "MEASURE": "MEAS", "MODULATION": "MOD"}[
            choice(args, "DISabled", "AVGover", "MEASure", "MODulation").upper()]

    def _trigger_now(self, args: str) -> None:
        """``:TRIGger NODEA`` (or 1): as if a pulse came in at the trigger input; ``NODEB`` (2)
        drives the output connector, which nothing here listens to."""
        node = choice(args if args.strip() not in ("1", "2") else {"1": "NODEA", "2": "NODEB"}[args.strip()],
                      "NODEA", "NODEB")
        if node != "NODEA":
            return
        now = self.world.now_ns()
        for ch in self.channels.values():
            if ch.armed and ch.trigger == "CME":  # a complete measurement starts with the pulse
                ch.armed, ch.log_start_ns = False, now

    def _set_logging(self, ch: _Channel, args: str) -> None:
        parts = args.split(",")
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        count, atime = int(parse_number(parts[0])), parse_number(parts[1], "S")
        if not 1 <= count <= 1_000_000 or not self.min_interval_s <= atime <= 10:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.log_count, ch.log_atime_s = count, atime

    def _value(self, ch: _Channel, dbm: float) -> float:
        if "out_of_range" in self.faults:
            return SENTINEL
        dbm += ch.loss_db
        if ch.relative:
            return dbm - ch.reference["TOREF"]
        return dbm if ch.unit == 0 else 10 ** (dbm / 10) / 1000

    def _read(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        window = int(ch.atime_s * 1e9)
        t0 = self.world.now_ns()
        time.sleep(window / 1e9)  # the head integrates for its averaging time before it answers
        return keysight_float(self._value(ch, ch.head.read_dbm(t0, t0 + window)))

    def _all(self) -> list[float]:
        t0 = self.world.now_ns()
        window = max(int(ch.atime_s * 1e9) for ch in self.channels.values())
        time.sleep(window / 1e9)
        return [self._value(ch, ch.head.read_dbm(t0, t0 + window)) for ch in self.channels.values()]

    def _all_csv(self, args: str, n: int, m: int) -> str:
        return ",".join(keysight_float(v) for v in self._all())

    def _all_block(self, args: str, n: int, m: int) -> bytes:
        values = self._all()
        return ieee_block(struct.pack(f"<{len(values)}f", *values))

    def _function(self, args: str, n: int, m: int) -> None:
        ch = self._channel(n, m)
        parts = [p.strip().upper() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        function = choice(parts[0], "LOGGing", "STABility", "MINMax")
        action = choice(parts[1], "STARt", "STOP")
        if action == "STARt":
            if ch.trigger not in ("IGN", "CME"):
                raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; only free-running and CMEasure logging "
                                                      "are emulated")
            if function != "LOGGing":
                raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; only logging is emulated")
            ch.function = "LOGGING_STABILITY"
            if ch.trigger == "CME":  # armed: the run starts at the next trigger
                ch.armed, ch.log_start_ns = True, None
            else:
                ch.armed, ch.log_start_ns = False, self.world.now_ns()
        else:
            ch.armed, ch.log_start_ns, ch.function = False, None, "NONE"

    def _finished(self, ch: _Channel) -> bool:
        end = ch.log_start_ns + ch.log_count * int(ch.log_atime_s * 1e9)
        return self.world.now_ns() >= end

    def _state(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        if ch.armed:
            return f"{ch.function},PROGRESS"
        if ch.log_start_ns is None:
            return f"{ch.function},COMPLETE"
        return f"{ch.function},{'COMPLETE' if self._finished(ch) else 'PROGRESS'}"

    def _result_index(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        if ch.log_start_ns is None:
            return "+0"
        done = (self.world.now_ns() - ch.log_start_ns) // max(1, int(ch.log_atime_s * 1e9))
        return f"+{min(ch.log_count, done)}"

    def _result(self, args: str, n: int, m: int) -> bytes:
        ch = self._channel(n, m)
        if ch.log_start_ns is None or not self._finished(ch):
            raise ScpiError(*DATA_STALE)
        step = int(ch.log_atime_s * 1e9)
        start = ch.log_start_ns
        values = [self._value(ch, ch.head.read_dbm(start + i * step, start + (i + 1) * step))
                  for i in range(ch.log_count)]
        return ieee_block(struct.pack(f"<{len(values)}f", *values))
