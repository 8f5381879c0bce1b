"""What the run is doing now, for a person watching it: the current test, the activity inside it
(a recovery phase, say) and how long it has lasted, the deadline left, and counters such as the
failure sequences explored so far. Code that does the work updates it; the pytest plugin shows
it. No output here."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Activity:
    name: str
    started: float  # time.monotonic()
    deadline: float | None = None  # time.monotonic() by which it must end


@dataclass
class Progress:
    test: str | None = None
    test_started: float | None = None
    activity: Activity | None = None
    counters: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start_test(self, nodeid: str | None) -> None:
        with self._lock:
            self.test, self.test_started, self.activity = nodeid, time.monotonic(), None
            self.counters = {}

    def set_activity(self, name: str | None, deadline: float | None = None) -> None:
        with self._lock:
            self.activity = Activity(name, time.monotonic(), deadline) if name else None

    @contextmanager
    def doing(self, name: str, deadline: float | None = None):
        previous = self.activity
        self.set_activity(name, deadline)
        try:
            yield
        finally:
            with self._lock:
                self.activity = previous

    def count(self, name: str, by: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + by

    def line(self, now: float | None = None) -> str | None:
        """One line saying what is going on, or None when nothing is."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self.test is None:
                return None
            parts = [f"{self.test.split('::')[-1]} for {_duration(now - (self.test_started or now))}"]
            if self.activity is not None:
                text = f"{self.activity.name} for {_duration(now - self.activity.started)}"
                if self.activity.deadline is not None:
                    text += f", deadline in {_duration(max(0.0, self.activity.deadline - now))}"
                parts.append(text)
            parts += [f"{name} {value}" for name, value in sorted(self.counters.items())]
            return "; ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs:02d} s"


PROGRESS = Progress()
