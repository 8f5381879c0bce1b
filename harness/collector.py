"""The harness's own garbage collector, kept out of what the harness measures.

A pytest process that drives a bench holds 70,000 to 210,000 objects that the cyclic garbage
collector scans (pytest, Hypothesis, the suites, the harness, an emulated world). A collection
of all of them stops every thread of the process, and on a 2-core machine beside a busy core it
took 25-165 ms (gc.callbacks, in the project's tests and in the exploration's workers). Inside a
measured recovery such a pause is counted as the controller's time: between its phases, where
the real-time recovery test allows 20 ms in all (it failed 3 times in 5 in the flake benchmark
with 97-143 ms there), or, at a fiftieth of real time, as 1-8 s of the bench's time.

- :func:`no_collection`: no automatic collection while a recovery is measured (reference
  counting still frees what the recovery drops; the collection it owes runs after the window).
  Nested or concurrent windows (two recordings in one process) keep it off until the last ends.
- :func:`freeze_long_lived`: what a pytest process holds once its tests are collected (modules,
  classes, the collected items) is moved out of the collector's reach for good (``gc.freeze``),
  so that the collections that do run, outside the windows, scan what the tests made since."""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_windows = 0
_was_enabled = False


@contextmanager
def no_collection() -> Iterator[None]:
    """No automatic cyclic collection in this process until the outermost window ends; the
    collector's state before the first window is restored after the last. An explicit
    ``gc.collect()`` still runs (a library that calls one inside a window is its own time)."""
    global _windows, _was_enabled
    with _lock:
        if _windows == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _windows += 1
    try:
        yield
    finally:
        with _lock:
            _windows -= 1
            if _windows == 0 and _was_enabled:
                gc.enable()


def freeze_long_lived() -> None:
    """Everything the collector tracks now is left out of every later collection (see the
    module's text). Not collected first: a full collection here would cost what it saves, and
    the garbage a process has made by the end of its collection is small."""
    gc.freeze()
