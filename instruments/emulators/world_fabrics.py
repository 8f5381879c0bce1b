"""The world's fabrics (:class:`FabricMixin`): what a collective costs over the optical
circuits whose links are up now, or over the electrical rack; and the migration baseline, a
checkpoint copied to a reserved rack outside the fabric."""

from __future__ import annotations

from lumion_hil.instruments.collectives import Cost, Fabric, Link, collective_cost, rack_fabric
from lumion_hil.instruments.emulators.world_links import LinkMixin
from lumion_hil.instruments.emulators.world_switch import SwitchMixin
from lumion_hil.instruments.emulators.world_types import WorldError


class FabricMixin(LinkMixin, SwitchMixin):
    """Collectives' costs over the links that are up, and checkpoints copied off the fabric."""

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
