"""Controllers with named bugs, for proving that verdicts turn red (the controller defects of
harness/defects.py: ``slow_controller``, ``spare_in_use``, ...). Each is the reference controller
with one part replaced through its public extension points (harness/controller.py): a spare
policy, a rewiring rule, the plan checks, the switch it drives, a phase listener, or what its
public ``recover`` returns. They are also examples for a lab building its own controller.
"""

from __future__ import annotations

import time
from dataclasses import replace

from lumion_hil.harness.controller import ReferenceController
from lumion_hil.harness.detection import Watchers
from lumion_hil.harness.planning import like_for_like
from lumion_hil.harness.recovery_model import RecoveryResult, Status
from lumion_hil.harness.spares import SparePool


class SlowController(ReferenceController):
    """Spends ``delay_ms`` more in one phase (a slow planner, a slow switch driver...)."""

    def __init__(self, session, ranks, delay_ms: float = 600.0, phase: str = "plan"):
        super().__init__(session, ranks)
        self.delay_s, self.slow_phase = delay_ms / 1e3, phase
        self.phase_listeners.append(self._dawdle)

    def _dawdle(self, phase: str, _plan) -> None:
        if phase == self.slow_phase:
            time.sleep(self.delay_s)  # the bug: a slow phase


def _spare_in_use(pool: SparePool, ranks: list[str]) -> str | None:
    for host in pool.bench.topology.hosts:
        if host.name in ranks and any(g.role == "spare" for g in host.gpus):
            return host.name
    others = [h for h in ranks if not pool.lost(h)]
    return others[-1] if others else None  # the bug: a host already in the ring


def SpareInUseController(session, ranks):
    """Takes the first host with a spare GPU, even one the job already runs on."""
    return ReferenceController(session, ranks, spare_policy=_spare_in_use)


def _leave_failed_circuits(bench, failed: str, spare: str, live: dict, intended: dict):
    used = {p for pair in live.items() for p in pair}
    f_nics, s_nics = bench.host(failed).nics, bench.host(spare).nics
    mine = {p for n in f_nics for p in (n.tx_port, n.rx_port)}
    peers: list[str] = []
    for ingress, egress in sorted(live.items()):
        if ingress in mine or egress in mine:
            end = bench.nic_on_rx_port(egress) if ingress in mine else bench.nic_on_tx_port(ingress)
            if end is not None and end[0].name not in peers:
                peers.append(end[0].name)
    add = []
    for s_nic, peer in zip(s_nics, peers):
        free = next((n for n in bench.host(peer).nics if n.tx_port not in used and n.rx_port not in used), None)
        if free is None:
            return like_for_like(bench, failed, spare, live, intended)  # no free port: it has to do it right
        used |= {free.tx_port, free.rx_port}
        add += [(s_nic.tx_port, free.rx_port), (free.tx_port, s_nic.rx_port)]
    spare_ports = {p for n in s_nics for p in (n.tx_port, n.rx_port)}
    return [(i, e) for i, e in sorted(live.items()) if {i, e} & spare_ports], add


def LeavesFailedCircuitsController(session, ranks):
    """Wires the spare to free ports of the failed GPU's neighbours where it can, and leaves the
    failed GPU's circuits where they are (light into a dead host, ports lost to the fabric)."""
    return ReferenceController(session, ranks, rewiring=_leave_failed_circuits)


class NeverDegradedController(ReferenceController):
    """With no spare left it reports a failure, not "degraded": the run cannot tell a fabric
    with no spare from a broken one."""

    def recover(self, fault_ns=None) -> RecoveryResult:
        result = super().recover(fault_ns)
        if result.status == Status.DEGRADED:
            result.status = Status.FAILED
        return result


class EarlyFirstStepController(ReferenceController):
    """Claims the first step ``delay_ms`` before it happened."""

    def __init__(self, session, ranks, delay_ms: float = 200.0):
        super().__init__(session, ranks)
        self.early_ns = int(delay_ms * 1e6)

    def recover(self, fault_ns=None) -> RecoveryResult:
        result = super().recover(fault_ns)
        if result.first_step_ns is not None:
            result.first_step_ns -= self.early_ns
        return result


