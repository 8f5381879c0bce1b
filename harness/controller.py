"""The reference recovery controller, composed of parts a lab can replace one at a time.

detect (event-driven: XID events, carrier down, the job exiting) -> plan (a spare from the
topology; circuits to remove and add; protected ports refused) -> switch (waits for completion)
-> light (every new path has light) -> link (every NIC on them reports carrier) -> restart (the
job on the new rank map) -> first step. Each phase is a span on the bench's timeline; every wait
has a deadline from the bench file, so a recovery ends (recovered, degraded or failed), never
hangs.

The parts (each its own module):

- the recovery model (harness/recovery_model.py): Detection, Plan, RecoveryResult, Phase, and
  the :class:`RecoveryController` interface a lab's controller may implement whole;
- detection (harness/detection.py): the watchers;
- planning (harness/planning.py): diagnosis, the rewiring rule, the checks a plan must pass;
- the spare pool (harness/spares.py): hosts out of service, guesses, the spare policy;
- the phase runner (harness/phases.py): spans, deadline, listeners, progress.

Extension points, as keyword arguments: callables from a lab's own factory, or from the bench
file as ``module:attribute`` strings in ``recovery.controller_options``
(``{spare_policy: mylab.spares:nearest}``)::

    ReferenceController(session, ranks,
                        spare_policy=my_policy,      # (pool, ranks) -> host | None
                        rewiring=my_rule,            # (bench, failed, spare, live, intended) -> (remove, add)
                        plan_checks=[my_check],      # (bench, plan) -> None, raises to refuse
                        switch=my_switch,            # what it switches through (default: the guarded switch)
                        restart=my_restart)          # (session, ranks) -> None: the job started on the new map

Their types: :class:`~lumion_hil.harness.spares.SparePolicy`, :class:`~lumion_hil.harness.planning.Rewiring`
and :class:`~lumion_hil.harness.planning.PlanCheck` (harness/planning.py), :class:`RestartJob`
(here), and for ``phase_listeners``
:class:`~lumion_hil.harness.recovery_model.PhaseListener`.

``phase_listeners`` (called as each phase begins) and the public ``recover``/``resume`` are the
rest of its surface. harness/testing.py builds controllers with named bugs from these alone.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Protocol

from lumion_hil.harness.detection import WATCH_WINDOW_S, Watchers
from lumion_hil.harness.errors import SafetyError
from lumion_hil.harness.interrupts import critical
from lumion_hil.harness.phases import PhaseRunner
from lumion_hil.harness.planning import PlanCheck, Planner, Rewiring
from lumion_hil.harness.plugins import CONTROLLERS, PluginError, load_object
from lumion_hil.harness.recovery_model import (
    PHASES, Detection, Phase, Plan, RecoveryController, RecoveryError, RecoveryResult, Status, load_controller,
)
from lumion_hil.harness.spares import SparePolicy, SparePool
from lumion_hil.instruments.gpu_host.replies import JobStatus, StepWait
from lumion_hil.instruments.threads import WORKERS
from lumion_hil.instruments.protocols import InstrumentError

if TYPE_CHECKING:
    from lumion_hil.harness.session import BenchSession

__all__ = ["PHASES", "Detection", "Phase", "Plan", "RecoveryController", "RecoveryError", "RecoveryResult",
           "ReferenceController", "RestartJob", "Status", "load_controller"]


class RestartJob(Protocol):
    """How the job is started again on the new rank map once the fabric is rewired (the job
    already stopped on every host). The controller calls it positionally, so a lab's restart
    may name its parameters as it likes; it returns once the job is started (the controller
    then waits for its first step), and raises to fail the recovery."""

    def __call__(self, session: BenchSession, ranks: list[str], /) -> None: ...


def _last_words(status: JobStatus | None) -> str:
    """What a job said as it failed (JobStatus.last_words), or that its agent did not answer."""
    return "no answer from its agent" if status is None else " | ".join(status.last_words())


def start_every_rank(session: BenchSession, ranks: list[str]) -> None:
    """The reference restart: every rank of the new map, on every host at once."""
    session.start_job(ranks)


def _named(part, what: str):
    """An extension given by name in a bench file (``module:attribute``) is loaded; a callable
    is taken as it is."""
    if not isinstance(part, str):
        return part
    try:
        return load_object(part, CONTROLLERS, f"recovery.controller_options.{what}")
    except PluginError as exc:
        raise RecoveryError(str(exc)) from None


class ReferenceController(RecoveryController):
    def __init__(self, session, ranks: list[str], *, spare_policy: SparePolicy | None = None,
                 rewiring: Rewiring | None = None, plan_checks: list[PlanCheck] | None = None, switch=None,
                 restart: RestartJob | None = None):
        super().__init__(session, ranks)
        spare_policy, rewiring = _named(spare_policy, "spare_policy"), _named(rewiring, "rewiring")
        plan_checks = None if plan_checks is None else [_named(c, "plan_checks") for c in plan_checks]
        self.bench = session.bench
        self.timeline = session.timeline
        self.switch = switch if switch is not None else session.switch
        self.spares = SparePool(session, spare_policy)
        self.planner = Planner(session, self.spares, self.switch, rewiring, plan_checks)
        self.watchers = Watchers(session)
        self.phases = PhaseRunner(self.bench, self.timeline, self.phase_listeners)
        self._stopping: tuple | None = None  # the job being stopped while the fabric is rewired
        self.restart_job: RestartJob = _named(restart, "restart") or start_every_rank

    # -- detect ----------------------------------------------------------------------------------

    def arm(self) -> None:
        self.watchers.arm(self.ranks, self.planner.read_circuits())

    def wait_detection(self, timeout_s: float) -> Detection | None:
        """The first failure seen since ``arm`` (None if none within the timeout)."""
        return self.watchers.wait(timeout_s)

    def disarm(self) -> None:
        self.watchers.stop()

    # -- recover ---------------------------------------------------------------------------------

    def recover(self, fault_ns: int | None = None) -> RecoveryResult:
        result = RecoveryResult(Status.FAILED)
        self.phases.start()
        try:
            with self.phases.phase(result, Phase.DETECT, fault_ns) as marks:
                detection = self.watchers.wait(self.bench.waits.recovery_s)
                if detection is None:
                    result.reason = f"no failure detected within {self.phases.deadline('recovery_s')}"
                    return result
                result.detection = detection
                marks["end"] = detection.t_ns
            self.watchers.stop()  # watchers end on their own; joining them here would delay recovery
            with self.phases.phase(result, Phase.PLAN):
                plan = self.plan(result.detection)
                result.plan = plan
            if plan.ranks_after and (plan.add or plan.remove):
                self._stop_job_meanwhile()
            self._carry_out(result, plan)
        except (RecoveryError, SafetyError, InstrumentError) as exc:
            result.status = Status.DEGRADED if isinstance(exc, SafetyError) else Status.FAILED
            result.reason = str(exc)
        finally:
            self.disarm()
        return result

    def plan(self, detection: Detection) -> Plan:
        """The plan for ``detection`` on the current rank map (see harness/planning.py)."""
        return self.planner.plan(detection, self.ranks)

    def return_to_service(self, host: str) -> None:
        self.spares.return_to_service(host)

    def resume(self) -> RecoveryResult:
        """Back to full size after a repair: each rank still out of service (or lost) is replaced
        by a spare, then the job restarts on the new map."""
        result = RecoveryResult(Status.FAILED)
        self.phases.start()
        spares = self.spares
        try:
            with self.phases.phase(result, Phase.PLAN):
                self.planner.job_circuits()  # as the job last ran, not as the switch has them now
                for host in sorted(spares.recheck & set(self.ranks)):
                    if self._links_work(host):  # the guess was wrong: the repair mended the link
                        spares.out_of_service.pop(host, None)
                spares.recheck.clear()
                for host, other in sorted(spares.repaired_guesses.items()):
                    if host in self.ranks and other in self.ranks and not self._links_work(host):
                        spares.take_out(other, f"its link to {host} stayed down or dim after {host} was repaired")
                spares.repaired_guesses.clear()
                bad = [h for h in self.ranks if h in spares.out_of_service or spares.lost(h)]
                plan = Plan(None, None, list(self.ranks), list(self.ranks), diagnosis="resumed at full size")
                fallback = self.planner.other_end_instead(self.ranks, bad)
                why = "; ".join(spares.out_of_service.get(h, "its GPU is lost") for h in bad)
                # With no host to replace, still the job's circuits the switch lacks (one cut there
                # stays cut when the host at its end is repaired): made again.
                plan = self.planner.replan(plan, bad, f"out of service: {why}")
                if fallback is not None:  # taken out on a guess: back in service if the other end is
                    plan.failed_host, plan.fallback = bad[0], fallback
                result.plan = plan
            self._carry_out(result, plan)
        except (RecoveryError, SafetyError, InstrumentError) as exc:
            result.status = Status.DEGRADED if isinstance(exc, SafetyError) else Status.FAILED
            result.reason = str(exc)
        return result

    def _carry_out(self, result: RecoveryResult, plan: Plan) -> None:
        """Switch the plan in, restart, first step; a host of the new rank map lost meanwhile (the
        spare failed as it was switched in, another rank failed during the recovery) is
        replaced too. Ends ``result``: recovered on ``result.plan``, or degraded (no spare)."""
        if plan.ranks_after == []:
            result.status, result.reason = Status.DEGRADED, plan.diagnosis
            return
        for attempt in range(len(self.bench.topology.hosts)):
            try:
                self._switch_in(result, plan, first=attempt == 0)
                assert result.plan is not None  # _switch_in sets it first thing
                self.ranks = result.plan.ranks_after
                result.status, result.reason = Status.RECOVERED, result.plan.diagnosis
                return
            except RecoveryError as exc:
                assert result.plan is not None  # _switch_in sets it first thing
                plan = result.plan  # the fallback, where the first guess was wrong
                lost = [h for h in plan.ranks_after if self.spares.lost(h)]
                if not lost:
                    raise
                wired = plan.ranks_after  # what the switch now carries
                with self.phases.phase(result, Phase.REPLAN):
                    plan = result.plan = self.planner.replan(plan, lost, str(exc))
                if plan.ranks_after == []:
                    self.ranks = list(wired)  # a later resume starts from the circuits in place
                    result.status, result.reason = Status.DEGRADED, plan.diagnosis
                    return
        raise RecoveryError(f"gave up after replacing {len(self.bench.topology.hosts)} hosts")

    def _switch_in(self, result: RecoveryResult, plan: Plan, first: bool) -> None:
        """Rewire (trying the other end where the diagnosis was a guess), restart, first step.
        ``result.plan`` is the plan carried out."""
        result.plan = plan
        try:
            self._apply(result, plan)
        except RecoveryError as failed:
            if plan.fallback is None or not first:
                raise
            with self.phases.phase(result, Phase.RETRY), critical():  # the guess was wrong: put it back, try the other
                if plan.add:
                    self.switch.disconnect(plan.add)
                if plan.remove:
                    self.switch.connect(plan.remove)
                fallback = plan.fallback
                # a plan with a fallback is a guess between two hosts, each replaced (Planner.plan)
                assert plan.failed_host is not None and fallback.failed_host is not None
                fallback.diagnosis += f" (the first guess failed: {failed})"
                self.spares.take_out(fallback.failed_host, self.spares.out_of_service.pop(plan.failed_host, "diagnosed"))
                plan = result.plan = fallback
                self._apply(result, plan, record=False)
        with self.phases.phase(result, Phase.RESTART):
            restart_from = self.timeline.clock()
            self._restart(plan.ranks_after)
            result.restarted_ns = self.timeline.clock()
        with self.phases.phase(result, Phase.FIRST_STEP) as marks:
            lead = self.session.hosts[plan.ranks_after[0]]
            status = self._wait_first_step(plan.ranks_after, self.phases.left(), restart_from)
            result.first_step_ns = status.progress["t_ns"]
            result.first_step_uncertainty_ns = lead.clock.uncertainty_ns
            marks["end"] = result.first_step_ns

    def _apply(self, result: RecoveryResult, plan: Plan, record: bool = True) -> None:
        """Rewire, then check light and carrier on the new paths."""
        deadlines = self.bench.waits
        with self.phases.phase(result, Phase.SWITCH, record=record), critical():  # never half rewired
            if plan.remove:
                self.switch.disconnect(plan.remove)
            if plan.add:
                self.switch.connect(plan.add)
        with self.phases.phase(result, Phase.LIGHT, record=record):
            self._verify_light(plan.add, self.phases.left(deadlines.light_s))
        with self.phases.phase(result, Phase.LINK, record=record):
            self._wait_links(plan.add, self.phases.left(deadlines.link_up_s))

    # -- the job ---------------------------------------------------------------------------------

    def _stop_job_meanwhile(self) -> None:
        """The job is broken once a failure is detected: stop it on every host while the fabric
        is rewired (off the critical path); the restart waits for it before starting again."""
        done: dict = {}

        def stop() -> None:
            try:
                self.session.stop_job()
            except Exception as exc:  # raised by the restart, which needs it stopped
                done["error"] = exc

        self._stopping = (WORKERS.submit(stop), done)

    def _restart(self, ranks: list[str]) -> None:
        """The job, stopped everywhere, started again on the new rank map."""
        stopping, self._stopping = self._stopping, None
        if stopping is not None:
            stopped, done = stopping
            stopped.result()
            if "error" in done:
                raise done["error"]
        else:
            self.session.stop_job()
        self.restart_job(self.session, ranks)

    def _wait_first_step(self, ranks: list[str], timeout_s: float, since_ns: int | None = None) -> StepWait:
        """The lead rank's first step; a rank whose process started at the restart (after
        ``since_ns``) and exits first (its GPU lost as the job started, say) ends the wait at
        once instead of at the deadline. A host whose process predates the restart was not
        restarted: what the job makes of its missing rank (a rendezvous that times out) decides."""
        done = threading.Event()
        outcome: dict[str, StepWait] = {}
        exited: list[tuple[str, StepWait]] = []

        def lead() -> None:
            status = self.session.hosts[ranks[0]].wait_step(1, timeout_s)
            outcome.setdefault("lead", status)
            done.set()

        def follower(host: str) -> None:
            until = time.monotonic() + timeout_s
            while not done.is_set() and time.monotonic() < until:
                status = self.session.hosts[host].wait_step(10**12, min(WATCH_WINDOW_S, until - time.monotonic()))
                if status.ended:
                    if since_ns is not None and (self.session.hosts[host].job_status().started_ns or 0) < since_ns:
                        return  # not this restart's process
                    exited.append((host, status))
                    done.set()
                    return

        WORKERS.submit(lead)
        for host in ranks[1:]:
            WORKERS.submit(follower, host)
        done.wait(timeout_s + self.bench.waits.opc_s)
        lead_status = outcome.get("lead")
        if lead_status is not None and lead_status.reached:
            return lead_status
        if exited:
            host, status = exited[0]
            raise RecoveryError(f"the job exited on {host} before its first step on {ranks}: {_last_words(status)}")
        timed_out = lead_status is None or lead_status.timed_out
        raise RecoveryError(f"the job did not complete a step on {ranks} "
                            f"({'timed out' if timed_out else 'it exited'}: {_last_words(lead_status)})")

    # -- verify ----------------------------------------------------------------------------------

    def _links_work(self, host: str) -> bool:
        """Light and carrier on every circuit to and from ``host`` the job is meant to run on (one
        cut at the switch has neither)."""
        nics = self.bench.host(host).nics
        circuits = [(i, e) for i, e in self.planner.circuits.items() if any(i == n.tx_port or e == n.rx_port for n in nics)]
        try:
            self._verify_light(circuits, self.phases.left(self.bench.waits.light_s))
            self._wait_links(circuits, self.phases.left(self.bench.waits.link_up_s))
        except RecoveryError:
            return False
        return bool(circuits)

    def _verify_light(self, circuits: list[tuple[int, int]], deadline_s: float) -> None:
        """Every new path carries light above the receiver's sensitivity plus the link margin,
        its detectors read together (the switch's monitors in one query) until each has it."""
        threshold = self.bench.limits.light_floor_dbm
        end = time.monotonic() + deadline_s
        # no detector on a path: the link check that follows still covers it
        waiting = {egress: det for _, egress in circuits
                   if (det := next(iter(self.bench.detectors_for_port(egress)), None)) is not None}
        while waiting:
            readings = self.session.received_dbms(list(waiting.values()))
            waiting = {egress: det for egress, det in waiting.items()
                       if not (isinstance(readings[det.name], float) and readings[det.name] >= threshold)}
            if waiting and time.monotonic() > end:
                egress, det = next(iter(waiting.items()))
                raise RecoveryError(f"no light above {threshold:g} dBm (sensitivity + margin) at egress port "
                                    f"{egress} ({det.name}: {readings[det.name]} at the receiver)")

    def _wait_links(self, circuits: list[tuple[int, int]], deadline_s: float) -> None:
        waits = []
        for _, egress in circuits:
            owner = self.bench.nic_on_rx_port(egress)
            if owner is not None:
                host, nic = owner
                waits.append((host.name, nic.interface or nic.name))
        up: dict[tuple[str, str], bool] = {}

        def wait(host: str, interface: str) -> None:
            try:
                up[(host, interface)] = not self.session.hosts[host].wait_link(interface, up=True,
                                                                               timeout_s=deadline_s).timed_out
            except InstrumentError:  # a host that cannot say is a link not known to be up
                up[(host, interface)] = False

        for waited in [WORKERS.submit(wait, *w) for w in waits]:
            waited.result()
        down = [f"{h}.{i}" for (h, i), is_up in up.items() if not is_up]
        if down:
            raise RecoveryError(f"link(s) {down} did not come up within {deadline_s:g} s")
