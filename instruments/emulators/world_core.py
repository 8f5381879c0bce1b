"""The emulated world's state and clock (:class:`WorldCore`): the bench as it is really wired
(:func:`as_wired`), its lock and change conditions, every history the parts of
:class:`~lumion_hil.instruments.emulators.world.World` read and write (circuits and their indexes,
ports, losses, sources, GPUs, the caches), the event log, and the versions of the light that
say when an answer worked out from it still holds."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from lumion_hil.instruments.emulators.world_types import (
    Circuit,
    GpuState,
    History,
    Sink,
    Source,
    WorldError,
    WorldEvent,
)


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


class WorldCore:
    """What every part of the world shares: its state over time, its clock and its event log."""

    def __init__(self, bench: Any, clock_ns=time.perf_counter_ns):
        self.bench = bench = as_wired(bench)
        self.now_ns = clock_ns
        self.time_scale = bench.emulator.time_scale
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # anything recorded: light, GPUs, the jobs' events
        # What a host's links and NVML wait on, each woken by its own news only: the light at
        # one receiving port (by port), one host's GPU events (by host). Woken all at every
        # change, a dozen waits on other hosts' links woke for each one and went back to sleep.
        self._light_waits: dict[int, threading.Condition] = {}
        self._gpu_waits: dict[str, threading.Condition] = {}
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
        self.sources: dict[int, Source] = {}
        self.sinks: dict[int, Sink] = {}
        for host, nic in bench.nic_ports():
            owner = f"{host.name}.{nic.name}"
            self.sources[nic.tx_port] = Source(nic.launch_dbm, nic.tx_fibre_loss_db, owner, nic.wavelength_nm)
            self.sinks[nic.rx_port] = Sink(nic.rx_fibre_loss_db, owner, host.emulation.receiver_sensitivity_dbm)
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
        self._extra_loss: dict[int, History] = {}
        self._port_state: dict[int, History] = {}
        self._source_on: dict[int, History] = {}
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
        self._counted: dict[tuple[str, str], tuple] = {}  # (host, nic) -> (its history, entries counted, ups, downs)
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

    def _notify(self) -> None:
        """Wake every wait for a change (under the lock)."""
        self._changed_ns = self.now_ns()
        self.changed.notify_all()

    def record(self, t_ns: int, kind: str, subject: str, **detail) -> None:
        with self.lock:
            self.events.append(WorldEvent(t_ns, kind, subject, detail))
            self._notify()

    def light_wait(self, rx_port: int) -> threading.Condition:
        """What a wait on the light at a receiving port (a link's state) waits on, under the
        world's lock: woken by every change to that light. Changes the world makes on its own
        (a beam settling, a link locking) are planned: a wait is timed to the next one."""
        with self.lock:
            return self._light_waits.setdefault(rx_port, threading.Condition(self.lock))

    def gpu_wait(self, host: str) -> threading.Condition:
        """What a wait for a host's next GPU event waits on, under the world's lock."""
        with self.lock:
            return self._gpu_waits.setdefault(host, threading.Condition(self.lock))

    def events_of(self, kind: str, subject: str | None = None) -> list[WorldEvent]:
        with self.lock:
            return sorted(
                (e for e in self.events if e.kind == kind and (subject is None or e.subject == subject)),
                key=lambda e: e.t_ns,
            )

    def _circuits_at(self, t: int):
        """The circuits that may be in place at t (under the lock): those not yet removed, where t
        is at or after the last circuit made or removed; else every circuit ever made."""
        return self._current.values() if t >= self._last_change_ns else self.circuits

    # -- versions of the light: what an answer worked out from it was worked out at ------------

    def _touch(self, port: int) -> None:
        """The light at ``port`` changed (or, at an ingress, at every egress it has fed)."""
        self._light_version += 1
        touched = {port} | {c.egress for c in self._by_ingress.get(port, ())}
        for egress in touched:
            self._port_versions[egress] = self._port_versions.get(egress, 0) + 1
        # With crosstalk a dark port sees every lit path (as _version_of): every wait is news.
        for egress in (self._light_waits if self.crosstalk_db is not None else touched & self._light_waits.keys()):
            self._light_waits[egress].notify_all()

    def _version_of(self, rx_port: int) -> int:
        # With crosstalk a dark port sees every lit path: any change anywhere matters.
        return self._light_version if self.crosstalk_db is not None else self._port_versions.get(rx_port, 0)

    # -- the bench's NICs -----------------------------------------------------------------------

    def _nic(self, host: str, nic: str):
        for n in self.hosts[host].nics:
            if n.name == nic:
                return n, self.hosts[host].emulation
        raise WorldError("argument", f"host {host} has no NIC {nic}")
