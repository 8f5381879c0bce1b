"""The promises a failure sequence keeps, and the checks that judge them after every step, read
from the bench through its drivers and agents:

- no port is in two circuits, protected ports are untouched, and no circuit is left on a host
  outside the job;
- every circuit the job runs on has light above sensitivity plus margin, and carrier;
- while usable spares remain, the job runs at full size on healthy GPUs; once none is left the
  controller says degraded, and it stays so until a repair;
- each recovery ends within its deadline;
- the run record holds every measurement taken.

Each promise is named once (:data:`PROMISES`); each check is registered with the promises it
guards (:attr:`PromiseChecks.CHECKS`). :class:`PromiseChecks` is the explorer's base
(harness/explorer.py): the checks read what the explorer keeps.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from lumion_hil.instruments.threads import at_once


# The promises a failure sequence keeps, each named once. The checks after every step are
# registered with the promises they guard (PromiseChecks.CHECKS, in the order they run); the
# others are judged as a recovery ends (the explorer's _judge and _took).
PROMISES = (
    "no port is in two circuits",
    "protected ports are untouched",
    "no circuit is left on a host outside the job",
    "the job runs at full size",
    "the job runs on healthy GPUs",
    "every circuit has light above sensitivity plus margin",
    "every circuit has carrier",
    "the job runs",
    "degraded only while no spare is left",
    "the run record holds every measurement taken",
    "a recovery succeeds or says degraded",
    "degraded exactly when no spare is left",
    "each recovery ends within its deadline",
)


class Broken(AssertionError):
    """A promise the bench (or the controller) did not keep."""

    def __init__(self, promise: str, detail: str):
        if promise not in PROMISES:
            raise ValueError(f"{promise!r} is not one of the promises (harness/promises.py PROMISES)")
        self.promise, self.detail = promise, detail
        super().__init__(f"{promise}: {detail}")


@dataclass(frozen=True)
class Check:
    """A check run after every step: which promises it guards, and in which state of the job."""

    name: str
    promises: tuple[str, ...]
    when: str  # "always", "running" (the job at full size), "degraded"
    run: Callable


def _check(name: str, *promises: str, when: str = "always"):
    """Register a method of PromiseChecks as a check of these promises (as Hypothesis names rules)."""
    unknown = [p for p in promises if p not in PROMISES]
    if unknown:
        raise ValueError(f"check {name!r}: unknown promise(s) {unknown}")

    def register(method):
        _CHECKS.append(Check(name, promises, when, method))
        return method

    return register


_CHECKS: list[Check] = []


class PromiseChecks(ABC):
    """The checks run after every step (:meth:`check`), over what the explorer keeps: its session
    and bench, the job's ranks and state, and the measurements it has taken."""

    CHECKS: ClassVar[tuple[Check, ...]]  # set below the class, once every check is registered

    session: Any  # the open bench session
    bench: Any  # the session's bench
    protected: set[int]  # the bench's protected ports
    ranks: list[str]  # the hosts the job runs on, in rank order
    size: int  # the job's size
    state: str  # "running" (the job at full size) or "degraded"
    measure: Callable | None
    record_path: Path | None
    test: str | None  # the test whose measurements the run record holds
    measured: int  # measurements taken
    _record_seen: int  # of those, found in the run record
    _record_offset: int  # how far the run record has been read

    @abstractmethod
    def usable_spares(self) -> list[str]:
        """Hosts that could take a rank now."""

    @abstractmethod
    def _can_be_full(self) -> bool:
        """Whether the job could run at full size with the spares left."""

    def check(self) -> None:
        """Every promise, read from the bench through its drivers and agents: the registered
        checks in order, each in the state of the job it applies to."""
        live = self.session.switch.connections()
        for check in self.CHECKS:
            if check.when == "always" or check.when == self.state:
                check.run(self, live)

    @_check("safety", "no port is in two circuits", "protected ports are untouched")
    def _check_safety(self, live: dict[int, int]) -> None:
        egress = list(live.values())
        doubled = sorted({e for e in egress if egress.count(e) > 1})
        if doubled:
            raise Broken("no port is in two circuits", f"egress port(s) {doubled}")
        touched = sorted({p for pair in live.items() for p in pair} & self.protected)
        if touched:
            raise Broken("protected ports are untouched", f"circuits on protected port(s) {touched}: {live}")
        world = self.session.world
        if world is not None and world.violations:
            raise Broken("protected ports are untouched", str(world.violations[0]))

    @_check("stray circuits", "no circuit is left on a host outside the job", when="running")
    def _check_stray(self, live: dict[int, int]) -> None:
        job_ports = {p for h in self.ranks for n in self.bench.host(h).nics for p in (n.tx_port, n.rx_port)}
        stray = sorted((i, e) for i, e in live.items() if not {i, e} <= job_ports)
        if stray:
            owners = sorted({self._owner(p) for pair in stray for p in pair if p not in job_ports})
            raise Broken("no circuit is left on a host outside the job",
                         f"{stray} on {', '.join(owners)} (the job runs on {', '.join(self.ranks)})")

    @_check("degraded", "degraded only while no spare is left", when="degraded")
    def _check_degraded(self, live: dict[int, int]) -> None:
        if self._can_be_full():
            raise Broken("degraded only while no spare is left",
                         f"degraded with usable spare(s) {self.usable_spares()} for {self.ranks}")

    def _owner(self, port: int) -> str:
        for host, nic in self.bench.nic_ports():
            if port in (nic.tx_port, nic.rx_port):
                return f"{host.name}.{nic.name}"
        return f"port {port}"

    @_check("the job on its rank map", "the job runs at full size", "the job runs on healthy GPUs",
            "every circuit has light above sensitivity plus margin", "every circuit has carrier", "the job runs",
            when="running")
    def _check_running(self, live: dict[int, int]) -> None:
        if len(set(self.ranks)) != self.size:
            raise Broken("the job runs at full size", f"ranks {self.ranks} for a job of {self.size}")
        floor = self.bench.limits.light_floor_dbm
        fed = set(live.values())
        watched = {(host, nic.name): next(iter(self.bench.detectors_for_port(nic.rx_port)), None)
                   for host in self.ranks for nic in self.bench.host(host).nics if nic.rx_port in fed}
        # Every host asked at once (the lead rank for the job's status too), every detector read
        # together; judged in order below.
        lead = self.session.hosts[self.ranks[0]]
        asked = at_once({**{(host, "health"): self.session.hosts[host].health for host in self.ranks},
                         **{(host, "links"): self.session.hosts[host].links for host in self.ranks},
                         ("light", None): lambda: self.session.received_dbms(
                             [d for d in watched.values() if d is not None]),
                         ("job", None): lead.job_status})
        for host in self.ranks:
            if any(g.lost for g in self._answer(asked, (host, "health"))):
                raise Broken("the job runs on healthy GPUs", f"{host}'s GPU is lost and it is in the job {self.ranks}")
            links = {s.interface: s for s in self._answer(asked, (host, "links"))}
            for nic in self.bench.host(host).nics:
                if nic.rx_port not in fed:
                    continue
                det = watched[(host, nic.name)]
                if det is not None:
                    received = self._answer(asked, ("light", None))[det.name]
                    if not isinstance(received, float) or received < floor:
                        raise Broken("every circuit has light above sensitivity plus margin",
                                     f"{host}.{nic.name} receives {received} ({det.name}), floor {floor:g} dBm")
                state = links.get(nic.interface or nic.name)
                if state is None or state.carrier != 1:
                    raise Broken("every circuit has carrier", f"{host}.{nic.name}: {state}")
        status = self._answer(asked, ("job", None))
        if not status.running:
            raise Broken("the job runs", f"not running on {self.ranks}: {status.last_lines[-2:]}")

    @staticmethod
    def _answer(asked: dict, key):
        value = asked[key]
        if isinstance(value, Exception):
            raise value
        return value

    @_check("the run record", "the run record holds every measurement taken")
    def _check_record(self, _live: dict[int, int]) -> None:
        if self.record_path is None or self.measure is None:
            return
        with open(self.record_path, encoding="utf-8") as fh:
            fh.seek(self._record_offset)
            for line in fh:
                if not line.endswith("\n"):
                    break
                self._record_offset += len(line.encode("utf-8"))
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if item.get("type") == "measurement" and item.get("name") == "sequence_recovery_time" \
                        and (self.test is None or item.get("test") == self.test):
                    self._record_seen += 1
        if self._record_seen < self.measured:
            raise Broken("the run record holds every measurement taken",
                         f"{self.measured} taken, {self._record_seen} in {self.record_path}")


PromiseChecks.CHECKS = tuple(_CHECKS)  # the checks after every step, in the order they run
