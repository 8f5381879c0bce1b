"""What a rack in a box is made of (:class:`RackSpec`: hosts, their optical NICs, racks and
rates), and where each part of it sits: the names and addresses a rack gives its namespaces,
links and hosts (:class:`RackLayout`). The rack itself is built by
:class:`~lumion_hil.instruments.emulators.rack.Rack`.

Names (``P`` the prefix, ``k`` a host's index in the spec, ``j`` a NIC's index on its host,
``r`` a rack's index in order of first appearance):

- namespaces ``P-<host>``, ``P-sw`` (optical switch), ``P-tor`` (electrical), ``P-mgmt``;
- host ``k``, NIC ``j``: its ``ifname`` in ``P-<host>``, ``h<k>n<j>`` in ``P-sw``; a circuit is
  the bridge ``c<port>-<port>`` (e.g. ``ch0n0-h1n0``) in ``P-sw``;
- electrical: the host's ``electrical_ifname``, ``e<k>`` in ``P-tor`` in bridge ``rack<r>``;
  uplink ``up<r>`` (rack side) to ``sp<r>`` (spine side) in bridge ``spine``;
- management: ``mgmt0`` in each host, ``m<k>`` in ``P-mgmt`` in bridge ``br0``; the root
  namespace's one link ``P-m`` to ``gw`` in ``br0``. Far ends carry an alias naming what they
  stand for (``ip -n P-sw -d link``: ``alias gpu0/nic0``).

Addresses: optical 198.19.1.(8k+j+1)/24, electrical 198.19.2.(k+11)/24 (both only inside the
rack's namespaces, so every rack uses the same), management 198.18.N.(k+11)/24 with the root
end at 198.18.N.1, N the first /24 of 198.18.0.0/16 that no root-namespace address or route
and no other rack's state file uses.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass
from typing import cast

NETNS_DIR = "/run/netns"  # where `ip netns` names network namespaces
OPTICAL_NET = ipaddress.IPv4Network("198.19.1.0/24")
ELECTRICAL_NET = ipaddress.IPv4Network("198.19.2.0/24")
FABRIC_NET = ipaddress.IPv4Network("198.19.3.0/24")  # each host's fabric address (a /32 on FABRIC_IFNAME)
FABRIC_IFNAME = "opt0"
MGMT_SPACE = ipaddress.IPv4Network("198.18.0.0/16")  # the management /24s are taken from here
MAX_NICS_PER_HOST = 8  # optical addresses are 8k+j+1
MAX_HOSTS = 31
RESERVED_HOSTS = ("sw", "tor", "mgmt")  # namespace suffixes the rack uses itself
MGMT_IFNAME = "mgmt0"
POLICY_TABLE = 100  # host k, NIC j: replies from its address leave by it (table 100+j)
TBF_MAX_BIT = 8 * (2**32 - 1)  # tbf's 32-bit rate in bytes/s as pyroute2 sends it: 34 Gb/s
PREFIX = re.compile(r"^[a-z0-9][a-z0-9-]{0,12}$")  # a rack's prefix: "P-m" fits in IFNAMSIZ
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")

# Every link the rack makes has an index chosen here, and the two ends of a veth never share
# one: the kernel tells a link's carrier change to the rest of the stack (operstate, the
# RTM_NEWLINK that netlink listeners wait for, a bridge port starting to forward) at once
# only for a link whose index differs from its peer's; for one whose index equals its peer's
# (as when two fresh namespaces number their links alike) it may wait up to a second
# (net/core/link_watch.c, linkwatch_urgent_event; measured: docs/rack.md). Indexes in each namespace:
INDEX = {
    "optical": 10, "electrical": 20, "mgmt0": 30, "fabric": 40,  # host: NIC j at optical + j
    "switch port": 100, "circuit": 1000,  # switch: host k NIC j at 100 + 8k + j; circuits above
    "tor port": 100, "spine": 299, "rack": 300, "up": 400, "sp": 500,  # tor: host k, rack r at + k, + r
    "gw": 2, "br0": 99, "mgmt port": 100,  # management: host k at + k; the root end's is the kernel's
}


class RackError(Exception):
    """A rack operation the kernel or the machine refused, naming what and why."""


class RackUnavailable(RackError):
    """This machine cannot build a rack (not Linux, not root, pyroute2 missing, namespaces
    refused...)."""


@dataclass
class RackNic:
    """An optical NIC: ``ifname`` is its name inside its host's namespace (``p0``)."""

    host: str
    nic: str
    ifname: str
    rate_mbit: float


