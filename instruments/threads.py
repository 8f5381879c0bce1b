"""Threads kept between uses, for short waits started many at a time: the harness's (a recovery
starts some forty at once: a watcher per XID, link and job of every rank, the job stopped on
every host, each rank's start, its first step, each new link) and a host agent's (a thread per
request). A thread started for each costs a start and a handshake with the new thread, a
millisecond each on a busy machine. Here a call runs on a thread kept from an earlier one, or on
a new one where none is free; the threads are daemons, as the ones they replace, so that a wait
on a host that never answers does not hold the process at its exit."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable


class Workers:
    def __init__(self, name: str):
        self.name = name
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a task, none promised to one yet
        self._count = 0

    def submit(self, fn: Callable, *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` on a thread of its own now; its outcome is the future's."""
        future: Future = Future()
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._count += 1
                threading.Thread(target=self._work, daemon=True, name=f"{self.name}-{self._count}").start()
        self._tasks.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            future, fn, args, kwargs = self._tasks.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # the caller's to raise, where it waits
                    future.set_exception(exc)
            del future, fn, args, kwargs  # nothing of a finished task is kept while idle
            with self._lock:
                self._idle += 1


WORKERS = Workers("worker")


def at_once(calls: dict) -> dict:
    """Each ``key: callable`` at once; by key, its result or the exception it raised."""
    futures = {key: WORKERS.submit(call) for key, call in calls.items()}
    out = {}
    for key, future in futures.items():
        try:
            out[key] = future.result()
        except Exception as exc:
            out[key] = exc
    return out
