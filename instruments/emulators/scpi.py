"""SCPI for emulators: a command parser with a real error queue, and servers that put an
emulated instrument on the transports real ones use (raw TCP socket, pseudo-terminal).

Headers follow SCPI: case-insensitive, each node in its short form (the capitals of the
declared pattern) or its long form; a node declared with ``#`` takes an optional number suffix
(``READ#`` matches ``READ``, ``read2``, ``READ10``). Several commands may share a line, joined
by ``;``; each part is parsed from the root (instruments differ here; the lenient choice keeps
``:oxc:swit:conn:add ...;*OPC?`` working).
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
from dataclasses import dataclass
from typing import Callable

_ERROR_QUEUE_SIZE = 30


class ScpiError(Exception):
    """An error an emulated instrument puts on its error queue."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        super().__init__(f'{code},"{message}"')


UNDEFINED_HEADER = (-113, "Undefined header")
DATA_TYPE_ERROR = (-104, "Data type error")
MISSING_PARAMETER = (-109, "Missing parameter")
PARAMETER_NOT_ALLOWED = (-108, "Parameter not allowed")
ILLEGAL_PARAMETER = (-224, "Illegal parameter value")
SETTINGS_CONFLICT = (-221, "Settings conflict")
DATA_OUT_OF_RANGE = (-222, "Data out of range")


@dataclass
class _Node:
    short: str
    long: str
    numbered: bool

    def match(self, token: str) -> tuple[bool, int | None]:
        number = None
        if self.numbered:
            m = re.fullmatch(r"([A-Za-z*]+)(\d*)", token)
            if not m:
                return False, None
            token, digits = m.group(1), m.group(2)
            number = int(digits) if digits else 1
        upper = token.upper()
        return upper in (self.short, self.long), number


Handler = Callable[..., "str | None"]


@dataclass
class _Command:
    nodes: list[_Node]
    query: bool
    handler: Handler


def _compile(pattern: str) -> tuple[list[_Node], bool]:
    query = pattern.endswith("?")
    nodes = []
    for part in pattern.rstrip("?").lstrip(":").split(":"):
        numbered = part.endswith("#")
        part = part.rstrip("#")
        short = "".join(ch for ch in part if ch.isupper() or ch == "*" or ch.isdigit())
        nodes.append(_Node(short or part.upper(), part.upper(), numbered))
    return nodes, query


def split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside parentheses and quotes."""
    parts, depth, quote, current = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def parse_channel_list(text: str) -> list[int]:
    """``(@1,2,5:7)`` -> [1, 2, 5, 6, 7]; ``(@)`` -> []."""
    m = re.fullmatch(r"\s*\(\s*@([^)]*)\)\s*", text)
    if not m:
        raise ScpiError(*DATA_TYPE_ERROR)
    out: list[int] = []
    for item in filter(None, (s.strip() for s in m.group(1).split(","))):
        if ":" in item:
            lo, hi = item.split(":", 1)
            if not (lo.strip().isdigit() and hi.strip().isdigit()) or int(lo) > int(hi):
                raise ScpiError(*DATA_TYPE_ERROR)
            out.extend(range(int(lo), int(hi) + 1))
        elif item.isdigit():
            out.append(int(item))
        else:
            raise ScpiError(*DATA_TYPE_ERROR)
    return out


def ieee_block(payload: bytes) -> bytes:
    """IEEE 488.2 definite-length block: #<digits><length><payload>."""
    length = str(len(payload))
    return f"#{len(length)}{length}".encode("ascii") + payload