@dataclass
class RackHost:
    """A server: its optical NICs, the rack it stands in, and its electrical NIC's name (none:
    not on the electrical network)."""

    name: str
    nics: list[RackNic]
    rack: str = "rack0"
    electrical_ifname: str | None = None


@dataclass
class RackSpec:
    """What to build. ``electrical_mbit`` shapes every electrical NIC (None: line rate of the
    veth), ``uplink_mbit`` each rack's uplink to the spine: one rate for every rack, or rack ->
    rate (None, or a rack not named: unshaped)."""

    hosts: list[RackHost]
    electrical_mbit: float | None = None
    uplink_mbit: float | dict[str, float] | None = None

    def __post_init__(self):
        names = [h.name for h in self.hosts]
        if not names:
            raise ValueError("a rack needs at least one host")
        if len(names) > MAX_HOSTS:
            raise ValueError(f"{len(names)} hosts: a rack holds at most {MAX_HOSTS}")
        if len(set(names)) != len(names):
            raise ValueError(f"host names repeat: {names}")
        for h in self.hosts:
            if not _NAME.match(h.name) or h.name in RESERVED_HOSTS:
                raise ValueError(f"host {h.name!r}: a name of letters, digits, '_.-', not one of {RESERVED_HOSTS}")
            if not _NAME.match(h.rack):
                raise ValueError(f"host {h.name}: rack name {h.rack!r} must be letters, digits, '_.-'")
            if len(h.nics) > MAX_NICS_PER_HOST:
                raise ValueError(f"host {h.name}: {len(h.nics)} NICs, at most {MAX_NICS_PER_HOST}")
            ifnames = [n.ifname for n in h.nics] + [MGMT_IFNAME, "lo"]
            if h.electrical_ifname:
                ifnames.append(h.electrical_ifname)
            if len(set(ifnames)) != len(ifnames):
                raise ValueError(f"host {h.name}: interface names repeat or use mgmt0/lo: {ifnames}")
            nics = [n.nic for n in h.nics]
            if len(set(nics)) != len(nics):
                raise ValueError(f"host {h.name}: NIC names repeat: {nics}")
            for n in h.nics:
                if n.host != h.name:
                    raise ValueError(f"NIC {n.host}/{n.nic} is listed under host {h.name}")
                if not _IFNAME.match(n.ifname):
                    raise ValueError(f"{h.name}/{n.nic}: interface name {n.ifname!r} is not 1-15 of [A-Za-z0-9_.-]")
                check_rate(f"{h.name}/{n.nic}", n.rate_mbit)
            if h.electrical_ifname and not _IFNAME.match(h.electrical_ifname):
                raise ValueError(f"{h.name}: electrical interface {h.electrical_ifname!r} "
                                 f"is not 1-15 of [A-Za-z0-9_.-]")
        uplinks = self.uplink_mbit if isinstance(self.uplink_mbit, dict) else {"": self.uplink_mbit}
        for what, mbit in (("electrical_mbit", self.electrical_mbit),
                           *((f"uplink_mbit {rack}".strip(), rate) for rack, rate in uplinks.items())):
            if mbit is not None:
                check_rate(what, mbit)


def check_rate(what: str, mbit: float) -> None:
    """A rate tbf can shape: above 0 and within its 32-bit byte rate; ValueError naming ``what`` if not."""
    if not mbit > 0 or mbit * 1e6 > TBF_MAX_BIT:
        raise ValueError(f"{what}: rate {mbit} Mb/s is not in (0, {TBF_MAX_BIT / 1e6:.0f}]")


def port_index(k: int, j: int) -> int:
    """The index of host k's NIC j's far end in the switch namespace."""
    return INDEX["switch port"] + MAX_NICS_PER_HOST * k + j


def circuit_index(a: int, b: int) -> int:
    """One index per pair of switch ports, above theirs."""
    a, b = sorted((a - INDEX["switch port"], b - INDEX["switch port"]))
    return INDEX["circuit"] + 256 * a + b