def _any_healthy_spare(pool: SparePool, ranks: list[str]) -> str | None:
    for host in pool.bench.topology.hosts:  # the bug: protected ports are not its concern
        if host.name not in ranks and host.name not in pool.out_of_service \
                and any(g.role == "spare" for g in host.gpus) and not pool.lost(host.name):
            return host.name
    return None


class _Unguarded:
    """The guarded switch, but for connect and disconnect, which go to the raw driver."""

    def __init__(self, raw, guarded):
        self._raw, self._guarded = raw, guarded

    def __getattr__(self, name):
        return getattr(self._raw if name in ("connect", "disconnect") else self._guarded, name)


def UnguardedController(session, ranks):
    """Rewires through the raw switch driver, around the guard, and so does not refuse a spare
    behind a protected port."""
    raw = session.drivers[session.bench.topology.switch]  # the bug: not the guarded switch
    return ReferenceController(session, ranks, spare_policy=_any_healthy_spare, plan_checks=[],
                               switch=_Unguarded(raw, session.switch))


def _lead_only(session, ranks: list[str]) -> None:
    session.start_job(ranks, only=ranks[:1])  # the bug: the other ranks of the map are never started


def LeadOnlyRestartController(session, ranks):
    """Restarts only the lead rank of the new rank map (a launcher that forgets the others):
    on NCCL the lead hangs at init waiting for its peers and fails at the NCCL timeout (under
    torchrun, at its rendezvous's timeout)."""
    return ReferenceController(session, ranks, restart=_lead_only)


def _kill_a_follower(session, ranks: list[str]) -> None:
    session.start_job(ranks)
    if len(ranks) > 1:  # the bug: a follower's process is killed as the job starts (SIGTERM; SIGKILL after 1 s)
        session.hosts[ranks[-1]].stop_job(timeout_s=1.0)


def FollowerKilledAfterRestartController(session, ranks):
    """Restarts every rank, and a follower's process dies at once (a launcher that kills what
    it just started, an OOM on the host): the other ranks wait for it in the job's rendezvous
    or collectives and fail at the framework's timeout."""
    return ReferenceController(session, ranks, restart=_kill_a_follower)


class NoPhasesController(ReferenceController):
    """Recovers as the reference does and reports none of its phases: a harness that summed
    the controller's phases would score its overhead 0."""

    def recover(self, fault_ns=None) -> RecoveryResult:
        result = super().recover(fault_ns)
        result.phases = {}
        return result


class WrongFailedHostController(ReferenceController):
    """Recovers as the reference does and names another rank as the failed host: a harness that
    took its word would look for the failed host's circuits in the wrong place."""

    def recover(self, fault_ns=None) -> RecoveryResult:
        result = super().recover(fault_ns)
        if result.plan is not None and result.plan.failed_host:
            others = [h for h in result.plan.ranks_after if h != result.plan.failed_host]
            result.plan = replace(result.plan, failed_host=others[-1] if others else None)
        return result


class WrongRankMapController(ReferenceController):
    """Recovers as the reference does and reports the new rank map in another order than the
    one it started: a harness that took its word would time the wrong rank's first step."""

    def recover(self, fault_ns=None) -> RecoveryResult:
        result = super().recover(fault_ns)
        if result.plan is not None and len(result.plan.ranks_after) > 1:
            ranks = list(result.plan.ranks_after)
            result.plan = replace(result.plan, ranks_after=ranks[1:] + ranks[:1])
        return result


class _BlindToFading(Watchers):
    def _watch_margin(self, *_args) -> None:
        return  # the bug: the light at the receivers is never read


class IgnoresFadingLightController(ReferenceController):
    """Never watches the light at its receivers: a transmitter that fades below the margin goes
    unseen until the link drops (and one that fades into the margin zone, for ever)."""

    def __init__(self, session, ranks):
        super().__init__(session, ranks)
        self.watchers = _BlindToFading(session)


