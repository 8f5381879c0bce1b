"""Stopping a run at a safe point.

SIGINT (Ctrl-C) and SIGTERM (what CI sends on cancel) ask the run to stop. The first one raises
:class:`RunInterrupted` in the main thread while a test is being set up or run (inside
:meth:`Interrupts.armed`; elsewhere the request is noted and the runner stops before the next
test), but never inside a :func:`critical` section: an
instrument command that has been sent is always followed to its reply (a VISA session that lost
a reply would hand it to the next query), and a group of switch commands is never left half
done. Inside one, the interrupt waits for the section to end. A second signal does not raise
again: it sets :attr:`Interrupts.hurry`, which cuts short the waiting in clean-up (for a job to
exit, an agent to leave) but not what clean-up does to the hardware.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Optional, Union

# What signal.getsignal returns and signal.signal takes back (typeshed's private signal._HANDLER).
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


class RunInterrupted(BaseException):
    """The run was asked to stop (SIGINT or SIGTERM). A BaseException, like KeyboardInterrupt,
    so that ``except Exception`` in a test or a controller does not swallow it."""

    def __init__(self, signal_name: str):
        self.signal_name = signal_name
        super().__init__(f"interrupted by {signal_name}")


class Interrupts:
    def __init__(self) -> None:
        self.reset()
        self._installed: dict[int, _Handler] = {}

    def reset(self) -> None:
        """Forget any request (a new run in the same process)."""
        self.requested: str | None = None  # the first signal's name
        self.requested_at: float | None = None
        self.hurry = threading.Event()
        self._depth = 0  # critical sections open in the main thread
        self._shielded = 0  # clean-up sections open in the main thread
        self._armed = 0  # where an interrupt may be raised (a test's set-up and body)
        self._pending = False

    # -- signals --------------------------------------------------------------------------------

    def install(self) -> bool:
        """Take over SIGINT and SIGTERM (main thread only). Returns whether it could."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._installed[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        return True

    def uninstall(self) -> None:
        for signum, previous in self._installed.items():
            try:
                signal.signal(signum, previous)
            except (ValueError, TypeError):
                pass
        self._installed.clear()

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            self.hurry.set()  # a second signal: stop waiting, keep cleaning up
            return
        self.requested, self.requested_at = name, time.monotonic()
        if not self._armed or self._shielded:
            return  # noted: the runner stops before the next test
        if self._depth:
            self._pending = True  # raised when the critical section ends
            return
        raise RunInterrupted(name)

    def request(self, name: str) -> None:
        """Ask for a stop as a signal would (tests, or a run that decides to stop itself)."""
        if self.requested is None:
            self.requested, self.requested_at = name, time.monotonic()
        else:
            self.hurry.set()

    # -- critical sections ----------------------------------------------------------------------

    @contextmanager
    def critical(self):
        """No interrupt is raised inside; one that arrives is raised as the section ends."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals are handled in the main thread only: nothing to hold back here
            return
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._pending:
                self._pending = False
                if self._armed and not self._shielded:
                    raise RunInterrupted(self.requested or "SIGINT")

    @contextmanager
    def armed(self):
        """Where a first signal is raised at once (outside critical sections): a test's body."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._armed += 1
        try:
            if self.requested is not None and not self._shielded:
                raise RunInterrupted(self.requested)  # asked to stop before this began
            yield
        finally:
            self._armed -= 1
            self._pending = False

    @contextmanager
    def shield(self):
        """Clean-up: an interrupt that arrives here is noted (and seen between tests) but never
        raised, so every clean-up step runs."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._shielded += 1
        try:
            yield
        finally:
            self._shielded -= 1

    def wait_s(self, seconds: float, hurried_s: float = 0.5) -> float:
        """How long a clean-up wait may last: ``seconds``, or ``hurried_s`` after a second signal."""
        return min(seconds, hurried_s) if self.hurry.is_set() else seconds


INTERRUPTS = Interrupts()
critical = INTERRUPTS.critical
shield = INTERRUPTS.shield
