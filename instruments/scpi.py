"""The shape shared by SCPI drivers: commands declared once with their parsing beside them,
set commands that wait for completion with ``*OPC?``, and an error queue checked after each."""

from __future__ import annotations

import re
from typing import Any, Callable

from lumion_hil.instruments.protocols import Identity, InstrumentError, InstrumentIOError
from lumion_hil.instruments.visa import VisaSession

_ERROR_ITEM = re.compile(r'\s*([+-]?\d+)\s*,\s*"([^"]*)"\s*')


def parse_identity(reply: str) -> Identity:
    parts = [p.strip() for p in reply.split(",")]
    if len(parts) != 4 or not parts[0]:
        raise ValueError("expected 'vendor,model,serial,firmware'")
    return Identity(*parts)


def parse_errors(reply: str) -> list[tuple[int, str]]:
    """``-113,"Undefined header",-221,"Settings conflict"`` -> [(-113, ...), (-221, ...)];
    ``0,"No error"`` -> []."""
    items, pos = [], 0
    while pos < len(reply):
        m = _ERROR_ITEM.match(reply, pos)
        if not m:
            raise ValueError("not an SCPI error list")
        items.append((int(m.group(1)), m.group(2)))
        pos = m.end()
        if pos < len(reply):
            if reply[pos] != ",":
                raise ValueError("not an SCPI error list")
            pos += 1
    if not items:
        raise ValueError("empty error reply")
    return [(c, m) for c, m in items if c != 0]


class query:
    """A read-only property backed by one query: ``size = query(":OXC:SWIT:SIZE?", parse, "doc")``."""

    def __init__(self, command: str, parse: Callable[[str], Any], doc: str = ""):
        self.command = command
        self.parse = parse
        self.__doc__ = doc

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instrument, owner=None):
        if instrument is None:
            return self
        return instrument.ask(self.command, self.parse)


class ScpiInstrument:
    """Base of SCPI drivers. ``error_query`` is the model's way to read its whole error queue."""

    error_query = ":SYST:ERR?"
    error_query_returns_all = False

    def __init__(self, session: VisaSession, *, opc_timeout_s: float = 10.0):
        self.session = session
        self.name = session.name
        self.opc_timeout_s = opc_timeout_s

    def ask(self, command: str, parse: Callable[[str], Any] = str, *, timeout_s: float | None = None) -> Any:
        """Query and parse; a reply that does not parse is an InstrumentError, never a wrong value."""
        reply = self.session.query(command, timeout_s=timeout_s)
        try:
            return parse(reply)
        except (ValueError, IndexError) as exc:
            raise InstrumentIOError(self.name, command, f"unexpected reply ({exc})", reply) from None

    def send(self, command: str) -> None:
        """A set command, then the error queue."""
        self.session.write(command)
        self.check_errors(command)

    def send_and_wait(self, command: str, timeout_s: float | None = None) -> None:
        """A set command joined with ``*OPC?``: returns when the instrument reports it complete."""
        full = f"{command};*OPC?"
        reply = self.session.query(full, timeout_s=timeout_s or self.opc_timeout_s)
        if reply.strip() != "1":
            raise InstrumentIOError(self.name, full, "operation did not report completion", reply)
        self.check_errors(command)

    def clear_status(self) -> None:
        """``*CLS``: empty the error queue and the event registers, so that what an earlier
        session left there is not taken for the answer to this one's commands."""
        self.session.write("*CLS")

    def errors(self) -> list[tuple[int, str]]:
        """Empty the error queue and return what was on it."""
        found: list[tuple[int, str]] = []
        for _ in range(32):  # an SCPI queue holds a bounded number of entries
            batch = self.ask(self.error_query, parse_errors)
            found.extend(batch)
            if self.error_query_returns_all or not batch:
                break
        return found

    def check_errors(self, after: str) -> None:
        errs = self.errors()
        if errs:
            listed = "; ".join(f"{code} {msg}" for code, msg in errs)
            raise InstrumentError(self.name, after, f"instrument reported: {listed}")

    def close(self) -> None:
        self.session.close()
