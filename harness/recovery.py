"""What the recovery suite needs beside the controller: a light probe (the light at the ports a
recovery lights, sampled for the plot), the comparison with the emulated world's ground truth
(the controller's overhead per phase), and the migration baseline (recovery without a fabric)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lumion_hil.harness.recovery_model import PHASES, RecoveryResult
from lumion_hil.instruments.threads import at_once
from lumion_hil.instruments.backend import FaultKind


class LightProbe:
    """Samples the power at some detectors in the background while a recovery runs, through
    instrument sessions of its own: it never queues behind the controller's commands (on a paced
    real switch that would delay what is being timed). An instrument that will not open a
    second session is left out, and said so in ``skipped``."""

    def __init__(self, session, detectors, interval_s: float = 0.002):
        from lumion_hil.harness.binding import open_driver

        self.session, self.interval_s = session, interval_s
        self.drivers: dict[str, Any] = {}  # switches and meters, as open_driver opens them
        self.skipped: dict[str, str] = {}
        for det in detectors:
            if det.instrument in self.drivers or det.instrument in self.skipped:
                continue
            spec = session.bench.instruments[det.instrument]
            try:
                self.drivers[det.instrument] = open_driver(f"{det.instrument}-probe", spec,
                                                           session.resources[det.instrument])
            except Exception as exc:  # the probe never stops a recovery
                self.skipped[det.instrument] = f"cannot open a second session: {exc}"
        self.detectors = [d for d in detectors if d.instrument in self.drivers]
        self.samples: dict[str, list[tuple[int, float | None]]] = {d.name: [] for d in self.detectors}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="light-probe")

    def __enter__(self) -> "LightProbe":
        if self.detectors:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for driver in self.drivers.values():
            try:
                driver.close()
            except Exception:
                pass

    def _read(self, det) -> float | None:
        driver = self.drivers[det.instrument]
        if det.channel is None:  # a switch's own monitor
            value = driver.port_power_dbm([det.port])[det.port]
        else:
            value = driver.read_dbm(det.channel)
        return value + det.tap_loss_db if isinstance(value, float) else None

    def _run(self) -> None:
        while not self._stop.is_set():
            for det in self.detectors:
                try:
                    value = self._read(det)
                except Exception:  # the probe never disturbs a recovery
                    value = None
                self.samples[det.name].append((time.perf_counter_ns(), value))
            self._stop.wait(self.interval_s)


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
        return [e for e in world.events_of("job.step", lead) if e.t_ns > (restarted_ns or fault_ns)
                and e.detail.get("step") == 1]

    # The emulated job tells the world of a step just after it prints it (so the world's
    # bookkeeping never delays what the host sees): a step the harness saw may reach the world
    # a moment later. Wait for it, woken by each world event, at most a second.
    steps, until = first_steps(), time.monotonic() + 1.0
    seen = restart.first_step_ns if restart else result.first_step_ns
    while not steps and seen is not None and time.monotonic() < until:
        world.wait_for_change(until - time.monotonic())
        steps = first_steps()
    truth = RecoveryTruth(fault_ns, steps[0].t_ns if steps else None)
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


class NotRestarted(AssertionError):
    """The job was not restarted as the harness sees it: a rank missing, or a stale one."""


@dataclass
class Restart:
    """The job after a recovery as the agents report it, never the controller's word for it."""

    ranks: list[str]  # the rank map: the host that runs each rank, rank 0 first
    started_ns: dict[str, int]  # when each of those hosts started its rank's process
    restarted_ns: int  # when the last of them started
    first_step_ns: int  # rank 0's first step after that
    ready_ns: int | None = None  # every rank's communicator ready (its own line, as its agent saw it); None: not said
    running_ns: int | None = None  # every rank's communicator ready and first collective done: the job runs again
    running_from: str = ""  # what ``running_ns`` was read from

    @property
    def lead(self) -> str:
        return self.ranks[0]


def rank_map(session, fault_ns: int, world_size: int | None = None) -> tuple[list[str], dict[str, int]]:
    """The job's rank map as the agents report it: ask every host which rank of the job it runs
    and when it started it. Every rank of the job (``world_size``, by default the bench's job)
    must run on one host, in a process started after the fault. Returns (hosts by rank, when
    each started); a rank no host runs, or one whose process predates the fault, raises
    :class:`NotRestarted`, never passes."""
    world_size = world_size or len(session.bench.job.ranks)
    running: dict[int, list[tuple[str, int | None]]] = {}
    asked = at_once({name: host.job_status for name, host in session.hosts.items()})  # every host at once
    for name, status in asked.items():
        if isinstance(status, Exception):
            raise status
        rank = (status.get("fields") or {}).get("rank")
        if status.get("running") and isinstance(rank, int):
            running.setdefault(rank, []).append((name, status.get("started_ns")))
    missing = [r for r in range(world_size) if r not in running]
    doubled = {r: [h for h, _ in hs] for r, hs in running.items() if len(hs) > 1}
    if missing or doubled:
        seen = {r: [h for h, _ in hs] for r, hs in sorted(running.items())}
        raise NotRestarted(f"the agents report ranks {seen} of a job of {world_size}: "
                           + (f"no host runs rank(s) {missing}" if missing else f"rank(s) run twice: {doubled}"))
    ranks = [running[r][0][0] for r in range(world_size)]
    started = {running[r][0][0]: running[r][0][1] for r in range(world_size)}
    stale = sorted(h for h, t in started.items() if t is None or t <= fault_ns)
    if stale:
        raise NotRestarted(f"no rank process started after the fault on {stale} (rank map from the agents: {ranks})")
    return ranks, {h: t for h, t in started.items() if t is not None}  # every one, as stale is empty


