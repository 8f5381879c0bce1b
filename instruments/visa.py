"""A session with a message-based instrument through pyvisa and pyvisa-py (no vendor VISA).

Every failure becomes an InstrumentError that names the instrument, the command and the reason.
"""

from __future__ import annotations

import re
import socket
from contextlib import contextmanager
import threading
import time

import pyvisa
from pyvisa import constants, errors as visa_errors

from instruments.protocols import InstrumentError

_rm_lock = threading.Lock()
_rm: pyvisa.ResourceManager | None = None


def resource_manager() -> pyvisa.ResourceManager:
    """The process's pyvisa-py resource manager."""
    global _rm
    with _rm_lock:
        if _rm is None:
            _rm = pyvisa.ResourceManager("@py")
        return _rm


class VisaSession:
    """Write, read and query text lines; paced when the instrument needs it."""

    def __init__(
        self,
        name: str,
        resource: str,
        *,
        timeout_s: float = 5.0,
        read_termination: str = "\n",
        write_termination: str = "\n",
        pace_s: float = 0.0,
    ):
        self.name = name
        self.resource_name = resource
        self.timeout_s = timeout_s
        self.pace_s = pace_s
        self._last_write = 0.0
        self._lock = threading.RLock()
        _probe_socket(name, resource, timeout_s)
        try:
            self._res = resource_manager().open_resource(
                resource,
                read_termination=read_termination,
                write_termination=write_termination,
                timeout=int(timeout_s * 1000),
            )
        except (visa_errors.Error, OSError, ValueError) as exc:
            raise InstrumentError(name, f"open {resource}", f"cannot open the instrument: {exc}") from None
        if _SOCKET.fullmatch(resource.strip()):
            _no_delay(self._res)

    def _pace(self) -> None:
        if self.pace_s:
            wait = self._last_write + self.pace_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # a pacing rule of the firmware, not a completion wait
        self._last_write = time.perf_counter()

    def write(self, command: str) -> None:
        with self._lock:
            self._pace()
            try:
                self._res.write(command)
            except (visa_errors.Error, OSError) as exc:
                raise InstrumentError(self.name, command, f"write failed: {_why(exc)}") from None

    @contextmanager
    def _timeout(self, timeout_s: float | None):
        """Run under a longer (or shorter) VISA timeout, then put the usual one back."""
        if timeout_s is None:
            yield
            return
        old = self._res.timeout
        self._res.timeout = int(timeout_s * 1000)
        try:
            yield
        finally:
            self._res.timeout = old

    def query(self, command: str, *, timeout_s: float | None = None) -> str:
        with self._lock, self._timeout(timeout_s):
            self._pace()
            try:
                return self._res.query(command).strip()
            except (visa_errors.Error, OSError) as exc:
                raise InstrumentError(self.name, command, f"no valid reply: {_why(exc)}") from None
            except UnicodeDecodeError:
                raise InstrumentError(self.name, command, "reply is not text") from None

    def query_binary_floats(self, command: str, *, timeout_s: float | None = None) -> list[float]:
        """An IEEE 488.2 definite-length block of little-endian float32."""
        with self._lock, self._timeout(timeout_s):
            self._pace()
            try:
                return list(self._res.query_binary_values(command, datatype="f", is_big_endian=False))
            except (visa_errors.Error, OSError, ValueError) as exc:
                raise InstrumentError(self.name, command, f"no valid binary block: {_why(exc)}") from None

    def close(self) -> None:
        with self._lock:
            try:
                self._res.close()
            except (visa_errors.Error, OSError):
                pass


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


def _probe_socket(name: str, resource: str, timeout_s: float) -> None:
    """pyvisa-py connects raw sockets without waiting for the answer, so a dead instrument would
    only show at the first query; find out now, and say so plainly."""
    m = _SOCKET.fullmatch(resource.strip())
    if not m:
        return
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s).close()
    except OSError as exc:
        raise InstrumentError(name, f"open {resource}", f"cannot open the instrument: {exc.strerror or exc}") from None


def _why(exc: Exception) -> str:
    if isinstance(exc, visa_errors.VisaIOError) and exc.error_code == constants.StatusCode.error_timeout:
        return "timed out waiting for the instrument"
    return str(exc) or type(exc).__name__
