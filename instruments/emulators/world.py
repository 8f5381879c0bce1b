"""The emulated bench's one physical world.

Emulated instruments are views of it: the switch emulator changes cross-connects, a meter reads
the power arriving at the port it taps, a host sees its links. Everything the world holds is a
history over time (``perf_counter_ns``, the same clock the harness times with), so any view can
ask "what was the light at port 18 at instant t" and the world also knows the true time of every
physical event: the ground truth the harness's measurements are checked against.
"""

from __future__ import annotations

import bisect
import math
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from lumion_hil.instruments.collectives import Cost, Fabric, Link, collective_cost, rack_fabric


class WorldError(Exception):
    """A request the physical world refuses; emulators turn it into their instrument's error."""

    def __init__(self, kind: str, message: str):
        self.kind = kind  # "range", "conflict", "argument"
        super().__init__(message)


@dataclass
class Circuit:
    """One cross-connect, from command to removal."""

    ingress: int
    egress: int
    commanded_ns: int
    lit_ns: int  # when the beam settles and light passes
    removed_ns: int | None = None
    moving_ns: int | None = None  # when its own beam began to move (after the beams queued before it)

    def live_at(self, t_ns: int) -> bool:
        """Configured at t (switching or lit)."""
        return self.commanded_ns <= t_ns and (self.removed_ns is None or t_ns < self.removed_ns)

    def lit_at(self, t_ns: int) -> bool:
        return self.lit_ns <= t_ns and (self.removed_ns is None or t_ns < self.removed_ns)


@dataclass(frozen=True)
class WorldEvent:
    """A physical event and the instant it truly happened."""

    t_ns: int
    kind: str  # "switch.command", "circuit.lit", "circuit.dark", "port.state", "loss", ...
    subject: str
    detail: dict = field(default_factory=dict, hash=False)


@dataclass
class _Source:
    launch_dbm: float
    tx_fibre_loss_db: float
    owner: str
    wavelength_nm: float = 1310.0


@dataclass
class _Sink:
    rx_fibre_loss_db: float
    owner: str
    sensitivity_dbm: float  # the receiver's own (its host's emulation setting), not the lab's limit


class _History:
    """A value that changes at instants; ``at(t)`` gives the value in force at t."""

    def __init__(self, initial):
        self._times: list[int] = [-(2**62)]
        self._values: list = [initial]

    def set(self, t_ns: int, value) -> None:
        i = bisect.bisect_right(self._times, t_ns)
        # A change supersedes anything planned after it.
        del self._times[i:], self._values[i:]
        self._times.append(t_ns)
        self._values.append(value)

    def at(self, t_ns: int):
        return self._values[bisect.bisect_right(self._times, t_ns) - 1]


@dataclass
class GpuState:
    host: str
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    role: str = "active"
    failed_ns: int | None = None
    xid: int | None = None
    ecc_dbe: int = 0
    retired_pages: int = 0
    temperature_c: float = 45.0
    power_w: float = 80.0


LINK_STATES = ("dark", "light", "locked", "up")


def as_wired(bench: Any) -> Any:
    """The bench as it is really wired and lit, where its emulation says the bench file is
    wrong: fibres swapped between ports (the switch's ``swapped_ports``) and transmitters
    weaker than their ``launch_dbm`` (a host's ``tx_shortfall_db``). The world's light follows
    this; the harness reads the bench file, and finds the difference by measuring."""
    swaps = bench.switch.emulation.swapped_ports
    if not swaps and not any(h.emulation.tx_shortfall_db for h in bench.topology.hosts):
        return bench
    really = {}
    for a, b in swaps:
        really[a], really[b] = b, a
    hosts = []
    for host in bench.topology.hosts:
        shortfall = host.emulation.tx_shortfall_db
        nics = [n.model_copy(update={"tx_port": really.get(n.tx_port, n.tx_port),
                                     "rx_port": really.get(n.rx_port, n.rx_port),
                                     "launch_dbm": n.launch_dbm - shortfall.get(n.name, 0.0)}) for n in host.nics]
        hosts.append(host.model_copy(update={"nics": nics}))
    return bench.model_copy(update={"topology": bench.topology.model_copy(update={"hosts": hosts})})


