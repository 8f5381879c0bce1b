"""The fibre walk: where each NIC's fibres land on the switch, found by light and carrier.

Transmitters: each NIC's transmitter is turned off and on again through its host's agent, one
at a time, while the switch's power monitors watch every ingress port; the one port whose light
went out is where that NIC's transmit fibre lands. A switch without monitors is watched through a
meter instead: each ingress port in turn is connected to the egress port a meter taps. Receivers: with every circuit this bench may
switch removed, one lit ingress is connected to one candidate egress port at a time, and the NIC
whose carrier comes up (as its agent sees it) is the one whose receive fibre comes from that
port. The meters' channels are read at each step too: the one that lights up taps that port.

It talks to the bench only as a run does: the guarded switch (protected ports and another
bench's are never commanded), the drivers' monitors and meters, the agents. It never reads the
bench file's ports to find an answer, only to choose which port to try first.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from lumion_hil.instruments.gpu_host.replies import LinkState
from typing import Callable

from lumion_hil.harness.errors import HarnessError
from lumion_hil.harness.interrupts import critical
from lumion_hil.instruments.protocols import InstrumentError

# A port whose light fell (or rose) by this much changed: 10GBASE-LR's weakest transmitter
# (-8.2 dBm) is still some 40 dB above a monitor's or a meter's dark reading.
CHANGE_DB = 10.0
# How often the switch's monitors and the hosts' links are read while waiting for a change:
# they announce nothing, so this is polling (the agent's own waits are per interface).
POLL_S = 0.002
DARK_DBM = -200.0  # what a reading that is not a number (under range, no light) counts as


class WalkError(HarnessError):
    """The walk cannot be done on this bench (and why)."""


@dataclass(frozen=True)
class WalkedNic:
    """A NIC port the walk looks for: its host, its name in the bench file, the host's interface
    for it, and where the bench file says its fibres land (None: nothing said)."""

    host: str
    nic: str
    interface: str
    tx_port: int | None = None
    rx_port: int | None = None

    @property
    def key(self) -> str:
        return f"{self.host}.{self.nic}"


@dataclass(frozen=True)
class Transmitter:
    port: int  # the ingress port its light arrives on
    input_dbm: float | None  # the light there, as the switch's monitor read it (None: no monitor)


@dataclass(frozen=True)
class Receiver:
    port: int  # the egress port its light comes from
    via: int  # the ingress port that lit it
    carrier_after_s: float  # from the circuit's completion to carrier up as its agent saw it
    speed_mbps: int | None = None  # the link's rate once up, as the host's kernel reports it


@dataclass(frozen=True)
class Tap:
    instrument: str
    channel: int
    port: int  # the egress port whose light this meter channel sees
    tap_loss_db: float | None  # the switch's monitor at that port less the meter (None: no monitor)


@dataclass
class FibreMap:
    """What the walk found, and what it could not find with the reason."""

    transmitters: dict[str, Transmitter] = field(default_factory=dict)
    receivers: dict[str, Receiver] = field(default_factory=dict)
    taps: list[Tap] = field(default_factory=list)
    not_found: dict[str, list[str]] = field(default_factory=dict)
    switching_s: list[float] = field(default_factory=list)  # each test circuit, command to completion
    duration_s: float = 0.0

    def missing(self, key: str, why: str) -> None:
        self.not_found.setdefault(key, []).append(why)


def dbm_or_dark(value) -> float:
    """A reading in dBm, or DARK_DBM for one that is not a number (under range, no light)."""
    return value if isinstance(value, float) and math.isfinite(value) else DARK_DBM


def _is_up(state: LinkState | None) -> bool:
    return state is not None and state.up


class _Walk:
    def __init__(self, session, nics: list[WalkedNic], log: Callable[[str], None]):
        self.session, self.bench, self.switch = session, session.bench, session.switch
        self.nics, self.log = nics, log
        self.found = FibreMap()
        self.has_monitors = self.switch.has_power_monitors
        # Without monitors, a meter watches the ingress under test through a test circuit to the
        # egress port it taps (the bench file's first meter detector on a port it may switch).
        self.probe = None if self.has_monitors else next(
            (d for d in self.bench.detectors if d.instrument in session.meters and self.switch.may_switch(d.port)),
            None)
        if not self.has_monitors and self.probe is None:
            raise WalkError(f"{self.switch.name} has no power monitors, and the bench file names no meter tap on a "
                            "port this bench may switch: the walk needs one or the other to see a transmitter's light")
        self.ingress = list(self.bench.switch.ingress_ports)
        self.egress = list(self.bench.switch.egress_ports)

    # -- readings ---------------------------------------------------------------------------------

    def monitors(self, ports: list[int]) -> dict[int, float]:
        return {p: dbm_or_dark(v) for p, v in self.switch.port_power_dbm(ports).items()}

    def meter_channels(self) -> dict[tuple[str, int], float]:
        return {(name, ch): dbm_or_dark(meter.read_dbm(ch)) for name, meter in self.session.meters.items()
                for ch in range(1, meter.channels + 1)}

    def links(self, nics: list[WalkedNic]) -> dict[str, LinkState]:
        """The link of each NIC, as its host's agent sees it now (one request a host)."""
        out = {}
        for host in sorted({n.host for n in nics}):
            states = {s.interface: s for s in self.session.hosts[host].links()}
            for n in nics:
                if n.host == host and n.interface in states:
                    out[n.key] = states[n.interface]
        return out

    def transmitter(self, nic: WalkedNic, on: bool) -> bool:
        """Turn a NIC's transmitter off or on; False (and the reason noted) where its host
        refused to turn it off (the interface its session or default route runs over)."""
        try:
            with critical():  # sent is answered: an off is never overtaken by the on that undoes it
                self.session.hosts[nic.host].set_transmitter(nic.interface, on)
        except InstrumentError as exc:
            if on:
                raise
            self.found.missing(nic.key, f"its transmitter could not be turned off: {exc.reason}")
            return False
        return True

    # -- transmitters -----------------------------------------------------------------------------

    def transmitters(self) -> None:
        if not self.has_monitors:
            self._transmitters_by_meter()
            return
        before = self.monitors(self.ingress)
        light_s = self.bench.waits.light_s
        for nic in self.nics:
            if nic.tx_port is not None and not self.switch.may_switch(nic.tx_port):
                self.found.missing(nic.key, f"not walked: the bench file puts its transmitter on port {nic.tx_port}, "
                                            "which this bench may not touch (protected, or another bench's)")
                continue
            if not self.transmitter(nic, False):
                continue
            try:
                deadline = time.monotonic() + light_s
                while True:
                    now = self.monitors(self.ingress)
                    dark = [p for p in self.ingress if before[p] - now[p] >= CHANGE_DB]
                    if dark or time.monotonic() > deadline:
                        break
                    time.sleep(POLL_S)
            finally:
                self.transmitter(nic, True)
            if len(dark) != 1:
                self.found.missing(nic.key, "no light went out at any ingress port within "
                                            f"{light_s:g} s of its transmitter being turned off (not on this switch, "
                                            "or a NIC that keeps its laser on when its interface is down)"
                                   if not dark else f"the light went out at ports {dark} at once: cannot tell which")
                continue
            port = dark[0]
            if not self.switch.may_switch(port):
                self.found.missing(nic.key, f"its transmitter feeds port {port}, which this bench may not touch "
                                            "(turned on again at once)")
                continue
            self.found.transmitters[nic.key] = Transmitter(port, before[port])
            self.log(f"transmitter {nic.key} ({nic.interface}): port {port}, {before[port]:.2f} dBm at the input")
            self._light_back(port, before[port], light_s)

    def _transmitters_by_meter(self) -> None:
        """A meter through a test circuit: each ingress port in turn (the bench file's transmit
        ports first) is connected to the egress the meter taps; where light arrives, the NIC the
        file puts there is turned off to see whether it goes out. Ports where it did not are
        tried again at the end with every NIC still to place (few, by then)."""
        det, switch = self.probe, self.switch
        assert det is not None  # __init__ refuses a switch without monitors and no meter tap
        meter = self.session.meters[det.instrument]

        def read() -> float:
            return dbm_or_dark(meter.read_dbm(det.channel))

        self._clear()
        dark = read()
        unplaced = [n for n in self.nics if n.tx_port is None or switch.may_switch(n.tx_port)]
        for nic in self.nics:
            if nic not in unplaced:
                self.found.missing(nic.key, f"not walked: the bench file puts its transmitter on port {nic.tx_port}, "
                                            "which this bench may not touch (protected, or another bench's)")
        claimed = [n.tx_port for n in unplaced if n.tx_port is not None]
        deferred = []
        for ingress in [p for p in dict.fromkeys(claimed + self.ingress) if switch.may_switch(p)]:
            if not unplaced:
                break
            owner = [n for n in unplaced if n.tx_port == ingress]
            if self._toggle_at(ingress, owner, read, dark, unplaced) is False:
                deferred.append((ingress, set(n.key for n in owner)))
        for ingress, tried in deferred:
            if unplaced:
                self._toggle_at(ingress, [n for n in unplaced if n.key not in tried], read, dark, unplaced)
        for nic in unplaced:
            self.found.missing(nic.key, f"its light reached {det.instrument} channel {det.channel} (port {det.port}) "
                                        "through no ingress port when it was turned off and on")

    def _toggle_at(self, ingress: int, candidates: list[WalkedNic], read, dark: float,
                   unplaced: list[WalkedNic]) -> bool | None:
        """With ``ingress`` connected to the meter's port: None if no light arrives there, else
        whether one of ``candidates`` (turned off one at a time) is the transmitter behind it."""
        det, light_s = self.probe, self.bench.waits.light_s
        assert det is not None  # only walked by meter, which __init__ made sure has a tap
        self.switch.connect([(ingress, det.port)])
        try:
            lit = read()
            if lit - dark < CHANGE_DB:
                return None
            for nic in candidates:
                if not self.transmitter(nic, False):
                    continue
                try:
                    deadline = time.monotonic() + light_s
                    while True:
                        gone = lit - read() >= CHANGE_DB
                        if gone or time.monotonic() >= deadline:
                            break
                        time.sleep(POLL_S)
                finally:
                    self.transmitter(nic, True)
                if not gone:
                    continue
                self.found.transmitters[nic.key] = Transmitter(ingress, None)
                unplaced.remove(nic)
                self.log(f"transmitter {nic.key} ({nic.interface}): port {ingress}, seen by {det.instrument} "
                         f"channel {det.channel} through port {det.port}")
                deadline = time.monotonic() + light_s
                while lit - read() >= CHANGE_DB / 2 and time.monotonic() < deadline:
                    time.sleep(POLL_S)
                return True
            return False
        finally:
            self.switch.disconnect([(ingress, det.port)])

    def _clear(self) -> dict[int, int]:
        """Every circuit this bench may switch removed; returns those it must leave (ingress -> egress)."""
        switch = self.switch
        current = switch.connections()
        kept = {i: e for i, e in current.items() if not (switch.may_switch(i) and switch.may_switch(e))}
        clear = sorted((i, e) for i, e in current.items() if i not in kept)
        if clear:
            switch.disconnect(clear)
        return kept

    def _light_back(self, port: int, was_dbm: float, light_s: float) -> None:
        deadline = time.monotonic() + light_s
        while self.monitors([port])[port] < was_dbm - CHANGE_DB / 2:
            if time.monotonic() > deadline:
                raise WalkError(f"the light at port {port} did not come back within {light_s:g} s of its "
                                "transmitter being turned on again")
            time.sleep(POLL_S)

    # -- receivers --------------------------------------------------------------------------------

    def receivers(self, only_lit: bool) -> None:
        switch = self.switch
        kept = self._clear()
        unknown = []
        for n in self.nics:
            if only_lit and n.key not in self.found.transmitters:
                continue  # not on this switch, as far as its light says: its receiver is not looked for
            if n.rx_port is not None and not switch.may_switch(n.rx_port):
                self.found.missing(n.key, f"receiver not walked: the bench file puts it on port {n.rx_port}, which "
                                          "this bench may not touch (protected, or another bench's)")
            else:
                unknown.append(n)
        sources = sorted((t for t in self.found.transmitters.values() if t.port not in kept),
                         key=lambda t: -(t.input_dbm if t.input_dbm is not None else DARK_DBM))
        if not sources:
            for n in unknown:
                self.found.missing(n.key, "receiver not walked: no transmitter was found on a port this bench may "
                                          "switch, so no light could be sent")
            return
        source = sources[0].port  # the brightest: every receiver can lock on it
        unknown = self._dark_first(unknown)
        if not unknown:
            return
        dark_meters = self.meter_channels()
        claimed = [n.rx_port for n in unknown if n.rx_port is not None]
        candidates = [p for p in dict.fromkeys(claimed + self.egress)
                      if p in self.egress and switch.may_switch(p) and p not in kept.values()]
        link_up_s = self.bench.waits.link_up_s
        for egress in candidates:
            if not unknown:
                break
            started = time.perf_counter()
            switch.connect([(source, egress)])
            self.found.switching_s.append(time.perf_counter() - started)
            settled_ns = time.perf_counter_ns()
            try:
                self._taps(egress, dark_meters)
                lit = self._first_up(unknown, settled_ns, link_up_s)
            finally:
                switch.disconnect([(source, egress)])
            if lit is not None:
                nic, after_s, speed = lit
                self.found.receivers[nic.key] = Receiver(egress, source, after_s, speed)
                unknown.remove(nic)
                self.log(f"receiver {nic.key} ({nic.interface}): port {egress}, carrier {after_s * 1e3:.0f} ms "
                         f"after light from port {source}")
        for n in unknown:
            self.found.missing(n.key, f"no carrier came up with light sent to any of ports {candidates} (each for "
                                      f"{link_up_s:g} s)")

    def _dark_first(self, unknown: list[WalkedNic]) -> list[WalkedNic]:
        """Wait for every NIC still to find to lose its carrier (its light is gone); one that
        keeps it is lit through a circuit this bench may not switch and cannot be told apart."""
        deadline = time.monotonic() + self.bench.waits.link_up_s
        while True:
            up = {k for k, s in self.links(unknown).items() if _is_up(s)}
            if not up or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        for n in unknown:
            if n.key in up:
                self.found.missing(n.key, "its carrier stays up with every circuit this bench may switch removed: "
                                          "it is lit through a protected port's circuit, or another bench's")
        return [n for n in unknown if n.key not in up]

    def _first_up(self, unknown: list[WalkedNic], since_ns: int, within_s: float):
        deadline = time.monotonic() + within_s
        while True:
            states = self.links(unknown)
            up = [n for n in unknown if _is_up(states.get(n.key))]
            if up:
                nic = up[0]
                seen = states[nic.key].t_ns or time.perf_counter_ns()
                return nic, max(0.0, (seen - since_ns) / 1e9), states[nic.key].speed_mbps
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)

    def _taps(self, egress: int, dark: dict[tuple[str, int], float]) -> None:
        if not dark or any(t.port == egress for t in self.found.taps):
            return
        now = self.meter_channels()
        lit = [key for key, value in now.items() if value - dark[key] >= CHANGE_DB]
        if not lit:
            return
        at_port = self.monitors([egress])[egress] if self.has_monitors else DARK_DBM
        for name, channel in lit:
            loss = at_port - now[(name, channel)] if at_port > DARK_DBM else None
            self.found.taps.append(Tap(name, channel, egress, loss))
            self.log(f"meter {name} channel {channel}: taps port {egress}"
                     + (f", {loss:.2f} dB below the switch's monitor" if loss is not None else ""))


def find_fibres(session, nics: list[WalkedNic], *, only_lit: bool = False,
                log: Callable[[str], None] = lambda _: None) -> FibreMap:
    """Walk the bench's fibres (see the module's doc). ``session`` is an open BenchSession:
    its lock or place is held, and closing it restores the baseline, whatever happened here.
    ``only_lit``: look for the receivers of the NICs whose transmitter was found only (a host's
    other interfaces, its management network say, are not on the switch)."""
    walk = _Walk(session, nics, log)
    started = time.perf_counter()
    with session.timeline.span("commissioning.transmitters", nics=len(nics)):
        walk.transmitters()
    with session.timeline.span("commissioning.receivers"):
        walk.receivers(only_lit)
    walk.found.duration_s = time.perf_counter() - started
    return walk.found


def nics_of(bench) -> list[WalkedNic]:
    """Every NIC port of a bench file, with where the file says its fibres land."""
    return [WalkedNic(h.name, n.name, n.interface or n.name, n.tx_port, n.rx_port) for h, n in bench.nic_ports()]
