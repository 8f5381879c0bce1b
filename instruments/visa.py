"""A session with a message-based instrument through pyvisa and pyvisa-py (no vendor VISA).

Every failure becomes an InstrumentError that names the instrument, the command and the reason
(an InstrumentIOError when the exchange itself failed).

A session reaches its instrument through an :class:`Opener`: :func:`open_resource` (pyvisa-py)
unless it is given another. That is the one place a transport is chosen, so a driver built on a
session runs unchanged over anything that opens a :class:`MessageResource`: the project's tests
pass an instrument in memory that plays a scripted dialogue (tests/dialogue.py).
"""

from __future__ import annotations

import re
import socket
from contextlib import contextmanager
import threading
import time
from typing import Protocol, Sequence

import pyvisa
from pyvisa import constants, errors as visa_errors
from pyvisa.util import BINARY_DATATYPES

from lumion_hil.instruments import transcript
from lumion_hil.instruments.protocols import InstrumentError, InstrumentIOError

_rm_lock = threading.Lock()
_rm: pyvisa.ResourceManager | None = None


def resource_manager() -> pyvisa.ResourceManager:
    """The process's pyvisa-py resource manager."""
    global _rm
    with _rm_lock:
        if _rm is None:
            _rm = pyvisa.ResourceManager("@py")
        return _rm


class MessageResource(Protocol):
    """What a session uses of an open instrument: a pyvisa message-based resource has all of it.
    Failures are pyvisa's (``VisaIOError``; a timeout is ``StatusCode.error_timeout``) or
    ``OSError`` (``ConnectionError`` when the instrument closed the connection)."""

    timeout: float  # milliseconds, as pyvisa counts them

    def write(self, message: str) -> int: ...

    def query(self, message: str) -> str: ...

    def query_binary_values(self, message: str, datatype: BINARY_DATATYPES, is_big_endian: bool) -> Sequence[float]: ...

    def close(self) -> None: ...


class Opener(Protocol):
    """Opens ``resource`` for a session: within ``connect_within_s`` it is open or fails (an
    ``OSError``, a pyvisa error or a ``ValueError``, which the session turns into an
    InstrumentError naming the instrument); ``timeout_s`` is then each exchange's deadline."""

    def __call__(self, resource: str, *, timeout_s: float, connect_within_s: float, read_termination: str,
                 write_termination: str) -> MessageResource: ...


def open_resource(resource: str, *, timeout_s: float, connect_within_s: float, read_termination: str,
                  write_termination: str) -> MessageResource:
    """The usual opener: pyvisa-py's resource manager. A raw socket is probed first (pyvisa-py
    connects without waiting for the answer, so a dead instrument would only show at the first
    query) and gets Nagle's algorithm turned off."""
    m = _SOCKET.fullmatch(resource.strip())
    if m:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=connect_within_s).close()
    res = resource_manager().open_resource(resource, timeout=int(timeout_s * 1000), read_termination=read_termination,
                                           write_termination=write_termination)
    if not isinstance(res, pyvisa.resources.MessageBasedResource):
        res.close()
        raise ValueError(f"{resource} is not a message-based instrument")
    if m:
        _no_delay(res)
    return res


