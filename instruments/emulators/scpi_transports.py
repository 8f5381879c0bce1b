"""The wires an emulated instrument answers on, as real ones do: raw SCPI over a TCP socket
(:class:`TcpScpiServer`, which also loses its power and comes back), and a line-oriented device
on a pseudo-terminal that pyserial opens like a real serial port (:class:`PtyLineServer`); and
what a faulty instrument puts on them (see ``FAULTS`` in scpi.py).
"""

from __future__ import annotations

import collections
import os
import re
import select
import socket
import socketserver
import threading
import time
import tty
from typing import Callable

from lumion_hil.instruments.emulators.scpi import ScpiDevice

GARBAGE = b"\x7f#!garbage?%"


def faulty_reply(faults: dict, reply: bytes, eol: bytes) -> bytes | None:
    """What the wire carries for a reply under the device's faults (None: nothing at all)."""
    if "stall" in faults:
        return None
    if "garbage" in faults:
        reply = GARBAGE
    if "partial" in faults:
        return reply[: max(1, len(reply) // 2)]  # and never the rest, nor the line end
    if "delay" in faults:
        time.sleep(faults["delay"] if faults["delay"] is not None else 30.0)
    return reply + eol


class _LineHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server = self.server
        device: ScpiDevice = server.device  # type: ignore[attr-defined]
        server.clients_seen += 1  # type: ignore[attr-defined]
        server.connections.add(self.connection)  # type: ignore[attr-defined]
        try:
            while True:
                try:
                    raw = self.rfile.readline()
                except (ConnectionError, OSError):  # the client went away mid-line, or power was cut
                    return
                if not raw:
                    return
                if "drop" in device.faults:
                    return
                line = raw.decode("ascii", "replace").rstrip("\r\n")
                reply = device.handle_line(line)
                server.wire_log.append((line, reply))  # type: ignore[attr-defined]
                if reply is None:
                    continue
                data = faulty_reply(device.faults, reply if isinstance(reply, bytes) else
                                    reply.encode("ascii", "replace"), b"\n")
                if data is None:
                    continue
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except (ConnectionError, BrokenPipeError, OSError):
                    return
        finally:
            server.connections.discard(self.connection)  # type: ignore[attr-defined]


class ThreadingServer(socketserver.ThreadingTCPServer):
    """A TCP server for an emulated instrument's clients: a thread each, Nagle off."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


class TcpScpiServer:
    """Serve a device as raw SCPI over TCP on loopback, on a port the OS chooses (or ``port``)."""

    def __init__(self, device: ScpiDevice, host: str = "127.0.0.1", port: int = 0):
        self.device = device
        self.host = host
        self._server = self._make_server(host, port)
        # What arrived and what was answered, newest last: lets a test compare a driver's bytes
        # with a recorded dialogue.
        self.wire_log: collections.deque = collections.deque(maxlen=1000)
        self._server.wire_log = self.wire_log  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None
        self._power = threading.Lock()
        self._closed = False

    def _make_server(self, host: str, port: int) -> ThreadingServer:
        server = ThreadingServer((host, port), _LineHandler)
        server.device = self.device  # type: ignore[attr-defined]
        server.clients_seen = 0  # type: ignore[attr-defined]
        server.connections = set()  # type: ignore[attr-defined]
        if hasattr(self, "wire_log"):
            server.wire_log = self.wire_log  # type: ignore[attr-defined]
        return server

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def clients_seen(self) -> int:
        return self._server.clients_seen  # type: ignore[attr-defined]

    @property
    def resource(self) -> str:
        return f"TCPIP0::127.0.0.1::{self.port}::SOCKET"

    def start(self) -> "TcpScpiServer":
        # A short poll interval: stopping a bench should not wait half a second per instrument.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=f"scpi-{self.device.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._power:
            self._closed = True
            self._shutdown()

    def _shutdown(self) -> None:
        self._server.shutdown()
        for conn in list(self._server.connections):  # type: ignore[attr-defined]
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()

    def power_loss(self, down_s: float = 1.0) -> None:
        """Cut the power now: every connection drops and nothing listens; ``down_s`` later the
        instrument comes back on the same address in its power-on state (as if its process were
        killed and started again). Returns at once; the comeback happens on its own."""
        port = self.port
        with self._power:
            self._shutdown()
        self.device.power_on()

        def come_back() -> None:
            time.sleep(down_s)  # the instrument boots for this long
            with self._power:
                if not self._closed:  # the bench was stopped meanwhile: stay off
                    self._server = self._make_server(self.host, port)
                    self.start()

        threading.Thread(target=come_back, name=f"scpi-{self.device.name}-boot", daemon=True).start()


class PtyLineServer:
    """Serve a line-oriented device on a pseudo-terminal, opened by pyserial like a real port.

    ``eol`` is the line ending the instrument uses in both directions. The device's ``faults``
    (see FAULTS) apply to what goes back on the wire; ``power_loss`` here means nothing answers
    while it is down and the device is reset."""

    def __init__(self, handle_line: Callable[[str], "str | None"], name: str, eol: bytes = b"\n",
                 faults: dict | None = None, power_on: Callable[[], None] | None = None, any_eol: bool = False):
        self._handle_line = handle_line
        self.name = name
        self.eol = eol
        self.any_eol = any_eol  # lines may end in CR, LF or CR LF (answers still end in ``eol``)
        self.faults = faults if faults is not None else {}
        self._power_on = power_on
        self._down_until = 0.0
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)  # no echo, no line editing: bytes pass as they are
        self.path = os.ttyname(self._slave)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"pty-{name}", daemon=True)

    @property
    def resource(self) -> str:
        return self.path

    def start(self) -> "PtyLineServer":
        self._thread.start()
        return self

    def power_loss(self, down_s: float = 1.0) -> None:
        self._down_until = time.monotonic() + down_s
        if self._power_on:
            self._power_on()

    def _run(self) -> None:
        buffer = b""
        while True:
            ready, _, _ = select.select([self._master, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                chunk = os.read(self._master, 4096)
            except OSError:
                return
            if time.monotonic() < self._down_until:
                buffer = b""  # no power: what arrives is lost
                continue
            buffer += chunk
            while True:
                if self.any_eol:
                    m = re.search(rb"\r\n|\r|\n", buffer)
                    if not m:
                        break
                    line, buffer = buffer[:m.start()], buffer[m.end():]
                elif self.eol in buffer:
                    line, buffer = buffer.split(self.eol, 1)
                else:
                    break
                if "drop" in self.faults:  # a serial line has no connection to drop: it goes silent
                    continue
                reply = self._handle_line(line.decode("ascii", "replace").strip("\r\n"))
                if reply is None:
                    continue
                data = faulty_reply(self.faults, reply.encode("ascii", "replace"), self.eol)
                if data is not None:
                    os.write(self._master, data)

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=2)
        for fd in (self._master, self._slave, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
