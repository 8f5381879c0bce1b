"""The reference recovery controller, and the interface a lab's own controller implements.

detect (event-driven: XID events, carrier down, the job exiting) -> plan (a spare from the
topology; circuits to remove and add; protected ports refused) -> switch (waits for completion)
-> light (every new path has light) -> link (every NIC on them reports carrier) -> restart (the
job on the new rank map) -> first step. Each phase is a span on the bench's timeline; every wait
has a deadline from the bench file, so a recovery ends (recovered, degraded or failed), never
hangs.

A bench names the controller under test with ``recovery.controller: module:factory``; the
factory is called as ``factory(session, ranks)`` and returns a :class:`RecoveryController`.
"""

from __future__ import annotations

import abc
import importlib
from contextlib import contextmanager
import threading
import time
from dataclasses import dataclass, field

from lumion_hil.harness.errors import HarnessError, SafetyError
from lumion_hil.harness.interrupts import critical
from lumion_hil.harness.progress import PROGRESS
from lumion_hil.instruments.protocols import InstrumentError

PHASES = ("detect", "plan", "switch", "light", "link", "retry", "restart", "first_step", "replan")
_WATCH_WINDOW_S = 0.25
# Light this far below the receiver's sensitivity is still light (a faded transmitter, a dirty
# connector), not the darkness of a cut fibre or a failed port (meters read 40 dB lower there).
DIM_LIGHT_DB = 20.0
# A transmitter's light this far below what it launches, read at the switch, has faded (well
# above a monitor's repeatability, below the smallest fade that matters on a thin loss budget).
FADE_SEEN_DB = 0.5
# XIDs after which the GPU cannot go on: 79 fell off the bus, 48 double-bit ECC, 74 NVLink error,
# 94/95 contained/uncontained ECC (NVIDIA's XID catalogue). Application XIDs (13, 31, 43) are not.
_FATAL_XIDS = (79, 48, 74, 94, 95)  # how long each watcher's event wait lasts before it checks for disarm


@dataclass
class Detection:
    kind: str  # "xid", "link_down", "job_exit"
    host: str
    t_ns: int  # harness clock
    uncertainty_ns: int = 0
    detail: dict = field(default_factory=dict)


@dataclass
class Plan:
    failed_host: str | None
    spare: str | None
    ranks_before: list[str]
    ranks_after: list[str]
    remove: list[tuple[int, int]] = field(default_factory=list)
    add: list[tuple[int, int]] = field(default_factory=list)
    diagnosis: str = ""
    fallback: "Plan | None" = None  # where the diagnosis was a guess: the other end to try


@dataclass
class RecoveryResult:
    status: str  # "recovered", "degraded", "failed"
    reason: str = ""
    detection: Detection | None = None
    plan: Plan | None = None
    phases: dict[str, tuple[int, int]] = field(default_factory=dict)
    restarted_ns: int | None = None
    first_step_ns: int | None = None
    first_step_uncertainty_ns: int = 0

    def phase_s(self, name: str) -> float | None:
        if name not in self.phases:
            return None
        start, end = self.phases[name]
        return (end - start) / 1e9


class RecoveryError(HarnessError):
    pass


class RecoveryController(abc.ABC):
    """What the recovery suite drives: ``arm`` before the fault, ``recover`` after it."""

    def __init__(self, session, ranks: list[str]):
        self.session = session
        self.ranks = list(ranks)
        # Called with a phase's name and the plan so far as the controller enters the phase: a
        # harness can act mid-recovery (make a second fault, say). A controller that never calls
        # them is still a controller.
        self.phase_listeners: list = []

    @abc.abstractmethod
    def arm(self) -> None:
        """Start watching for failures of the running job."""

    @abc.abstractmethod
    def recover(self, fault_ns: int | None = None) -> RecoveryResult:
        """Wait for a failure, recover from it, and report. ``fault_ns`` (when the harness made
        the fault) starts the detect phase; without it, detection time is all that is known."""

    def disarm(self) -> None:
        """Stop watching."""

    def return_to_service(self, host: str) -> None:
        """The lab repaired ``host``: it may serve as a spare again."""

    def resume(self) -> RecoveryResult:
        """After a repair, bring a degraded job back to full size (default: cannot)."""
        return RecoveryResult("degraded", f"{type(self).__name__} cannot resume a degraded job")


