"""Planning: from what was detected to a :class:`Plan`. Which host failed (diagnosis: which end
of a dark link), which spare replaces it (the spare pool's policy), and which circuits to
remove and add (a rewiring rule), each plan checked before it is carried out.

Extension points (passed to ``ReferenceController``):

- ``rewiring``: a callable ``rule(bench, failed, spare, live, intended) -> (remove, add)``
  (:class:`Rewiring`); the reference rule is :func:`like_for_like`.
- ``plan_checks``: callables ``check(bench, plan)`` that raise to refuse a plan
  (:class:`PlanCheck`); the reference check is :func:`refuse_protected_ports`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol

from lumion_hil.harness.errors import SafetyError
from lumion_hil.harness.recovery_model import Detection, DetectionKind, Plan
from lumion_hil.harness.spares import SparePool
from lumion_hil.instruments.protocols import InstrumentError
from lumion_hil.instruments.threads import at_once

if TYPE_CHECKING:
    from lumion_hil.harness.config import Bench

# Light this far below the receiver's sensitivity is still light (a faded transmitter, a dirty
# connector), not the darkness of a cut fibre or a failed port (meters read 40 dB lower there).
DIM_LIGHT_DB = 20.0
# A transmitter's light this far below what it launches, read at the switch, has faded (well
# above a monitor's repeatability, below the smallest fade that matters on a thin loss budget).
FADE_SEEN_DB = 0.5

Circuits = list[tuple[int, int]]  # (ingress port, egress port) cross-connects of the switch


class Rewiring(Protocol):
    """A rewiring rule: which circuits to remove and add so that ``spare`` takes ``failed``'s
    place. The planner calls it positionally (a lab's rule may name its parameters as it likes)
    and checks what it returns with the plan checks before anything is switched."""

    def __call__(self, bench: Bench, failed: str, spare: str, live: dict[int, int],
                 intended: dict[int, int], /) -> tuple[Circuits, Circuits]:
        """``live``: the cross-connects in place now (ingress port -> egress port); ``intended``:
        those the job ran on before the fault, which the rule rebuilds (a fault may have removed
        one from ``live``). Returns ``(remove, add)``, each a list of (ingress, egress)."""
        ...


class PlanCheck(Protocol):
    """A check every plan must pass before it is carried out: it raises to refuse the plan
    (:class:`SafetyError` for a refusal the fabric explains, which makes the recovery degraded,
    not failed) and returns nothing when the plan may go ahead."""

    def __call__(self, bench: Bench, plan: Plan, /) -> None: ...


def like_for_like(bench: Bench, failed: str, spare: str, live: dict[int, int],
                  intended: dict[int, int]) -> tuple[Circuits, Circuits]:
    """The spare takes the failed host's place on every circuit the job ran on (NIC for NIC);
    whatever else holds a port the new paths need is removed."""
    f_nics, s_nics = bench.host(failed).nics, bench.host(spare).nics
    tx_map = {f.tx_port: s.tx_port for f, s in zip(f_nics, s_nics)}
    rx_map = {f.rx_port: s.rx_port for f, s in zip(f_nics, s_nics)}
    spare_ports = {p for n in s_nics for p in (n.tx_port, n.rx_port)}
    remove: Circuits = []
    add: Circuits = []
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


def refuse_protected_ports(bench: Bench, plan: Plan) -> None:
    """Protected ports are never switched: a plan that needs one is refused (degraded)."""
    touched = sorted({p for pair in plan.remove + plan.add for p in pair} & set(bench.safety.protected_ports))
    if touched:
        raise SafetyError(f"replacing {plan.failed_host} by {plan.spare} needs protected port(s) {touched}; refused "
                          "(protected ports are never switched): degraded")


def _changed(circuits: dict[int, int], remove: Circuits, add: Circuits) -> dict[int, int]:
    """``circuits`` once ``remove`` and ``add`` are carried out: a circuit sharing a port with
    one added is gone too (a port carries one circuit; one cut at the switch is not among those
    removed, yet the new one replaces it)."""
    taken = {p for pair in add for p in pair}
    kept = {i: e for i, e in circuits.items() if (i, e) not in remove and i not in taken and e not in taken}
    return {**kept, **dict(add)}


class Planner:
    def __init__(self, session, spares: SparePool, switch, rewiring: Rewiring | None = None,
                 plan_checks: list[PlanCheck] | None = None):
        self.session = session
        self.bench = session.bench
        self.spares = spares
        self.switch = switch
        self.rewiring = rewiring or like_for_like
        self.plan_checks = [refuse_protected_ports] if plan_checks is None else list(plan_checks)
        self.circuits: dict[int, int] = {}  # the cross-connects the job runs on, as last read

    def read_circuits(self) -> dict[int, int]:
        """What the job runs on, read from the switch now: a plan rebuilds these paths wherever a
        fault later removes or darkens one (a cut made at the switch leaves no trace there)."""
        self.circuits = dict(self.switch.connections())
        return self.circuits

    def job_circuits(self) -> dict[int, int]:
        """What the job is meant to run on: as last read for it, with every plan carried out
        since (a circuit a cut at the switch took away is still among them: a host that takes
        its end over is wired to it), or read now where nothing has been."""
        return self.circuits or self.read_circuits()

    def plan(self, detection: Detection, ranks: list[str]) -> Plan:
        ranks = list(ranks)
        why, reason = f"{detection.kind}", f"{detection.kind} on {detection.host}"
        if detection.kind == DetectionKind.JOB_EXIT and not self.spares.lost(detection.host):
            # A rank's exit is often a symptom: a peer of its collective died (its GPU lost), and
            # the exit of a rank that waited on it may be seen before the lost GPU's own XID.
            others = [h for h in ranks if h != detection.host]
            lost = [h for h, gone in at_once({h: partial(self.spares.lost, h) for h in others}).items() if gone is True]
            if not lost:
                return Plan(None, None, ranks, ranks, diagnosis=f"the job exited on {detection.host} (return code "
                            f"{detection.detail.get('returncode')}); its GPU and links are healthy: restart in place")
            failed, other_end = lost[0], None
            why = reason = f"its GPU lost (seen first: the job's exit on {detection.host})"
        else:
            failed, other_end = self.diagnose(detection)
        spare = self.spares.pick(ranks)
        if spare is None:
            self.spares.take_out(failed, reason)
            guess = ""
            if other_end is not None and other_end in ranks:
                self.spares.guessed[failed] = other_end
                guess = f" (a guess: nothing shows whether {failed} or {other_end} failed)"
            return Plan(failed, None, ranks, [], diagnosis=f"{failed} failed ({why}){guess} and "
                        f"{self.spares.no_spare()}: the job cannot be recovered on this fabric (degraded)")
        plan = self.replacement(ranks, failed, spare, why)
        self.spares.take_out(failed, reason)
        if other_end is not None and other_end in ranks:
            plan.diagnosis += "; the receiving end was assumed (nothing shows which end of the link failed)"
            plan.fallback = self.replacement(ranks, other_end, spare, f"{detection.kind}, the sending end")
        return plan

    def replacement(self, ranks: list[str], failed: str, spare: str, why: str,
                    live: dict[int, int] | None = None) -> Plan:
        """The plan that puts ``spare`` in ``failed``'s place, checked; from the circuits ``live``
        (by default the switch's now), which are also those the job is meant to run on where
        given (a replan's), else those last read for it."""
        intended = live if live is not None else self.circuits
        live = self.switch.connections() if live is None else live
        remove, add = self.rewiring(self.bench, failed, spare, live, intended or live)
        after = [spare if h == failed else h for h in ranks]
        plan = Plan(failed, spare, ranks, after, remove, add, diagnosis=f"{failed} replaced by spare {spare} after {why}")
        for check in self.plan_checks:
            check(self.bench, plan)
        return plan

    def replan(self, plan: Plan, lost: list[str], why: str) -> Plan:
        """Replace hosts of ``plan``'s new rank map that were lost, from the circuits the job is
        meant to run on once ``plan`` is carried out (:meth:`job_circuits`, with its changes: not
        merely those the switch has now, from which a cut made at the switch is missing). Each
        replacement is made on the circuits the ones before it leave; the plan is the difference
        between the circuits in place and those wanted at the end (a later replacement may rewire
        a port an earlier one would have connected). A replan that ends degraded (no spare for a
        host) changes nothing: the job's circuits stay those ``plan`` left, its replacements
        before that one are never carried out."""
        in_place = set(self.switch.connections().items())
        self.circuits = circuits = _changed(self.job_circuits(), plan.remove, plan.add)
        ranks, diagnosis = list(plan.ranks_after), plan.diagnosis
        for host in lost:
            if host not in self.spares.out_of_service:  # one taken out already keeps its own reason
                self.spares.take_out(host, f"lost during a recovery ({why})")
            spare = self.spares.pick(ranks)
            if spare is None:
                return Plan(host, None, plan.ranks_before, [], diagnosis=f"{diagnosis}; then {host} was lost too "
                            f"({why}) and {self.spares.no_spare()}: degraded")
            step = self.replacement(ranks, host, spare, "it was lost during the recovery", live=dict(circuits))
            ranks, diagnosis = step.ranks_after, f"{diagnosis}; then {step.diagnosis}"
            circuits = _changed(circuits, step.remove, step.add)
        self.circuits = circuits
        wanted = set(circuits.items())
        spares = [h for h in ranks if h not in plan.ranks_after]
        return Plan(plan.failed_host, spares[-1] if spares else plan.spare, plan.ranks_before, ranks,
                    sorted(in_place - wanted), sorted(wanted - in_place), diagnosis=diagnosis)

    def other_end_instead(self, ranks: list[str], bad: list[str]) -> Plan | None:
        """Where the one host to replace was taken out on a guess: the plan that replaces the
        other end of its link instead (tried if the guess proves wrong)."""
        other = self.spares.guessed.pop(bad[0], None) if len(bad) == 1 else None
        if other is None or other not in ranks or self.spares.lost(bad[0]):
            return None
        spare = self.spares.pick(ranks)
        if spare is None:
            return None
        return self.replacement(list(ranks), other, spare, f"a dark link, the other end from {bad[0]}")

    def diagnose(self, detection: Detection) -> tuple[str, str | None]:
        """The host that failed, and (where that is a guess) the host at the other end."""
        if detection.kind not in (DetectionKind.LINK_DOWN, DetectionKind.MARGIN_LOW):
            return detection.host, None
        # Which end of the dark link failed: a port the switch reports failed, else the light
        # arriving at the ingress (a dim transmitter), else the receiving end.
        nic = next(n for n in self.bench.host(detection.host).nics if n.name == detection.detail["nic"])
        live = self.switch.connections()
        feeding = next((i for i, e in live.items() if e == nic.rx_port), None)
        if feeding is None:
            # The circuit is gone from the switch (cut there): both ends may be healthy, and the
            # receiving end is replaced, as for a fibre cut on its side.
            return detection.host, None
        sender = self.bench.nic_on_tx_port(feeding)
        try:
            states = self.switch.port_states([feeding, nic.rx_port])
            if states[feeding].value != "E" and sender is not None:
                return sender[0].name, None
            if states[nic.rx_port].value != "E":
                return detection.host, None
        except (InstrumentError, AttributeError):
            pass
        sensitivity = self.bench.limits.receiver_sensitivity_dbm.value
        floor = self.bench.limits.light_floor_dbm
        if self.switch.has_power_monitors and sender is not None:
            read = self.switch.port_power_dbm([feeding, nic.rx_port])
            arriving = read[feeding]
            if arriving < sensitivity:
                return sender[0].name, None  # no usable light reaches the switch: the sender failed
            # How much light the sender's side lost before the switch, and whether that explains
            # the receiver's shortfall (with its full light, the receiver would be above the floor).
            short = sender[1].launch_dbm - sender[1].tx_fibre_loss_db - arriving
            received = self.bench.at_receiver_dbm(nic.rx_port, read[nic.rx_port])
            # A fade explains a dim receiver, never a dark one: a transmitter short by more than
            # the margin beside a receiver cut off (a fibre cut on its side) is two faults, and the
            # dark one is the receiver's.
            if short >= FADE_SEEN_DB and received + short >= floor:
                return sender[0].name, None  # the light is already short at the switch: it faded
            return detection.host, None  # the light arrives at the switch: the far side failed
        for det in self.bench.detectors_for_port(nic.rx_port):
            received = self.session.received_dbm(det)
            if sender is not None and isinstance(received, float) and sensitivity - DIM_LIGHT_DB <= received < sensitivity:
                return sender[0].name, None  # light arrives, too weak: the transmitter has faded
        return detection.host, sender[0].name if sender else None
