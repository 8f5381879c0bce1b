"""An emulated SCPI instrument (:class:`ScpiDevice`): a command tree declared as patterns
(scpi_grammar.py), a real error queue, IEEE 488.2's status registers and SCPI-99's status
structures, and faults. scpi_transports.py puts it on the wire real instruments use.

Several commands may share a line, joined by ``;``: a header without a leading colon continues
from the previous one's branch (SCPI-99 6.2.4) and, failing that, from the root (lenient, as
some firmware is). What a real instrument refuses goes on the error queue with the standard's
number.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from typing import cast

from lumion_hil.instruments.backend import INSTRUMENT_FAULTS
from lumion_hil.instruments.emulators.scpi_grammar import (
    DEVICE_ERROR,
    EXECUTION_ERROR,
    HEADER_TOKEN,
    QUEUE_OVERFLOW,
    SYNTAX_ERROR,
    UNDEFINED_HEADER,
    Command,
    Handler,
    Number,
    ScpiError,
    compile_pattern,
    match_tokens,
    no_args,
    split_top_level,
)

_ERROR_QUEUE_SIZE = 30

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
        self._commands: list[Command] = []
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

        def preset_command(args: str) -> None:
            no_args(args)
            preset()

        self.command(":STATus:PRESet", preset_command)

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
        items, query, _ = compile_pattern(pattern)
        self._refusals.append((items, query, error))

    def command(self, pattern: str, handler: Handler) -> None:
        items, query, suffixes = compile_pattern(pattern)
        self._commands.append(Command(items, query, handler, pattern, suffixes))

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
        replies: list[str | bytes] = []
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
        return ";".join(cast("list[str]", replies))  # no bytes among them, checked above

    @staticmethod
    def _reads_status(path: list, part: str) -> bool:
        """The error queue's own queries and the status commands: the ``errors`` fault follows
        the other commands, so that reading or clearing the queue can empty it."""
        header = part.split(None, 1)[0].upper()
        return header.startswith("*") or ":ERR" in header or header.startswith("SYST") and "ERR" in header

    def _dispatch(self, text: str, path: list) -> tuple[str | bytes | None, list]:
        m = re.match(r"([^\s]*)\s*(.*)$", text, re.S)
        assert m is not None  # both groups match the empty string
        header, args = m.group(1), m.group(2)
        query = header.endswith("?")
        bare = header.rstrip("?")
        absolute = bare.startswith(":") or bare.startswith("*")
        tokens = []
        for token in bare.lstrip(":").split(":"):
            tm = HEADER_TOKEN.fullmatch(token)
            if not tm:
                raise ScpiError(*UNDEFINED_HEADER if token else SYNTAX_ERROR)
            tokens.append((tm.group(1), tm.group(2)))
        tries = [tokens] if absolute or not path else [path + tokens, tokens]
        for attempt in tries:
            for cmd in self._commands:
                if cmd.query != query:
                    continue
                suffixes = match_tokens(cmd.items, attempt, [])
                if suffixes is None:
                    continue
                if "busy" in self.faults and not query and not header.startswith("*"):
                    raise ScpiError(EXECUTION_ERROR[0], "Execution error; busy")
                reply = cmd.handler(args.strip(), *suffixes)
                new_path = attempt[:-1] if not header.startswith("*") else path
                return reply, new_path
        for attempt in tries:
            for items, is_query, error in self._refusals:
                if is_query == query and match_tokens(items, attempt, []) is not None:
                    raise ScpiError(*error)
        raise ScpiError(*UNDEFINED_HEADER)


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