def load_controller(session, ranks: list[str]) -> RecoveryController:
    spec = session.bench.recovery.controller
    module_name, _, factory_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as exc:
        raise RecoveryError(f"recovery.controller {spec!r}: cannot load it: {exc}") from None
    controller = factory(session, ranks, **session.bench.recovery.controller_options)
    if not isinstance(controller, RecoveryController):
        raise RecoveryError(f"recovery.controller {spec!r} did not return a RecoveryController")
    return controller


class ReferenceController(RecoveryController):
    def __init__(self, session, ranks: list[str]):
        super().__init__(session, ranks)
        self.bench = session.bench
        self.timeline = session.timeline
        self._detected: list[Detection] = []
        self._found = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._circuits: dict[int, int] = {}  # the cross-connects the job ran on, read at arm
        self._give_up: float | None = None  # time.monotonic() at which the recovery gives up
        self._stopping: tuple | None = None  # the job being stopped while the fabric is rewired
        # Hosts this controller took out of the job: never a spare again until the lab says they
        # are repaired (return_to_service). A long-lived controller remembers across recoveries.
        self.out_of_service: dict[str, str] = {}
        # Hosts taken out on a guess (nothing showed which end of a link failed) while no spare
        # was left to check it: the other end, tried in their place when the job resumes.
        self.guessed: dict[str, str] = {}
        self._recheck: set[str] = set()  # guessed hosts whose other end was repaired: check them
        self.passed_over: dict[str, str] = {}  # why each candidate spare was not taken, at the last pick

    # -- detect ----------------------------------------------------------------------------------

    def arm(self) -> None:
        # A new stop signal for each arming: watchers of an earlier one finish their current
        # wait on their own (never joined: disarming must not wait out their windows) and can
        # no longer report into this one.
        self._stop = threading.Event()
        self._found.clear()
        self._detected.clear()
        # What the job runs on, read from the switch now: the plan rebuilds these paths wherever a
        # fault later removes or darkens one (a cut made at the switch leaves no trace there).
        self._circuits = dict(self.session.switch.connections())
        connected_rx = set(self._circuits.values())
        for host_name in self.ranks:
            agent = self.session.hosts[host_name]
            self._drain_xids(agent, host_name)
            self._watch(self._watch_xid, agent, host_name)
            self._watch(self._watch_job, agent, host_name)
            for nic in self.bench.host(host_name).nics:
                if nic.rx_port in connected_rx:
                    self._watch(self._watch_link, agent, host_name, nic.interface or nic.name, nic.name)
        watched = [(h, n, det) for h in self.ranks for n in self.bench.host(h).nics if n.rx_port in connected_rx
                   for det in self.bench.detectors_for_port(n.rx_port)[:1]]
        if watched:
            self._watch(self._watch_margin, None, None, watched)

    def _watch(self, target, agent, host: str | None, *args) -> None:
        """Run ``target(stop, agent, host, *args)`` in a thread of its own until it reports."""
        thread = threading.Thread(target=self._guarded, args=(target, self._stop, agent, host, *args), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _guarded(self, target, stop: threading.Event, agent, host: str | None, *args) -> None:
        while not stop.is_set():
            try:
                target(stop, agent, host, *args)
                return
            except InstrumentError as exc:
                if agent is not None and agent.alive:
                    continue  # a slow reply (a loaded host): not a failure; watch on
                if host is not None:  # an agent that is gone is itself a failure of that host
                    self._report(Detection("agent_lost", host, self.timeline.clock(), detail={"error": str(exc)}),
                                 stop)
                return

    def _report(self, detection: Detection, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        if stop.is_set() or stop is not self._stop:
            return  # after detection, the recovery's own actions (stopping the job) are no news
        self._detected.append(detection)
        self._found.set()

    def _drain_xids(self, agent, host: str) -> None:
        """NVML keeps events until someone waits for them: an XID from before arming (a GPU that
        has since been replaced, say) is history, unless the GPU is lost now."""
        stale = None
        for _ in range(1000):
            event = agent.wait_xid(0)
            if event is None:
                break
            stale = event if event.get("xid") in _FATAL_XIDS else stale
        if stale is not None and self._host_lost(host):
            self._report(Detection("xid", host, stale["t_ns"], stale["uncertainty_ns"], stale), self._stop)

    def _watch_xid(self, stop, agent, host: str) -> None:
        while not stop.is_set():
            event = agent.wait_xid(_WATCH_WINDOW_S)
            if event is not None and event.get("xid") in _FATAL_XIDS:
                self._report(Detection("xid", host, event["t_ns"], event["uncertainty_ns"], event), stop)
                return

    def _watch_link(self, stop, agent, host: str, interface: str, nic: str) -> None:
        while not stop.is_set():
            state = agent.wait_link(interface, up=False, timeout_s=_WATCH_WINDOW_S)
            if not state["timed_out"]:  # detected when the host saw it (since_ns: when it happened)
                self._report(Detection("link_down", host, state["t_ns"], state["uncertainty_ns"], {"nic": nic, **state}),
                             stop)
                return

    def _watch_job(self, stop, agent, host: str) -> None:
        while not stop.is_set():
            status = agent.wait_step(10**12, _WATCH_WINDOW_S)
            if not status["running"] and status.get("pid") is not None:
                self._report(Detection("job_exit", host, self.timeline.clock(), 0, {"returncode": status["returncode"],
                                                                "last_lines": status.get("last_lines", [])}), stop)
                return

    def _watch_margin(self, stop, _agent, _host, watched: list) -> None:
        """Light fading on a circuit the job runs on (a transmitter degrading, a connector getting
        dirty): below sensitivity + margin it is a failure to act on before the link drops."""
        floor = self.bench.limits.light_floor_dbm
        every = max(0.005, _WATCH_WINDOW_S * self.bench.time_scale)
        while not stop.is_set():
            for host, nic, det in watched:
                reading = self.session.detector_dbm(det)
                received = reading - nic.rx_fibre_loss_db if isinstance(reading, float) else None
                if received is not None and received < floor:
                    self._report(Detection("margin_low", host, self.timeline.clock(), 0,
                                           {"nic": nic.name, "received_dbm": round(received, 2), "floor_dbm": floor}),
                                 stop)
                    return
            stop.wait(every)  # a meter has no event to wait on: sample it

    def wait_detection(self, timeout_s: float) -> Detection | None:
        """The first failure seen since ``arm`` (None if none within the timeout)."""
        return self._first_detection() if self._found.wait(timeout_s) else None

    def disarm(self) -> None:
        """Stop watching. The watchers end after their current wait (at most a watch window);
        nothing waits for them here."""
        self._stop.set()
        self._threads = [t for t in self._threads if t.is_alive()]

    # -- recover ---------------------------------------------------------------------------------

    def recover(self, fault_ns: int | None = None) -> RecoveryResult:
        deadlines = self.bench.waits
        result = RecoveryResult("failed")
        give_up = self._give_up = time.monotonic() + deadlines.recovery_s
        try:
            with self._phase(result, "detect", fault_ns) as marks:
                if not self._found.wait(deadlines.recovery_s):
                    result.reason = f"no failure detected within {self._deadline('recovery_s')}"
                    return result
                result.detection = self._first_detection()
                marks["end"] = result.detection.t_ns
            self._stop.set()  # watchers end on their own; joining them here would delay recovery
            with self._phase(result, "plan"):
                plan = self.plan(result.detection)
                result.plan = plan
            if plan.ranks_after and (plan.add or plan.remove):
                self._stop_job_meanwhile()
            self._carry_out(result, plan, give_up)
        except (RecoveryError, SafetyError, InstrumentError) as exc:
            result.status = "degraded" if isinstance(exc, SafetyError) else "failed"
            result.reason = str(exc)
        finally:
            self.disarm()
        return result

    def _carry_out(self, result: RecoveryResult, plan: Plan, give_up: float) -> None:
        """Switch the plan in, restart, first step; a host of the new rank map lost meanwhile (the
        spare failed as it was switched in, another rank failed during the recovery) is
        replaced too. Ends ``result``: recovered on ``result.plan``, or degraded (no spare)."""
        if plan.ranks_after == []:
            result.status, result.reason = "degraded", plan.diagnosis
            return
        for attempt in range(len(self.bench.topology.hosts)):
            try:
                self._switch_in(result, plan, give_up, first=attempt == 0)
                self.ranks = result.plan.ranks_after
                result.status, result.reason = "recovered", result.plan.diagnosis
                return
            except RecoveryError as exc:
                plan = result.plan  # the fallback, where the first guess was wrong
                lost = [h for h in plan.ranks_after if self._host_lost(h)]
                if not lost:
                    raise
                wired = plan.ranks_after  # what the switch now carries
                with self._phase(result, "replan"):
                    plan = result.plan = self._replan(plan, lost, str(exc))
                if plan.ranks_after == []:
                    self.ranks = list(wired)  # a later resume starts from the circuits in place
                    result.status, result.reason = "degraded", plan.diagnosis
                    return
        raise RecoveryError(f"gave up after replacing {len(self.bench.topology.hosts)} hosts")

    def resume(self) -> RecoveryResult:
        """Back to full size after a repair: each rank still out of service (or lost) is replaced
        by a spare, then the job restarts on the new map."""
        result = RecoveryResult("failed")
        give_up = self._give_up = time.monotonic() + self.bench.waits.recovery_s
        try:
            with self._phase(result, "plan"):
                self._circuits = dict(self.session.switch.connections())
                for host in sorted(self._recheck & set(self.ranks)):
                    if self._links_work(host):  # the guess was wrong: the repair mended the link
                        self.out_of_service.pop(host, None)
                self._recheck.clear()
                bad = [h for h in self.ranks if h in self.out_of_service or self._host_lost(h)]
                plan = Plan(None, None, list(self.ranks), list(self.ranks), diagnosis="resumed at full size")
                fallback = self._other_end_instead(bad)
                if bad:
                    plan = self._replan(plan, bad, "out of service")
                if fallback is not None:  # taken out on a guess: back in service if the other end is
                    plan.failed_host, plan.fallback = bad[0], fallback
                result.plan = plan
            self._carry_out(result, plan, give_up)
        except (RecoveryError, SafetyError, InstrumentError) as exc:
            result.status = "degraded" if isinstance(exc, SafetyError) else "failed"
            result.reason = str(exc)
        return result

    def _other_end_instead(self, bad: list[str]) -> Plan | None:
        """Where the one host to replace was taken out on a guess: the plan that replaces the
        other end of its link instead (tried if the guess proves wrong)."""
        other = self.guessed.pop(bad[0], None) if len(bad) == 1 else None
        if other is None or other not in self.ranks or self._host_lost(bad[0]):
            return None
        spare = self._pick_spare(self.ranks)
        if spare is None:
            return None
        return self._replacement(list(self.ranks), other, spare, f"a dark link, the other end from {bad[0]}")

    def _switch_in(self, result: RecoveryResult, plan: Plan, give_up: float, first: bool) -> None:
        """Rewire (trying the other end where the diagnosis was a guess), restart, first step.
        ``result.plan`` is the plan carried out."""
        result.plan = plan
        try:
            self._apply(result, plan, give_up)
        except RecoveryError as failed:
            if plan.fallback is None or not first:
                raise
            with self._phase(result, "retry"), critical():  # the guess was wrong: put it back, try the other
                if plan.add:
                    self.session.switch.disconnect(plan.add)
                if plan.remove:
                    self.session.switch.connect(plan.remove)
                fallback = plan.fallback
                fallback.diagnosis += f" (the first guess failed: {failed})"
                self.out_of_service[fallback.failed_host] = self.out_of_service.pop(plan.failed_host, "diagnosed")
                plan = result.plan = fallback
                self._apply(result, plan, give_up, record=False)
        with self._phase(result, "restart"):
            self._restart(plan.ranks_after)
            result.restarted_ns = self.timeline.clock()
        with self._phase(result, "first_step") as marks:
            lead = self.session.hosts[plan.ranks_after[0]]
            status = self._wait_first_step(plan.ranks_after, self._left(give_up))
            result.first_step_ns = status["progress"]["t_ns"]
            result.first_step_uncertainty_ns = lead.clock.uncertainty_ns
            marks["end"] = result.first_step_ns

    def _wait_first_step(self, ranks: list[str], timeout_s: float) -> dict:
        """The lead rank's first step; a rank whose process exits first (its GPU lost as the job
        started, say) ends the wait at once instead of at the deadline."""
        done = threading.Event()
        outcome: dict = {}

        def lead() -> None:
            status = self.session.hosts[ranks[0]].wait_step(1, timeout_s)
            outcome.setdefault("lead", status)
            done.set()

        def follower(host: str) -> None:
            until = time.monotonic() + timeout_s
            while not done.is_set() and time.monotonic() < until:
                status = self.session.hosts[host].wait_step(10**12, min(_WATCH_WINDOW_S, until - time.monotonic()))
                if not status.get("running") and status.get("pid") is not None:
                    outcome.setdefault("exited", (host, status))
                    done.set()
                    return

        threads = [threading.Thread(target=lead, daemon=True)]
        threads += [threading.Thread(target=follower, args=(h,), daemon=True) for h in ranks[1:]]
        for t in threads:
            t.start()
        done.wait(timeout_s + self.bench.waits.opc_s)
        if "lead" in outcome and outcome["lead"].get("reached"):
            return outcome["lead"]
        if "exited" in outcome:
            host, status = outcome["exited"]
            raise RecoveryError(f"the job exited on {host} before its first step on {ranks}: "
                                f"{' | '.join(status.get('last_lines', [])[-2:])}")
        status = outcome.get("lead", {})
        raise RecoveryError(f"the job did not complete a step on {ranks} "
                            f"({'timed out' if status.get('timed_out', True) else 'it exited'}: "
                            f"{' | '.join(status.get('last_lines', [])[-2:])})")

    def _replan(self, plan: Plan, lost: list[str], why: str) -> Plan:
        """Replace hosts of ``plan``'s new rank map that were lost, from the circuits now in place."""
        self._circuits = dict(self.session.switch.connections())
        ranks, diagnosis, remove, add = list(plan.ranks_after), plan.diagnosis, [], []
        for host in lost:
            self.out_of_service[host] = f"lost during a recovery ({why})"
            spare = self._pick_spare(ranks)
            if spare is None:
                return Plan(host, None, plan.ranks_before, [], diagnosis=f"{diagnosis}; then {host} was lost too "
                            f"({why}) and {self._no_spare()}: degraded")
            step = self._replacement(ranks, host, spare, "it was lost during the recovery")
            ranks, diagnosis = step.ranks_after, f"{diagnosis}; then {step.diagnosis}"
            remove += step.remove
            add += step.add
            self._circuits = {**{i: e for i, e in self._circuits.items() if (i, e) not in step.remove},
                              **dict(step.add)}
        spares = [h for h in ranks if h not in plan.ranks_after]
        return Plan(plan.failed_host, spares[-1] if spares else plan.spare, plan.ranks_before, ranks, remove, add,
                    diagnosis=diagnosis)

    def _stop_job_meanwhile(self) -> None:
        """The job is broken once a failure is detected: stop it on every host while the fabric
        is rewired (off the critical path); the restart waits for it before starting again."""
        done: dict = {}

        def stop() -> None:
            try:
                self.session.stop_job()
            except Exception as exc:  # raised by the restart, which needs it stopped
                done["error"] = exc

        thread = threading.Thread(target=stop, daemon=True, name="stop-job")
        thread.start()
        self._stopping = (thread, done)

    def _restart(self, ranks: list[str]) -> None:
        """The job, stopped everywhere, started again on the new rank map."""
        stopping, self._stopping = self._stopping, None
        if stopping is not None:
            thread, done = stopping
            thread.join()
            if "error" in done:
                raise done["error"]
        else:
            self.session.stop_job()
        self.session.start_job(ranks)

    def _apply(self, result: RecoveryResult, plan: Plan, give_up: float, record: bool = True) -> None:
        """Rewire, then check light and carrier on the new paths."""
        deadlines = self.bench.waits
        phase = self._phase if record else self._no_phase
        with phase(result, "switch"), critical():  # never half rewired
            if plan.remove:
                self.session.switch.disconnect(plan.remove)
            if plan.add:
                self.session.switch.connect(plan.add)
        with phase(result, "light"):
            self._verify_light(plan.add, min(deadlines.light_s, self._left(give_up)))
        with phase(result, "link"):
            self._wait_links(plan.add, min(deadlines.link_up_s, self._left(give_up)))

    @contextmanager
    def _no_phase(self, result, name):
        yield {}

    def _first_detection(self) -> Detection:
        # Several watchers may fire for one fault (an XID and then the job's exit): the most
        # telling one that came first is what happened.
        order = {"xid": 0, "link_down": 1, "margin_low": 2, "agent_lost": 3, "job_exit": 4}
        return min(self._detected, key=lambda d: (d.t_ns, order.get(d.kind, 9)))

    def _deadline(self, name: str) -> str:
        """A deadline as waited, and where it came from."""
        waited, written, scale = getattr(self.bench.waits, name), getattr(self.bench.deadlines, name), self.bench.time_scale
        how = "" if scale == 1.0 else f" x time scale {scale:g} + {self.bench.deadlines.io_allowance_s:g} s I/O allowance"
        return f"{waited:.3g} s (deadlines.{name} {written:g} s{how})"

    def _left(self, give_up: float) -> float:
        left = give_up - time.monotonic()
        if left <= 0:
            raise RecoveryError(f"the recovery deadline passed: {self._deadline('recovery_s')}")
        return left

    @contextmanager
    def _phase(self, result: RecoveryResult, name: str, start_ns: int | None = None):
        """A recovery phase: its interval goes on the result and, as a span, on the timeline.
        The body may set ``marks["end"]`` when the phase truly ended earlier than now (the
        instant a host reported, say)."""
        marks = {"start": start_ns if start_ns is not None else self.timeline.clock()}
        error = None
        for listener in list(self.phase_listeners):
            listener(name, result.plan)
        try:
            with PROGRESS.doing(f"recovery phase {name}", self._give_up):
                yield marks
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            end = marks.get("end") or self.timeline.clock()
            result.phases[name] = (marks["start"], end)
            self.timeline.add_span(f"recovery.{name}", marks["start"], end, error=error)

    # -- plan ------------------------------------------------------------------------------------

    def plan(self, detection: Detection) -> Plan:
        ranks = list(self.ranks)
        if detection.kind == "job_exit" and not self._host_lost(detection.host):
            return Plan(None, None, ranks, ranks, diagnosis=f"the job exited on {detection.host} "
                        f"(return code {detection.detail.get('returncode')}); its GPU and links are healthy: restart in place")
        failed, other_end = self._diagnose(detection)
        spare = self._pick_spare(ranks)
        if spare is None:
            self.out_of_service[failed] = f"{detection.kind} on {detection.host}"
            guess = ""
            if other_end is not None and other_end in ranks:
                self.guessed[failed] = other_end
                guess = f" (a guess: nothing shows whether {failed} or {other_end} failed)"
            return Plan(failed, None, ranks, [], diagnosis=f"{failed} failed ({detection.kind}){guess} and "
                        f"{self._no_spare()}: the job cannot be recovered on this fabric (degraded)")
        plan = self._replacement(ranks, failed, spare, f"{detection.kind}")
        self.out_of_service[failed] = f"{detection.kind} on {detection.host}"
        if other_end is not None and other_end in ranks:
            plan.diagnosis += "; the receiving end was assumed (nothing shows which end of the link failed)"
            plan.fallback = self._replacement(ranks, other_end, spare, f"{detection.kind}, the sending end")
        return plan

    def _replacement(self, ranks: list[str], failed: str, spare: str, why: str) -> Plan:
        remove, add = self._rewire(failed, spare)
        protected = set(self.bench.safety.protected_ports)
        touched = sorted({p for pair in remove + add for p in pair} & protected)
        if touched:
            raise SafetyError(f"replacing {failed} by {spare} needs protected port(s) {touched}; refused "
                              "(protected ports are never switched): degraded")
        after = [spare if h == failed else h for h in ranks]
        return Plan(failed, spare, ranks, after, remove, add, diagnosis=f"{failed} replaced by spare {spare} after {why}")

    def _host_lost(self, host: str) -> bool:
        """A GPU of the host reports lost, or its agent is gone. A host whose agent cannot read
        NVML is not known to be lost (it may still be a spare)."""
        try:
            return any(gpu.get("lost") for gpu in self.session.hosts[host].health())
        except InstrumentError as exc:
            return "the agent is not running" in str(exc)

    def _diagnose(self, detection: Detection) -> tuple[str, str | None]:
        """The host that failed, and (where that is a guess) the host at the other end."""
        if detection.kind not in ("link_down", "margin_low"):
            return detection.host, None
        # Which end of the dark link failed: a port the switch reports failed, else the light
        # arriving at the ingress (a dim transmitter), else the receiving end.
        nic = next(n for n in self.bench.host(detection.host).nics if n.name == detection.detail["nic"])
        live = self.session.switch.connections()
        feeding = next((i for i, e in live.items() if e == nic.rx_port), None)
        if feeding is None:
            # The circuit is gone from the switch (cut there): both ends may be healthy, and the
            # receiving end is replaced, as for a fibre cut on its side.
            return detection.host, None
        sender = self.bench.nic_on_tx_port(feeding)
        try:
            states = self.session.switch.port_states([feeding, nic.rx_port])
            if states[feeding].value != "E" and sender is not None:
                return sender[0].name, None
            if states[nic.rx_port].value != "E":
                return detection.host, None
        except (InstrumentError, AttributeError):
            pass
        sensitivity = self.bench.limits.receiver_sensitivity_dbm.value
        margin = self.bench.limits.link_margin_db.value
        if self.session.switch.has_power_monitors and sender is not None:
            read = self.session.switch.port_power_dbm([feeding, nic.rx_port])
            arriving, leaving = read[feeding], read[nic.rx_port]
            if arriving < sensitivity:
                return sender[0].name, None  # no usable light reaches the switch: the sender failed
            # How much light the sender's side lost before the switch, and whether that explains
            # the receiver's shortfall (with its full light, the receiver would be above the floor).
            short = sender[1].launch_dbm - sender[1].tx_fibre_loss_db - arriving
            received = leaving - nic.rx_fibre_loss_db
            if short > margin or (short >= FADE_SEEN_DB and received + short >= self.bench.limits.light_floor_dbm):
                return sender[0].name, None  # the light is already short at the switch: it faded
            return detection.host, None  # the light arrives at the switch: the far side failed
        for det in self.bench.detectors_for_port(nic.rx_port):
            reading = self.session.detector_dbm(det)
            received = reading - nic.rx_fibre_loss_db if isinstance(reading, float) else None
            if sender is not None and received is not None and sensitivity - DIM_LIGHT_DB <= received < sensitivity:
                return sender[0].name, None  # light arrives, too weak: the transmitter has faded
        return detection.host, sender[0].name if sender else None

    def _pick_spare(self, ranks: list[str]) -> str | None:
        """A host that can take a rank: a spare (or a former rank the lab repaired) outside the
        job, healthy, in service, and reachable without switching a protected port."""
        original = set(self.bench.job.ranks) if self.bench.job else set()
        protected = set(self.bench.safety.protected_ports)
        self.passed_over = {}
        for host in self.bench.topology.hosts:
            if host.name in ranks or not (any(g.role == "spare" for g in host.gpus) or host.name in original):
                continue
            behind = sorted({p for n in host.nics for p in (n.tx_port, n.rx_port)} & protected)
            if host.name in self.out_of_service:
                self.passed_over[host.name] = f"out of service: {self.out_of_service[host.name]}"
            elif behind:
                self.passed_over[host.name] = f"behind protected port(s) {behind}, never switched"
            elif self._host_lost(host.name):
                self.passed_over[host.name] = "its GPU is lost"
            else:
                return host.name
        return None

    def _no_spare(self) -> str:
        why = "; ".join(f"{h} {reason}" for h, reason in self.passed_over.items())
        return f"no spare GPU is left{f' ({why})' if why else ''}"

    def return_to_service(self, host: str) -> None:
        self.out_of_service.pop(host, None)
        self.guessed.pop(host, None)
        for guess, other in list(self.guessed.items()):
            if other == host:  # the other end of a guess repaired: the guessed host may be healthy
                del self.guessed[guess]
                self._recheck.add(guess)

    def _links_work(self, host: str) -> bool:
        """Light and carrier on every circuit to and from ``host`` (as read from the switch at resume)."""
        nics = self.bench.host(host).nics
        circuits = [(i, e) for i, e in self._circuits.items() if any(i == n.tx_port or e == n.rx_port for n in nics)]
        try:
            self._verify_light(circuits, min(self.bench.waits.light_s, self._left(self._give_up)))
            self._wait_links(circuits, min(self.bench.waits.link_up_s, self._left(self._give_up)))
        except RecoveryError:
            return False
        return bool(circuits)

    def _rewire(self, failed: str, spare: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        f_nics, s_nics = self.bench.host(failed).nics, self.bench.host(spare).nics
        tx_map = {f.tx_port: s.tx_port for f, s in zip(f_nics, s_nics)}
        rx_map = {f.rx_port: s.rx_port for f, s in zip(f_nics, s_nics)}
        spare_ports = {p for n in s_nics for p in (n.tx_port, n.rx_port)}
        live = self.session.switch.connections()
        intended = self._circuits or live
        remove, add = [], []
        for ingress, egress in sorted(intended.items()):
            if ingress in tx_map or egress in rx_map:
                if live.get(ingress) == egress:
                    remove.append((ingress, egress))
                add.append((tx_map.get(ingress, ingress), rx_map.get(egress, egress)))
        freed = {p for pair in add for p in pair} | spare_ports
        for ingress, egress in sorted(live.items()):  # whatever holds a port the new paths need
            if (ingress in freed or egress in freed) and (ingress, egress) not in remove:
                remove.append((ingress, egress))
        return remove, add

    # -- verify ----------------------------------------------------------------------------------

    def _verify_light(self, circuits: list[tuple[int, int]], deadline_s: float) -> None:
        """Every new path carries light above the receiver's sensitivity plus the link margin."""
        threshold = self.bench.limits.light_floor_dbm
        end = time.monotonic() + deadline_s
        for _, egress in circuits:
            detector = next(iter(self.bench.detectors_for_port(egress)), None)
            if detector is None:
                continue  # no detector on this path: the link check below still covers it
            while True:
                power = self.session.detector_dbm(detector)
                nic = self.bench.nic_on_rx_port(egress)
                received = power - (nic[1].rx_fibre_loss_db if nic else 0.0) if isinstance(power, float) else None
                if received is not None and received >= threshold:
                    break
                if time.monotonic() > end:
                    raise RecoveryError(f"no light above {threshold:g} dBm (sensitivity + margin) at egress port "
                                        f"{egress} ({detector.name} reads {power})")

    def _wait_links(self, circuits: list[tuple[int, int]], deadline_s: float) -> None:
        waits = []
        for _, egress in circuits:
            owner = self.bench.nic_on_rx_port(egress)
            if owner is not None:
                host, nic = owner
                waits.append((host.name, nic.interface or nic.name))
        results: dict = {}

        def wait(host: str, interface: str) -> None:
            try:
                results[(host, interface)] = self.session.hosts[host].wait_link(interface, up=True, timeout_s=deadline_s)
            except InstrumentError as exc:
                results[(host, interface)] = {"timed_out": True, "error": str(exc)}

        threads = [threading.Thread(target=wait, args=w) for w in waits]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        down = [f"{h}.{i}" for (h, i), r in results.items() if r.get("timed_out")]
        if down:
            raise RecoveryError(f"link(s) {down} did not come up within {deadline_s:g} s")
