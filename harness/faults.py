"""The fault catalogue and a seeded injector.

On an emulated bench a fault goes into the world, which records its true instant. On a real
bench each fault is made the way a lab can make it safely (kill a rank, cut a circuit at the
switch, close a port's shutter), and the ones a bench cannot make say why.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lumion_hil.harness.errors import HarnessError


@dataclass(frozen=True)
class FaultKind:
    name: str
    description: str
    on_bench: str | None  # how a real bench makes it; None: it cannot
    why_not: str = ""


CATALOGUE: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("gpu_failure", "a GPU fails with an XID (79: fell off the bus)", None,
              "a real GPU cannot be made to fail on demand; run it on the emulated bench or wait for one"),
    FaultKind("process_kill", "the job's process on one rank is killed", "the host's agent kills the rank's process"),
    FaultKind("fibre_cut", "the fibre feeding a NIC's receiver is cut",
              "the circuit feeding the NIC is disconnected at the switch (a cut circuit)"),
    FaultKind("transceiver_degradation", "a transmitter's light drops by N dB", None,
              "needs a variable optical attenuator in the fibre, which the bench file does not describe"),
    FaultKind("switch_port_failure", "the switch port feeding a NIC fails",
              "the port's shutter is closed (switches with shutters only)"),
)}


@dataclass(frozen=True)
class Fault:
    kind: str
    host: str
    nic: str | None = None
    xid: int = 79
    loss_db: float = 15.0
    detail: dict = field(default_factory=dict, hash=False)

    def describe(self) -> str:
        where = f"{self.host}.{self.nic}" if self.nic else self.host
        extra = {"gpu_failure": f" (XID {self.xid})", "transceiver_degradation": f" (-{self.loss_db:g} dB)"}
        return f"{self.kind} at {where}{extra.get(self.kind, '')}"


class FaultNotPossible(HarnessError):
    pass


class Injector:
    """Chooses targets with a seeded generator (so a failing sequence can be replayed) and makes
    the fault. ``inject`` returns the harness-clock instant the fault was made."""

    def __init__(self, session, seed: int = 1):
        self.session = session
        self.bench = session.bench
        self.rng = random.Random(seed)
        self.world = session.world
        # A bench served by `lumion-hil emulate` behaves like a real one, and its world takes the
        # faults no lab can make by hand (a GPU failing, a transmitter fading).
        served = next((h.world_address for h in self.bench.topology.hosts if h.world_address), None)
        self.served_world = None
        if self.world is None and served:
            from lumion_hil.instruments.emulators.world_client import WorldClient

            self.served_world = WorldClient(served)

    def supported(self, kind: str) -> tuple[bool, str]:
        if kind not in CATALOGUE:
            raise KeyError(f"unknown fault {kind!r}; known: {', '.join(CATALOGUE)}")
        spec = CATALOGUE[kind]
        if self.world is not None:
            return True, "emulated: made in the world"
        if spec.on_bench is None:
            if self.served_world is not None:
                return True, "served emulated bench: made in its world"
            return False, spec.why_not
        if kind == "switch_port_failure" and not hasattr(self.session.switch._switch, "disable_ports"):
            return False, f"switch {self.session.switch.name} has no port shutters"
        return True, spec.on_bench

    def choose(self, kind: str, ranks: list[str]) -> Fault:
        self.supported(kind)
        host = self.bench.host(self.rng.choice(ranks))
        nic = self.rng.choice(host.nics).name if kind in ("fibre_cut", "transceiver_degradation", "switch_port_failure") else None
        return Fault(kind, host.name, nic)

    def _nic(self, fault: Fault):
        return next(n for n in self.bench.host(fault.host).nics if n.name == fault.nic)

    def inject(self, fault: Fault) -> int:
        ok, why = self.supported(fault.kind)
        if not ok:
            raise FaultNotPossible(f"{fault.describe()}: not possible on bench {self.bench.name!r}: {why}")
        timeline = self.session.timeline
        if fault.kind == "process_kill":
            t = timeline.clock()
            self.session.hosts[fault.host].stop_job()
        elif self.world is not None:
            t = self._into_world(fault)
        elif CATALOGUE[fault.kind].on_bench is None:  # only a served bench's world can make it
            t = self._into_served_world(fault)
        elif fault.kind == "fibre_cut":
            nic = self._nic(fault)
            feeding = [(i, e) for i, e in self.session.switch.connections().items() if e == nic.rx_port]
            t = timeline.clock()
            self.session.switch.disconnect(feeding)
        else:  # switch_port_failure on a bench
            t = timeline.clock()
            self.session.switch.disable_ports([self._nic(fault).rx_port])
        timeline.event("fault.injected", t, kind=fault.kind, target=fault.describe())
        return t

    def _into_world(self, fault: Fault) -> int:
        world = self.world
        if fault.kind == "gpu_failure":
            return world.fail_gpu(fault.host, 0, fault.xid).t_ns
        nic = self._nic(fault)
        t = world.now_ns()
        if fault.kind == "fibre_cut":
            world.set_extra_loss(nic.rx_port, float("inf"), t)
        elif fault.kind == "transceiver_degradation":
            world.set_extra_loss(nic.tx_port, fault.loss_db, t)
        elif fault.kind == "switch_port_failure":
            world.set_port_state(nic.rx_port, "F", t)
        return t

    def _into_served_world(self, fault: Fault) -> int:
        if fault.kind == "gpu_failure":
            world_ns = self.served_world.call("fail_gpu", host=fault.host, index=0, xid=fault.xid)
        else:
            world_ns = self.served_world.call("set_extra_loss", port=self._nic(fault).tx_port, loss_db=fault.loss_db)
        # The served world runs on this machine's monotonic clock, as the harness does.
        return world_ns

    def repair(self, fault: Fault) -> None:
        """Undo the fault (emulated: the world is healed; bench: the circuit or port comes back
        with the baseline; a failed GPU cannot be repaired from here)."""
        if self.world is None:
            if fault.kind == "switch_port_failure":
                self.session.switch.enable_ports([self._nic(fault).rx_port])
            elif self.served_world is not None and fault.kind == "gpu_failure":
                self.served_world.call("repair_gpu", host=fault.host, index=0)
            elif self.served_world is not None and fault.kind == "transceiver_degradation":
                self.served_world.call("set_extra_loss", port=self._nic(fault).tx_port, loss_db=0.0)
            return
        if fault.kind == "gpu_failure":
            self.world.repair_gpu(fault.host, 0)
        elif fault.kind in ("fibre_cut", "transceiver_degradation"):
            nic = self._nic(fault)
            self.world.set_extra_loss(nic.rx_port if fault.kind == "fibre_cut" else nic.tx_port, 0.0)
        elif fault.kind == "switch_port_failure":
            self.world.set_port_state(self._nic(fault).rx_port, "E")