def _every_rank(session, ranks: list[str], event: str) -> int | None:
    """When the last rank of ``ranks`` reported ``event`` (its first of this run, as its agent
    stamped it); None if a rank has not reported it."""
    instants = []
    for host in ranks:
        found = session.hosts[host].wait_job_event(event, 0).get("event")
        if found is None:
            return None
        instants.append(found["t_ns"])
    return max(instants)


def observe_restart(session, fault_ns: int, world_size: int | None = None) -> Restart:
    """The restart as the harness sees it: the rank map from the agents (:func:`rank_map`), rank
    0's first step once the last rank had started, and when the job ran again: every rank's
    communicator ready and first collective done, from the lines each rank printed as its agent
    saw them (a job that reports no collective of its own: rank 0's first step, which needs
    every rank's all-reduce, stands for it)."""
    ranks, started = rank_map(session, fault_ns, world_size)
    restarted_ns = max(started.values())
    firsts = [t for step, t in session.hosts[ranks[0]].job_steps(0) if step == 1 and t > restarted_ns]
    if not firsts:
        raise NotRestarted(f"{ranks[0]} (rank 0) completed no first step after every rank of {ranks} had started")
    first_step_ns = min(firsts)
    # NCCL's Init COMPLETE line, or a job's own communicator_ready (gloo says nothing of its own)
    ready_ns = _every_rank(session, ranks, "nccl_init") or _every_rank(session, ranks, "communicator_ready")
    collective_ns = _every_rank(session, ranks, "collective")
    if collective_ns is not None:
        running_ns = max(collective_ns, ready_ns or collective_ns)
        running_from = "every rank's communicator ready and first collective done (the ranks' own lines)"
    else:
        running_ns, running_from = first_step_ns, "rank 0's first step (the job reports no collective of its own)"
    return Restart(ranks, started, restarted_ns, first_step_ns, ready_ns, min(running_ns, first_step_ns), running_from)


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
            up = agent.wait_link(interface, up=True, timeout_s=0)["timed_out"] is False
            while not self._stop.is_set():
                state = agent.wait_link(interface, up=not up, timeout_s=self.window_s)
                if not state["timed_out"]:
                    up = not up
                    self.changes[nic].append((state["t_ns"], up))
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


def migrate_to_reserved_rack(session, ranks: list[str]) -> dict:
    """Recovery without an optical fabric, on the emulated world: stop the job, claim an idle
    reserved rack, copy the checkpoint to it, and restart there on its electrical network.
    Returns the instants (harness clock) and the job's step time there."""
    from lumion_hil.instruments.gpu_host.jobs import JobControl

    world = session.world
    reserved = [f"reserved-{i}" for i in range(len(ranks))]
    argv = session.backend.reserved_rack_job_argv(session.bench.job, reserved) if world is not None else None
    if argv is None:
        raise ValueError("the migration baseline runs on an emulated bench (a reserved rack is not on a real one)")
    settings = session.bench.recovery.migration
    session.stop_job()
    restored_ns = world.transfer_checkpoint(settings.checkpoint_bytes, settings.network_gbps, settings.scheduling_s)
    control = JobControl("/tmp/lumion-hil-migration", clock_ns=time.perf_counter_ns)
    # The reserved rack has no optical fabric: its servers talk over the electrical network.
    control.start(argv, {"rank": 0}, session.fabric_env(ranks[0], "electrical"))
    try:
        status = control.wait_step(2, session.bench.waits.recovery_s)
        if not status["reached"]:
            raise RuntimeError(f"the job did not step on the reserved rack: {status['last_lines']}")
        steps = control.steps()
        return {"restored_ns": restored_ns, "first_step_ns": steps[0][1], "steps": steps}
    finally:
        control.stop(timeout_s=5)


# The hard faults that need a spare swapped in, in the order a suite tries them.
SWAP_FAULTS = (FaultKind.GPU_FAILURE.value, FaultKind.FIBRE_CUT.value, FaultKind.SWITCH_PORT_FAILURE.value)


