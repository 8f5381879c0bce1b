"""The controller's overhead, measured from outside it: a recovery's wall time minus the physics
its final plan needed, from the emulated world's record where there is one (:func:`ground_truth`,
per phase the controller reports) and from what the harness itself saw on any bench (switch
commands on the timeline, carrier changes the NICs' agents stamped: :func:`controller_overhead`)."""

from __future__ import annotations

import ast
import concurrent.futures
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from lumion_hil.harness import decisions
from lumion_hil.harness.job_restart import Restart
from lumion_hil.harness.recovery_model import PHASES, RecoveryResult


@dataclass
class RecoveryTruth:
    fault_ns: int
    first_step_ns: int | None
    physical_s: dict[str, float] = field(default_factory=dict)  # per phase: time spent waiting on physics
    between_phases_s: float = 0.0  # critical-path time outside every phase (all of it overhead)

    @property
    def total_s(self) -> float | None:
        return None if self.first_step_ns is None else (self.first_step_ns - self.fault_ns) / 1e9


def ground_truth(world, fault_ns: int, result: RecoveryResult, restart: "Restart | None" = None) -> RecoveryTruth:
    """The emulated world's record of the same recovery: when the fault truly happened, when the
    first step truly completed, and how much of each phase the controller reports was physics
    (beams settling, links locking, the job starting and stepping) rather than the controller.
    The lead rank and the restart instant are the harness's own (``restart``, from the agents);
    without one, the controller's word stands in (kept for callers that have no session)."""
    lead = restart.lead if restart else (result.plan.ranks_after[0] if result.plan else None)
    restarted_ns = restart.restarted_ns if restart else result.restarted_ns

    def first_steps():
        return [t for step, t in _told_steps(world, lead, restarted_ns or fault_ns).items() if step == 1]

    # The emulated job tells the world of a step just after it prints it (so the world's
    # bookkeeping never delays what the host sees): a step the harness saw may reach the world
    # a moment later. Wait for it, woken by each world event, at most a second.
    steps, until = first_steps(), time.monotonic() + 1.0
    seen = restart.first_step_ns if restart else result.first_step_ns
    while not steps and seen is not None and time.monotonic() < until:
        world.wait_for_change(until - time.monotonic())
        steps = first_steps()
    truth = RecoveryTruth(fault_ns, steps[0] if steps else None)
    lit = [e.t_ns for e in world.events_of("circuit.lit") if e.t_ns > fault_ns]
    ups = []
    end = truth.first_step_ns or world.now_ns()
    for _, egress in _made_between(world, fault_ns, end):
        owner = world.bench.nic_on_rx_port(egress)
        if owner:
            state, since = world.link_state(owner[0].name, owner[1].name)
            if state == "up":
                ups.append(since)
    physics_end = {"switch": max(lit) if lit else None, "link": max(ups) if ups else None,
                   "first_step": truth.first_step_ns}
    for phase in PHASES:
        if phase not in result.phases:
            continue
        start, end = result.phases[phase]
        ended = physics_end.get(phase)
        truth.physical_s[phase] = 0.0 if ended is None else max(0.0, min(ended, end) - start) / 1e9
    truth.between_phases_s = between_phases_s(result)
    return truth


STAMPED_STEPS = 4  # per rank of the new map: its first steps, stamped by both the world and its agent


def _told_steps(world, host: str | None, since_ns: int) -> dict[int, int]:
    """step -> the world's instant of it, for the steps ``host``'s rank (None: any) told the world after ``since_ns``."""
    told: dict[int, int] = {}
    for e in world.events_of("job.step", host):
        if e.t_ns > since_ns:
            told.setdefault(e.detail.get("step"), e.t_ns)
    return told


