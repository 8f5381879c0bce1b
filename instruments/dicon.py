"""DiCon GP600-class serial matrix optical switch in its X1 configuration (RS-232, 115200 8N1,
lines end in \\n).

``X1 CH <in> <out>`` connects, ``X1 CH <in>?`` answers ``<in>,<out>`` (0: parked), ``X1 CH * 0``
parks all, ``SYST:ERR?`` reads the error queue (``+0, No Error`` when empty): the command set a
published GP600 driver uses. Set commands answer nothing, and the switch handles one command at a
time, so the answer to the ``SYST:ERR?`` that follows a move comes once the mirror has settled
(that answer is the completion signal); the move is then read back. A refused move is an error
naming what the switch reported; a read-back that differs is an error naming both.

Bench port numbers follow the optical-switch convention (ingress 1..N, egress N+1..N+M); on the
wire outputs are 1..M, so the driver maps between them.

The line is opened by ``opener`` (pyserial's ``serial_for_url`` unless given another): the one
place the transport is chosen, so the driver runs unchanged over any port object with pyserial's
interface; the project's tests pass one in memory (tests/dialogue.py).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable, Iterable, Protocol

import serial

from lumion_hil.instruments import transcript
from lumion_hil.instruments.protocols import (
    Identity,
    InstrumentError,
    InstrumentIOError,
    OpticalSwitch,
    Pairs,
    PortState,
    as_pairs,
)


class _SerialLine(Protocol):
    """What the driver uses of the port ``opener`` gives (any of pyserial's, whatever its URL)."""

    @property
    def timeout(self) -> float | None: ...

    def write(self, b: bytes, /) -> int | None: ...

    def readline(self) -> bytes: ...

    def reset_input_buffer(self) -> None: ...

    def close(self) -> None: ...


class DiconMatrix(OpticalSwitch):
    def __init__(self, name: str, port: str, *, ingress: int, egress: int, baud_rate: int = 115200,
                 timeout_s: float = 5.0, pace_s: float = 0.0, module: int = 1,
                 opener: Callable[..., _SerialLine] = serial.serial_for_url):
        self.name = name
        self.ingress, self.egress = ingress, egress
        self.module = module
        self.pace_s = pace_s
        self._lock = threading.RLock()
        self._last = 0.0
        self._dirty = False  # an exchange failed: a late reply may still be on its way
        device = port.removeprefix("ASRL").removesuffix("::INSTR")
        try:
            # A device path, or a pyserial URL: socket://HOST:PORT or rfc2217://HOST:PORT for a
            # matrix behind ser2net (a labgrid NetworkSerialPort).
            self._serial = opener(device, baudrate=baud_rate, bytesize=8, parity="N", stopbits=1,
                                  timeout=timeout_s, write_timeout=timeout_s)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise InstrumentError(name, f"open {device}", f"cannot open the serial port: {exc}") from None

    # -- wire -------------------------------------------------------------------------------------

    def _write(self, line: str, record: bool = True) -> None:
        if record and transcript.current() is not None:
            t_ns = time.perf_counter_ns()
            self._write(line, record=False)
            transcript.exchange("serial", self.name, t_ns, command=line)
            return
        if self.pace_s:
            wait = self._last + self.pace_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # firmware pacing rule, not a completion wait
        self._last = time.perf_counter()
        try:
            self._serial.write(line.encode("ascii") + b"\n")
        except (serial.SerialException, OSError) as exc:
            self._dirty = True
            raise InstrumentIOError(self.name, line, f"write failed: {exc}") from None

    def _readline(self, line: str) -> str:
        try:
            raw = self._serial.readline()
        except (serial.SerialException, OSError) as exc:
            self._dirty = True
            raise InstrumentIOError(self.name, line, f"read failed: {exc}") from None
        if not raw.endswith(b"\n"):
            self._dirty = True
            raise InstrumentIOError(self.name, line, "no valid reply: timed out waiting for the instrument",
                                    raw.decode("ascii", "replace") or None)
        return raw.decode("ascii", "replace").strip()

    def _resync(self) -> None:
        """After a failed exchange a late answer may still come, and a serial line has no
        connection to renew: ask *IDN? and read until its answer, so whatever came late is
        read and dropped before the next question."""
        self._serial.reset_input_buffer()
        self._write("*IDN?")
        deadline = time.monotonic() + 4 * (self._serial.timeout or 1.0)  # a late answer may be slow to come
        while time.monotonic() < deadline:
            raw = self._serial.readline()
            if raw.endswith(b"\n") and raw.count(b",") == 3:
                self._dirty = False
                return
        raise InstrumentIOError(self.name, "*IDN?", "could not resynchronise after a failed exchange: "
                                "no identity among the replies")

    def _query(self, line: str) -> str:
        with self._lock:
            if self._dirty:
                self._resync()
            self._serial.reset_input_buffer()  # a stray line must not pass for this answer
            if transcript.current() is None:
                self._write(line)
                return self._readline(line)
            t_ns = time.perf_counter_ns()
            try:
                self._write(line, record=False)
                reply = self._readline(line)
            except InstrumentError as exc:
                transcript.exchange("serial", self.name, t_ns, command=line, error=exc.reason)
                raise
            transcript.exchange("serial", self.name, t_ns, command=line, reply=reply)
            return reply

    def _output_of(self, ingress: int) -> int:
        command = f"X{self.module} CH {ingress}?"
        reply = self._query(command)
        m = re.fullmatch(r"(\d+)\s*,\s*(\d+)", reply)
        if not m or int(m.group(1)) != ingress:
            self._dirty = True
            raise InstrumentIOError(self.name, command, f"unexpected reply (expected '{ingress},<output>')", reply)
        return int(m.group(2))

    def _check_errors(self, after: str) -> None:
        """Empty the error queue; anything on it is the switch refusing ``after``."""
        found = []
        for _ in range(32):  # the queue holds a bounded number of entries
            reply = self._query("SYST:ERR?")
            m = re.fullmatch(r"([+-]?\d+)\s*,\s*(.*)", reply)
            if not m:
                self._dirty = True
                raise InstrumentIOError(self.name, "SYST:ERR?", "unexpected reply (expected '<code>, <message>')", reply)
            if int(m.group(1)) == 0:
                break
            found.append(f"{int(m.group(1))} {m.group(2).strip()}")
        if found:
            raise InstrumentError(self.name, after, f"instrument reported: {'; '.join(found)}")

    def _to_wire(self, ingress: int, egress: int) -> tuple[int, int]:
        if not 1 <= ingress <= self.ingress:
            raise InstrumentError(self.name, f"connect {ingress}->{egress}", f"{ingress} is not an ingress port")
        if not self.ingress < egress <= self.ingress + self.egress:
            raise InstrumentError(self.name, f"connect {ingress}->{egress}", f"{egress} is not an egress port")
        return ingress, egress - self.ingress

    def _move(self, ingress: int, wire_out: int) -> None:
        command = f"X{self.module} CH {ingress} {wire_out}"
        with self._lock:
            if self._dirty:
                self._resync()
            self._write(command)
            self._check_errors(command)
            now_on = self._output_of(ingress)
        if now_on != wire_out:
            raise InstrumentError(self.name, command, f"read back output {now_on}, expected {wire_out}")

    # -- OpticalSwitch ----------------------------------------------------------------------------

    def identify(self) -> Identity:
        reply = self._query("*IDN?")
        parts = [p.strip() for p in reply.split(",")]
        if len(parts) != 4:
            raise InstrumentIOError(self.name, "*IDN?", "unexpected reply (expected vendor,model,serial,firmware)", reply)
        return Identity(*parts)

    def size(self) -> tuple[int, int]:
        return self.ingress, self.egress

    def read_size(self) -> tuple[int, int]:
        """(inputs, outputs) as the matrix reports them (``X1 DIM?``), not as it was opened with."""
        command = f"X{self.module} DIM?"
        reply = self._query(command)
        m = re.fullmatch(r"(\d+)\s*,\s*(\d+)", reply)
        if not m:
            raise InstrumentIOError(self.name, command, "unexpected reply (expected '<inputs>,<outputs>')", reply)
        return int(m.group(1)), int(m.group(2))

    def connections(self) -> dict[int, int]:
        out = {}
        for ingress in range(1, self.ingress + 1):
            wire = self._output_of(ingress)
            if wire:
                out[ingress] = wire + self.ingress
        return out

    def connect(self, pairs: Pairs) -> None:
        for ingress, egress in as_pairs(pairs):
            self._move(*self._to_wire(ingress, egress))

    def disconnect(self, pairs: Pairs) -> None:
        for ingress, egress in as_pairs(pairs):
            self._to_wire(ingress, egress)
            self._move(ingress, 0)

    def disconnect_all(self) -> None:
        with self._lock:
            self._write(f"X{self.module} CH * 0")
            self._check_errors(f"X{self.module} CH * 0")
            if self.connections():
                raise InstrumentError(self.name, f"X{self.module} CH * 0", "outputs still connected after parking all")

    def port_states(self, ports: Iterable[int]) -> dict[int, PortState]:
        return {int(p): PortState.ENABLED for p in ports}  # no shutters on this switch

    def close(self) -> None:
        try:
            self._serial.close()
        except (serial.SerialException, OSError):
            pass
