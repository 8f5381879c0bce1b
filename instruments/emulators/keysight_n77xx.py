"""Emulated Keysight N7744A / N7745A multi-port power meter over the world, on raw SCPI/TCP.

Per channel: wavelength, unit (0 dBm, 1 W), averaging time, auto range, trigger input, and
hardware-timed logging. Logging starts when ``FUNC:STAT LOGG,STAR`` is handled; sample i
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

from instruments.emulators.photodiode import PhotodiodeChannel, taps_for
from instruments.emulators.scpi import (
    DATA_OUT_OF_RANGE,
    ILLEGAL_PARAMETER,
    SETTINGS_CONFLICT,
    ScpiDevice,
    ScpiError,
    ieee_block,
    parse_number,
)

SENTINEL = 9.91e37


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
        self.trigger = "IGN"
        self.log_count = 100
        self.log_atime_s = 0.0001
        self.log_start_ns: int | None = None
        self.function = "NONE"


class KeysightN77xxEmulator(ScpiDevice):
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
        self.command("*IDN?", lambda a: self.identity)
        self.command("*OPC?", lambda a: "1")
        self.command("*RST", self._reset)
        self.command(":READ#:CHANnel#:POWer?", self._read)
        self.command(":FETCh#:CHANnel#:POWer?", self._read)
        self.command(":SENSe#:POWer:WAVelength", self._setter(self._set_wavelength))
        self.command(":SENSe#:POWer:WAVelength?", lambda a, n: keysight_float(self._ch(n).head.wavelength_nm * 1e-9))
        self.command(":SENSe#:POWer:UNIT", self._setter(self._set_unit))
        self.command(":SENSe#:POWer:UNIT?", lambda a, n: str(self._ch(n).unit))
        self.command(":SENSe#:POWer:ATIMe", self._setter(self._set_atime))
        self.command(":SENSe#:POWer:ATIMe?", lambda a, n: keysight_float(self._ch(n).atime_s))
        self.command(":SENSe#:POWer:RANGe:AUTO", self._setter(self._set_auto_range))
        self.command(":TRIGger#:INPut", self._setter(self._set_trigger))
        self.command(":TRIGger#:INPut?", lambda a, n: self._ch(n).trigger)
        self.command(":SENSe#:FUNCtion:PARameter:LOGGing", self._setter(self._set_logging))
        self.command(":SENSe#:FUNCtion:STATe", self._function)
        self.command(":SENSe#:FUNCtion:STATe?", self._state)
        self.command(":SENSe#:FUNCtion:RESult?", self._result)

    def _ch(self, n: int) -> _Channel:
        if n not in self.channels:
            raise ScpiError(-241, "Hardware missing")
        return self.channels[n]

    def _setter(self, apply):
        def handler(args: str, n: int) -> None:
            channel = self._ch(n)
            if channel.log_start_ns is not None and not self._finished(channel):
                channel.log_start_ns, channel.function = None, "NONE"  # a setting change stops logging
            apply(channel, args.strip())

        return handler

    def _reset(self, args: str) -> None:
        for channel in self.channels.values():
            head = channel.head
            channel.__init__(head)

    def _set_wavelength(self, ch: _Channel, args: str) -> None:
        value = parse_number(args, "M")
        nm = value * 1e9 if value < 1e-3 else value  # "1550nm" parses to metres; a bare 1550 means nm
        if not 800 <= nm <= 1700:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.head.wavelength_nm = nm

    def _set_unit(self, ch: _Channel, args: str) -> None:
        if args not in ("0", "1", "DBM", "W"):
            raise ScpiError(*ILLEGAL_PARAMETER)
        ch.unit = 0 if args in ("0", "DBM") else 1

    def _set_atime(self, ch: _Channel, args: str) -> None:
        seconds = parse_number(args, "S")
        if not self.min_interval_s <= seconds <= 10:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.atime_s = seconds

    def _set_auto_range(self, ch: _Channel, args: str) -> None:
        if args.upper() not in ("0", "1", "ON", "OFF"):
            raise ScpiError(*ILLEGAL_PARAMETER)
        ch.auto_range = args.upper() in ("1", "ON")

    def _set_trigger(self, ch: _Channel, args: str) -> None:
        mode = args.upper()[:3]
        if mode not in ("IGN", "SME", "CME"):
            raise ScpiError(*ILLEGAL_PARAMETER)
        ch.trigger = mode

    def _set_logging(self, ch: _Channel, args: str) -> None:
        parts = args.split(",")
        if len(parts) != 2:
            raise ScpiError(-109, "Missing parameter")
        count, atime = int(parse_number(parts[0])), parse_number(parts[1], "S")
        if not 1 <= count <= 1_000_000 or not self.min_interval_s <= atime <= 10:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        ch.log_count, ch.log_atime_s = count, atime

    def _value(self, ch: _Channel, dbm: float) -> float:
        if "out_of_range" in self.faults:
            return SENTINEL
        return dbm if ch.unit == 0 else 10 ** (dbm / 10) / 1000

    def _read(self, args: str, slot: int, chan: int) -> str:
        if chan != 1:
            raise ScpiError(-241, "Hardware missing")
        ch = self._ch(slot)
        window = int(ch.atime_s * 1e9)
        t0 = self.world.now_ns()
        time.sleep(window / 1e9)  # the head integrates for its averaging time before it answers
        return keysight_float(self._value(ch, ch.head.read_dbm(t0, t0 + window)))

    def _function(self, args: str, n: int) -> None:
        ch = self._ch(n)
        parts = [p.strip().upper() for p in args.split(",")]
        if len(parts) != 2 or not parts[0].startswith("LOGG") or parts[1][:4] not in ("STAR", "STOP"):
            raise ScpiError(*ILLEGAL_PARAMETER)
        if parts[1].startswith("STAR"):
            if ch.trigger != "IGN":
                raise ScpiError(*SETTINGS_CONFLICT)  # only free-run logging is emulated
            ch.log_start_ns, ch.function = self.world.now_ns(), "LOGGING_STABILITY"
        else:
            ch.log_start_ns, ch.function = None, "NONE"

    def _finished(self, ch: _Channel) -> bool:
        end = ch.log_start_ns + ch.log_count * int(ch.log_atime_s * 1e9)
        return self.world.now_ns() >= end

    def _state(self, args: str, n: int) -> str:
        ch = self._ch(n)
        if ch.log_start_ns is None:
            return f"{ch.function},COMPLETE"
        return f"{ch.function},{'COMPLETE' if self._finished(ch) else 'PROGRESS'}"

    def _result(self, args: str, n: int) -> bytes:
        ch = self._ch(n)
        if ch.log_start_ns is None or not self._finished(ch):
            raise ScpiError(-230, "Data corrupt or stale")
        step = int(ch.log_atime_s * 1e9)
        start = ch.log_start_ns
        values = [self._value(ch, ch.head.read_dbm(start + i * step, start + (i + 1) * step))
                  for i in range(ch.log_count)]
        return ieee_block(struct.pack(f"<{len(values)}f", *values))
