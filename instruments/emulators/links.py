"""An emulated host's links, as its agent reads them: the world's link state machine seen the
way a real host's kernel shows it (sysfs, netlink)."""

from __future__ import annotations

import time

from lumion_hil.instruments.gpu_host.links import SysfsLinks


class WorldLinks(SysfsLinks):
    """An emulated host's links, read the way a real host's are: carrier, operstate and counters
    as /sys/class/net shows them, woken by the link's changes as netlink would, and stamped
    with the agent's own clock when seen. The world's own instants are never handed over.
    Interface names are the bench's ``interface`` for each NIC port, or the port's name."""

    def __init__(self, world, host: str, interfaces: dict[str, str], clock_ns=time.monotonic_ns, latency_s: float = 0.0):
        self.world = world
        self.host = host
        self.nic_of = interfaces  # interface -> NIC name in the bench
        self.clock_ns = clock_ns
        self.latency_s = latency_s  # the emulated kernel's delay in telling the agent (a defect)
        self.dark: set[str] = set()

    def interfaces(self) -> list[str]:
        return sorted(self.nic_of)

    def _nic(self, interface: str) -> str:
        if interface not in self.nic_of:
            raise KeyError(f"no interface {interface!r} on {self.host}")
        return self.nic_of[interface]

    def state(self, interface: str) -> dict:
        return self._shown(interface, self.world.call("link", host=self.host, nic=self._nic(interface)))

    def states(self) -> list[dict]:
        """Every link at once (one question to the world, as one look at /sys/class/net)."""
        interfaces = self.interfaces()
        links = self.world.call("links", host=self.host, nics=[self._nic(i) for i in interfaces])
        return [self._shown(i, link) for i, link in zip(interfaces, links)]

    def _shown(self, interface: str, link: dict) -> dict:
        """What the host's kernel shows of a link, stamped when the agent read it."""
        return {"interface": interface, "carrier": link["carrier"], "operstate": link["operstate"],
                "t_ns": self.clock_ns(), **{k: link[k] for k in ("carrier_changes", "carrier_up_count",
                                                                   "carrier_down_count", "speed_mbps") if k in link}}

    def set_transmitter(self, interface: str, on: bool) -> dict:
        """The NIC's laser off or on: its light leaves (or comes back to) the fibre it is on."""
        self.world.call("set_transmitter", host=self.host, nic=self._nic(interface), on=bool(on))
        (self.dark.discard if on else self.dark.add)(interface)
        return {"interface": interface, "on": bool(on), "t_ns": self.clock_ns()}

    def wait(self, interface: str, up: bool, timeout_s: float) -> dict:
        """Until the link is up (or down), as netlink would wake a real host's agent: one
        question to the world a wait (its ``wait_link``), and with a late kernel (``latency_s``)
        a look again once the late news arrives."""
        deadline = time.monotonic() + timeout_s
        nic = self._nic(interface)
        first = True
        while True:
            seen = self.world.call("wait_link", host=self.host, nic=nic, up=bool(up),
                                   timeout_s=max(0.0, deadline - time.monotonic()))
            if self.latency_s and not seen["already"] and not seen["timed_out"]:
                time.sleep(self.latency_s)  # the notification comes late
                state = self.state(interface)
            else:
                state = self._shown(interface, seen["link"])
            if self.is_up(state) == up:
                return {**state, "timed_out": False, "method": "netlink", "already": first and seen["already"]}
            first = False
            if seen["timed_out"] or time.monotonic() >= deadline:
                return {**state, "timed_out": True, "method": "netlink"}
