"""Where a failure sequence's wall time goes: a pytest plug-in that perf/exploration.py loads into
the suite's run (``-p exploration_split``, this folder on PYTHONPATH). It times each thing the
explorer does (a reset, a recovery, a repair, a quiet step, the promises' check) on the
harness's clock and splits its wall time, from outside the controller, into:

- physics: the scaled physics the emulated world accounts for on that span, each instant counted
  once however it overlaps: beams switching (commanded to lit), light to link up, each restarted
  rank's scaled start-up (the job's own sleep before it says it is ready) and the first step's
  compute and all-reduce (a quiet step: the steps waited for);
- start-up: each restarted rank's process start (the agent starting it to the job beginning its
  scaled start-up), outside the physics;
- harness: CPU time of the harness's process over the span (the harness, the controller, and the
  emulators and world service it serves in-process), at most the rest of the wall time;
- waiting: what is left (idle time no physics, start-up or harness CPU explains).

Beside them, how late a thread of the worker wakes from a 1 ms sleep, over each shard's test
(``wake`` records: median, p90, p99 in microseconds): the machine's scheduling, and in this
process of many threads (the harness's, the in-process emulators', the world service's one a
connection) its turn at the interpreter lock. perf/exploration.py prints it beside the same
figure of a process of its own. (The probe is a thread more, taking the lock a thousand times a
second: a small load of its own, on the code before and after a change alike.)

Each record goes to ``$LUMION_HIL_SPLIT_OUT/split-<pid>.jsonl`` (one file per worker). Nothing here
changes what the suite does; the plug-in works on the code before and after a change alike."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path

import pytest

# The code of --before held the explorer in exploration.py and the covered-spans helper in
# recovery.py: looked for there first. Importing a module that tree lacks finds this tree's
# (the editable install maps the package's folders), and timing this tree's explorer would
# time nothing of that run.
from lumion_hil.harness import exploration as _exploration, recovery as _recovery

if hasattr(_exploration, "Explorer"):
    _explorer = _exploration
else:
    from lumion_hil.harness import explorer as _explorer
if hasattr(_recovery, "_covered_ns"):  # how much of [lo, hi] spans cover, once
    _union_ns = _recovery._covered_ns
else:
    from lumion_hil.harness.overhead import _covered_ns as _union_ns

_OUT = os.environ.get("LUMION_HIL_SPLIT_OUT")


class _Split:
    def __init__(self, explorer):
        self.explorer = explorer
        self.path = Path(_OUT) / f"split-{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def step_ns(self, world, t_ns: int) -> int:
        """One step's physics at ``t_ns``: compute, then the gradients' all-reduce over the light up then."""
        job = self.explorer.bench.job
        try:
            comm = world.collective_cost("all_reduce", list(self.explorer.ranks), int(job.gradient_bytes),
                                         t_ns=t_ns).time_s
        except Exception:  # no path at that instant: count the compute alone
            comm = 0.0
        return world.scaled_ns(job.compute_time_s + comm)

    def physics(self, kind: str, t0: int, t1: int, first: int, first_circuit: int) -> tuple[list, list]:
        """(physics spans, process start-up spans) on [t0, t1] from the world's record: its events
        from ``first`` on and its circuits from ``first_circuit`` on (the world keeps every circuit
        it made in the order it made them: what is older than the span is never read, so that this
        accounting, outside the operations it times, does not grow with the run)."""
        world = self.explorer.session.world
        spans, startup = [], []
        if world is None:
            return spans, startup
        with world.lock:
            circuits = [c for c in world.circuits[first_circuit:] if t0 <= c.commanded_ns <= t1]
            events = [e for e in world.events[first:] if t0 <= e.t_ns <= t1 and e.kind.startswith("job.")]
        for c in circuits:
            spans.append((c.commanded_ns, c.lit_ns))
            owner = world.bench.nic_on_rx_port(c.egress)
            if owner is not None:
                state, since = world.link_state(owner[0].name, owner[1].name, t1)
                if state == "up" and since > c.lit_ns:
                    spans.append((c.lit_ns, since))
        # The emulated job sleeps its scaled start-up before it says it is ready; the namespaced
        # bench's ring job (real processes, real sockets) has none: its whole start is start-up.
        backend = self.explorer.session.backend
        real = getattr(backend, "real_traffic", False)
        startup_ns = 0 if real else world.scaled_ns(self.explorer.bench.job.startup_time_s)
        ready = {}  # host -> when its rank said ready (the last time, in this span)
        for e in events:
            if e.kind == "job.ready":
                ready[e.subject] = e.t_ns
        lead = self.explorer.ranks[0] if self.explorer.ranks else None
        # The ranks of one start start together: the last of them to be ready is on the path to
        # the first step (a start's physics is counted once, not once per rank).
        readies, since = sorted(e.t_ns for e in events if e.kind == "job.ready"), t0
        for e in events:
            if e.kind == "job.step" and e.subject == lead and (kind == "quiet" or e.detail.get("step") == 1):
                spans.append((e.t_ns - self.step_ns(world, e.t_ns), e.t_ns))
                if e.detail.get("step") == 1:
                    before = [t for t in readies if since < t <= e.t_ns]
                    if before and startup_ns:
                        spans.append((before[-1] - startup_ns, before[-1]))
                    since = e.t_ns
        after = [t for t in readies if t > since]
        if after and startup_ns:  # a start that never stepped (a rank lost as it started): its start-up all the same
            spans.append((after[-1] - startup_ns, after[-1]))
        if ready:
            for host in ready:
                try:
                    started = self.explorer.session.hosts[host].job_status().started_ns
                except Exception:
                    continue
                if started is not None and t0 <= started <= ready[host] - startup_ns:
                    startup.append((started, ready[host] - startup_ns))
        return spans, startup

    def timed(self, kind: str, call):
        world = self.explorer.session.world
        first = max(0, len(world.events) - 64) if world is not None else 0
        first_circuit = len(world.circuits) if world is not None else 0
        t0, cpu0 = time.perf_counter_ns(), time.process_time()
        try:
            return call()
        finally:
            t1, cpu1 = time.perf_counter_ns(), time.process_time()
            try:
                self.record(kind, t0, t1, cpu1 - cpu0, first, first_circuit)
            except Exception as exc:  # the measurement never breaks the run
                self.write({"kind": kind, "error": f"{type(exc).__name__}: {exc}"})

    def record(self, kind: str, t0: int, t1: int, cpu_s: float, first: int, first_circuit: int) -> None:
        spans, startup = self.physics(kind, t0, t1, first, first_circuit)
        wall = (t1 - t0) / 1e9
        physics = _union_ns(spans, t0, t1) / 1e9
        both = _union_ns(spans + startup, t0, t1) / 1e9
        rest = max(0.0, wall - both)
        harness = min(max(0.0, cpu_s), rest)
        self.write({"kind": kind, "wall_s": wall, "physics_s": physics, "startup_s": both - physics,
                    "harness_s": harness, "waiting_s": rest - harness, "cpu_s": cpu_s, "ranks_started": len(startup)})

    def write(self, item: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(item) + "\n")


def late_us(samples: list[int]) -> dict:
    """Median, p90 and p99 of wake-up lateness samples (microseconds), and their count."""
    ordered = sorted(samples)
    if not ordered:
        return {"n": 0}
    return {"n": len(ordered), **{k: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
                                  for k, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}}


class _WakeProbe:
    """A daemon thread that sleeps 1 ms again and again and notes how late it woke."""

    def __init__(self):
        self.samples: list[int] = []
        threading.Thread(target=self._run, name="perf-wake-probe", daemon=True).start()

    def _run(self) -> None:
        clock = time.perf_counter_ns
        while True:
            t0 = clock()
            time.sleep(0.001)
            self.samples.append((clock() - t0 - 1_000_000) // 1000)


_WAKE = _WakeProbe() if _OUT else None


def _wrap(name: str, kind: str) -> None:
    original = getattr(_explorer.Explorer, name)

    @functools.wraps(original)
    def timed(self, *args, **kwargs):
        split = getattr(self, "_perf_split", None)
        if split is None:
            return original(self, *args, **kwargs)
        return split.timed(kind, lambda: original(self, *args, **kwargs))

    setattr(_explorer.Explorer, name, timed)


if _OUT:
    _init = _explorer.Explorer.__init__

    def _init_timed(self, session, *args, **kwargs):
        self._perf_split = None
        _init(self, session, *args, **kwargs)  # (its first reset is set-up, not timed)
        self._perf_split = _Split(self)

    _explorer.Explorer.__init__ = _init_timed
    for _name, _kind in (("reset", "reset"), ("_recover", "recovery"), ("_repair", "repair"), ("_quiet", "quiet"),
                         ("check", "check")):
        _wrap(_name, _kind)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """The wall time of each shard's test, beside the parts timed above."""
    started, cpu = time.perf_counter_ns(), time.process_time()
    woke = len(_WAKE.samples) if _WAKE else 0
    try:
        return (yield)
    finally:
        if _OUT and "failure_sequences" in item.name:
            # the folder the explorer's timers make, made here too: a shard that timed nothing
            # (code before them, or a story broken at once) still reports its wall time
            Path(_OUT).mkdir(parents=True, exist_ok=True)
            with open(Path(_OUT) / f"split-{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"kind": "shard", "test": item.nodeid, "cpu_s": time.process_time() - cpu,
                                     "wall_s": (time.perf_counter_ns() - started) / 1e9}) + "\n")
                if _WAKE:
                    fh.write(json.dumps({"kind": "wake", "test": item.nodeid,
                                         **late_us(_WAKE.samples[woke:])}) + "\n")
