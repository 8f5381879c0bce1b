"""The namespaced bench's data plane: the rack (rack.py) kept where the emulated world's physics
says it is. Circuits are bridged while lit both ways, each NIC's carrier follows the world's
link state machine, and each change is recorded in the world as the ground truth the agent's
own timestamps are judged against."""

from __future__ import annotations

import threading


class DataPlane:
    """Keeps the rack's data plane where the world's physics says it is: a NIC pair joined
    (bridged) while the circuits both ways between them are lit, each NIC's carrier up while
    the world's link state machine says up. Each carrier change is recorded in the world
    (``netns.carrier``) at the instant its netlink request was sent, with the instant the kernel
    acknowledged it (``acked_ns``; the same clock): the change happened between the two. That is
    the ground truth the agent's netlink stamps are judged against."""

    def __init__(self, world, rack, bench):
        self.world, self.rack, self.bench = world, rack, bench
        self.nics = [(h.name, n.name) for h, n in bench.nic_ports()]
        self.tx_owner = {n.tx_port: (h.name, n.name) for h, n in bench.nic_ports()}
        self.rx_owner = {n.rx_port: (h.name, n.name) for h, n in bench.nic_ports()}
        self.carrier: dict[tuple[str, str], bool] = {nic: False for nic in self.nics}
        self.joined: set[frozenset] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="netns-data-plane")

    def start(self) -> "DataPlane":
        self.apply()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.world.lock:
            self.world.changed.notify_all()
        self._thread.join(timeout=5)

    def wanted(self) -> tuple[dict, set, int | None]:
        """(carrier per NIC, NIC pairs to join, the next instant either may change), at now."""
        world = self.world
        with world.lock:
            t = world.now_ns()
            carrier = {(h, n): world.link_state(h, n, t)[0] == "up" for h, n in self.nics}
            lit = {(self.tx_owner[c.ingress], self.rx_owner[c.egress]) for c in world.live_circuits(t)
                   if c.lit_at(t) and c.ingress in self.tx_owner and c.egress in self.rx_owner}
            pairs = {frozenset((a, b)) for a, b in lit if a != b and (b, a) in lit}
            upcoming = [x for x in (world.next_link_change_ns(h, n, t) for h, n in self.nics) if x is not None]
            upcoming += [c.lit_ns for c in world.live_circuits(t) if c.lit_ns > t]
        return carrier, pairs, min(upcoming) if upcoming else None

    def apply(self) -> None:
        carrier, pairs, _ = self.wanted()
        self._apply(carrier, pairs)

    def _apply(self, carrier: dict, pairs: set) -> None:
        """Carriers that go down first (the light has gone), then the circuits, then the
        carriers that come up (over the circuits as they now are)."""
        self._set_carriers({nic: up for nic, up in carrier.items() if not up})
        for pair in self.joined - pairs:
            self.rack.part(*sorted(pair))
        for pair in pairs - self.joined:
            self.rack.join(*sorted(pair))
        if pairs != self.joined:  # the hosts' routes to each other's fabric address follow the circuits
            self.rack.set_fabric_routes(pairs)
        self.joined = set(pairs)
        self._set_carriers({nic: up for nic, up in carrier.items() if up})

    def _set_carriers(self, carrier: dict) -> None:
        for nic, up in carrier.items():
            if up != self.carrier[nic]:
                sent = self.world.now_ns()
                acked = self.rack.set_carrier(nic[0], nic[1], up)  # the kernel changed it in between
                self.carrier[nic] = up
                self.world.record(sent, "netns.carrier", f"{nic[0]}.{nic[1]}", up=up, acked_ns=acked)

    def _stamp(self) -> tuple[int, int]:
        """What moves when the world changes (light, or a recorded event such as a switch command)."""
        with self.world.lock:
            return self.world.light_version, len(self.world.events)

    def _run(self) -> None:
        world = self.world
        while not self._stop.is_set():
            stamp = self._stamp()
            carrier, pairs, upcoming = self.wanted()
            self._apply(carrier, pairs)
            with world.lock:
                if self._stop.is_set():
                    return
                if self._stamp() != stamp:
                    continue  # the world changed while we applied the last state: no wake-up is owed
                wait = 1.0 if upcoming is None else max(0.0, (upcoming - world.now_ns()) / 1e9)
                if wait > 0:
                    world.changed.wait(min(wait, 1.0))