class World:
    """Light, loss and switch state of the whole emulated bench, over time."""

    def __init__(self, bench: Any, clock_ns=time.perf_counter_ns):
        self.bench = bench = as_wired(bench)
        self.now_ns = clock_ns
        self.time_scale = bench.emulator.time_scale
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # anything recorded: light, GPUs, the jobs' events
        # Light, ports, switch and GPUs only: what a host's links and NVML wait on. The jobs'
        # bookkeeping (a step told, many a second) does not wake them.
        self.physics_changed = threading.Condition(self.lock)
        switch = bench.switch
        self.ingress_ports = switch.ingress_ports
        self.egress_ports = switch.egress_ports
        self.switching_time_ns = self.scaled_ns(switch.emulation.switching_time_s)
        self.switching_jitter_ns = self.scaled_ns(switch.emulation.switching_jitter_s)
        self.multi_connection_extra_ns = self.scaled_ns(switch.emulation.multi_connection_extra_s)
        self._switching_seed = bench.emulator.seed
        self._connections_made: dict[tuple[int, int], int] = {}  # pair -> how many times it was made
        self.connection_loss_db = {tuple(int(p) for p in key.split("-")): loss
                                   for key, loss in switch.emulation.connection_loss_db.items()}
        self.insertion_loss_db = switch.emulation.insertion_loss_db
        self.port_loss_db = dict(switch.emulation.port_loss_db)  # a damaged connector: always there
        self.crosstalk_db = switch.emulation.crosstalk_db
        self.connector_loss_db = bench.topology.connector_loss_db
        self.protected_ports = frozenset(bench.safety.protected_ports)
        self.sources: dict[int, _Source] = {}
        self.sinks: dict[int, _Sink] = {}
        for host, nic in bench.nic_ports():
            owner = f"{host.name}.{nic.name}"
            self.sources[nic.tx_port] = _Source(nic.launch_dbm, nic.tx_fibre_loss_db, owner, nic.wavelength_nm)
            self.sinks[nic.rx_port] = _Sink(nic.rx_fibre_loss_db, owner, host.emulation.receiver_sensitivity_dbm)
        self.hosts = {h.name: h for h in bench.topology.hosts}
        self.gpus: dict[tuple[str, int], GpuState] = {}
        for host in bench.topology.hosts:
            for gpu in host.gpus:
                key = f"{bench.name}/{host.name}/{gpu.index}"
                self.gpus[(host.name, gpu.index)] = GpuState(
                    host.name, gpu.index, gpu.model, f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, key)}",
                    f"00000000:{0x17 + gpu.index:02X}:00.0", role=gpu.role)
        self.gpu_events: list[WorldEvent] = []
        self.circuits: list[Circuit] = []  # every circuit ever made, in order
        # Indexes, so that the light at one port never scans the whole history:
        self._by_egress: dict[int, list[Circuit]] = {}
        self._by_ingress: dict[int, list[Circuit]] = {}
        self._current: dict[int, Circuit] = {}  # ingress -> the circuit not yet removed
        self._busy_until_ns = 0
        self._last_change_ns = 0  # the latest instant a circuit was made or removed
        self._extra_loss: dict[int, _History] = {}
        self._port_state: dict[int, _History] = {}
        self._source_on: dict[int, _History] = {}
        self.events: list[WorldEvent] = []
        self.violations: list[WorldEvent] = []  # protected ports switched (also among events)
        # Bumped by every change to light (circuits, ports, losses, sources), overall and per
        # receiving port: answers computed from a port's history stay good until its version
        # moves, or until the next instant already planned for it.
        self._light_version = 0
        self._changed_ns = 0  # when anything last changed by a command, a fault or a job's report
        self._port_versions: dict[int, int] = {}
        self._since_cache: dict[int, tuple] = {}
        self._transitions: dict[tuple[str, str], tuple[int, list]] = {}
        # (light version, from, until, fabric): the optical fabric while nothing can change it
        self._fabric_cache: tuple | None = None
        self._counters: dict[tuple[str, str], tuple] = {}  # (host, nic) -> (version, from, until, counters)
        self._costs: dict[tuple, tuple] = {}  # the last collectives' costs, by fabric and what was asked
        self._next_change: tuple | None = None  # (light version, from, until, the next change the world makes)

    # -- time ---------------------------------------------------------------------------------

    def scaled_ns(self, seconds: float) -> int:
        return int(round(seconds * self.time_scale * 1e9))

    @property
    def light_version(self) -> int:
        """Moves with every change to light (circuits, ports, losses, sources): a view that
        worked something out at one version knows whether it may still hold."""
        return self._light_version

    def _notify(self, physics: bool = True) -> None:
        """Wake every wait for a change (under the lock); with ``physics``, the hosts' waits too."""
        self._changed_ns = self.now_ns()
        self.changed.notify_all()
        if physics:
            self.physics_changed.notify_all()

    def record(self, t_ns: int, kind: str, subject: str, **detail) -> None:
        with self.lock:
            self.events.append(WorldEvent(t_ns, kind, subject, detail))
            self._notify(physics=not kind.startswith("job."))

    def events_of(self, kind: str, subject: str | None = None) -> list[WorldEvent]:
        with self.lock:
            return sorted(
                (e for e in self.events if e.kind == kind and (subject is None or e.subject == subject)),
                key=lambda e: e.t_ns,
            )

    # -- the switch ---------------------------------------------------------------------------

    def live_circuits(self, t_ns: int | None = None) -> list[Circuit]:
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            pool = self._current.values() if t >= self._last_change_ns else self.circuits
            return sorted((c for c in pool if c.live_at(t)), key=lambda c: c.ingress)

    def connections(self, t_ns: int | None = None) -> dict[int, int]:
        return {c.ingress: c.egress for c in self.live_circuits(t_ns)}

    def switch_busy_until_ns(self) -> int:
        with self.lock:
            return self._busy_until_ns

    def wait_settled(self) -> int:
        """Block until every beam commanded so far has settled (the switch's own busy-until
        instant, ground truth); returns that instant."""
        while (remaining := self.switch_busy_until_ns() - self.now_ns()) > 0:
            time.sleep(min(remaining / 1e9, 0.05))  # looked at again: a command may queue more beams
        return self.switch_busy_until_ns()

    def connect(self, pairs: Iterable[tuple[int, int]], t_ns: int | None = None) -> int:
        """Start moving beams for each (ingress, egress). Returns when the last one settles.

        Connections settle one after another, ``switching_time_s`` each (a beam-steering
        switch's controller moves one beam pair at a time: assumption from "about 50 ms per
        connection"), each drawing its own time where ``switching_jitter_s`` spreads it. A
        pair that already exists is left as it is."""
        pairs = list(pairs)
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            live = {c.ingress: c for c in self.live_circuits(t)}
            egress_used = {c.egress: c for c in live.values()}
            self._check_pairs(pairs)
            new = []
            for ingress, egress in pairs:
                existing = live.get(ingress)
                if existing is not None and existing.egress == egress:
                    continue
                if existing is not None:
                    raise WorldError("conflict", f"ingress {ingress} is already connected to {existing.egress}")
                if egress in egress_used:
                    raise WorldError("conflict", f"egress {egress} is already connected to {egress_used[egress].ingress}")
                new.append((ingress, egress))
            start = max(t, self._busy_until_ns)
            self.record(t, "switch.command", "connect", pairs=new)
            lit = start
            for ingress, egress in new:
                moving = lit
                lit += self._switching_ns(ingress, egress) + (self.multi_connection_extra_ns if len(new) > 1 else 0)
                circuit = Circuit(ingress, egress, t, lit, moving_ns=moving)
                self.circuits.append(circuit)
                self._touch(egress)
                self._by_egress.setdefault(egress, []).append(circuit)
                self._by_ingress.setdefault(ingress, []).append(circuit)
                self._current[ingress] = circuit
                self._last_change_ns = max(self._last_change_ns, t)
                self.events.append(WorldEvent(lit, "circuit.lit", f"{ingress}->{egress}",
                                               {"ingress": ingress, "egress": egress}))
                self._busy_until_ns = lit
                self._note_protected(t, ingress, egress)
            self._notify()
            return max(self._busy_until_ns, t)

    def _switching_ns(self, ingress: int, egress: int) -> int:
        """One connection's switching time: switching_time_s, spread by switching_jitter_s. The
        n-th making of a pair draws from (seed, pair, n): two benches of one seed draw alike for
        the same connection, whatever else each did in between (common random numbers)."""
        if not self.switching_jitter_ns:
            return self.switching_time_ns
        n = self._connections_made.get((ingress, egress), 0)
        self._connections_made[(ingress, egress)] = n + 1
        draw = random.Random(f"{self._switching_seed}/{ingress}-{egress}/{n}").gauss(0.0, 1.0)
        return max(0, int(self.switching_time_ns + draw * self.switching_jitter_ns))

    def disconnect(self, pairs: Iterable[tuple[int, int]] | None = None, t_ns: int | None = None) -> None:
        """Remove the given (ingress, egress) connections, or all of them. Light is lost at once:
        the beam leaves the output as soon as it starts to move."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            live = self.live_circuits(t)
            if pairs is None:
                chosen = live
            else:
                wanted = list(pairs)
                self._check_pairs(wanted)
                by_pair = {(c.ingress, c.egress): c for c in live}
                missing = [p for p in wanted if p not in by_pair]
                if missing:
                    raise WorldError("conflict", f"not connected: {', '.join(f'{i}->{e}' for i, e in missing)}")
                chosen = [by_pair[p] for p in wanted]
            for c in chosen:
                c.removed_ns = t
                self._touch(c.egress)
                if self._current.get(c.ingress) is c:
                    del self._current[c.ingress]
                self._last_change_ns = max(self._last_change_ns, t)
                was_lit = c.lit_ns <= t
                if not was_lit:  # removed while its beam was still moving
                    self.events = [e for e in self.events
                                   if not (e.kind == "circuit.lit" and e.subject == f"{c.ingress}->{c.egress}"
                                           and e.t_ns == c.lit_ns)]
                self.events.append(WorldEvent(t, "circuit.dark", f"{c.ingress}->{c.egress}",
                                               {"ingress": c.ingress, "egress": c.egress, "was_lit": was_lit}))
                self._note_protected(t, c.ingress, c.egress)
            self.record(t, "switch.command", "disconnect", pairs=[(c.ingress, c.egress) for c in chosen])

    def replace_all(self, pairs: Iterable[tuple[int, int]], t_ns: int | None = None) -> int:
        """Make the given connections the only ones; unchanged ones are not touched."""
        pairs = list(pairs)
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._check_pairs(pairs)
            wanted = set(pairs)
            current = {(c.ingress, c.egress) for c in self.live_circuits(t)}
            stale = current - wanted
            if stale:
                self.disconnect(sorted(stale), t)
            return self.connect(sorted(wanted - current), t)

    def _check_pairs(self, pairs: list[tuple[int, int]]) -> None:
        ins = [i for i, _ in pairs]
        outs = [e for _, e in pairs]
        for port in ins:
            if port not in self.ingress_ports:
                raise WorldError("range", f"{port} is not an ingress port")
        for port in outs:
            if port not in self.egress_ports:
                raise WorldError("range", f"{port} is not an egress port")
        if len(set(ins)) != len(ins) or len(set(outs)) != len(outs):
            raise WorldError("argument", "a port appears twice in one request")

    def _note_protected(self, t: int, *ports: int) -> None:
        touched = sorted(set(ports) & self.protected_ports)
        if touched:
            violation = WorldEvent(t, "safety.violation", "protected port switched", {"ports": touched})
            self.events.append(violation)
            self.violations.append(violation)

    # -- ports, losses and sources --------------------------------------------------------------

    def set_port_state(self, port: int, state: str, t_ns: int | None = None) -> None:
        """'E' enabled, 'D' disabled (shutter closed), 'F' failed."""
        if port not in self.ingress_ports and port not in self.egress_ports:
            raise WorldError("range", f"{port} is not a port of the switch")
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._port_state.setdefault(port, _History("E")).set(t, state)
            self._touch(port)
            self.record(t, "port.state", str(port), state=state)

    def port_state(self, port: int, t_ns: int | None = None) -> str:
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            hist = self._port_state.get(port)
            return hist.at(t) if hist else "E"

    def set_extra_loss(self, port: int, loss_db: float, t_ns: int | None = None) -> None:
        """Extra loss on the fibre at a switch port (a bend, a dirty connector; inf is a cut)."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._extra_loss.setdefault(port, _History(0.0)).set(t, loss_db)
            self._touch(port)
            self.record(t, "loss", str(port), extra_db=loss_db)

    def set_source(self, ingress: int, on: bool, t_ns: int | None = None) -> None:
        """Switch a transmitter's laser on or off (a host powering down, say)."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._source_on.setdefault(ingress, _History(True)).set(t, on)
            self._touch(ingress)
            self.record(t, "source", str(ingress), on=on)

    def set_transmitter(self, host: str, nic: str, on: bool) -> int:
        """A host turns one NIC's transmitter off or on (its laser: what a host's agent does for
        the fibre walk); the light goes out, or comes back, at the port its fibre really lands on."""
        spec, _ = self._nic(host, nic)
        t = self.now_ns()
        self.set_source(spec.tx_port, bool(on), t)
        return t

    def heal(self) -> None:
        """Every fault undone: failed GPUs repaired, ports enabled, extra losses gone (the
        defects of the bench, its damaged connectors, stay)."""
        with self.lock:
            t = self.now_ns()
            for (host, index), gpu in self.gpus.items():
                if gpu.failed_ns is not None:
                    self.repair_gpu(host, index)
            for port, hist in self._port_state.items():
                if hist.at(t) != "E":
                    self.set_port_state(port, "E", t)
            for port, hist in self._extra_loss.items():
                if hist.at(t) != 0.0:
                    self.set_extra_loss(port, 0.0, t)

    def _touch(self, port: int) -> None:
        """The light at ``port`` changed (or, at an ingress, at every egress it has fed)."""
        self._light_version += 1
        for egress in {port} | {c.egress for c in self._by_ingress.get(port, ())}:
            self._port_versions[egress] = self._port_versions.get(egress, 0) + 1

    def _version_of(self, rx_port: int) -> int:
        # With crosstalk a dark port sees every lit path: any change anywhere matters.
        return self._light_version if self.crosstalk_db is not None else self._port_versions.get(rx_port, 0)

    def _extra(self, port: int, t: int) -> float:
        hist = self._extra_loss.get(port)
        return (hist.at(t) if hist else 0.0) + self.port_loss_db.get(port, 0.0)

    # -- light ----------------------------------------------------------------------------------

    def port_power_dbm(self, port: int, t_ns: int | None = None) -> float | None:
        """Optical power at a switch port at instant t, or None when it is dark.

        Ingress: what arrives from the transmitter. Egress: what leaves the switch towards the
        receiver, after the switch's insertion loss and the connectors."""
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            if port in self.ingress_ports:
                return self._ingress_power(port, t)
            if port not in self.egress_ports or self.port_state(port, t) != "E":
                return None
            circuit = self._lit_into(port, t)
            if circuit is None:
                return self._crosstalk_dbm(port, t)
            if self.port_state(circuit.ingress, t) != "E":
                return None
            arriving = self._ingress_power(circuit.ingress, t)
            if arriving is None:
                return None
            power = arriving - self.insertion_loss_db - self.connection_loss_db.get((circuit.ingress, port), 0.0) \
                - self.connector_loss_db - self._extra(port, t)
            return None if math.isinf(power) else power

    def _lit_into(self, egress: int, t: int) -> Circuit | None:
        """The circuit lighting an egress port at t (the newest first: history is long)."""
        for c in reversed(self._by_egress.get(egress, ())):
            if c.lit_at(t):
                return c
        return None

    def _crosstalk_dbm(self, egress: int, t: int) -> float | None:
        """A dark egress port's leak from every lit path, ``crosstalk_db`` down (a defect)."""
        if self.crosstalk_db is None:
            return None
        leaking = [self._ingress_power(c.ingress, t) for c in self.circuits if c.lit_at(t)]
        total_mw = sum(10 ** (p / 10) for p in leaking if p is not None)
        if total_mw <= 0:
            return None
        power = 10 * math.log10(total_mw) + self.crosstalk_db - self.insertion_loss_db - self._extra(egress, t)
        return None if math.isinf(power) else power

    def _ingress_power(self, port: int, t: int) -> float | None:
        source = self.sources.get(port)
        if source is None:
            return None
        on = self._source_on.get(port)
        if on is not None and not on.at(t):
            return None
        power = source.launch_dbm - source.tx_fibre_loss_db - self._extra(port, t)
        return None if math.isinf(power) else power

    def received_dbm(self, egress: int, t_ns: int | None = None) -> float | None:
        """Power at the receiver fed by an egress port (after its receive fibre)."""
        power = self.port_power_dbm(egress, t_ns)
        sink = self.sinks.get(egress)
        if power is None or sink is None:
            return power
        return power - sink.rx_fibre_loss_db

    def wavelength_at(self, port: int, t_ns: int | None = None) -> float | None:
        """Wavelength of the light at a port (None when dark)."""
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            if port in self.sources:
                return self.sources[port].wavelength_nm
            circuit = self._lit_into(port, t)
            return self.sources[circuit.ingress].wavelength_nm if circuit and circuit.ingress in self.sources else None

    def mean_power_mw(self, port: int, t0_ns: int, t1_ns: int, samples: int = 32) -> float:
        """Mean optical power over [t0, t1] in mW (what an averaging detector integrates);
        dark counts as zero."""
        if t1_ns <= t0_ns:
            power = self.port_power_dbm(port, t0_ns)
            return 0.0 if power is None else 10 ** (power / 10)
        step = (t1_ns - t0_ns) / samples
        total = 0.0
        for i in range(samples):
            power = self.port_power_dbm(port, int(t0_ns + (i + 0.5) * step))
            total += 0.0 if power is None else 10 ** (power / 10)
        return total / samples

    def light_changes(self, port: int, since_ns: int) -> list[int]:
        """Instants after ``since_ns`` at which the light at a port may change (known so far)."""
        with self.lock:
            out: set[int] = set()
            for c in self._by_ingress.get(port, []) + self._by_egress.get(port, []):
                out.update(x for x in (c.lit_ns, c.removed_ns) if x is not None and x > since_ns)
            return sorted(out)

    # -- GPUs -----------------------------------------------------------------------------------

    def fail_gpu(self, host: str, index: int = 0, xid: int = 79, t_ns: int | None = None) -> WorldEvent:
        """A GPU fails (XID 79: fell off the bus; 48: double-bit ECC; 13/31/43: application)."""
        with self.lock:
            gpu = self.gpus[(host, index)]
            t = self.now_ns() if t_ns is None else t_ns
            if xid in (79, 48):
                gpu.failed_ns = gpu.failed_ns or t
            if xid == 48:
                gpu.ecc_dbe += 1
                gpu.retired_pages += 1
            gpu.xid = xid
            event = WorldEvent(t, "gpu.xid", f"{host}/{index}", {"host": host, "index": index, "xid": xid,
                                                                  "uuid": gpu.uuid})
            self.events.append(event)
            self.gpu_events.append(event)
            self._notify()
            return event

    def repair_gpu(self, host: str, index: int = 0) -> None:
        """A replaced or reset GPU: healthy again from now on."""
        with self.lock:
            gpu = self.gpus[(host, index)]
            gpu.failed_ns = gpu.xid = None
            self.record(self.now_ns(), "gpu.repaired", f"{host}/{index}")

    def gpu_failed(self, host: str, index: int = 0, t_ns: int | None = None) -> bool:
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            gpu = self.gpus[(host, index)]
            return gpu.failed_ns is not None and gpu.failed_ns <= t

    def corrupts_data(self, host: str) -> bool:
        """A GPU that computes wrong results without reporting an error (silent data corruption)."""
        return host in self.hosts and self.hosts[host].emulation.silent_data_corruption

    def host_failed(self, host: str, t_ns: int | None = None) -> bool:
        return any(self.gpu_failed(h, i, t_ns) for (h, i) in self.gpus if h == host)

    # -- NIC links: dark -> light -> locked -> up, following the light at the receiver ----------

    def _instants(self, rx_port: int, t: int | None = None, after: int | None = None) -> list[int]:
        """Every instant in (after, t] (either end open when None) at which the light reaching
        ``rx_port`` may have changed: its circuits coming and going, and anything at their
        ingress or at the port. Only the history inside the window is read."""
        lo = -1 if after is None else after
        out = {0} if lo < 0 else set()
        ports = {rx_port}
        for c in reversed(self._by_egress.get(rx_port, ())):
            ports.add(c.ingress)
            out.update(x for x in (c.commanded_ns, c.lit_ns, c.removed_ns) if x is not None and x > lo)
            if c.commanded_ns <= lo and c.removed_ns is not None and c.removed_ns <= lo:
                break  # one egress carries one circuit at a time: every earlier one ended before this one
        for histories in (self._extra_loss, self._port_state, self._source_on):
            for port in ports:
                hist = histories.get(port)
                if hist is not None:
                    times = hist._times
                    out.update(x for x in times[bisect.bisect_right(times, lo):] if x >= 0)
        return sorted(x for x in out if t is None or x <= t)

    def _nic(self, host: str, nic: str):
        for n in self.hosts[host].nics:
            if n.name == nic:
                return n, self.hosts[host].emulation
        raise WorldError("argument", f"host {host} has no NIC {nic}")

    def _receiving(self, rx_port: int, t: int) -> bool:
        power = self.received_dbm(rx_port, t)
        return power is not None and power >= self.sinks[rx_port].sensitivity_dbm

    def _receiving_since(self, rx_port: int, t: int) -> tuple[bool, int]:
        """Whether the receiver has light at t, and since when. Kept until the light's history
        changes or the next planned instant comes (it is asked for every link, every step)."""
        version = self._version_of(rx_port)
        cached = self._since_cache.get(rx_port)
        if cached is not None and cached[0] == version and cached[1] <= t < cached[2]:
            return cached[3], cached[4]
        upcoming = next(iter(self._instants(rx_port, after=t)), 2**63)
        receiving = self._receiving(rx_port, t)
        since, hi, width, done = 0, t, 2**30, False
        while not done:  # walk back through ever wider windows until the state differs
            lo = hi - width if hi - width > 0 else None
            for inst in reversed(self._instants(rx_port, hi, after=lo)):
                if inst > t:
                    continue
                if self._receiving(rx_port, inst) != receiving:
                    done = True
                    break
                since = inst
            if lo is None:
                break
            hi, width = lo, width * 2
        self._since_cache[rx_port] = (version, t, upcoming, receiving, since)
        return receiving, since

    def _bringup(self, emu) -> tuple[int, int, int, int]:
        """(lock, up, hold, flaps) in ns: a flapping link comes up for ``hold`` (as long as a lock
        and bring-up: assumption), drops, and relocks, ``flaps`` times before it stays up."""
        lock_ns, up_ns = self.scaled_ns(emu.lock_time_s), self.scaled_ns(emu.link_up_time_s)
        return lock_ns, up_ns, lock_ns + up_ns, emu.link_flaps

    def _schedule(self, since: int, emu) -> list[tuple[int, str]]:
        """The (instant, state) a link goes through once light arrives at ``since``."""
        lock_ns, up_ns, hold_ns, flaps = self._bringup(emu)
        out, start = [], since
        for _ in range(flaps):
            out += [(start, "light"), (start + lock_ns, "locked"), (start + lock_ns + up_ns, "up")]
            start += lock_ns + up_ns + hold_ns
        return out + [(start, "light"), (start + lock_ns, "locked"), (start + lock_ns + up_ns, "up")]

    def link_state(self, host: str, nic: str, t_ns: int | None = None) -> tuple[str, int]:
        """(state, since_ns): the NIC's link state at t and when that state began."""
        t = self.now_ns() if t_ns is None else t_ns
        spec, emu = self._nic(host, nic)
        with self.lock:
            receiving, since = self._receiving_since(spec.rx_port, t)
            if not receiving:
                return "dark", since
            current = ("light", since)
            for instant, state in self._schedule(since, emu):
                if instant > t:
                    break
                current = (state, instant)
            return current[0], current[1]

    def link_transitions(self, host: str, nic: str, t_ns: int | None = None) -> list[tuple[int, str]]:
        """Every (instant, state) the link went through, up to t. What was worked out for an
        earlier t is kept and only the time since is examined (history is made at the present,
        never inserted into the past)."""
        t = self.now_ns() if t_ns is None else t_ns
        spec, emu = self._nic(host, nic)
        with self.lock:
            upto, out = self._transitions.get((host, nic), (-1, []))
            if t < upto:
                upto, out = -1, []  # asked about the past: work it out afresh
            out = list(out)
            lock_ns, up_ns, hold_ns, flaps = self._bringup(emu)
            reach = (flaps + 1) * (lock_ns + up_ns + hold_ns)  # how far after a light change it still acts
            candidates = set(self._instants(spec.rx_port, t, after=None if upto < 0 else upto - reach))
            for inst in list(candidates):
                candidates.update(x for x, _ in self._schedule(inst, emu) if x <= t)
            for inst in sorted(c for c in candidates if c > upto):
                state, since = self.link_state(host, nic, inst)
                if not out or out[-1][1] != state:
                    out.append((since, state))
            if t <= self.now_ns():
                self._transitions[(host, nic)] = (t, out)
            return list(out)

    def carrier_counters(self, host: str, nic: str, t_ns: int | None = None) -> dict[str, int]:
        spec, _ = self._nic(host, nic)
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns  # (under the lock: see optical_fabric)
            # Kept while the light at the receiver is as it was and no change is due: a host
            # reads its counters with every look at its links.
            version = self._version_of(spec.rx_port)
            cached = self._counters.get((host, nic))
            if t_ns is None and cached is not None and cached[0] == version and cached[1] <= t < cached[2]:
                return dict(cached[3])
            states = [s for _, s in self.link_transitions(host, nic, t)]
            ups = sum(1 for a, b in zip(["dark"] + states, states) if b == "up" and a != "up")
            downs = sum(1 for a, b in zip(states, states[1:]) if a == "up" and b != "up")
            counters = {"carrier_up_count": ups, "carrier_down_count": downs, "carrier_changes": ups + downs}
            if t_ns is None:
                upcoming = self.next_link_change_ns(host, nic, t)
                self._counters[(host, nic)] = (version, t, 2**63 if upcoming is None else upcoming, counters)
            return dict(counters)

    def next_link_change_ns(self, host: str, nic: str, t_ns: int | None = None) -> int | None:
        """The next instant the link state may change on its own (lock, up, a flap, or a
        settling beam)."""
        t = self.now_ns() if t_ns is None else t_ns
        spec, emu = self._nic(host, nic)
        with self.lock:
            candidates = [c.lit_ns for c in self._by_egress.get(spec.rx_port, ()) if c.lit_ns > t]
            receiving, since = self._receiving_since(spec.rx_port, t)
            if receiving:
                candidates += [x for x, _ in self._schedule(since, emu) if x > t][:1]
        return min(candidates) if candidates else None

    # -- fabrics: what a collective costs over the light that is up now ------------------------

    def fabric_name(self, socket_ifname: str | None) -> str:
        """Which fabric a job's traffic takes: the electrical rack when NCCL_SOCKET_IFNAME names
        its interface, else the optical circuits."""
        electrical = self.bench.electrical
        names = {n.strip() for n in (socket_ifname or "").split(",") if n.strip()}
        return "electrical" if electrical is not None and electrical.interface in names else "optical"

    def optical_fabric(self, t_ns: int | None = None) -> Fabric:
        """One link per ordered host pair: every lit circuit from the first host's transmitters
        to the second's receivers whose receiving link is up, their rates added (NCCL spreads
        over several NICs). Kept until the light changes or the next instant one of those
        links, or a beam still settling, is due to change (every step of a job asks for it)."""
        with self.lock:
            # "Now" read under the lock: a command that got the lock first is in the past of it
            # (read before, the fabric of an instant before a change would be kept after it).
            t = self.now_ns() if t_ns is None else t_ns
            cached = self._fabric_cache
            if t_ns is None and cached is not None and cached[0] == self._light_version and cached[1] <= t < cached[2]:
                return cached[3]
            latency = self.bench.collectives.optical_hop_latency_us.value
            links: dict = {}
            until = 2**63
            for c in self.live_circuits(t):
                if c.ingress not in self.sources or c.egress not in self.sinks:
                    continue
                a, a_nic = self.sources[c.ingress].owner.split(".", 1)
                b, b_nic = self.sinks[c.egress].owner.split(".", 1)
                upcoming = self.next_link_change_ns(b, b_nic, t)
                if upcoming is not None:
                    until = min(until, upcoming)
                if not c.lit_at(t) or self.link_state(b, b_nic, t)[0] != "up":
                    continue
                tx, rx = self._nic(a, a_nic)[0], self._nic(b, b_nic)[0]
                rate = min(tx.rate_gbps * self.hosts[a].emulation.link_rate_factor,
                           rx.rate_gbps * self.hosts[b].emulation.link_rate_factor)
                old = links.get(("optical", a, b))
                links[("optical", a, b)] = Link((old.capacity_gbps if old else 0.0) + rate, latency)
            fabric = Fabric(links, lambda x, y: (("optical", x, y),) if ("optical", x, y) in links else None)
            if t_ns is None:  # (an instant asked about is worked out, never kept)
                self._fabric_cache = (self._light_version, t, until, fabric)
            return fabric

    def electrical_fabric(self, ranks: list[str]) -> Fabric:
        """Each server's NIC to its rack's packet switch; traffic to another rack crosses the
        rack's uplink, which under load gives each server 1/oversubscription of its NIC rate
        each way (assumption: every server of the rack is busy). Hosts of the reserved rack
        (the migration baseline) are in a rack of their own."""
        rack = self.bench.electrical
        if rack is None:
            raise WorldError("argument", f"bench {self.bench.name!r} has no electrical section")
        return rack_fabric(set(self.hosts) | set(ranks), rack.nic_gbps.value, rack.hop_latency_us.value,
                           rack.oversubscription.value, rack.rack_of)

    def collective_cost(self, collective: str, ranks: list[str], size_bytes: int, fabric: str = "optical",
                        t_ns: int | None = None) -> Cost:
        """The physical time of one collective now (unscaled). Raises NoPath when two ranks that
        must talk have no link up between them. The same collective on the same fabric costs
        the same: the last answers are kept (every rank asks at every step)."""
        settings = self.bench.collectives
        key = (fabric, collective, tuple(ranks), size_bytes)
        net = None if fabric == "electrical" else self.optical_fabric(t_ns)  # the electrical rack never changes
        with self.lock:
            known = self._costs.get(key)
            if known is not None and known[0] is net:
                return known[1]
        if net is None:
            net = self.electrical_fabric(ranks)
        cost = collective_cost(collective, ranks, size_bytes, net, step_latency_us=settings.step_latency_us.value,
                               rings=settings.rings)
        with self.lock:
            if len(self._costs) > 64:
                self._costs.clear()
            self._costs[key] = (None if fabric == "electrical" else net, cost)
        return cost

    def next_change_ns(self, t_ns: int | None = None) -> int | None:
        """The next instant the world changes on its own, with no command: a beam settling, a
        link locking, coming up or flapping."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            # Kept while the light is as it was: from the instant it was worked out until the
            # change it found, nothing else happens on its own (every stalled rank asks it).
            kept = self._next_change
            if kept is not None and kept[0] == self._light_version and kept[1] <= t < kept[2]:
                return kept[3]
            instants = [self.next_link_change_ns(h.name, n.name, t) for h, n in self.bench.nic_ports()]
            nxt = min((x for x in instants if x is not None), default=None)
            if t >= self._changed_ns:  # (an instant before the last change is worked out, never kept)
                self._next_change = (self._light_version, t, 2**63 if nxt is None else nxt, nxt)
            return nxt

    def wait_for_change(self, timeout_s: float, since_ns: int | None = None) -> None:
        """Until something changes: a command, a fault, or a change the world makes on its own
        (woken at its instant, not at the timeout). ``since_ns``: when the caller last looked;
        a change since then, one it may have missed, ends the wait at once."""
        with self.lock:
            now = self.now_ns()
            since = now if since_ns is None else since_ns
            nxt = self.next_change_ns(since)
            if self._changed_ns > since or (nxt is not None and nxt <= now):
                return
            if nxt is not None:
                timeout_s = min(timeout_s, max(0.0, (nxt - now) / 1e9) + 5e-5)
            self.changed.wait(timeout_s)

    # -- the migration baseline: a checkpoint copied to a reserved rack outside the fabric ------

    def transfer_checkpoint(self, checkpoint_bytes: float, network_gbps: float, scheduling_s: float) -> int:
        """Claim a reserved rack and copy the checkpoint to it; returns when it is restored
        (the emulated duration of scheduling plus the copy), with the instant recorded."""
        start = self.now_ns()
        done = start + self.scaled_ns(scheduling_s + checkpoint_bytes * 8 / (network_gbps * 1e9))
        self.record(start, "migration.start", "reserved-rack", bytes=checkpoint_bytes)
        with self.lock:
            while self.now_ns() < done:
                self.changed.wait((done - self.now_ns()) / 1e9)  # the copy takes this long
        self.record(done, "migration.restored", "reserved-rack")
        return done
