"""Keysight 8163B / N7744A / N7745A optical power meters (SCPI over LAN or GPIB).

Multi-channel. On N77xx the number after READ and SENS is the port (channel); CHAN is 1.
Hardware-timed logging (FUNC:PAR:LOGG, FUNC:STAT LOGG,STAR, FUNC:RES? as a little-endian
float32 IEEE block) is how a trace is taken: the meter times the samples, not the harness.
"""

from __future__ import annotations

import math
import time

from lumion_hil.instruments.protocols import Identity, InstrumentError, OutOfRange, PowerMeter, PowerTrace, Reading
from lumion_hil.instruments.scpi import ScpiInstrument, parse_identity, query

INVALID_ABOVE = 1e20  # over-range readings come back as a huge sentinel (about 9.9E37)


def reading(value: float, raw: str = "") -> Reading:
    if not math.isfinite(value) or value > INVALID_ABOVE:
        return OutOfRange("over", raw or f"{value:g}")
    return value


def parse_reading(reply: str) -> Reading:
    return reading(float(reply), reply.strip())


class KeysightN77xx(ScpiInstrument, PowerMeter):
    error_query = ":SYST:ERR?"

    identity = query("*IDN?", parse_identity, "vendor, model, serial, firmware")

    def __init__(self, session, *, channels: int = 4, **kw):
        super().__init__(session, **kw)
        self.channels = channels
        self._unit_is_dbm: dict[int, bool] = {}

    def identify(self) -> Identity:
        return self.identity

    def installed_channels(self, most: int = 8) -> int:
        """How many power-meter ports the mainframe has, as it reports them (``:SLOT<n>:EMPTy?``
        is 0 for a fitted one), counted from port 1 until the first empty one."""
        count = 0
        for slot in range(1, most + 1):
            if self.ask(f":SLOT{slot}:EMPT?", lambda r: int(float(r))) != 0:
                break
            count = slot
        return count

    def _ch(self, channel: int) -> int:
        if not 1 <= channel <= self.channels:
            raise ValueError(f"{self.name}: channel {channel} out of 1..{self.channels}")
        return channel

    def set_wavelength_nm(self, wavelength_nm: float, channel: int = 1) -> None:
        self.send(f":SENS{self._ch(channel)}:POW:WAV {wavelength_nm:g}nm")

    def wavelength_nm(self, channel: int = 1) -> float:
        return self.ask(f":SENS{self._ch(channel)}:POW:WAV?", float) * 1e9

    def set_unit_dbm(self, channel: int = 1) -> None:
        self.send(f":SENS{self._ch(channel)}:POW:UNIT 0")
        self._unit_is_dbm[channel] = True

    def set_averaging_time_s(self, seconds: float, channel: int = 1) -> None:
        self.send(f":SENS{self._ch(channel)}:POW:ATIME {seconds:g}s")

    def set_auto_range(self, on: bool = True, channel: int = 1) -> None:
        self.send(f":SENS{self._ch(channel)}:POW:RANG:AUTO {1 if on else 0}")

    def _ensure_dbm(self, channel: int) -> None:
        if not self._unit_is_dbm.get(channel):
            self._unit_is_dbm[channel] = self.ask(f":SENS{channel}:POW:UNIT?", lambda r: int(float(r))) == 0
            if not self._unit_is_dbm[channel]:
                self.set_unit_dbm(channel)

    def read_dbm(self, channel: int = 1) -> Reading:
        self._ch(channel)
        self._ensure_dbm(channel)
        return self.ask(f":READ{channel}:CHAN1:POW?", parse_reading)

    # -- hardware-timed logging -------------------------------------------------------------------

    @property
    def hardware_logging(self) -> bool:
        return True

    def start_trace(self, channel: int, duration_s: float, interval_s: float):
        self._ch(channel)
        self._ensure_dbm(channel)
        count = max(1, int(round(duration_s / interval_s)))
        self.send(f":TRIG{channel}:INP IGN")
        self.send(f":SENS{channel}:FUNC:PAR:LOGG {count},{interval_s:g}s")
        command = f":SENS{channel}:FUNC:STAT LOGG,STAR"
        sent = time.perf_counter_ns()
        # The meter starts logging when it handles the command: after `sent`, before the
        # answer to the *OPC? on the same line arrives.
        reply = self.session.query(f"{command};*OPC?")
        answered = time.perf_counter_ns()
        if reply.strip() != "1":
            raise InstrumentError(self.name, f"{command};*OPC?", "logging start did not complete", reply)
        self.check_errors(command)
        return {"channel": channel, "count": count, "interval_s": interval_s,
                "start_ns": sent, "uncertainty_ns": answered - sent}

    def logging_state(self, channel: int) -> str:
        return self.ask(f":SENS{channel}:FUNC:STAT?", str)

    def finish_trace(self, handle, timeout_s: float | None = None) -> PowerTrace:
        channel = handle["channel"]
        deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                       else handle["count"] * handle["interval_s"] + 10)
        while True:
            state = self.logging_state(channel)
            if "COMPLETE" in state.upper():
                break
            if "PROGRESS" not in state.upper():
                raise InstrumentError(self.name, f":SENS{channel}:FUNC:STAT?", "logging is not running", state)
            if time.monotonic() > deadline:
                raise InstrumentError(self.name, f":SENS{channel}:FUNC:STAT?", "logging did not complete in time", state)
            # The documented way to learn completion is to ask; ask at a tenth of the run.
            time.sleep(min(0.05, handle["count"] * handle["interval_s"] / 10))
        command = f":SENS{channel}:FUNC:RES?"
        values = self.session.query_binary_floats(command, timeout_s=max(self.session.timeout_s, 10))
        if len(values) != handle["count"]:
            raise InstrumentError(self.name, command, f"expected {handle['count']} samples, got {len(values)}")
        step = handle["interval_s"] * 1e9
        # Sample i averages [start + i*T, start + (i+1)*T]: place it at the window's end, where
        # a change inside the window first shows.
        times = [handle["start_ns"] + int((i + 1) * step) for i in range(len(values))]
        return PowerTrace(channel, times, [reading(v) for v in values], "hardware-logging",
                          handle["interval_s"], handle["uncertainty_ns"])
