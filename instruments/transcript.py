"""A run's transcript: every exchange with the instruments and the hosts' agents, one JSON line
each, written and flushed as it happens (``lumion-hil run --record``).

Each line carries the harness's clock (``perf_counter_ns``) when the exchange began and when it
ended; an agent's reply carries the host's own clock too (``remote_ns``). The first line says
what was recorded: the bench, its time scale, the wall-clock time of the harness clock's
``t0_ns``, and the addresses the instruments and agents had (a replay maps them to its own).

Lines: ``{"type": "transcript", ...}`` (the header), ``{"type": "scpi" | "serial", "name",
"command", "reply", "error", "t_ns", "done_ns"}``, ``{"type": "agent", "name", "method",
"params", "result", "error", "remote_ns", "t_ns", "done_ns"}``, ``{"type": "fault" | "repair",
"fault", "by_backend", "t_ns"}`` (what the harness made happen to the bench, or undid). Each
says which of the harness's threads made it (``thread``): a replay keeps each thread's order.

The drivers and the agent client call :func:`exchange`, which costs nothing without a
transcript. Writing is serialised by a lock; a line is one ``write`` of a complete line.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

VERSION = 1


def _plain(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats as strings (JSON has none), bytes as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Transcript:
    def __init__(self, path: str | Path, **header: Any):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fh = self.path.open("a", encoding="utf-8", buffering=1)
        self.lines = 0
        self.t0_ns = time.perf_counter_ns()
        self.write({"type": "transcript", "version": VERSION, "t0_ns": self.t0_ns, "wall_t0": time.time(),
                    "pid": os.getpid(), **header})

    def write(self, entry: dict) -> None:
        line = json.dumps(_plain(entry), separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(line)
            self._fh.flush()
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()


_current: Transcript | None = None


def install(transcript: Transcript | None) -> None:
    """Make ``transcript`` the process's (None: stop recording)."""
    global _current
    _current = transcript


def current() -> Transcript | None:
    return _current


def exchange(kind: str, name: str, t_ns: int, done_ns: int | None = None, **fields: Any) -> None:
    """Record one exchange (a no-op without a transcript)."""
    transcript = _current
    if transcript is None:
        return
    transcript.write({"type": kind, "name": name, "t_ns": t_ns,
                      "done_ns": time.perf_counter_ns() if done_ns is None else done_ns,
                      "thread": threading.get_ident(), **fields})


def note(kind: str, **fields: Any) -> None:
    """Record something the harness did to the bench (a fault it made, a setting)."""
    transcript = _current
    if transcript is not None:
        transcript.write({"type": kind, "t_ns": time.perf_counter_ns(), "thread": threading.get_ident(), **fields})


def write_fault(fault: dict, t_ns: int | None, *, by_backend: bool, kind: str = "fault") -> None:
    """A fault the harness made (``kind`` fault) or undid (repair), at ``t_ns`` (None: now);
    ``by_backend``: in the bench's backend (the emulated world), not through the drivers (whose
    exchanges are in the transcript anyway)."""
    transcript = _current
    if transcript is not None:
        transcript.write({"type": kind, "t_ns": time.perf_counter_ns() if t_ns is None else t_ns, "fault": fault,
                          "by_backend": by_backend, "thread": threading.get_ident()})


def read(path: str | Path) -> tuple[dict, list[dict]]:
    """(header, entries) of a transcript; a clear error for a file that is not one. A last line
    cut short (the run was killed while writing it) is dropped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the transcript: {exc.strerror or exc}") from None
    lines = text.splitlines()
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break  # cut short by a kill: everything before it is whole
            raise ValueError(f"{path}:{number}: not a transcript line: {exc.msg}") from None
    if not entries or entries[0].get("type") != "transcript":
        raise ValueError(f"{path}: not a lumion-hil transcript (its first line is no transcript header; "
                         "record one with lumion-hil run --record)")
    if entries[0].get("version") != VERSION:
        raise ValueError(f"{path}: transcript version {entries[0].get('version')!r}; this lumion-hil reads {VERSION}")
    return entries[0], entries[1:]