def stamp_pairs(session, world, ranks: list[str], since_ns: int, timeout_s: float) -> list[tuple[int, int]]:
    """(the world's instant, the agent's stamp) of each of the first :data:`STAMPED_STEPS` steps
    every rank of the new map completed after ``since_ns``. The emulated job takes the world's
    instant just before it prints the step's line, and tells the world with its next question
    (a moment after the line); the rank's agent stamps the line as it reads it. A step's line
    comes alone, a step after the last (the lines of a start come in a burst: a slow reader's
    delays add up along it). Waits, woken by the agent and then by the world, until every rank
    has both for each step, or ``timeout_s`` has passed: a pair missing is the caller's to judge."""
    deadline = time.monotonic() + timeout_s
    pairs: list[tuple[int, int]] = []
    for host in ranks:
        agent = session.hosts[host]
        agent.wait_step(STAMPED_STEPS, max(0.0, deadline - time.monotonic()))
        told = _told_steps(world, host, since_ns)
        while STAMPED_STEPS not in told and time.monotonic() < deadline:
            world.wait_for_change(min(1.0, deadline - time.monotonic()))
            told = _told_steps(world, host, since_ns)
        pairs += [(told[step], seen) for step, seen in agent.job_steps(0)
                  if step <= STAMPED_STEPS and seen > since_ns and step in told]
    return pairs


MEASUREMENT_MARGIN_S = 0.005  # the harness's requirement: its stamps within 5 ms of a bare reader's on the machine

# A bare reader of this machine (reader_floor): a writer that wakes at instants START + k*STEP
# and prints each instant, read by a process of its own that prints how late each line came.
_WRITER = ("import sys, time\n"
           "start, step, lines = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])\n"
           "for k in range(1, lines + 1):\n"
           "    time.sleep(max(0.0, (start + int(k * step * 1e9) - time.monotonic_ns()) / 1e9))\n"
           "    print(time.monotonic_ns(), flush=True)\n")
_READER = ("import subprocess, sys, time\n"
           "writer = subprocess.Popen([sys.executable, '-c', *sys.argv[1:]], stdout=subprocess.PIPE)\n"
           "late = [time.monotonic_ns() - int(line) for line in writer.stdout]\n"
           "print(late if writer.wait() == 0 else 'the writer failed')\n")


