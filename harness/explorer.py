"""The explorer: carries out a story's steps on an open bench session through the drivers, the
agents and the controller under test, and judges the promises (harness/promises.py) after every
step. Hypothesis chooses the steps (test_suites/test_failure_sequences.py); :func:`replay` tells
a story read from a file (``lumion-hil replay``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lumion_hil.harness.controller import RecoveryResult, load_controller
from lumion_hil.harness.faults import Fault, FaultNotPossible, Injector
from lumion_hil.harness.measurements import Spec
from lumion_hil.harness.promises import Broken, PromiseChecks
from lumion_hil.harness.recovery import NotRestarted, rank_map, recover_from
from lumion_hil.harness.stories import NIC_KINDS, REPLACING, Step, Story, StoryError
from lumion_hil.instruments import transcript
from lumion_hil.instruments.backend import FaultKind

# How close to a boundary (sensitivity + margin, the sensitivity) a fade may leave a light: six
# standard deviations of its detector's readings. A light that far off is read on the wrong side
# with probability 1e-9 per reading, so neither the controller's watcher nor a promise is decided
# by noise (one reading each, thousands a run); a fade chosen by fade_into lands two guards off,
# so a second reading (the oracle's, before the fade) disagrees with the first by a guard only
# with probability 3e-5. At least 0.05 dB where the noise is (said to be) nothing: readings
# are rounded.
LIGHT_GUARD_SIGMAS = 6.0
LIGHT_GUARD_MIN_DB = 0.05


@dataclass
class _Damage:
    """What the explorer knows has happened: hardware broken and not repaired, fading NICs."""

    faults: dict[str, list[Fault]] = field(default_factory=dict)  # host -> faults made on it
    fading: dict[tuple[str, str], float] = field(default_factory=dict)  # (host, nic) -> dB lost
    # Hosts a controller took out on a guess (nothing showed which end of a link failed): out of
    # the pool until the lab repairs them, as a controller may keep them.
    suspects: set[str] = field(default_factory=set)

    def broken(self, host: str) -> bool:
        return bool(self.faults.get(host))

    def faded(self, host: str) -> bool:
        return any(h == host for h, _ in self.fading)


class Explorer(PromiseChecks):
    """Carries out steps on an open session and judges the promises after each."""

    def __init__(self, session, *, measure: Callable | None = None, record_path: str | Path | None = None,
                 test: str | None = None):
        if session.bench.job is None:
            raise StoryError(f"bench {session.bench.name!r} has no job section: nothing to keep running")
        self.session = session
        self.bench = session.bench
        self.injector = Injector(session, seed=self.bench.recovery.fault_seed)
        self.size = len(self.bench.job.ranks)
        self.protected = set(self.bench.safety.protected_ports)
        self.measure = measure
        self.record_path = Path(record_path) if record_path else None
        self.test = test
        self.measured = 0
        self._record_seen = 0
        self._record_offset = 0
        self.recoveries = 0
        self.steps_taken = 0
        self.paths: dict[str, int] = {}  # the detection and recovery paths the stories took
        self.reset()

    # -- the bench's parts ---------------------------------------------------------------------

    def hosts_named(self) -> set[str]:
        return {h.name for h in self.bench.topology.hosts}

    def nics_of(self, host: str) -> list[str]:
        return [n.name for n in self.bench.host(host).nics]

    def can_make(self, kind: str) -> bool:
        return self.injector.supported(kind)[0]

    def usable_spares(self) -> list[str]:
        """Hosts that could take a rank now: outside the job, a spare (or a repaired former rank),
        nothing broken or faded, not behind a protected port."""
        out = []
        for host in self.bench.topology.hosts:
            if host.name in self.ranks or self.model.broken(host.name) or self.model.faded(host.name) \
                    or host.name in self.model.suspects:
                continue
            if not (any(g.role == "spare" for g in host.gpus) or host.name in self.bench.job.ranks):
                continue
            if {p for n in host.nics for p in (n.tx_port, n.rx_port)} & self.protected:
                continue
            out.append(host.name)
        return out

    # -- a fresh start -------------------------------------------------------------------------

    def reset(self) -> None:
        """Every fault repaired, the baseline restored, the job running on its ranks."""
        self.finish()
        session = self.session
        self.ranks = list(self.bench.job.ranks)
        self.state = "running"
        self.last: RecoveryResult | None = None
        self.controller = load_controller(session, self.ranks)
        session.start_job(self.ranks)
        if not session.hosts[self.ranks[0]].wait_step(1, self.bench.waits.recovery_s).reached:
            raise Broken("the job runs", f"it did not start on {self.ranks} after a reset")

    def finish(self) -> None:
        """Leave the bench as exploration found it: the job stopped, every fault made repaired,
        the baseline restored."""
        model = getattr(self, "model", _Damage())
        repairs: list[Callable[[], object]] = [functools.partial(self.injector.repair, fault)
                                               for faults in model.faults.values() for fault in faults]
        repairs += [functools.partial(self.injector.repair, Fault("transceiver_degradation", host, nic))
                    for host, nic in model.fading]
        if self.session.world is not None:
            repairs.append(self._heal)
        self.session.put_back(*repairs)  # every step, even past one that fails (an agent gone)
        self.model = _Damage()

    def _heal(self) -> None:
        """Emulated: whatever a story broke, heal all of it."""
        world = self.session.world
        world.heal()
        transcript.note("heal")
        # a circuit on a protected port is one a broken controller made (the guard never
        # switches it back): in the emulated world it can be undone
        stray = [(i, e) for i, e in world.connections().items() if {i, e} & self.protected]
        if stray:
            world.disconnect(stray)

    # -- steps -----------------------------------------------------------------------------------

    def missing_parts(self, step: Step) -> str | None:
        """Why this bench cannot tell this step at all (a host or NIC it lacks, a fault it cannot
        make); None when it has what the step names."""
        names = self.hosts_named()
        for s in (step, step.during):
            if s is None:
                continue
            if s.host is not None and s.host not in names:
                return f"bench {self.bench.name!r} has no host {s.host!r}"
            if s.nic is not None:
                assert s.host is not None, "a step that names a NIC names its host"
                if s.nic not in self.nics_of(s.host):
                    return f"host {s.host!r} has no NIC {s.nic!r}"
            if s.kind is not None and not self.can_make(s.kind):
                return f"{s.kind}: {self.injector.supported(s.kind)[1]}"
        if step.action == "degrade" and not self.can_make("transceiver_degradation"):
            return "this bench cannot fade a transmitter"
        return None

    def can_take(self, step: Step) -> str | None:
        """Why this step cannot be told now on this bench (None: it can)."""
        missing = self.missing_parts(step)
        if missing is not None:
            return missing
        if step.action in ("fault", "degrade") and self.state != "running":
            return "the job is degraded: nothing runs to fail"
        if step.action in ("fault", "degrade") and step.host not in self.ranks:
            return f"{step.host} is not in the job ({', '.join(self.ranks)})"
        if step.during is not None and (step.during.host not in self.ranks or step.during.host == step.host):
            return f"{step.during.host} is not another host of the job"
        if step.action == "repair":
            assert step.host is not None, "a repair step names its host"
            if not self.model.broken(step.host) and not self.model.faded(step.host):
                return f"nothing on {step.host} is broken"
        if step.during is not None and step.during.kind not in (FaultKind.GPU_FAILURE, FaultKind.PROCESS_KILL):
            return "a second fault during a recovery is a GPU failure or a killed process"
        if step.spare_fails and step.kind not in REPLACING:
            return f"{step.kind} takes no spare"
        return None

    def apply(self, step: Step) -> str:
        """Carry out one step; returns what happened, in words."""
        why_not = self.can_take(step)
        if why_not is not None:
            raise StoryError(f"cannot {step.describe()}: {why_not}")
        self.steps_taken += 1
        if step.action == "quiet":
            return self._quiet()
        if step.action == "repair":
            assert step.host is not None, "a repair step names its host"
            return self._repair(step.host)
        if step.action == "degrade":
            return self._degrade(step)
        return self._fault(step)

    def _fault_of(self, step: Step) -> Fault:
        assert step.kind is not None and step.host is not None, "a fault step names its kind and host"
        return Fault(step.kind, step.host, step.nic if step.kind in NIC_KINDS else None)

    def _note(self, fault: Fault) -> None:
        if fault.kind in REPLACING:
            self.model.faults.setdefault(fault.host, []).append(fault)

    def _fault(self, step: Step) -> str:
        fault = self._fault_of(step)
        needed = 0 if fault.kind == "process_kill" else 1
        extra: list[Fault] = []
        listeners = self.controller.phase_listeners

        def second(phase: str, plan) -> None:
            if step.during is not None and phase == step.at and not extra:
                extra.append(self._fault_of(step.during))
                self._note(extra[-1])
                self.injector.inject(extra[-1])
            if step.spare_fails and phase == "switch" and plan is not None and plan.spare and not extra:
                extra.append(Fault("gpu_failure", plan.spare))
                self._note(extra[-1])
                self.injector.inject(extra[-1])

        if step.during is not None and step.during.kind in REPLACING:
            needed += 1
        if step.spare_fails:
            needed += 1
        usable = len(self.usable_spares())
        self._note(fault)  # before it is made: a reset repairs it whatever happens next
        listeners.append(second)
        try:
            result = self._recover(lambda: self.injector.inject(fault), step)
        finally:
            listeners.remove(second)
        if step.spare_fails and not extra:
            needed -= 1  # no spare was taken (none was left): none could fail
        if step.spare_fails and extra:
            self._reached("the spare lost on the way in")
        if step.during is not None and extra:
            self._reached(f"a second fault during {step.at}")
        if step.during is not None and not extra and step.during.kind in REPLACING:
            needed -= 1  # the recovery never entered that phase (or the controller does not say its phases)
        expect = "degraded" if needed > usable else "recovered"
        self._judge(result, expect, step)
        return f"{result.status}: {result.reason}"

    def _degrade(self, step: Step) -> str:
        assert step.host is not None and step.nic is not None and step.by_db is not None, \
            "a degrade step names its host, NIC and dB"
        key = (step.host, step.nic)
        total = self.model.fading.get(key, 0.0) + step.by_db
        now = self.light_at_receiver(step.host, step.nic)  # read before the fade: the oracle's measurement
        floor, sensitivity = self.bench.limits.light_floor_dbm, self.bench.limits.receiver_sensitivity_dbm.value
        if now is None:
            nic = next(n for n in self.bench.host(step.host).nics if n.name == step.nic)
            receiver = self.session.switch.connections().get(nic.tx_port)
            if receiver is not None:
                # A receiver no detector sees: what the fade does to its link (margin, or dark) is
                # unknown to the oracle, so no promise could be judged after it: not made.
                return f"not made: no detector sees its receiver at port {receiver}"
        else:
            guard = self.light_guard_db(step.host, step.nic)
            landing = now - step.by_db
            near = [(name, b) for name, b in (("the floor", floor), ("the sensitivity", sensitivity))
                    if abs(landing - b) < guard]
            if near:
                # Which side it lands on would be the readings' noise's to say (the controller's
                # watcher and the promise each read it once): no verdict on it could be trusted.
                name, boundary = near[0]
                return (f"not made: it would leave {landing:.2f} dBm at the receiver, within {guard:.2f} dB of "
                        f"{name} ({boundary:g} dBm), where one reading's noise decides which side it is on")
        self.model.fading[key] = total
        fault = Fault("transceiver_degradation", step.host, step.nic, loss_db=total)
        if now is None or now - step.by_db >= floor:
            self.injector.inject(fault)
            return f"faded to -{total:g} dB, still above the margin" if now is not None else \
                f"faded to -{total:g} dB, into no receiver"
        self._reached("fade into the margin zone" if now - step.by_db >= sensitivity else "fade into the dark")
        usable = len(self.usable_spares())
        self._note(fault)
        result = self._recover(lambda: self.injector.inject(fault), step)
        self._judge(result, "degraded" if usable == 0 else "recovered", step)
        if result.status == "recovered" and step.host in self.ranks:
            # The controller replaced the other end and the job runs on this host, fade and all
            # (the guess stood): no rank to replace any more, but still no spare (model.fading).
            self.model.faults[step.host].remove(fault)
        return f"faded to -{total:g} dB: {result.status}: {result.reason}"

    def _receiver_detector(self, host: str, nic_name: str):
        """The detector that sees the receiver this NIC's transmitter feeds now (None where no
        circuit carries it or no detector sees that receiver)."""
        nic = next(n for n in self.bench.host(host).nics if n.name == nic_name)
        receiver_port = self.session.switch.connections().get(nic.tx_port)
        if receiver_port is None:
            return None
        return next(iter(self.bench.detectors_for_port(receiver_port)), None)

    def light_at_receiver(self, host: str, nic_name: str) -> float | None:
        """The light this NIC's transmitter puts on its receiver now, as the receiver's detector
        reads it (a meter or the switch's monitor): None where no circuit carries it or no
        detector sees that receiver. Never computed from the bench's settings."""
        det = self._receiver_detector(host, nic_name)
        if det is None:
            return None
        reading = self.session.received_dbm(det)
        return reading if isinstance(reading, float) else None

    def light_guard_db(self, host: str, nic_name: str) -> float:
        """How close to a boundary (the floor, the sensitivity) a fade of this NIC may leave its
        light: ``LIGHT_GUARD_SIGMAS`` standard deviations of its receiver's detector's readings
        (``Bench.reading_noise_db``), and never under ``LIGHT_GUARD_MIN_DB``."""
        det = self._receiver_detector(host, nic_name)
        sigma = self.bench.reading_noise_db(det) if det is not None else 0.0
        return max(LIGHT_GUARD_MIN_DB, LIGHT_GUARD_SIGMAS * sigma)

    def fade_into(self, host: str, nic_name: str, zone: str) -> float:
        """The fade (dB, a multiple of 0.1) that takes this NIC's light, as its receiver's
        detector reads it now, into ``zone``: "above" the margin, the "margin" zone (below
        sensitivity + margin, above sensitivity: the margin watcher's to catch before the link
        drops), or the "dark" below sensitivity. It never leaves the light within two light
        guards of a boundary (:meth:`light_guard_db`): a fade that would (a walk of small fades
        reaching the floor, say) goes on past it. Without a reading: the fixed 2, 4 and 10 dB."""
        now = self.light_at_receiver(host, nic_name)
        if now is None:
            return {"above": 2.0, "margin": 4.0, "dark": 10.0}[zone]
        floor, sensitivity = self.bench.limits.light_floor_dbm, self.bench.limits.receiver_sensitivity_dbm.value
        target = {"above": floor + 1.0, "margin": (floor + sensitivity) / 2, "dark": sensitivity - 3.0}[zone]
        clear = 2 * self.light_guard_db(host, nic_name)

        def tenths(db: float) -> float:  # up to the next 0.1 dB: a fade only ever goes deeper
            return math.ceil(round(db * 10, 6)) / 10

        fade = tenths(max(0.5, now - target))
        for boundary in (floor, sensitivity):  # the floor lies above the sensitivity: crossed first
            if abs(now - fade - boundary) < clear:
                fade = tenths(now - boundary + clear)
        return fade

    def _repair(self, host: str) -> str:
        self.model.suspects.discard(host)
        for fault in self.model.faults.pop(host, []):
            self.injector.repair(fault)
        for key in [k for k in self.model.fading if k[0] == host]:
            del self.model.fading[key]
            self.injector.repair(Fault("transceiver_degradation", *key))
        self.controller.return_to_service(host)
        if self.state != "degraded":
            return "back in the spare pool"
        expect = "recovered" if self._can_be_full() else "degraded"
        started, since_ns = time.monotonic(), self.session.timeline.clock()
        result = self.controller.resume()
        self._took(result, started, Step("repair", host=host))
        self._settle(result, since_ns)
        self._judge(result, expect, Step("repair", host=host))
        return f"resumed: {result.status}: {result.reason}"

    def _can_be_full(self) -> bool:
        bad = [h for h in self.ranks if self.model.broken(h)]
        return len(bad) <= len(self.usable_spares())

    def _quiet(self) -> str:
        if self.state != "running":
            return "still degraded"
        lead = self.session.hosts[self.ranks[0]]
        step = lead.job_status().step
        if not lead.wait_step(step + 1, self.bench.waits.recovery_s).reached:
            raise Broken("the job runs", f"it stopped stepping on {self.ranks}")
        return f"the job stepped on ({step + 1})"

    def _recover(self, make_fault: Callable[[], int], step: Step) -> RecoveryResult:
        self.controller.ranks = list(self.ranks)
        started = time.monotonic()
        try:
            fault_ns, result = recover_from(self.controller, make_fault)
        except FaultNotPossible as exc:
            raise StoryError(str(exc)) from None
        self._took(result, started, step)
        self._settle(result, fault_ns)
        return result

    def _reached(self, path: str) -> None:
        self.paths[path] = self.paths.get(path, 0) + 1
        try:
            from hypothesis import event

            event(f"path: {path}")  # Hypothesis's statistics (pytest --hypothesis-show-statistics)
        except Exception:  # outside a Hypothesis test (a replay): the count is enough
            pass

    def _paths_of(self, result: RecoveryResult, step: Step) -> None:
        if result.detection is not None:
            self._reached(f"detected: {result.detection.kind}")
        if result.plan is not None and result.plan.fallback is not None:
            self._reached("a guess at which end failed")
            if result.status == "recovered" and "retry" not in result.phases and result.plan.failed_host:
                self.model.suspects.add(result.plan.failed_host)  # the guess stood
        if "retry" in result.phases:
            self._reached("a wrong guess, the other end tried")
        if result.status == "degraded":
            self._reached("degraded")
        if step.action == "repair":
            self._reached(f"resume after a repair: {result.status}")

    def _took(self, result: RecoveryResult, started: float, step: Step) -> None:
        took = time.monotonic() - started
        self.recoveries += 1
        self.last = result
        self._paths_of(result, step)
        limit = self.bench.waits.recovery_s
        if self.measure is not None:
            self.measure(Spec("sequence_recovery_time", "s", description="fault (or repair) to the job stepping "
                              "again, or to the controller's verdict, in a failure sequence").at_most(
                limit + 1.0, f"the recovery deadline, {limit:.3g} s, + 1 s to report"), took,
                status=result.status, step=step.describe())
            self.measured += 1
        if took > limit + 1.0:
            raise Broken("each recovery ends within its deadline", f"{step.describe()}: {took:.2f} s, deadline "
                         f"{limit:.3g} s")

    def _settle(self, result: RecoveryResult, since_ns: int) -> None:
        if result.status == "recovered":
            try:  # the rank map as the agents report it, never the controller's plan
                self.ranks = rank_map(self.session, since_ns, self.size)[0]
            except NotRestarted as exc:
                raise Broken("the job runs at full size", f"the controller said recovered, but {exc}") from None
            self.state = "running"
        elif result.status == "degraded":
            self.state = "degraded"
            self.ranks = list(self.controller.ranks)  # as the switch is wired now
        self.controller.ranks = list(self.ranks)

    def _judge(self, result: RecoveryResult, expect: str, step: Step) -> None:
        self._check_safety(self.session.switch.connections())  # a broken safety rule first: it says most
        if result.status == "failed":
            raise Broken("a recovery succeeds or says degraded", f"{step.describe()}: failed: {result.reason}")
        if result.status != expect:
            left = ", ".join(self.usable_spares()) or "none"
            raise Broken("degraded exactly when no spare is left",
                         f"{step.describe()}: {result.status} ({result.reason}); expected {expect} "
                         f"(usable spares now: {left})")


def replay(story: Story, session, *, log: Callable[[str], None] = print, measure: Callable | None = None) -> bool:
    """Tell a story on an open bench session, step by step, judging every promise after each.
    Returns True when every promise held; a step the bench cannot take is a StoryError."""
    explorer = Explorer(session, measure=measure)
    for n, step in enumerate(story.steps, 1):
        why_not = explorer.missing_parts(step)
        if why_not is not None:
            raise StoryError(f"step {n} ({step.describe()}) cannot be told on bench {session.bench.name!r}: {why_not}")

    def as_told(n: int, now: str) -> None:
        """What step ``n`` came to when the story was first told, where it differs from ``now``
        (the step that broke a promise then is the story's ``broke``, which the replay's caller
        says first)."""
        if n <= len(story.told) and story.told[n - 1] != now:
            log(f"   as first told: {story.told[n - 1]}")

    try:
        for n, step in enumerate(story.steps, 1):
            started = time.monotonic()
            try:
                outcome = explorer.apply(step)
                explorer.check()
            except Broken as broken:
                log(f"{n}. {step.describe()}: BROKEN after {time.monotonic() - started:.2f} s: {broken}")
                as_told(n, "BROKEN")
                return False
            log(f"{n}. {step.describe()}: {outcome} ({time.monotonic() - started:.2f} s; every promise kept)")
            as_told(n, outcome)
        return True
    finally:
        explorer.finish()  # repaired, baseline restored: a real bench is left as it was found