class RestartFirstController(ReferenceController):
    """Restarts the job on the new rank map first (a fair overlap: the job starts while the
    fabric is rewired), but rewires only ``delay_ms`` after the job says it is ready: it
    dawdles past the job's whole start-up. The job waits in its first collective for links that
    are not up yet; a harness that counted everything from the restart to the first step as
    the job's start-up would hide the dawdle there. (For a job whose communicator comes up
    without its links, as the emulated job's does.)"""

    def __init__(self, session, ranks, delay_ms: float = 400.0, phase: str | None = None):
        super().__init__(session, ranks, restart=self._unless_started)
        self.delay_s = delay_ms / 1e3
        self.started_for: list[str] | None = None
        self.phase_listeners.append(self._restart_then_dawdle)

    def _restart_then_dawdle(self, phase: str, plan) -> None:
        if phase == "switch" and plan is not None and plan.ranks_after and self.started_for is None:
            # The reference's own stop of the broken job (off the critical path) must be over
            # before the new job starts, or it stops some of the new ranks too (a loaded machine
            # made it late: the spare's rank killed, the others timed out waiting for it). It is
            # left pending: the reference's restart finds it done and starts nothing.
            if self._stopping is not None:
                self._stopping[0].result()
            self.session.stop_job()
            self.session.start_job(plan.ranks_after)
            self.started_for = list(plan.ranks_after)
            self.session.hosts[plan.ranks_after[0]].wait_job_event("nccl_init", self.phases.left())
            time.sleep(self.delay_s)  # the bug: nothing happens while the job waits for its links

    def _unless_started(self, session, ranks: list[str]) -> None:
        if self.started_for != list(ranks):
            session.start_job(ranks)


class _OtherSpareFirst:
    """The guarded switch, but the first connect of a recovery wires another spare in the
    chosen one's place, waits for its links, and takes it out again before doing as asked."""

    def __init__(self, session):
        self._session, self._switch, self._tried = session, session.switch, False

    def __getattr__(self, name):
        return getattr(self._switch, name)

    def connect(self, pairs) -> None:
        bench = self._session.bench
        if not self._tried:
            self._tried = True
            wrong = self._other_spare(bench, list(pairs))
            if wrong:
                self._switch.connect(wrong)
                for _, egress in wrong:  # the bug: a spare it did not choose, lit and locked for nothing
                    owner = bench.nic_on_rx_port(egress)
                    if owner is not None:
                        self._session.hosts[owner[0].name].wait_link(owner[1].interface or owner[1].name, up=True,
                                                                     timeout_s=bench.waits.link_up_s)
                self._switch.disconnect(wrong)
        self._switch.connect(pairs)

    @staticmethod
    def _other_spare(bench, pairs) -> list[tuple[int, int]]:
        spares = [h for h in bench.topology.hosts if any(g.role == "spare" for g in h.gpus)]
        ports = {p for pair in pairs for p in pair}
        chosen = next((h for h in spares if {p for n in h.nics for p in (n.tx_port, n.rx_port)} & ports), None)
        other = next((h for h in spares if h is not chosen and len(h.nics) == len(chosen.nics)), None) if chosen else None
        if chosen is None or other is None:
            return []
        swap = {}
        for mine, theirs in zip(chosen.nics, other.nics):
            swap[mine.tx_port], swap[mine.rx_port] = theirs.tx_port, theirs.rx_port
        return [(swap.get(i, i), swap.get(e, e)) for i, e in pairs]


def WrongSpareFirstController(session, ranks):
    """Wires another spare in first, waits for its links, then takes it out for the one it
    chose: switching, light and lock that the final plan did not need."""
    return ReferenceController(session, ranks, switch=_OtherSpareFirst(session))


class TouchesProtectedPortController(ReferenceController):
    """Parks a beam on a protected port through its own session to the switch as it starts to
    rewire, and takes it away again: the switch reads back clean afterwards."""

    def __init__(self, session, ranks):
        super().__init__(session, ranks)
        self.phase_listeners.append(self._park)
        self._parked = False

    def _park(self, phase: str, _plan) -> None:
        if phase != "switch" or self._parked:
            return
        self._parked = True
        bench = self.session.bench
        raw = self.session.drivers[bench.topology.switch]  # the bug: around the guard
        protected = sorted(bench.safety.protected_ports)
        ingress = next((p for p in protected if p in bench.switch.ingress_ports), None)
        egress = next((p for p in protected if p in bench.switch.egress_ports), None)
        if ingress is not None and egress is not None:
            raw.connect([(ingress, egress)])
            raw.disconnect([(ingress, egress)])
