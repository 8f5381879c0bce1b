"""The Keysight N77xx emulator's channels: each port's settings and data acquisition function
(:class:`Channel`), and the emulator's part that addresses a channel, turns the light into its
reading, and runs its functions (:class:`N77xxChannels`): logging (free-running, started by the
next trigger, or one sample per trigger), stability and min/max, their state and their results
from the world's history."""

from __future__ import annotations

import math
import struct
from typing import Any, final

from lumion_hil.instruments.emulators.keysight_n77xx_tables import SENTINEL
from lumion_hil.instruments.emulators.photodiode import PhotodiodeChannel
from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    DATA_STALE,
    HARDWARE_MISSING,
    MISSING_PARAMETER,
    SETTINGS_CONFLICT,
    Number,
    ScpiError,
    choice,
    ieee_block,
)


@final  # never subclassed: always true, and its __init__ is the one to reset it with
class Channel:
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
        self.input_rearm = False
        self.output_rearm = False
        self.armed = False  # a function started, waiting for a trigger (CMEasure)
        self.log_count = 100
        self.log_atime_s = 0.0001
        self.stab_total_s = 1.0
        self.stab_delay_s = 0.0
        self.stab_atime_s = 0.0001
        self.minmax_mode = "CONTinuous"
        self.minmax_points = 1
        self.log_start_ns: int | None = None
        self.kind = "LOGGing"  # the function last started: LOGGing, STABility or MINMax
        self.sme_times: list[int] | None = None  # the triggers of an SMEasure run, when one runs
        self.samples: list[float] | None = None  # a finished run's data array, kept as the meter keeps it
        self.function = "NONE"
        self.reference = {"TOREF": 0.0, "TOMOD": 0.0}
        self.relative = False
        self.loss_db = 0.0
        self.head.wavelength_nm = 1550.0

    # the function's samples: count, and window i's start offset and length, ns
    def step_ns(self) -> int:
        if self.kind == "STABility":
            return int((self.stab_delay_s + self.stab_atime_s) * 1e9)
        return int(self.log_atime_s * 1e9)

    def window_ns(self) -> int:
        return int((self.stab_atime_s if self.kind == "STABility" else self.log_atime_s) * 1e9)

    def count(self) -> int:
        if self.kind == "STABility":
            return max(1, int(self.stab_total_s / (self.stab_delay_s + self.stab_atime_s) + 1e-9))
        return self.log_count


