"""SCPI for emulators: a command tree declared the way the vendors' programming guides write it,
one parser for every spelling, a real error queue, faults, and servers that put an emulated
instrument on the transports real ones use (raw TCP socket, pseudo-terminal).

Patterns follow SCPI-99 and the guides: ``[:SENSe[n]]:CORRection:WAVelength?``. Each node
matches its short form (the capitals) or its long form, in any case; a node in brackets may be
left out; ``[n]`` (or ``#``) after a node takes an optional numeric suffix, 1 when absent.
Several commands may share a line, joined by ``;``: a header without a leading colon continues
from the previous one's branch (SCPI-99 6.2.4) and, failing that, from the root (lenient, as
some firmware is). Arguments take MIN/MAX/DEF and units where declared (``1550NM``,
``-10DBM``, ``100MS``). What a real instrument refuses goes on the error queue with the
standard's number.
"""

from __future__ import annotations

import collections
import os
import math
import re
import select
import socket
import socketserver
import threading
import time
import tty
from dataclasses import dataclass, field
from typing import Callable

from lumion_hil.instruments.backend import INSTRUMENT_FAULTS

_ERROR_QUEUE_SIZE = 30


class ScpiError(Exception):
    """An error an emulated instrument puts on its error queue."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        super().__init__(f'{code},"{message}"')


COMMAND_ERROR = (-100, "Command error")
INVALID_CHARACTER = (-101, "Invalid character")
SYNTAX_ERROR = (-102, "Syntax error")
DATA_TYPE_ERROR = (-104, "Data type error")
PARAMETER_NOT_ALLOWED = (-108, "Parameter not allowed")
MISSING_PARAMETER = (-109, "Missing parameter")
UNDEFINED_HEADER = (-113, "Undefined header")
HEADER_SUFFIX_OUT_OF_RANGE = (-114, "Header suffix out of range")
INVALID_SUFFIX = (-131, "Invalid suffix")
ILLEGAL_PARAMETER = (-224, "Illegal parameter value")
EXECUTION_ERROR = (-200, "Execution error")
SETTINGS_CONFLICT = (-221, "Settings conflict")
DATA_OUT_OF_RANGE = (-222, "Data out of range")
DATA_STALE = (-230, "Data corrupt or stale")
HARDWARE_MISSING = (-241, "Hardware missing")
DEVICE_ERROR = (-300, "Device-specific error")
QUEUE_OVERFLOW = (-350, "Queue overflow")


@dataclass
class _Node:
    short: str
    long: str
    suffix: bool = False

    def match(self, name: str, digits: str) -> tuple[bool, int | None]:
        if name.upper() not in (self.short, self.long):
            return False, None
        if digits and not self.suffix:
            return False, None
        return True, (int(digits) if digits else 1) if self.suffix else None


@dataclass
class _Optional:
    items: list


Handler = Callable[..., "str | bytes | None"]


@dataclass
class _Command:
    items: list
    query: bool
    handler: Handler
    pattern: str
    suffixes: int = 0


def _node(word: str, suffix: bool) -> _Node:
    short = "".join(ch for ch in word if ch.isupper() or ch.isdigit() or ch in "*") or word.upper()
    return _Node(short, word.upper(), suffix)


def _compile(pattern: str) -> tuple[list, bool, int]:
    """``[:SENSe[n]]:POWer[:DC]:UNIT?`` -> (items, is_query, number of suffix nodes)."""
    text = pattern.strip()
    query = text.endswith("?")
    text = text.rstrip("?")
    pos = 0
    count = 0

    def group(end: str | None) -> list:
        nonlocal pos, count
        items: list = []
        while pos < len(text):
            ch = text[pos]
            if end and ch == end:
                pos += 1
                return items
            if ch == "[":
                pos += 1
                items.append(_Optional(group("]")))
                continue
            if ch == ":":
                pos += 1
                continue
            m = re.compile(r"([A-Za-z*][A-Za-z0-9_*]*?)(\[n\]|\[m\]|<n>|<m>|#)?(?=[:\[\]]|$)").match(text, pos)
            if not m:
                raise ValueError(f"bad SCPI pattern {pattern!r} at {pos}")
            word, marker = m.group(1), m.group(2)
            items.append(_node(word, bool(marker)))
            count += bool(marker)
            pos = m.end()
        if end:
            raise ValueError(f"bad SCPI pattern {pattern!r}: unclosed [")
        return items

    items = group(None)
    return items, query, count


def _match(items: list, tokens: list[tuple[str, str]], suffixes: list) -> list | None:
    """Suffix values for every suffix node (skipped ones: 1) if the tokens match, else None."""
    if not items:
        return suffixes if not tokens else None
    head, rest = items[0], items[1:]
    if isinstance(head, _Optional):
        taken = _match(head.items + rest, tokens, suffixes)
        if taken is not None:
            return taken
        return _match(rest, tokens, suffixes + [1] * _suffix_nodes(head.items))
    if not tokens:
        return None
    ok, number = head.match(*tokens[0])
    if not ok:
        return None
    return _match(rest, tokens[1:], suffixes + ([number] if head.suffix else []))


def _suffix_nodes(items: list) -> int:
    return sum(_suffix_nodes(i.items) if isinstance(i, _Optional) else int(i.suffix) for i in items)


_TOKEN = re.compile(r"([A-Za-z*][A-Za-z0-9*]*?)(\d*)")  # a node may hold digits (Q4Voltage); trailing ones are its suffix


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


_MULTIPLIERS = {"": 1.0, "EX": 1e18, "PE": 1e15, "T": 1e12, "G": 1e9, "MA": 1e6, "K": 1e3, "M": 1e-3, "U": 1e-6,
                "N": 1e-9, "P": 1e-12, "F": 1e-15, "A": 1e-18}
_KEYWORDS = {"MIN": "MIN", "MINIMUM": "MIN", "MAX": "MAX", "MAXIMUM": "MAX", "DEF": "DEF", "DEFAULT": "DEF"}


def parse_number(text: str, unit: str = "", *, units: dict[str, float] | None = None) -> float:
    """A numeric argument with an optional SCPI multiplier and unit: ``1550nm``, ``100 MS``,
    ``1e-4s``, ``-10DBM``. ``unit`` is the base unit (``M`` metres, ``S`` seconds, ``W``);
    ``units`` maps other whole suffixes to factors (``{"NM": 1}`` for a value kept in nm)."""
    m = re.fullmatch(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise ScpiError(*DATA_TYPE_ERROR)
    value, suffix = float(m.group(1)), m.group(2).upper()
    if not suffix:
        return value
    if units and suffix in units:
        return value * units[suffix]
    if unit and suffix.endswith(unit.upper()):
        prefix = suffix[: -len(unit)]
        if prefix in _MULTIPLIERS:
            return value * _MULTIPLIERS[prefix]
    raise ScpiError(*INVALID_SUFFIX)


def keyword(text: str) -> str | None:
    """MIN, MAX or DEF (any spelling SCPI allows), or None."""
    return _KEYWORDS.get(text.strip().upper())


@dataclass
class Number:
    """A numeric setting the way SCPI declares one: its range, default, unit and the reply
    format; MIN/MAX/DEF work on the setting and on its query."""

    minimum: float
    maximum: float
    default: float
    unit: str = ""
    units: dict[str, float] = field(default_factory=dict)
    integer: bool = False

    def parse(self, args: str) -> float:
        if not args.strip():
            raise ScpiError(*MISSING_PARAMETER)
        word = keyword(args)
        if word:
            return {"MIN": self.minimum, "MAX": self.maximum, "DEF": self.default}[word]
        value = parse_number(args, self.unit, units=self.units)
        if self.integer:
            if value != int(value):
                raise ScpiError(*DATA_TYPE_ERROR)
            value = int(value)
        # A limit written with a multiplier (100 US for 1e-4 s) is the limit: the multiplication's
        # last bit of rounding does not put it out of range.
        for limit in (self.minimum, self.maximum):
            if math.isclose(value, limit, rel_tol=1e-9, abs_tol=0.0):
                value = limit
        if not self.minimum <= value <= self.maximum:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        return value

    def query(self, args: str, current: float) -> float:
        """The query's answer: the current value, or MIN/MAX/DEF when asked for."""
        if not args.strip():
            return current
        word = keyword(args)
        if word is None:
            raise ScpiError(*ILLEGAL_PARAMETER)
        return {"MIN": self.minimum, "MAX": self.maximum, "DEF": self.default}[word]