def parse_number(text: str, unit: str = "") -> float:
    """A numeric argument with an optional unit suffix: ``1550nm``, ``100 MS``, ``1e-4s``."""
    import re as _re

    m = _re.fullmatch(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise ScpiError(*DATA_TYPE_ERROR)
    value, suffix = float(m.group(1)), m.group(2).upper()
    scale = {"": 1.0, "M": 1e-3, "U": 1e-6, "N": 1e-9, "P": 1e-12}  # SCPI: M is milli
    if unit and suffix.endswith(unit.upper()):
        suffix = suffix[: -len(unit)]
    if suffix not in scale:
        raise ScpiError(-131, "Invalid suffix")
    return value * scale[suffix]


def format_channel_list(ports) -> str:
    return "(@" + ",".join(str(p) for p in ports) + ")"


class ScpiDevice:
    """An emulated SCPI instrument: declare commands with :meth:`command`, feed it lines.

    Subclasses call ``self.command(pattern, handler)``; a handler gets the argument text (and
    the numeric suffixes, for ``#`` nodes) and returns the reply for a query. Unknown headers,
    bad arguments and refused settings go on the error queue as a real instrument's would.
    """

    def __init__(self, name: str, *, command_latency_s: float = 0.0):
        self.name = name
        self.command_latency_s = command_latency_s
        self._commands: list[_Command] = []
        self._errors: collections.deque[tuple[int, str]] = collections.deque()
        self._errors_lock = threading.Lock()
        # Faults a test can switch on: "garbage" (replies are noise), "stall" (queries never
        # answer), "drop" (the connection is closed on the next line).
        self.faults: set[str] = set()
        self.lines_seen = 0
        self.command("*CLS", lambda args: self.clear_errors())
        self.command(":SYSTem:ERRor:ALL?", self._error_all)
        self.command(":SYSTem:ERRor?", self._error_next)
        self.command(":SYSTem:ERRor:NEXT?", self._error_next)

    def command(self, pattern: str, handler: Handler) -> None:
        nodes, query = _compile(pattern)
        self._commands.append(_Command(nodes, query, handler))

    # -- error queue ----------------------------------------------------------------------------

    def push_error(self, code: int, message: str) -> None:
        with self._errors_lock:
            if len(self._errors) >= _ERROR_QUEUE_SIZE - 1:
                if len(self._errors) == _ERROR_QUEUE_SIZE - 1:
                    self._errors.append((-350, "Queue overflow"))
                return
            self._errors.append((code, message))

    def clear_errors(self) -> None:
        with self._errors_lock:
            self._errors.clear()

    def _error_next(self, args: str) -> str:
        with self._errors_lock:
            code, msg = self._errors.popleft() if self._errors else (0, "No error")
        return f'{code},"{msg}"'

    def _error_all(self, args: str) -> str:
        with self._errors_lock:
            items = list(self._errors) or [(0, "No error")]
            self._errors.clear()
        return ",".join(f'{code},"{msg}"' for code, msg in items)

    # -- dispatch -------------------------------------------------------------------------------

    def handle_line(self, line: str) -> str | bytes | None:
        """Run one line of commands; return the reply line (None when nothing is to be said)."""
        self.lines_seen += 1
        if self.command_latency_s:
            time.sleep(self.command_latency_s)
        replies = []
        for part in split_top_level(line.strip(), ";"):
            part = part.strip()
            if not part:
                continue
            try:
                reply = self._dispatch(part)
            except ScpiError as exc:
                self.push_error(exc.code, exc.message)
                continue
            if reply is not None:
                replies.append(reply)
        if not replies:
            return None
        if any(isinstance(r, bytes) for r in replies):  # an IEEE 488.2 block among the answers
            return b";".join(r if isinstance(r, bytes) else r.encode("ascii") for r in replies)
        return ";".join(replies)

    def _dispatch(self, text: str) -> str | None:
        header, _, args = text.partition(" ")
        query = header.endswith("?")
        tokens = header.rstrip("?").lstrip(":").split(":")
        for cmd in self._commands:
            if cmd.query != query or len(cmd.nodes) != len(tokens):
                continue
            numbers = []
            for node, token in zip(cmd.nodes, tokens):
                ok, number = node.match(token)
                if not ok:
                    break
                if node.numbered:
                    numbers.append(number)
            else:
                return cmd.handler(args.strip(), *numbers)
        raise ScpiError(*UNDEFINED_HEADER)


# --- transports ---------------------------------------------------------------------------------


class _LineHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        device: ScpiDevice = self.server.device  # type: ignore[attr-defined]
        self.server.clients_seen += 1  # type: ignore[attr-defined]
        while True:
            try:
                raw = self.rfile.readline()
            except ConnectionError:  # the client went away mid-line
                return
            if not raw:
                return
            if "drop" in device.faults:
                return
            line = raw.decode("ascii", "replace").rstrip("\r\n")
            reply = device.handle_line(line)
            self.server.wire_log.append((line, reply))  # type: ignore[attr-defined]
            if reply is None:
                continue
            if "stall" in device.faults:
                continue
            if "garbage" in device.faults:
                reply = "\x7f#!garbage?%"
            data = reply if isinstance(reply, bytes) else reply.encode("ascii", "replace")
            try:
                self.wfile.write(data + b"\n")
                self.wfile.flush()
            except (ConnectionError, BrokenPipeError):
                return


class _ThreadingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


class TcpScpiServer:
    """Serve a device as raw SCPI over TCP on loopback, on a port the OS chooses."""

    def __init__(self, device: ScpiDevice, host: str = "127.0.0.1"):
        self.device = device
        self._server = _ThreadingServer((host, 0), _LineHandler)
        self._server.device = device  # type: ignore[attr-defined]
        self._server.clients_seen = 0  # type: ignore[attr-defined]
        # What arrived and what was answered, newest last: lets a test compare a driver's bytes
        # with a recorded dialogue.
        self._server.wire_log = collections.deque(maxlen=1000)  # type: ignore[attr-defined]
        # A short poll interval: stopping a bench should not wait half a second per instrument.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=f"scpi-{device.name}", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def wire_log(self) -> collections.deque:
        return self._server.wire_log  # type: ignore[attr-defined]

    @property
    def resource(self) -> str:
        return f"TCPIP0::127.0.0.1::{self.port}::SOCKET"

    def start(self) -> "TcpScpiServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PtyLineServer:
    """Serve a line-oriented device on a pseudo-terminal, opened by pyserial like a real port.

    ``eol`` is the line ending the instrument uses in both directions."""

    def __init__(self, handle_line: Callable[[str], "str | None"], name: str, eol: bytes = b"\n"):
        self._handle_line = handle_line
        self.name = name
        self.eol = eol
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
            buffer += chunk
            while self.eol in buffer:
                line, buffer = buffer.split(self.eol, 1)
                reply = self._handle_line(line.decode("ascii", "replace").strip("\r\n"))
                if reply is not None:
                    os.write(self._master, reply.encode("ascii", "replace") + self.eol)

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=2)
        for fd in (self._master, self._slave, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
