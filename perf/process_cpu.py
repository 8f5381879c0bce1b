"""Processor time by process, read from the kernel's accounting (/proc): what the perf scripts
print to say where a run's CPU goes, instead of a profiler's view of one process.

:class:`ByProcess` follows a command's processes while it runs and sums their CPU by kind: the
harness (the run's pytest and its workers: the explorer, the controller, the drivers, and the
emulated instruments and world service they serve in-process), the emulated hosts' agents, their
fork servers, and the ranks; beside them the whole machine's (/proc/stat). Each process counts
its own user and system time as last read, every quarter second: one that ends between two
readings loses at most that much of its time. A rank lives less than that, so the ranks are
counted as their parents reaped them: a fork server's children are its ranks, and an agent's are
ranks started as fresh processes and its fork server (whose own count is taken off). What the
machine spent beyond the kinds counted is the kernel's own work (softirqs, page reclaim), what
ended unseen, and anything else running."""

from __future__ import annotations

import os
import threading

TICK = os.sysconf("SC_CLK_TCK")
KINDS = ("harness", "agents", "fork servers", "ranks", "other")


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields from the third (state) on: the name before them may hold spaces."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def children_cpu_s(pid: int) -> float:
    """CPU of the reaped children of ``pid`` (cutime + cstime)."""
    fields = stat_fields(pid)
    return (int(fields[13]) + int(fields[14])) / TICK


def machine_busy_s() -> float:
    """CPU the whole machine has spent (user, nice, system, irq, softirq), /proc/stat."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


RANKS = (b"emulators.job", b"emulators.ring_job", b"emulators.torch_job")


def _kind(cmdline: bytes) -> str:
    if b"emulators.forkserver" in cmdline:
        return "fork servers"
    if b"emulators.agent" in cmdline:
        return "agents"
    if any(rank in cmdline for rank in RANKS):  # a rank started as a fresh process
        return "ranks"
    if b"pytest" in cmdline or b"lumion_hil" in cmdline or b"exec(eval(" in cmdline:  # the run, its xdist workers
        return "harness"
    return "other"


class ByProcess:
    """CPU of ``root`` and every process under it, by kind, while it runs (``start`` to ``stop``)."""

    def __init__(self, root: int, every_s: float = 0.25):
        self.root, self.every_s = root, every_s
        # (pid, start) -> (kind, own CPU s, its reaped children's s, the reading it was last seen in, its parent's key)
        self._seen: dict[tuple[int, str], tuple[str, float, float, int, tuple[int, str] | None]] = {}
        self._reading = 0
        self._kinds: dict[tuple[int, str], str] = {}  # (pid, its start time) -> kind
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="cpu-by-process")
        self._machine0 = machine_busy_s()
        self._machine_s = 0.0
        self._failed: Exception | None = None

    def start(self) -> "ByProcess":
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop reading; CPU seconds by kind, ``machine`` (all of it over the span) and ``cores``."""
        self._stop.set()
        self._thread.join()
        if self._failed is not None:
            raise RuntimeError(f"reading the run's CPU from /proc failed: {self._failed}") from self._failed
        totals = dict.fromkeys(KINDS, 0.0)
        for key, (kind, own, reaped, last, parent) in self._seen.items():
            totals[kind] += own
            if kind == "fork servers":
                totals["ranks"] += reaped  # a fork server's only children are its ranks
            elif kind == "agents":  # an agent's children: the jobs it started (their ranks), and its fork server
                servers = sum(s_own + s_reaped for s_kind, s_own, s_reaped, s_last, s_parent in self._seen.values()
                              if s_kind == "fork servers" and s_parent == key and s_last < last)  # reaped by it
                totals["ranks"] += max(0.0, reaped - servers)
        return {**totals, "machine": self._machine_s, "cores": float(os.cpu_count() or 1)}

    def _follow(self) -> None:
        try:
            while True:
                stopping = self._stop.is_set()  # a last reading after stop() was asked for
                self._read()
                self._machine_s = machine_busy_s() - self._machine0
                if stopping:
                    return
                self._stop.wait(self.every_s)
        except Exception as exc:  # said by stop(), not lost with this thread
            self._failed = exc

    def _read(self) -> None:
        self._reading += 1
        parents: dict[int, int] = {}
        fields_of: dict[int, list[str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = stat_fields(entry)
            except OSError:  # gone meanwhile
                continue
            parents[int(entry)] = int(fields[1])
            fields_of[int(entry)] = fields
        # A process seen stays ours while it lives (one whose parent ended is the init process's).
        ours = {self.root} | {pid for pid, started in self._kinds if pid in fields_of and fields_of[pid][19] == started}
        grew = True
        while grew:  # every process under one of ours
            grew = False
            for pid, parent in parents.items():
                if parent in ours and pid not in ours:
                    ours.add(pid)
                    grew = True
        cmdlines: dict[int, bytes] = {}

        def cmdline(pid: int) -> bytes:
            if pid not in cmdlines:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmdlines[pid] = fh.read()
                except OSError:
                    cmdlines[pid] = b""
            return cmdlines[pid]

        for pid in ours:  # each one's kind, from its command line (once it has its own)
            if pid in fields_of and (pid, fields_of[pid][19]) not in self._kinds:
                mine = cmdline(pid)
                # Empty: a zombie. Its parent's: a process between its fork and its exec (or a
                # fork server's rank, which never execs: counted as its server reaps it). Either
                # is asked again at the next reading.
                if mine and mine != cmdline(parents[pid]):
                    self._kinds[(pid, fields_of[pid][19])] = _kind(mine)
        for pid in ours:
            fields = fields_of.get(pid)
            kind = None if fields is None else self._kinds.get((pid, fields[19]))
            if fields is None or kind is None:
                continue
            parent = parents[pid]
            forked = parent in fields_of and self._kinds.get((parent, fields_of[parent][19])) == "fork servers"
            if forked or kind != "fork servers" and self._under_an_agent(pid, parents, fields_of):
                continue  # what an agent started (a rank, torchrun; a fork server's rank): counted as it is reaped
            own = (int(fields[11]) + int(fields[12])) / TICK
            reaped = (int(fields[13]) + int(fields[14])) / TICK
            key = (pid, fields[19])
            first = self._seen.get(key)
            parent_key = first[4] if first else (parent, fields_of[parent][19]) if parent in fields_of else None
            self._seen[key] = (kind, own, reaped, self._reading, parent_key)

    def _under_an_agent(self, pid: int, parents: dict[int, int], fields_of: dict[int, list[str]]) -> bool:
        seen = set()
        while pid in parents and pid not in seen:
            seen.add(pid)
            pid = parents[pid]
            if pid in fields_of and self._kinds.get((pid, fields_of[pid][19])) == "agents":
                return True
        return False


def describe(cpu: dict[str, float], wall_s: float) -> str:
    """One line: each kind's CPU seconds, and the machine's."""
    counted = sum(cpu[k] for k in KINDS)
    capacity = cpu["cores"] * wall_s
    parts = ", ".join(f"{k} {cpu[k]:.1f}" for k in KINDS)
    return (f"{parts}; the machine {cpu['machine']:.1f} of {capacity:.1f} ({100 * cpu['machine'] / capacity:.0f}% busy), "
            f"{max(0.0, cpu['machine'] - counted):.1f} of it beyond these (the kernel's own work, what processes spent "
            "after their last reading, anything else)")