def _measure_floor(writers: int, interval_s: float, lines: int) -> list[float]:
    start = time.monotonic_ns() + 500_000_000  # every writer started (a python each) before its first wake
    procs = [subprocess.Popen([sys.executable, "-c", _READER, _WRITER, str(start), str(interval_s), str(lines)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(writers)]
    late: list[float] = []
    for proc in procs:
        out, err = proc.communicate(timeout=30 + 2 * lines * interval_s)
        try:
            late += [ns / 1e9 for ns in ast.literal_eval(out.strip())]
        except (ValueError, SyntaxError, TypeError):
            raise RuntimeError(f"the bare reader's probe failed (exit {proc.returncode}): "
                               f"{(out + err).strip()[-300:] or 'no output'}") from None
    return late


_floors: dict[tuple[int, int, int], concurrent.futures.Future] = {}
_floors_lock = threading.Lock()


def start_reader_floor(writers: int, interval_s: float, lines: int = STAMPED_STEPS) -> concurrent.futures.Future:
    """Start measuring :func:`reader_floor` in the background (once per run for each writers,
    interval to 10 ms and lines: the machine's, not one recovery's); its future."""
    key = (writers, max(10, round(interval_s * 100) * 10), lines)
    with _floors_lock:
        future = _floors.get(key)
        if future is None:
            future = _floors[key] = concurrent.futures.Future()

            def measure() -> None:
                try:
                    future.set_result(_measure_floor(key[0], key[1] / 1000, key[2]))
                except BaseException as exc:  # the caller's result() raises it
                    future.set_exception(exc)

            threading.Thread(target=measure, daemon=True, name="reader-floor").start()
    return future


def reader_floor(writers: int, interval_s: float, lines: int = STAMPED_STEPS) -> list[float]:
    """How late (s) a bare reader on this machine reads a line that ends a sleep: ``writers``
    processes that wake together every ``interval_s`` and each print the instant, each read by
    a process of its own (as each host's agent reads its rank), ``lines`` lines each. What the
    machine itself costs such a line, whatever reads it: an idle core's wake-up (on a 2-core
    VM, a bare reader's line came 2 ms late after 0.3 s asleep and 9 ms after 1.6 s, the
    default bench's step at real time)."""
    return list(start_reader_floor(writers, interval_s, lines).result())


def step_interval_s(pairs: list[tuple[int, int]]) -> float:
    """The job's step interval, from one recovery's :func:`stamp_pairs` (the world's instants of
    every rank's first STAMPED_STEPS steps: the ranks step together)."""
    instants = [world for world, _ in pairs]
    return (max(instants) - min(instants)) / 1e9 / max(1, STAMPED_STEPS - 1) if instants else 0.0


def step_interval_before(world, ranks: list[str], before_ns: int) -> float | None:
    """The job's step interval before ``before_ns`` (a fault): between the last two consecutive
    steps one of ``ranks`` told the world; None if none did."""
    for host in ranks:
        steps = [(e.t_ns, e.detail.get("step")) for e in world.events_of("job.step", host) if e.t_ns < before_ns]
        if len(steps) >= 2 and isinstance(steps[-1][1], int) and steps[-2][1] == steps[-1][1] - 1:
            return (steps[-1][0] - steps[-2][0]) / 1e9
    return None


def floor_from_before(world, ranks: list[str], fault_ns: int) -> float | None:
    """Start measuring the bare reader (:func:`start_reader_floor`, as many writers as
    ``ranks``) at the job's step interval before ``fault_ns``, so that it runs while the
    restarted job's steps are stamped; that interval, or None where the job had not stepped
    twice before the fault."""
    interval = step_interval_before(world, ranks, fault_ns)
    if interval is not None:
        start_reader_floor(len(ranks), interval)
    return interval


@dataclass(frozen=True)
class StampError:
    decision: decisions.Decision
    expected: int  # pairs a whole sample has: every rank's first STAMPED_STEPS steps

    @property
    def complete(self) -> bool:
        return self.decision.n_after == self.expected


def stamp_error(session, world, restart: Restart, timeout_s: float, interval_s: float | None = None,
                alpha: float = decisions.RECOVERY_ERROR_ALPHA) -> StampError:
    """Whether the agents' stamps of the restarted job's steps (what ``recovery_to_first_step``
    is measured from) are later after the world's instants than a bare reader's lines on this
    machine by more than :data:`MEASUREMENT_MARGIN_S` (:func:`stamp_decision`). The bare
    reader runs at ``interval_s``, the job's step interval before the fault, where
    :func:`floor_from_before` started it while the steps were stamped; else at the restarted
    job's, after them. Its rate is nominal: it takes the stamps as independent, while a host's
    share its clock mapping and the ranks' lines of one step are read at one moment."""
    writers = len(restart.ranks)
    pairs = stamp_pairs(session, world, restart.ranks, restart.restarted_ns, timeout_s)
    return StampError(stamp_decision(pairs, writers, interval_s or step_interval_s(pairs), alpha),
                      writers * STAMPED_STEPS)


def stamp_decision(pairs: list[tuple[int, int]], writers: int, interval_s: float,
                   alpha: float = decisions.RECOVERY_ERROR_ALPHA) -> decisions.Decision:
    """The decision of :func:`stamp_error` on (the world's instant, the agent's stamp) pairs in
    ns, one recovery's or several recoveries' together: how late the stamps are against how
    late a bare reader on this machine reads a line after as long a sleep (:func:`reader_floor`,
    ``writers`` at once every ``interval_s``, as the job's ranks step), by the two samples'
    trimmed means. The machine's own wake-up is no error of the harness's; what the agent adds
    to it is."""
    late = [(stamp - world) / 1e9 for world, stamp in pairs]
    floor = reader_floor(writers, interval_s) if pairs else []
    return decisions.compare(floor, late, alpha=alpha, margin=MEASUREMENT_MARGIN_S, unit="s",
                             what="how late the agents stamp the restarted job's steps (after the world's instants) "
                                  "beyond how late a bare reader reads a line on this machine")


def _made_between(world, lo_ns: int, hi_ns: int) -> set[tuple[int, int]]:
    """The circuits live at ``hi_ns`` that were not live at ``lo_ns``: what a recovery added."""
    return set(world.connections(hi_ns).items()) - set(world.connections(lo_ns).items())


def between_phases_s(result: RecoveryResult) -> float:
    """Time on the path from the first phase's start to the last one's end that no phase covers."""
    spans = sorted(result.phases.values())
    if not spans:
        return 0.0
    gap, reach = 0, spans[0][1]
    for start, end in spans[1:]:
        gap += max(0, start - reach)
        reach = max(reach, end)
    return gap / 1e9


@dataclass
class Overhead:
    """A recovery's software time: its wall time on the harness's clock minus the physics its
    final plan needed (the switching of the circuits it added and removed, their light and
    lock, the job's own start-up and first step), each counted once however the controller
    overlaps them. Physics the final plan did not need (a wrong spare tried first, a retry,
    circuits made and taken away again) and time the job spent stalled on links not yet up
    are the controller's."""

    total_s: float  # fault to first step
    physics_s: float
    physics: dict[str, float]  # by kind, each on its own
    basis: str  # where the physics came from
    wasted: dict[str, float] = field(default_factory=dict)  # physics the final plan did not need: overhead
    added: list[tuple[int, int]] = field(default_factory=list)  # the final plan's circuits, as the harness saw
    removed: list[tuple[int, int]] = field(default_factory=list)

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.physics_s


def _covered_ns(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """How much of [lo, hi] the spans cover, overlaps counted once."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi and b > a)
    covered, reach = 0, lo
    for a, b in clipped:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered


def switch_commands(session, lo_ns: int, hi_ns: int) -> list[tuple[str, int, int, list[tuple[int, int]]]]:
    """The switch commands the harness saw between two instants, through the bench's switch:
    (method, start, end, the pairs asked for), in order."""
    switch = session.bench.topology.switch
    out = []
    for span in list(session.timeline.spans):
        method = span.name.removeprefix(f"{switch}.")
        if span.name.startswith(f"{switch}.") and span.end_ns is not None and lo_ns <= span.start_ns < hi_ns:
            first = (span.attrs.get("args") or [[]])[0]
            pairs = [tuple(p) for p in first if isinstance(p, (list, tuple)) and len(p) == 2] \
                if isinstance(first, (list, tuple)) else []
            out.append((method, span.start_ns, span.end_ns, pairs))
    return sorted(out, key=lambda c: c[1])


class LinkWatch:
    """Carrier changes of some NICs while a recovery runs, as their agents stamp them: what
    stands for the emulated world's record of light and lock on a bench that has none. Each NIC
    is followed by a thread that waits on its agent for the next change (event-driven)."""

    def __init__(self, session, nics: list[tuple[str, str]], window_s: float = 1.0):
        self.session, self.window_s = session, window_s
        self.changes: dict[tuple[str, str], list[tuple[int, bool]]] = {nic: [] for nic in nics}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._follow, args=(nic,), daemon=True, name=f"link-watch-{nic}")
                         for nic in nics]

    def __enter__(self) -> "LinkWatch":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.window_s + 5)

    def _follow(self, nic: tuple[str, str]) -> None:
        host, interface = nic
        agent = self.session.hosts[host]
        try:
            up = not agent.wait_link(interface, up=True, timeout_s=0).timed_out
            while not self._stop.is_set():
                state = agent.wait_link(interface, up=not up, timeout_s=self.window_s)
                if not state.timed_out:
                    up = not up
                    self.changes[nic].append((state.t_ns, up))
        except Exception:  # the watch never disturbs a recovery; a NIC it lost says nothing
            return

    def up_since(self, host: str, interface: str, after_ns: int) -> int | None:
        """When the NIC's carrier last came up after ``after_ns`` (and stayed up), if it did."""
        ups = [t for t, up in self.changes.get((host, interface), []) if up and t > after_ns]
        downs = [t for t, up in self.changes.get((host, interface), []) if not up]
        last_up = max(ups) if ups else None
        return last_up if last_up is not None and not any(d > last_up for d in downs) else None


def _nic_interface(bench, egress: int) -> tuple[str, str] | None:
    owner = bench.nic_on_rx_port(egress)
    return None if owner is None else (owner[0].name, owner[1].interface or owner[1].name)


def controller_overhead(session, fault_ns: int, restart: Restart, before: dict[int, int], after: dict[int, int],
                        links: LinkWatch | None = None) -> Overhead:
    """Measure the controller's overhead from outside it: nothing here reads what the
    controller reports. ``before`` and ``after``: the switch's connections as the harness read
    them before the fault and after the recovery; what they differ by is the final plan.

    Physics of the final plan: its circuits' switching (on an emulated bench each beam's own
    settling time from the world's record; on a real one the switch commands the harness saw
    that made or took away those circuits), their light and lock (the world's record; on a
    real bench, from the command's end to the carrier-up instant the NIC's agent stamped), the
    job's own start-up, from the last rank's process start to every rank ready (the world's
    ready record; on a real bench each rank's own communicator-ready line), and its first
    collective and step once the job is ready and its links are up. The job stalled on links
    not yet up, and everything switched that the final plan does not hold, are overhead."""
    end = restart.first_step_ns
    added = sorted(set(after.items()) - set(before.items()))
    removed = sorted(set(before.items()) - set(after.items()))
    needed = set(added) | set(removed)
    spans: dict[str, list[tuple[int, int]]] = {}
    wasted: dict[str, float] = {}
    world = session.world
    links_up: list[int] = []
    if world is not None:
        basis = "the emulated world's record of its physics"
        made = [c for c in list(world.circuits) if fault_ns <= c.commanded_ns < end]
        final = {}
        for c in made:  # the last making of each pair the final plan holds
            if (c.ingress, c.egress) in needed and c.removed_ns is None:
                final[(c.ingress, c.egress)] = c
        spans["switching"] = [(c.moving_ns or c.commanded_ns, c.lit_ns) for c in final.values()]
        lock = []
        for c in final.values():
            owner = world.bench.nic_on_rx_port(c.egress)
            if owner is not None:
                state, since = world.link_state(owner[0].name, owner[1].name, end)
                if state == "up" and since > c.lit_ns:
                    lock.append((c.lit_ns, since))
                    links_up.append(since)
        spans["light and lock"] = lock
        others = [c for c in made if c not in final.values()]
        wasted["switching"] = sum(c.lit_ns - (c.moving_ns or c.commanded_ns) for c in others) / 1e9
        ready = _world_ready_ns(world, restart, fault_ns, end)
    else:
        basis = ("the switch commands the harness saw, the carrier stamps of the NICs' agents, and the job's own "
                 "communicator-ready lines")
        commands = switch_commands(session, fault_ns, end)
        spans["switching"], spans["light and lock"] = [], []
        wasted["switching"] = 0.0
        for method, start, stop, pairs in commands:
            if method not in ("connect", "disconnect", "replace_all"):
                continue
            if set(pairs) & needed:
                spans["switching"].append((start, stop))
                for pair in set(pairs) & set(added):
                    nic = _nic_interface(session.bench, pair[1])
                    up = links.up_since(*nic, start) if links is not None and nic else None
                    if up is not None and up > stop:
                        spans["light and lock"].append((stop, up))
                        links_up.append(up)
            else:
                wasted["switching"] += (stop - start) / 1e9
        ready = restart.ready_ns
    if ready is None:  # the job says nothing of its start-up: all of it to its first step counts
        spans["job start-up"] = [(restart.restarted_ns, end)]
        basis += "; the job reports no readiness, so its start-up runs to its first step (an upper bound on physics)"
    else:
        spans["job start-up"] = [(restart.restarted_ns, ready)]
        spans["first collective and step"] = [(max([ready, *links_up]), end)]
    every = [span for group in spans.values() for span in group]
    return Overhead((end - fault_ns) / 1e9, _covered_ns(every, fault_ns, end) / 1e9,
                    {k: _covered_ns(v, fault_ns, end) / 1e9 for k, v in spans.items()}, basis, wasted, added, removed)


def _world_ready_ns(world, restart: Restart, fault_ns: int, end_ns: int) -> int | None:
    """Every rank of the restart ready, from the world's record: the instant each rank's job
    process said it had started (after its own start-up), the latest of them. A rank's ready is
    its last before the first step (a process started and stopped again after the fault said
    ready earlier), and it may precede the instant the agent stamped the start: a process forked
    from a warm one, with a start-up shorter than the fork's round trip, is ready before the
    agent's ``popen`` returns."""
    instants = []
    for host in restart.ranks:
        ready = [e.t_ns for e in world.events_of("job.ready", host) if fault_ns <= e.t_ns <= end_ns]
        if not ready:
            return None
        instants.append(max(ready))
    return max(instants)