class RackLayout:
    """The names and addresses of a rack built from ``spec`` under ``prefix`` (random when
    None), as the module's docstring gives them. The management network is chosen when the rack
    is built (:attr:`mgmt_net`); until then its addresses are not known."""

    def __init__(self, spec: RackSpec, prefix: str | None = None):
        self.spec = spec
        self.prefix = prefix or f"lh-{secrets.token_hex(3)}"
        if not PREFIX.match(self.prefix):
            raise ValueError(f"rack prefix {self.prefix!r}: 1-13 of [a-z0-9-] (it names links of at most 15)")
        self.root_link = f"{self.prefix}-m"
        self.sw_netns = f"{self.prefix}-sw"
        self.tor_netns = f"{self.prefix}-tor"
        self.mgmt_netns = f"{self.prefix}-mgmt"
        self._index = {h.name: k for k, h in enumerate(spec.hosts)}
        self._hosts = {h.name: h for h in spec.hosts}
        self._nics: dict[tuple[str, str], tuple[int, int, RackNic]] = {
            (h.name, n.nic): (k, j, n) for k, h in enumerate(spec.hosts) for j, n in enumerate(h.nics)}
        self._port_of = {key: f"h{k}n{j}" for key, (k, j, _) in self._nics.items()}
        self._nic_of_port = {port: key for key, port in self._port_of.items()}
        self._racks = list(dict.fromkeys(h.rack for h in spec.hosts if h.electrical_ifname))
        self.mgmt_net: ipaddress.IPv4Network | None = None

    def netns(self, host: str) -> str:
        """The host's namespace name."""
        self._host(host)
        return f"{self.prefix}-{host}"

    @property
    def namespaces(self) -> list[str]:
        """Every namespace the rack makes."""
        names = [self.netns(h.name) for h in self.spec.hosts] + [self.sw_netns, self.mgmt_netns]
        return names + ([self.tor_netns] if self._racks else [])

    def argv(self, host: str, *args: str) -> list[str]:
        """A command line that runs ``args`` in the host's namespace (``ip netns exec``, which
        also shows it its own /sys/class/net)."""
        return ["ip", "netns", "exec", self.netns(host), *args]

    @property
    def mgmt_gateway(self) -> str:
        """The root namespace's address on the management network (known once built)."""
        return str(self._mgmt()[1])

    def mgmt_address(self, host: str) -> str:
        """The host's address on the management network (its ``mgmt0``), where its sshd listens."""
        return str(self._mgmt()[self._host(host) + 11])

    def optical_address(self, host: str, nic: str) -> str:
        """The NIC's address (on its ``ifname`` in the host's namespace)."""
        k, j, _ = self._nic((host, nic))
        return str(OPTICAL_NET[8 * k + j + 1])

    def electrical_address(self, host: str) -> str | None:
        """The host's address on the electrical network (None: it is not on it)."""
        k = self._host(host)
        return str(ELECTRICAL_NET[k + 11]) if self._hosts[host].electrical_ifname else None

    def fabric_address(self, host: str) -> str:
        """The host's address on the optical fabric as a whole (on its ``FABRIC_IFNAME``),
        reached over whichever circuit joins the two hosts."""
        return str(FABRIC_NET[self._host(host) + 11])

    def switch_port(self, host: str, nic: str) -> str:
        """The NIC's far end's name in the switch namespace."""
        self._nic((host, nic))
        return self._port_of[(host, nic)]

    def _host(self, host: str) -> int:
        if host not in self._index:
            raise KeyError(f"no host {host!r} in rack {self.prefix} (hosts: {', '.join(self._index)})")
        return self._index[host]

    def _nic(self, key: tuple[str, str]) -> tuple[int, int, RackNic]:
        key = cast("tuple[str, str]", tuple(key))  # a list too, as an RPC's JSON gives it
        if key not in self._nics:
            self._host(key[0])
            raise KeyError(f"no NIC {key[1]!r} on host {key[0]} in rack {self.prefix} "
                           f"(NICs: {', '.join(n for h, n in self._nics if h == key[0])})")
        return self._nics[key]

    def _mgmt(self) -> ipaddress.IPv4Network:
        if self.mgmt_net is None:
            raise RackError(f"rack {self.prefix} is not built: its management network is chosen by build()")
        return self.mgmt_net
