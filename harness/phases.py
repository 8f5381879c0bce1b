"""The phase runner: each phase of a recovery as a span on the bench's timeline and on the
result, the listeners told as a phase begins, the progress line, and the recovery's deadline."""

from __future__ import annotations

import time
from contextlib import contextmanager

from lumion_hil.harness import timescale
from lumion_hil.harness.progress import PROGRESS
from lumion_hil.harness.recovery_model import PhaseListener, RecoveryError, RecoveryResult


class PhaseRunner:
    def __init__(self, bench, timeline, listeners: list[PhaseListener]):
        self.bench = bench
        self.timeline = timeline
        self.listeners = listeners  # the controller's phase_listeners (the same list)
        self.give_up: float | None = None  # time.monotonic() at which the recovery gives up

    def start(self) -> float:
        """A recovery starts now: its deadline is ``deadlines.recovery_s`` away (as waited)."""
        self.give_up = time.monotonic() + self.bench.waits.recovery_s
        return self.give_up

    def deadline(self, name: str) -> str:
        """A deadline as waited, and where it came from."""
        written, scale = getattr(self.bench.deadlines, name), self.bench.time_scale
        waited, how = timescale.scaled(written, scale, self.bench.deadlines.io_allowance_s)
        how = how.removesuffix(" (emulated latencies scaled alike)")
        return f"{waited:.3g} s (deadlines.{name} {written:g} s{' ' + how if how else ''})"

    def left(self, limit_s: float | None = None) -> float:
        """Seconds left of the recovery (at most ``limit_s``); past the deadline, an error."""
        assert self.give_up is not None, "left() asked before start() set the recovery's deadline"
        left = self.give_up - time.monotonic()
        if left <= 0:
            raise RecoveryError(f"the recovery deadline passed: {self.deadline('recovery_s')}")
        return left if limit_s is None else min(limit_s, left)

    @contextmanager
    def phase(self, result: RecoveryResult, name: str, start_ns: int | None = None, record: bool = True):
        """A recovery phase: its interval goes on the result and, as a span, on the timeline.
        The body may set ``marks["end"]`` when the phase truly ended earlier than now (the
        instant a host reported, say). With ``record=False`` the body runs unrecorded (a
        second try within a phase already recorded)."""
        if not record:
            yield {}
            return
        marks = {"start": start_ns if start_ns is not None else self.timeline.clock()}
        error = None
        for listener in list(self.listeners):
            listener(name, result.plan)
        try:
            with PROGRESS.doing(f"recovery phase {name}", self.give_up):
                yield marks
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            end = marks.get("end") or self.timeline.clock()
            result.phases[name] = (marks["start"], end)
            self.timeline.add_span(f"recovery.{name}", marks["start"], end, error=error)
