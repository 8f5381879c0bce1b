"""Run records: every measurement appended to a JSON-lines file as it is taken, flushed and
synced, so a crash or a kill loses nothing that was measured.

Format: one JSON object a line. The first has ``"type": "run"`` (bench, start time, harness
version); each measurement line has ``"type": "measurement"`` with ``test``, ``name``, ``value``,
``unit``, ``low``, ``high``, ``source``, ``verdict``, ``t_ns`` (harness clock) and ``time``
(UTC, ISO 8601); ``"type": "test"`` lines give each test's outcome (``passed``, ``failed``,
``error``, ``skipped``, ``interrupted``); other lines (``"type": "note"``) carry events worth
keeping. The last line (``"type": "end"``) says how the run ended: ``outcome`` (``passed``,
``failed``, ``interrupted``, ``crashed``, ...), ``exit_status``, ``counts`` and ``duration_s``. A
record without it is of a run that did not finish (killed, or the machine died). With
pytest-xdist each worker process adds its own ``run`` line and its measurements; the test lines
and the closing line come from the controlling process.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from lumion_hil.harness.measurements import Measurement


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class RunRecord:
    def __init__(self, path: str | Path, **run_info: Any):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")
        self._append({"type": "run", "time": _utc_now(), "pid": os.getpid(), **run_info})

    def append(self, obj: dict) -> None:
        """Append one line (flushed and synced before this returns)."""
        self._append(obj)

    def _append(self, obj: dict) -> None:
        line = json.dumps(obj, default=str, allow_nan=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def measurement(self, m: Measurement, test: str) -> None:
        self._append({"type": "measurement", "test": test, **m.to_dict(),
                      "t_ns": time.perf_counter_ns(), "time": _utc_now()})

    def note(self, text: str, **attrs: Any) -> None:
        self._append({"type": "note", "text": text, "time": _utc_now(), **attrs})

    def end(self, outcome: str, exit_status: int, counts: dict[str, int], duration_s: float, **attrs: Any) -> None:
        """The closing line: how the run ended."""
        if self._file.closed:
            return
        self._append({"type": "end", "outcome": outcome, "exit_status": exit_status, "counts": counts,
                      "duration_s": round(duration_s, 3), "time": _utc_now(), **attrs})

    def close(self) -> None:
        with self._lock:
            self._file.close()


def how_it_ended(path: str | Path) -> str:
    """The run's outcome from its closing line; a record without one is of a run that crashed
    (or is still going)."""
    ends = [line for line in read_record(path) if line.get("type") == "end"]
    return ends[-1]["outcome"] if ends else "crashed"


def read_record(path: str | Path) -> Iterator[dict]:
    """Every complete line of a run record; a line cut short by a crash is skipped."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