def boolean(args: str) -> bool:
    value = args.strip().upper()
    if not value:
        raise ScpiError(*MISSING_PARAMETER)
    if value in ("ON", "1"):
        return True
    if value in ("OFF", "0"):
        return False
    raise ScpiError(*ILLEGAL_PARAMETER)


def choice(args: str, *options: str) -> str:
    """One of the declared words (each in its short or long form), as declared."""
    value = args.strip().upper()
    if not value:
        raise ScpiError(*MISSING_PARAMETER)
    for option in options:
        node = _node(option, False)
        if value in (node.short, node.long):
            return option
    raise ScpiError(*ILLEGAL_PARAMETER)


def no_args(args: str) -> None:
    if args.strip():
        raise ScpiError(*PARAMETER_NOT_ALLOWED)


def format_channel_list(ports) -> str:
    return "(@" + ",".join(str(p) for p in ports) + ")"


FAULTS = INSTRUMENT_FAULTS  # what an emulated instrument can be made to do wrong


class ScpiDevice:
    """An emulated SCPI instrument: declare commands with :meth:`command`, feed it lines.

    Subclasses call ``self.command(pattern, handler)``; a handler gets the argument text and one
    number per suffix node of its pattern, and returns the reply for a query. Unknown headers,
    bad arguments and refused settings go on the error queue as a real instrument's would.
    ``no_error`` is how the instrument says its queue is empty."""

    no_error = '0,"No error"'

    def __init__(self, name: str, *, command_latency_s: float = 0.0):
        self.name = name
        self.command_latency_s = command_latency_s
        self._commands: list[_Command] = []
        self._refusals: list[tuple[list, bool, tuple[int, str]]] = []
        self._errors: collections.deque[tuple[int, str]] = collections.deque()
        self._errors_lock = threading.Lock()
        self.faults: dict[str, float | None] = {}  # name -> value; see FAULTS
        self.lines_seen = 0
        self.esr = 128  # standard event status register (IEEE 488.2 11.5.1); PON: just powered on
        self.ese = 0  # its enable mask (*ESE): which events set the status byte's ESB bit
        self.sre = 0  # the service request enable mask (*SRE)
        mask = Number(0, 255, 0, integer=True)
        self.command("*CLS", self._cls)
        self.command("*ESR?", self._esr_query)
        self.command("*ESE", lambda a: setattr(self, "ese", int(mask.parse(a))))
        self.command("*ESE?", lambda a: no_args(a) or str(self.ese))
        self.command("*SRE", lambda a: setattr(self, "sre", int(mask.parse(a)) & ~64))  # bit 6 cannot be enabled
        self.command("*SRE?", lambda a: no_args(a) or str(self.sre))
        self.command("*STB?", lambda a: no_args(a) or str(self.status_byte()))
        self.command("*OPC", lambda a: self._set_esr(1))
        self.command("*WAI", lambda a: None)
        self.command("*TST?", lambda a: "0")
        self.command(":SYSTem:ERRor:ALL?", self._error_all)
        self.command(":SYSTem:ERRor[:NEXT]?", self._error_next)
        self.command(":SYSTem:ERRor:COUNt?", lambda a: str(len(self._errors)))

    def status_registers(self, *names: str) -> None:
        """SCPI-99's status reporting structures (chapter 9), each with its condition, event,
        enable and transition registers: ``status_registers("OPERation", "QUEStionable")``.
        They read 0 until a model raises a condition with :meth:`set_condition`."""
        def preset() -> None:
            self.status = {name: {"CONDition": 0, "EVENt": 0, "ENABle": 0, "PTRansition": 32767, "NTRansition": 0}
                           for name in names}

        preset()
        integer = Number(0, 32767, 0, integer=True)

        def read_event(name):
            def handler(args: str) -> str:
                no_args(args)
                value, self.status[name]["EVENt"] = self.status[name]["EVENt"], 0  # reading clears it
                return str(value)
            return handler

        for name in names:
            self.command(f":STATus:{name}[:EVENt]?", read_event(name))
            self.command(f":STATus:{name}:CONDition?", lambda a, n=name: no_args(a) or str(self.status[n]["CONDition"]))
            for register in ("ENABle", "PTRansition", "NTRansition"):
                self.command(f":STATus:{name}:{register}",
                             lambda a, n=name, r=register: self.status[n].__setitem__(r, int(integer.parse(a))))
                self.command(f":STATus:{name}:{register}?", lambda a, n=name, r=register: str(self.status[n][r]))
        self.command(":STATus:PRESet", lambda a: no_args(a) or preset())

    def set_condition(self, name: str, bit: int, on: bool) -> None:
        """Raise or clear ``bit`` of a status structure's condition register; a change the
        transition filters pass (PTRansition for 0 to 1, NTRansition for 1 to 0) latches the
        bit in the event register (SCPI-99 9.2)."""
        register = self.status[name]
        before = register["CONDition"]
        after = before | bit if on else before & ~bit
        rising, falling = after & ~before, before & ~after
        register["EVENt"] |= (rising & register["PTRansition"]) | (falling & register["NTRansition"])
        register["CONDition"] = after

    def refuse(self, pattern: str, error: tuple[int, str]) -> None:
        """A command of the vendor's reference that this emulator answers with ``error`` (what
        its manual file lists as refused: hardware the bench has not, a setting it must not
        change), matched only where no declared command matches."""
        items, query, _ = _compile(pattern)
        self._refusals.append((items, query, error))

    def command(self, pattern: str, handler: Handler) -> None:
        items, query, suffixes = _compile(pattern)
        self._commands.append(_Command(items, query, handler, pattern, suffixes))

    def set_fault(self, name: str, value: float | None = None) -> None:
        if name not in FAULTS:
            raise ValueError(f"{self.name}: unknown fault {name!r}; known: {', '.join(FAULTS)}")
        self.faults[name] = value

    def clear_faults(self) -> None:
        self.faults.clear()

    def power_on(self) -> None:
        """The state after power comes back: the error queue empty, settings at their defaults
        (a model restores what it keeps in non-volatile memory)."""
        self.clear_errors()
        self.esr = 128  # PON: the power came on (IEEE 488.2 11.5.1.1); *ESR? or *CLS clears it
        self.ese = self.sre = 0  # cleared at power-on (the power-on status clear flag's default)

    # -- error queue ----------------------------------------------------------------------------

    def push_error(self, code: int, message: str) -> None:
        with self._errors_lock:
            if len(self._errors) >= _ERROR_QUEUE_SIZE - 1:
                if len(self._errors) == _ERROR_QUEUE_SIZE - 1:
                    self._errors.append(QUEUE_OVERFLOW)
                return
            self._errors.append((code, message))
        self._set_esr(esr_bit(code))

    def _set_esr(self, bit: int) -> None:
        self.esr |= bit

    def status_byte(self) -> int:
        """IEEE 488.2's status byte with SCPI's summaries: 4 an error or event in the queue, 8
        QUEStionable's summary, 32 ESB (an event of the ESR enabled by *ESE), 128 OPERation's
        summary, 64 MSS (any of these enabled by *SRE). MAV (16) is 0: a reply is never pending
        while a query is read here."""
        stb = 4 if self._errors else 0
        status = getattr(self, "status", {})
        for name, bit in (("QUEStionable", 8), ("OPERation", 128)):
            register = status.get(name)
            if register and register["EVENt"] & register["ENABle"]:
                stb |= bit
        if self.esr & self.ese:
            stb |= 32
        if stb & self.sre:
            stb |= 64
        return stb

    def _cls(self, args: str) -> None:
        no_args(args)
        self.clear_errors()
        self.esr = 0  # *CLS clears the event registers, not the enable masks (IEEE 488.2 10.3)
        for register in getattr(self, "status", {}).values():
            register["EVENt"] = 0

    def _esr_query(self, args: str) -> str:
        value, self.esr = self.esr, 0
        return str(value)

    def clear_errors(self) -> None:
        with self._errors_lock:
            self._errors.clear()

    def format_error(self, code: int, message: str) -> str:
        return f'{code},"{message}"'

    def _error_next(self, args: str, *_) -> str:
        with self._errors_lock:
            if not self._errors:
                return self.no_error
            code, msg = self._errors.popleft()
        return self.format_error(code, msg)

    def _error_all(self, args: str) -> str:
        with self._errors_lock:
            items = list(self._errors)
            self._errors.clear()
        return ",".join(self.format_error(c, m) for c, m in items) if items else self.no_error

    # -- dispatch -------------------------------------------------------------------------------

    def handle_line(self, line: str) -> str | bytes | None:
        """Run one line of commands; return the reply line (None when nothing is to be said)."""
        self.lines_seen += 1
        if self.command_latency_s:
            time.sleep(self.command_latency_s)
        replies = []
        path: list[tuple[str, str]] = []
        for part in split_top_level(line.strip(), ";"):
            part = part.strip()
            if not part:
                continue
            try:
                reply, path = self._dispatch(part, path)
            except ScpiError as exc:
                self.push_error(exc.code, exc.message)
                continue
            if "errors" in self.faults and not self._reads_status(path, part):
                self.push_error(*DEVICE_ERROR)
            if reply is not None:
                replies.append(reply)
        if not replies:
            return None
        if any(isinstance(r, bytes) for r in replies):  # an IEEE 488.2 block among the answers
            return b";".join(r if isinstance(r, bytes) else r.encode("ascii") for r in replies)
        return ";".join(replies)

    @staticmethod
    def _reads_status(path: list, part: str) -> bool:
        """The error queue's own queries and the status commands: the ``errors`` fault follows
        the other commands, so that reading or clearing the queue can empty it."""
        header = part.split(None, 1)[0].upper()
        return header.startswith("*") or ":ERR" in header or header.startswith("SYST") and "ERR" in header

    def _dispatch(self, text: str, path: list) -> tuple[str | bytes | None, list]:
        m = re.match(r"([^\s]*)\s*(.*)$", text, re.S)
        header, args = m.group(1), m.group(2)
        query = header.endswith("?")
        bare = header.rstrip("?")
        absolute = bare.startswith(":") or bare.startswith("*")
        tokens = []
        for token in bare.lstrip(":").split(":"):
            tm = _TOKEN.fullmatch(token)
            if not tm:
                raise ScpiError(*UNDEFINED_HEADER if token else SYNTAX_ERROR)
            tokens.append((tm.group(1), tm.group(2)))
        tries = [tokens] if absolute or not path else [path + tokens, tokens]
        for attempt in tries:
            for cmd in self._commands:
                if cmd.query != query:
                    continue
                suffixes = _match(cmd.items, attempt, [])
                if suffixes is None:
                    continue
                if "busy" in self.faults and not query and not header.startswith("*"):
                    raise ScpiError(EXECUTION_ERROR[0], "Execution error; busy")
                reply = cmd.handler(args.strip(), *suffixes)
                new_path = attempt[:-1] if not header.startswith("*") else path
                return reply, new_path
        for attempt in tries:
            for items, is_query, error in self._refusals:
                if is_query == query and _match(items, attempt, []) is not None:
                    raise ScpiError(*error)
        raise ScpiError(*UNDEFINED_HEADER)


def _raise(error: tuple[int, str]):
    raise ScpiError(*error)


def esr_bit(code: int) -> int:
    """The standard event status register's bit an error sets (IEEE 488.2 11.5.1, SCPI-99 21.8):
    -1xx command error 32, -2xx execution error 16, -4xx query error 4; -3xx and an instrument's
    own (positive) codes device-dependent, 8."""
    if -199 <= code <= -100:
        return 32
    if -299 <= code <= -200:
        return 16
    if -499 <= code <= -400:
        return 4
    return 8


# --- transports ---------------------------------------------------------------------------------

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