class VisaSession:
    """Write, read and query text lines; paced when the instrument needs it.

    Every exchange has a deadline (the VISA timeout; twice that for a query sent again). After a failed exchange the connection is
    opened afresh before the next one, so a late or half reply can never pass for the answer to a
    later command. Only a pure query (every part of the line ends in ``?``) is sent again, once,
    and only when the connection was lost: asking twice changes nothing on the instrument. A set
    command is never repeated here; the driver reads the instrument back and decides.

    ``opener`` reaches the instrument: :func:`open_resource` (pyvisa-py) unless given another."""

    def __init__(
        self,
        name: str,
        resource: str,
        *,
        timeout_s: float = 5.0,
        read_termination: str = "\n",
        write_termination: str = "\n",
        pace_s: float = 0.0,
        opener: Opener = open_resource,
    ):
        self.name = name
        self.resource_name = resource
        self.timeout_s = timeout_s
        self.pace_s = pace_s
        self._terminations = {"read_termination": read_termination, "write_termination": write_termination}
        self._opener = opener
        self._last_write = 0.0
        self._lock = threading.RLock()
        self._dirty = False
        self.reconnects = 0
        self._res = self._open(time.monotonic() + timeout_s)

    def _open(self, deadline: float) -> MessageResource:
        """Open the resource; while the instrument refuses connections (rebooting after a power
        loss), try again until ``deadline``."""
        while True:
            try:
                return self._opener(self.resource_name, timeout_s=self.timeout_s,
                                    connect_within_s=max(0.05, deadline - time.monotonic()), **self._terminations)
            except (visa_errors.Error, OSError, ValueError) as exc:
                if time.monotonic() >= deadline:
                    reason = (exc.strerror if isinstance(exc, OSError) else None) or exc
                    raise InstrumentError(self.name, f"open {self.resource_name}",
                                          f"cannot open the instrument: {reason}") from None
            time.sleep(0.05)  # the instrument's network stack is not listening yet: ask again shortly

    def _reopen(self, deadline: float) -> None:
        try:
            self._res.close()
        except (visa_errors.Error, OSError):
            pass
        self._res = self._open(deadline)
        self._dirty = False
        self.reconnects += 1

    def _socket(self) -> socket.socket | None:
        """The raw socket under a pyvisa-py session, if that is what the opener gave."""
        if not isinstance(self._res, pyvisa.resources.Resource):
            return None
        # pyvisa-py's library (untyped) keeps its sessions; pyvisa's base class does not declare them
        sessions = self._res.visalib.sessions  # type: ignore[attr-defined]
        interface = getattr(sessions.get(self._res.session), "interface", None)
        return interface if isinstance(interface, socket.socket) else None

    def _peer_closed(self) -> bool:
        """The instrument closed its end (dropped us, or lost power): a raw socket reads EOF."""
        sock = self._socket()
        if sock is None:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _pace(self) -> None:
        if self.pace_s:
            wait = self._last_write + self.pace_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # a pacing rule of the firmware, not a completion wait
        self._last_write = time.perf_counter()

    def _exchange(self, command: str, what: str, action, timeout_s: float | None, errors: tuple = ()):
        """Run one exchange under its deadline, reconnecting first if the last one failed; in
        the run's transcript, if it has one."""
        if transcript.current() is None:
            return self._run_exchange(command, what, action, timeout_s, errors)
        t_ns = time.perf_counter_ns()
        try:
            reply = self._run_exchange(command, what, action, timeout_s, errors)
        except InstrumentError as exc:
            transcript.exchange("scpi", self.name, t_ns, command=command, error=exc.reason)
            raise
        transcript.exchange("scpi", self.name, t_ns, command=command, reply=reply)
        return reply

    def _run_exchange(self, command: str, what: str, action, timeout_s: float | None, errors: tuple):
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        retried = False
        with self._lock, self._timeout(timeout_s):
            while True:
                if self._dirty or self._peer_closed():
                    self._reopen(deadline)
                    if timeout_s is not None:
                        self._res.timeout = int(timeout_s * 1000)
                self._pace()
                try:
                    return action()
                except (visa_errors.Error, OSError, *errors) as exc:
                    lost = self._peer_closed() or isinstance(exc, (ConnectionError, BrokenPipeError))
                    self._dirty = True
                    if lost and _pure_query(command) and not retried:
                        retried = True  # asking again changes nothing on the instrument: once more,
                        deadline = time.monotonic() + limit  # on a new connection, with its own deadline
                        continue
                    reason = "the instrument closed the connection" if lost else _why(exc)
                    raise InstrumentIOError(self.name, command, f"{what}: {reason}") from None
                except UnicodeDecodeError:
                    self._dirty = True
                    raise InstrumentIOError(self.name, command, "reply is not text") from None

    def write(self, command: str) -> None:
        self._exchange(command, "write failed", lambda: (self._res.write(command), None)[1], None)

    @contextmanager
    def _timeout(self, timeout_s: float | None):
        """Run under a longer (or shorter) VISA timeout, then put the usual one back."""
        if timeout_s is None:
            yield
            return
        self._res.timeout = int(timeout_s * 1000)
        try:
            yield
        finally:
            self._res.timeout = int(self.timeout_s * 1000)

    def query(self, command: str, *, timeout_s: float | None = None) -> str:
        return self._exchange(command, "no valid reply", lambda: self._res.query(command).strip(), timeout_s)

    def query_binary_floats(self, command: str, *, timeout_s: float | None = None) -> list[float]:
        """An IEEE 488.2 definite-length block of little-endian float32."""
        return self._exchange(command, "no valid binary block", lambda: list(
            self._res.query_binary_values(command, datatype="f", is_big_endian=False)), timeout_s, (ValueError,))

    def close(self) -> None:
        with self._lock:
            try:
                self._res.close()
            except (visa_errors.Error, OSError):
                pass


def _pure_query(command: str) -> bool:
    """Every part of the line is a query (``*IDN?``, ``:SENS1:POW:UNIT?;:READ1:POW?``)."""
    parts = [p.strip() for p in command.split(";") if p.strip()]
    return bool(parts) and all(p.split(None, 1)[0].endswith("?") for p in parts)


_SOCKET = re.compile(r"TCPIP\d*::([^:]+)::(\d+)::SOCKET", re.IGNORECASE)


def _no_delay(res) -> None:
    """Turn off Nagle's algorithm: otherwise a short command followed at once by a query waits
    for the peer's delayed ACK (about 40 ms on Linux). pyvisa-py 0.8.1 maps the setter of
    VI_ATTR_TCPIP_NODELAY to a stub that raises, so set the option on its socket directly."""
    try:
        res.set_visa_attribute(constants.ResourceAttribute.tcpip_nodelay, constants.VI_TRUE)
        return
    except Exception:  # the pyvisa-py bug above; fall through
        pass
    interface = getattr(res.visalib.sessions.get(res.session), "interface", None)
    if isinstance(interface, socket.socket):
        interface.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _why(exc: Exception) -> str:
    if isinstance(exc, visa_errors.VisaIOError) and exc.error_code == constants.StatusCode.error_timeout:
        return "timed out waiting for the instrument"
    return str(exc) or type(exc).__name__