def recover_from(controller, make_fault: Callable[[], int], undo: Callable[[], None] | None = None, *,
                 keep_fault: bool = False) -> tuple[int, RecoveryResult]:
    """The one path of every recovery the harness drives: arm the controller, make the fault,
    let it recover, disarm; then ``undo`` (repair the fault) unless ``keep_fault`` (the caller
    measures the bench with the fault in place and repairs it itself). Whatever goes wrong,
    the controller is disarmed and the fault undone. Returns (fault instant, result)."""
    controller.arm()
    try:
        fault_ns = make_fault()
        result = controller.recover(fault_ns)
    except BaseException:
        controller.disarm()
        if undo is not None:
            undo()
        raise
    controller.disarm()
    if undo is not None and not keep_fault:
        undo()
    return fault_ns, result


def recover_once(session, ranks: list[str], kinds: tuple[str, ...] = SWAP_FAULTS):
    """Make the first fault of ``kinds`` this bench can make (each needs a spare swapped in),
    and let the controller under test recover from it. Returns (injector, fault, fault_ns,
    result); the caller repairs the fault (``injector.repair(fault)``) when done with it."""
    from lumion_hil.harness.controller import load_controller
    from lumion_hil.harness.faults import Injector

    injector = Injector(session, seed=session.bench.recovery.fault_seed)
    kind = next((k for k in kinds if injector.supported(k)[0]), None)
    if kind is None:
        raise ValueError(f"bench {session.bench.name!r} can make none of the faults {', '.join(kinds)}")
    controller = load_controller(session, ranks)
    fault = injector.choose(kind, ranks)
    fault_ns, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault),
                                    keep_fault=True)
    return injector, fault, fault_ns, result


# The phases of a job's start after its processes started, each the instant its last rank
# reached it, read from what the job prints (README, "One job interface"); the first event
# named is the job's own, the later ones other jobs' words for the same thing (NCCL's Init
# COMPLETE line). A start goes through them in this order.
JOB_PHASES = (("rendezvous", ("rendezvous",)), ("communicator_ready", ("communicator_ready", "nccl_init")),
              ("checkpoint_loaded", ("checkpoint_loaded",)))
# Said beside them, in no fixed order: when a launcher's workers started (after its rendezvous
# under torchrun, before their own elsewhere).
JOB_EXTRAS = (("workers_started", ("process_started",)),)


@dataclass
class JobPhase:
    name: str
    t_ns: int  # when the last rank of the new rank map reached it (harness clock, as its agent saw it)
    by_rank_ns: dict[str, int]  # host -> when its rank reached it
    detail: dict = field(default_factory=dict)  # rank 0's event (the checkpoint's step, say)
    ordered: bool = True  # one of the phases a start goes through in order (not an extra)


def job_phases(session, restart: Restart) -> list[JobPhase]:
    """The restarted job's own account of its start, rank by rank, from the agents: when each
    host's process of the job was started (the agent starts the job's command: torchrun, say;
    ``processes_started``), then each phase of :data:`JOB_PHASES` the job printed on every
    rank, then rank 0's first step, and the :data:`JOB_EXTRAS` last. A phase not every rank
    printed is left out (a job that prints none gives processes started and first step)."""
    phases = [JobPhase("processes_started", restart.restarted_ns, dict(restart.started_ns))]
    events = {host: session.hosts[host].job_events() for host in restart.ranks}
    for name, names in JOB_PHASES + JOB_EXTRAS:
        by_rank, lead = {}, None
        for host in restart.ranks:
            found = next((e for wanted in names for e in events[host] if e["event"] == wanted), None)
            if found is not None:
                by_rank[host] = found["t_ns"]
                if host == restart.lead:
                    lead = found
        if len(by_rank) == len(restart.ranks):
            phases.append(JobPhase(name, max(by_rank.values()), by_rank,
                                   {k: v for k, v in (lead or {}).items() if k not in ("t_ns", "uncertainty_ns")},
                                   ordered=(name, names) in JOB_PHASES))
    first = JobPhase("first_step", restart.first_step_ns, {restart.lead: restart.first_step_ns})
    return [p for p in phases if p.ordered] + [first] + [p for p in phases if not p.ordered]


def checkpoint_saved_before(session, host: str) -> int | None:
    """The step of the newest checkpoint the job running on ``host`` has said it saved (None:
    none, or a job that says nothing of checkpoints)."""
    saved = session.hosts[host].job_events("checkpoint_saved")
    return max(int(e.get("step", 0)) for e in saved) if saved else None


def job_last_words(session, hosts: list[str], within_s: float) -> dict[str, list[str]]:
    """What the job said on each of ``hosts`` as it failed, once its process there has ended
    (waiting at most ``within_s`` for each, all at once: the framework's own timeouts take
    their time): its error lines where the agent kept some, else its last lines. A host whose
    job still runs at the end says so."""
    words: dict[str, list[str]] = {}

    def listen(host: str) -> None:
        status = session.hosts[host].wait_step(10**12, within_s)
        lines = status.get("error_lines") or status.get("last_lines") or []
        words[host] = (["(still running)"] if status.get("running") else []) + list(lines)

    threads = [threading.Thread(target=listen, args=(h,), daemon=True) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(within_s + session.bench.waits.opc_s)
    return {h: words.get(h, ["(no answer from its agent)"]) for h in hosts}
