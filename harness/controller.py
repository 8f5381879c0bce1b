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

from harness.errors import HarnessError, SafetyError
from harness.interrupts import critical
from harness.progress import PROGRESS
from instruments.protocols import InstrumentError

PHASES = ("detect", "plan", "switch", "light", "link", "retry", "restart", "first_step")
_WATCH_WINDOW_S = 0.25
# Light this far below the receiver's sensitivity is still light (a faded transmitter, a dirty
# connector), not the darkness of a cut fibre or a failed port (meters read 40 dB lower there).
DIM_LIGHT_DB = 20.0
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

    @abc.abstractmethod
    def arm(self) -> None:
        """Start watching for failures of the running job."""

    @abc.abstractmethod
    def recover(self, fault_ns: int | None = None) -> RecoveryResult:
        """Wait for a failure, recover from it, and report. ``fault_ns`` (when the harness made
        the fault) starts the detect phase; without it, detection time is all that is known."""

    def disarm(self) -> None:
        """Stop watching."""


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

    # -- detect ----------------------------------------------------------------------------------

    def arm(self) -> None:
        self._stop.clear()
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

    def _watch(self, target, *args) -> None:
        thread = threading.Thread(target=self._guarded, args=(target, *args), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _guarded(self, target, *args) -> None:
        try:
            target(*args)
        except InstrumentError as exc:  # an agent that dies is itself a failure of that host
            if not self._stop.is_set():
                self._report(Detection("agent_lost", args[1], self.timeline.clock(), detail={"error": str(exc)}))

    def _report(self, detection: Detection) -> None:
        if self._stop.is_set():
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
            self._report(Detection("xid", host, stale["t_ns"], stale["uncertainty_ns"], stale))

    def _watch_xid(self, agent, host: str) -> None:
        while not self._stop.is_set():
            event = agent.wait_xid(_WATCH_WINDOW_S)
            if event is not None and event.get("xid") in _FATAL_XIDS:
                self._report(Detection("xid", host, event["t_ns"], event["uncertainty_ns"], event))
                return

    def _watch_link(self, agent, host: str, interface: str, nic: str) -> None:
        while not self._stop.is_set():
            state = agent.wait_link(interface, up=False, timeout_s=_WATCH_WINDOW_S)
            if not state["timed_out"]:  # detected when the host saw it (since_ns: when it happened)
                self._report(Detection("link_down", host, state["t_ns"], state["uncertainty_ns"], {"nic": nic, **state}))
                return

    def _watch_job(self, agent, host: str) -> None:
        while not self._stop.is_set():
            status = agent.wait_step(10**12, _WATCH_WINDOW_S)
            if not status["running"] and status.get("pid") is not None:
                self._report(Detection("job_exit", host, self.timeline.clock(), 0, {"returncode": status["returncode"],
                                                                "last_lines": status.get("last_lines", [])}))
                return

    def wait_detection(self, timeout_s: float) -> Detection | None:
        """The first failure seen since ``arm`` (None if none within the timeout)."""
        return self._first_detection() if self._found.wait(timeout_s) else None

    def disarm(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=_WATCH_WINDOW_S * 4 + self.session.bench.waits.opc_s)
        self._threads.clear()

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
            if plan.ranks_after == []:
                result.status, result.reason = "degraded", plan.diagnosis
                return result
            try:
                self._apply(result, plan, give_up)
            except RecoveryError as first:
                if plan.fallback is None:
                    raise
                with self._phase(result, "retry"), critical():  # the guess was wrong: put it back, try the other
                    if plan.add:
                        self.session.switch.disconnect(plan.add)
                    if plan.remove:
                        self.session.switch.connect(plan.remove)
                    plan = result.plan = plan.fallback
                    plan.diagnosis += f" (the first guess failed: {first})"
                    self._apply(result, plan, give_up, record=False)
            with self._phase(result, "restart"):
                self._restart(plan.ranks_after)
                result.restarted_ns = self.timeline.clock()
            with self._phase(result, "first_step") as marks:
                lead = self.session.hosts[plan.ranks_after[0]]
                status = lead.wait_step(1, self._left(give_up))
                if not status.get("reached"):
                    raise RecoveryError(f"the job did not complete a step on {plan.ranks_after} "
                                        f"({'timed out' if status.get('timed_out') else 'it exited'}: "
                                        f"{' | '.join(status.get('last_lines', [])[-2:])})")
                result.first_step_ns = status["progress"]["t_ns"]
                result.first_step_uncertainty_ns = lead.clock.uncertainty_ns
                marks["end"] = result.first_step_ns
            self.ranks = plan.ranks_after
            result.status = "recovered"
            result.reason = plan.diagnosis
        except (RecoveryError, SafetyError, InstrumentError) as exc:
            result.status = "degraded" if isinstance(exc, SafetyError) else "failed"
            result.reason = str(exc)
        finally:
            self.disarm()
        return result

    def _restart(self, ranks: list[str]) -> None:
        """The job, stopped everywhere, started again on the new rank map."""
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
        order = {"xid": 0, "link_down": 1, "agent_lost": 2, "job_exit": 3}
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
            return Plan(failed, None, ranks, [], diagnosis=f"{failed} failed ({detection.kind}) and no spare GPU is left: "
                        "the job cannot be recovered on this fabric (degraded)")
        plan = self._replacement(ranks, failed, spare, f"{detection.kind}")
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
        if detection.kind != "link_down":
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
        if self.session.switch.has_power_monitors and sender is not None:
            arriving = self.session.switch.port_power_dbm([feeding])[feeding]
            if arriving < sensitivity:
                return sender[0].name, None
            return detection.host, None  # the light arrives at the switch: the far side failed
        for det in self.bench.detectors_for_port(nic.rx_port):
            reading = self.session.detector_dbm(det)
            received = reading - nic.rx_fibre_loss_db if isinstance(reading, float) else None
            if sender is not None and received is not None and sensitivity - DIM_LIGHT_DB <= received < sensitivity:
                return sender[0].name, None  # light arrives, too weak: the transmitter has faded
        return detection.host, sender[0].name if sender else None

    def _pick_spare(self, ranks: list[str]) -> str | None:
        for host in self.bench.topology.hosts:
            if host.name in ranks or not any(g.role == "spare" for g in host.gpus):
                continue
            if not self._host_lost(host.name):
                return host.name
        return None

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
        threshold = self.bench.limits.receiver_sensitivity_dbm.value
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
                    raise RecoveryError(f"no light at egress port {egress} ({detector.name} reads {power})")

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