class N77xxChannels(ScpiDevice):
    """The channels of a Keysight N77xx emulator: addressed, read, and running their functions."""

    world: Any  # the emulated world (set by the emulator)
    channels: dict[int, Channel]  # by port (set by the emulator)

    # -- addressing -------------------------------------------------------------------------------

    def _channel(self, n: int, m: int = 1) -> Channel:
        if n not in self.channels or m != 1:  # on N77xx the slot number is the port; channel is 1
            raise ScpiError(*HARDWARE_MISSING)
        return self.channels[n]

    # the older call sites name a channel by its slot only
    def _ch(self, n: int) -> Channel:
        return self._channel(n)

    def _port(self, n: int) -> Channel:
        return self._channel(n)

    # -- a reading as the channel gives it -------------------------------------------------------

    def _value(self, ch: Channel, dbm: float) -> float:
        if "out_of_range" in self.faults:
            return SENTINEL
        dbm += ch.loss_db
        if ch.relative:
            return dbm - ch.reference["TOREF"]
        return dbm if ch.unit == 0 else 10 ** (dbm / 10) / 1000

    # -- data acquisition functions -------------------------------------------------------------

    def _function(self, args: str, n: int, m: int) -> None:
        ch = self._channel(n, m)
        parts = [p.strip().upper() for p in args.split(",")]
        if len(parts) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        function = choice(parts[0], "LOGGing", "STABility", "MINMax")
        action = choice(parts[1], "STARt", "STOP")
        if action == "STOP":
            self._stop(ch)
            return
        if ch.trigger == "PAS":
            raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; a passthru trigger input starts no function")
        if function == "MINMax" and ch.trigger != "IGN":
            raise ScpiError(SETTINGS_CONFLICT[0], "Settings conflict; min/max runs free (trigger input IGNore)")
        ch.kind = function
        ch.function = "MINMAX" if function == "MINMax" else "LOGGING_STABILITY"
        ch.sme_times, ch.samples = None, None
        if ch.trigger == "CME":  # armed: the run starts at the next trigger
            ch.armed, ch.log_start_ns = True, None
        elif ch.trigger == "SME":  # each trigger takes one sample
            ch.armed, ch.log_start_ns, ch.sme_times = False, None, []
        else:
            ch.armed, ch.log_start_ns = False, self.world.now_ns()

    def _stop(self, ch: Channel) -> None:
        ch.armed, ch.log_start_ns, ch.sme_times, ch.function, ch.samples = False, None, None, "NONE", None

    def _running(self, ch: Channel) -> bool:
        if ch.armed:
            return True
        if ch.kind == "MINMax":
            return ch.log_start_ns is not None
        if ch.sme_times is not None:
            return len(ch.sme_times) < ch.count()
        return ch.log_start_ns is not None and not self._finished(ch)

    def _finished(self, ch: Channel) -> bool:
        if ch.sme_times is not None:
            return len(ch.sme_times) >= ch.count()
        if ch.log_start_ns is None:
            return False
        end = ch.log_start_ns + (ch.count() - 1) * ch.step_ns() + ch.window_ns()
        return self.world.now_ns() >= end

    def _state(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        if ch.function == "NONE":
            return "NONE,COMPLETE"
        return f"{ch.function},{'PROGRESS' if self._running(ch) else 'COMPLETE'}"

    def _done(self, ch: Channel) -> int:
        if ch.sme_times is not None:
            return len(ch.sme_times)
        if ch.log_start_ns is None:
            return 0
        elapsed = self.world.now_ns() - ch.log_start_ns - ch.window_ns()
        return 0 if elapsed < 0 else min(ch.count(), elapsed // max(1, ch.step_ns()) + 1)

    def _result_index(self, args: str, n: int, m: int) -> str:
        ch = self._channel(n, m)
        return f"+{0 if ch.kind == 'MINMax' else self._done(ch)}"

    def _samples(self, ch: Channel) -> list[float]:
        if ch.kind == "MINMax":
            return self._minmax(ch)
        if ch.function == "NONE" or not self._finished(ch):
            raise ScpiError(*DATA_STALE)
        if ch.samples is not None:  # read again: the same array
            return ch.samples
        window = ch.window_ns()
        if ch.sme_times is not None:
            starts = list(ch.sme_times)
        else:
            assert ch.log_start_ns is not None  # finished, so started
            starts = [ch.log_start_ns + i * ch.step_ns() for i in range(ch.count())]
        ch.samples = [self._value(ch, ch.head.read_dbm(t, t + window)) for t in starts]
        return ch.samples

    def _minmax(self, ch: Channel) -> list[float]:
        """Minimum, maximum and current reading since the start (CONTinuous), over the last N
        readings (WINDow), or since the last restart every N readings (REFResh). Readings are
        the channel's averaging time long; past 20000 of them the windows are widened (the
        extremes of shorter flashes are then averaged away)."""
        if ch.function == "NONE" or ch.log_start_ns is None:
            raise ScpiError(*DATA_STALE)
        now = self.world.now_ns()
        step = max(1, int(ch.atime_s * 1e9))
        done = max(1, (now - ch.log_start_ns) // step)
        first = 0
        if ch.minmax_mode == "WINDow":
            first = max(0, done - ch.minmax_points)
        elif ch.minmax_mode == "REFResh":
            first = (done - 1) // ch.minmax_points * ch.minmax_points
        start = ch.log_start_ns + first * step
        count = max(1, done - first)
        stride = max(1, math.ceil(count / 20000))
        readings = [self._value(ch, ch.head.read_dbm(start + i * step, start + min(i + stride, count) * step))
                    for i in range(0, count, stride)]
        current = self._value(ch, ch.head.read_dbm(now - step, now))
        return [min(readings), max(readings), current]

    def _result(self, args: str, n: int, m: int) -> bytes:
        values = self._samples(self._channel(n, m))
        return ieee_block(struct.pack(f"<{len(values)}f", *values))

    def _result_block(self, args: str, n: int, m: int) -> bytes:
        """``offset,count``: part of the result array, for runs too long for one transfer."""
        ch = self._channel(n, m)
        parts = [p.strip() for p in args.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ScpiError(*MISSING_PARAMETER)
        offset, count = (int(Number(0, 1_000_000, 0, integer=True).parse(p)) for p in parts)
        values = self._samples(ch)
        if offset + count > len(values):
            raise ScpiError(*DATA_OUT_OF_RANGE)
        part = values[offset:offset + count]
        return ieee_block(struct.pack(f"<{len(part)}f", *part))
