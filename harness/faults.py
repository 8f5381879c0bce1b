"""The fault catalogue and a seeded injector.

On an emulated bench a fault goes into the world, which records its true instant. On a real
bench each fault is made the way a lab can make it safely (kill a rank, cut a circuit at the
switch, close a port's shutter), and the ones a bench cannot make say why.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from lumion_hil.harness.errors import HarnessError
from lumion_hil.instruments import transcript
from lumion_hil.instruments.backend import Fault, FaultKind

__all__ = ["CATALOGUE", "Fault", "FaultKind", "FaultNotPossible", "Injector"]


@dataclass(frozen=True)
class FaultSpec:
    name: FaultKind
    description: str
    on_bench: str | None  # how a real bench makes it; None: it cannot
    why_not: str = ""


# Every fault kind (instruments/backend.py FaultKind), described, and how a lab makes it by hand.
CATALOGUE: dict[str, FaultSpec] = {k.name.value: k for k in (
    FaultSpec(FaultKind.GPU_FAILURE, "a GPU fails with an XID (79: fell off the bus)", None,
              "a real GPU cannot be made to fail on demand; run it on the emulated bench or wait for one"),
    FaultSpec(FaultKind.PROCESS_KILL, "the job's process on one rank is killed", "the host's agent kills the rank's process"),
    FaultSpec(FaultKind.FIBRE_CUT, "the fibre feeding a NIC's receiver is cut",
              "the circuit feeding the NIC is disconnected at the switch (a cut circuit)"),
    FaultSpec(FaultKind.TRANSCEIVER_DEGRADATION, "a transmitter's light drops by N dB", None,
              "needs a variable optical attenuator in the fibre, which the bench file does not describe"),
    FaultSpec(FaultKind.SWITCH_PORT_FAILURE, "the switch port feeding a NIC fails",
              "the port's shutter is closed (switches with shutters only)"),
)}
assert set(CATALOGUE) == set(FaultKind), "every fault kind is described once"


class FaultNotPossible(HarnessError):
    pass


class ByHand:
    """The faults a lab makes with the bench's own parts: a rank killed through its agent, a
    circuit cut at the switch, a port's shutter closed."""

    def __init__(self, session):
        self.session = session

    def _nic(self, fault: Fault):
        return next(n for n in self.session.bench.host(fault.host).nics if n.name == fault.nic)

    def can_inject(self, kind: str) -> tuple[bool, str]:
        spec = CATALOGUE[kind]
        if spec.on_bench is None:
            return False, spec.why_not
        if kind == FaultKind.SWITCH_PORT_FAILURE and not self.session.switch.has_port_shutters:
            return False, f"switch {self.session.switch.name} has no port shutters"
        return True, spec.on_bench

    def inject(self, fault: Fault) -> int:
        clock = self.session.timeline.clock
        if fault.kind == FaultKind.PROCESS_KILL:
            t = clock()
            self.session.hosts[fault.host].stop_job()
        elif fault.kind == FaultKind.FIBRE_CUT:
            nic = self._nic(fault)
            feeding = [(i, e) for i, e in self.session.switch.connections().items() if e == nic.rx_port]
            t = clock()
            self.session.switch.disconnect(feeding)
        else:  # switch_port_failure
            t = clock()
            self.session.switch.disable_ports([self._nic(fault).rx_port])
        return t

    def repair(self, fault: Fault) -> None:
        """A port's shutter opens again; a cut circuit comes back with the baseline."""
        if fault.kind == FaultKind.SWITCH_PORT_FAILURE:
            self.session.switch.enable_ports([self._nic(fault).rx_port])


class Injector:
    """Chooses targets with a seeded generator (so a failing sequence can be replayed) and makes
    the fault: through the bench's backend where it makes that kind (an emulated world makes
    every kind), else by hand. ``inject`` returns the harness-clock instant the fault was made."""

    def __init__(self, session, seed: int = 1):
        self.session = session
        self.bench = session.bench
        self.rng = random.Random(seed)
        self.makers = [session.backend, ByHand(session)]

    def _maker(self, kind: str):
        if kind not in CATALOGUE:
            raise KeyError(f"unknown fault {kind!r}; known: {', '.join(CATALOGUE)}")
        why = ""
        for maker in self.makers:
            ok, why = maker.can_inject(kind)
            if ok:
                return maker, why
        return None, why

    def supported(self, kind: str) -> tuple[bool, str]:
        maker, why = self._maker(kind)
        return maker is not None, why

    def choose(self, kind: str, ranks: list[str]) -> Fault:
        self.supported(kind)
        host = self.bench.host(self.rng.choice(ranks))
        nic = self.rng.choice(host.nics).name if FaultKind(kind).at_nic else None
        return Fault(kind, host.name, nic)

    def inject(self, fault: Fault) -> int:
        maker, why = self._maker(fault.kind)
        if maker is None:
            raise FaultNotPossible(f"{fault.describe()}: not possible on bench {self.bench.name!r}: {why}")
        t = maker.inject(fault)
        self.session.timeline.event("fault.injected", t, kind=fault.kind, target=fault.describe())
        # A fault the backend made is not an exchange on the wire: the transcript says what it was,
        # so that a replay makes it too (one made by hand is in the transcript as its commands).
        transcript.write_fault(dataclasses.asdict(fault), t, by_backend=maker is self.session.backend)
        return t

    def repair(self, fault: Fault) -> None:
        """Undo the fault (emulated: the world is healed; bench: the circuit or port comes back
        with the baseline; a failed GPU cannot be repaired from here)."""
        maker, _ = self._maker(fault.kind)
        if maker is not None:
            maker.repair(fault)
            transcript.write_fault(dataclasses.asdict(fault), None, by_backend=maker is self.session.backend,
                                   kind="repair")
