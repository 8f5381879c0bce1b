"""NCCL's communicator, as the emulated job's ranks meet it (held by the world service, which
every emulated host reaches).

- Init (ncclCommInitRank) returns only once every rank of the rank map has joined the same
  communicator. Rank 0 makes it (as the root makes the unique id the others fetch from the
  master's rendezvous); a rank that starts again makes or joins a new one, never the old.
- A collective completes only once every rank of the communicator has entered it.

So a missing rank (never started, or killed), a dead one, or one left over from an earlier
communicator (not restarted on the new rank map) stalls the others; they give up after the
job's NCCL timeout, as NCCL's watchdog does. Every wait here is a short slice: the rank asks
again until its own timeout, so a killed process never holds the service for long.

A collective's answer also says whether the ranks behind are only late (``late_only``): each
one's process alive and nothing of the world holding it (its last step was not stalled by a
failed peer or a link down). That lateness is the machine's (a starved core), not the job's:
at a fiftieth of real time NCCL's 30 s are 0.6 s, less than a starved process can be late,
and the rank may wait a little longer for it (instruments/emulators/job.py).
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field

_SLICE_S = 0.25
_KEPT = 64  # communicators remembered (older ones are long dead)


def _alive(pid: int | None) -> bool:
    """Whether a rank's process still runs (every emulated rank runs on this machine): not gone,
    and not a process that has ended and waits for its parent to reap it."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc to ask: the signal's answer stands


@dataclass
class _Comm:
    id: int
    key: str
    nranks: int
    members: dict[int, int] = field(default_factory=dict)  # rank -> pid
    entered: dict[int, int] = field(default_factory=dict)  # rank -> last collective entered
    late: set[int] = field(default_factory=set)  # ranks whose own process start outlasted the emulated start-up
    stalled: set[int] = field(default_factory=set)  # ranks whose last step the world held (a failed peer, no path)

    def complete(self) -> bool:
        return len(self.members) == self.nranks


class Communicators:
    def __init__(self):
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._latest: dict[str, _Comm] = {}  # key -> the communicator ranks join now
        self._by_id: dict[int, _Comm] = {}

    def join(self, key: str, nranks: int, rank: int, pid: int, wait_s: float, late: bool = False) -> dict:
        """Rank ``rank`` (process ``pid``) of job ``key`` joins its communicator and waits (one
        slice at most) for the others; the rank asks again until it is complete or its NCCL
        timeout passes. Returns the communicator's id, whether it is complete, who is missing,
        and which ranks came ``late`` (an emulated rank whose own process start, on a loaded
        machine, outlasted the start-up it emulates: every rank's first collective waits for it)."""
        with self._cond:
            comm = self._latest.get(key)
            if comm is not None and comm.members.get(rank) == pid:
                pass  # asking again
            elif rank == 0:  # the root (re)started: a new communicator, never the old one
                comm = self._new(key, nranks)
                comm.members[0] = pid
            elif comm is None or comm.complete() or not _alive(comm.members.get(0)):
                # the one open is another run's, or its root is gone (the rendezvous it served is
                # closed): wait for the root
                self._cond.wait(min(wait_s, _SLICE_S))
                return {"comm": None, "complete": False, "missing": [0]}
            else:
                comm.members[rank] = pid
            if late:
                comm.late.add(rank)
            self._cond.notify_all()
            return self._wait_complete(comm, wait_s)

    def _new(self, key: str, nranks: int) -> _Comm:
        comm = _Comm(next(self._ids), key, nranks)
        self._latest[key] = comm
        self._by_id[comm.id] = comm
        for old in sorted(self._by_id)[:-_KEPT]:
            del self._by_id[old]
        return comm

    def _wait_complete(self, comm: _Comm, wait_s: float) -> dict:
        self._cond.wait_for(comm.complete, timeout=min(wait_s, _SLICE_S))
        return {"comm": comm.id, "complete": comm.complete(),
                "missing": sorted(set(range(comm.nranks)) - set(comm.members)), "late": sorted(comm.late)}

    def stall(self, comm_id: int, rank: int) -> None:
        """The world could not run rank ``rank``'s next collective (a failed peer, no path): until
        it enters one, the others waiting for it wait on the world, not on a late process."""
        with self._cond:
            comm = self._by_id.get(comm_id)
            if comm is not None:
                comm.stalled.add(rank)

    def enter(self, comm_id: int, rank: int, seq: int, wait_s: float) -> dict:
        """Rank ``rank`` enters collective ``seq`` of the communicator and waits (one slice at
        most) until every rank has entered it. ``behind``: the ranks not there yet;
        ``late_only``: each of them alive and not stalled by the world (see the module's
        docstring)."""
        with self._cond:
            comm = self._by_id.get(comm_id)
            if comm is None:
                return {"done": False, "behind": [], "gone": True}
            comm.entered[rank] = max(seq, comm.entered.get(rank, -1))
            comm.stalled.discard(rank)

            def behind() -> list[int]:
                return [r for r in range(comm.nranks) if comm.entered.get(r, -1) < seq]

            if not behind():  # the last rank in: the others may go (no one is woken before)
                self._cond.notify_all()
            self._cond.wait_for(lambda: not behind(), timeout=min(wait_s, _SLICE_S))
            late = behind()
            return {"done": not late, "behind": late,
                    "late_only": bool(late) and all(r not in comm.stalled and _alive(comm.members.get(r)) for r in late)}
