"""A rack in a box: an emulated GPU rack's data plane made of real Linux kernel parts.

Each host is a network namespace; each optical NIC a veth pair whose far end sits in a switch
namespace, down until the world's light reaches it (the host end's carrier follows it); a
circuit is a bridge of its own in the switch namespace joining two NICs' far ends; the
electrical rack is a bridge per rack in a top-of-rack namespace, joined through a spine by
shaped uplinks; and a management bridge reaches every host from the root namespace through one
veth, so that the harness, on this machine, talks to each host's sshd as to a real one. Links are
shaped with tbf to their line rates. Everything is made with netlink (pyroute2) and named with
the rack's prefix, so two racks on one machine never collide, and what a crashed owner left
behind can be found and removed (``Rack.leftovers``, ``Rack.clean_up_stale``).

What a rack is made of, and the names and addresses of its parts: rack_spec.py. The netlink
calls and tbf's shaping: rack_netlink.py. Namespaces and processes on this machine:
rack_machine.py. A rack's state file and the clean-up after a dead owner: rack_state.py. Why
the shaping is what it is, as measured: docs/rack.md.

A host's optical NICs share one subnet, as a real GPU server's rails do, so each answers ARP
only for its own address (arp_ignore 1, arp_announce 2), reverse-path filtering is off, and a
rule per NIC sends what leaves from its address out by it (table 100+j), not by the first
route to the subnet. Address resolution on them gives up in 60 ms, so a connect() bound to a
NIC with no circuit behind it fails at once ("No route to host") instead of after 3 s. The
rack's links carry no IPv6. Every link is made at an index chosen so that its carrier changes
reach listeners at once (see INDEX).

Libraries that bind one address per host and connect every rank to every other (gloo's full
mesh, Open MPI's TCP transport) cannot use NICs that each reach one neighbour. For them each
host also has a fabric address, 198.19.3.(k+11)/32 on a link ``FABRIC_IFNAME`` of its own, routed
over the circuits as a routing daemon on each host would route it (``set_fabric_routes``): a
peer's fabric address via the far end of the circuit that joins a NIC of this host to it, so
its bytes cross the same shaped NICs and circuits. A peer no circuit reaches has no route.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from lumion_hil.instruments.emulators import rack_state
from lumion_hil.instruments.emulators.rack_machine import (available, create_netns, kill_in, list_netns,
                                                           netlink_in, pids_in, remove_named, root_links,
                                                           run_in_netns, run_in_netns_each, write_sysctls)
from lumion_hil.instruments.emulators.rack_netlink import (TCP_WMEM_MAX, UPLINK_QUEUE_MIN, IPRoute, NetlinkError,
                                                           OneThread, add_addr, add_bridge, add_veth, del_link,
                                                           del_qdisc, ensure_added, ensure_bridge, ensure_veth,
                                                           in_netlink_thread, links_by_name, tbf_args)
from lumion_hil.instruments.emulators.rack_spec import (ELECTRICAL_NET, FABRIC_IFNAME, INDEX, MGMT_IFNAME,
                                                        OPTICAL_NET, POLICY_TABLE, RackError, RackLayout, RackSpec,
                                                        RackUnavailable, check_rate, circuit_index, port_index)
from lumion_hil.instruments.emulators.rack_state import STATE_DIR, choose_mgmt_net, state_lock, write_state

# optical NICs: a connect() bound to one with no circuit behind it fails after
# mcast_solicit x retrans_time (60 ms) instead of the kernel's 3 s
NEIGH_RETRANS_MS = 20
NEIGH_MCAST_SOLICIT = 3
NEIGH_UCAST_SOLICIT = 1


class Rack(RackLayout):
    """An emulated rack's data plane (see the module's docstring for what it builds, and
    rack_spec.py for how it names its parts). ``build`` makes it (and repairs a half-built one), the run-time operations drive
    it (``set_carrier``, ``join``/``part``, ``set_uplink_mbit``, ``slow_mgmt``,
    ``kill_processes``), ``teardown`` removes every trace. Also a context manager (build on
    enter, teardown on exit). One netlink socket per namespace stays open for the rack's life,
    used from the rack's one netlink thread (every netlink call runs there), so threads may
    share a rack."""

    def __init__(self, spec: RackSpec, prefix: str | None = None, state_dir: str = STATE_DIR):
        super().__init__(spec, prefix)
        self.state_dir = Path(state_dir)
        self.state_file = self.state_dir / f"{self.prefix}.json"
        self.uplink_mbit = spec.uplink_mbit
        self._nl: dict[str, IPRoute] = {}
        self._cache: dict[str, dict] = {}  # links by namespace and name, during build
        self._sw_index: dict[str, int] = {}
        self._lock = threading.RLock()
        self._netlink = OneThread(f"rack {self.prefix} netlink")
        self._built = False
        self._atexit = False
        self.scratch: Path | None = None  # the rack's files (ssh keys, logs, checkpoints): made by build

    # -- build ----------------------------------------------------------------------------

    @in_netlink_thread
    def build(self) -> "Rack":
        """Make the rack, or complete and repair one half made (by this object or by a crashed
        owner under the same prefix): what exists is kept, what is missing is made, links of
        the wrong kind or without their peer are remade, shaping is replaced. Circuits and
        carriers already set are left as they are. Returns self."""
        ok, why = available()
        if not ok:
            raise RackUnavailable(why)
        with self._lock:
            if not self._atexit:  # a normal exit tears down what the owner forgot
                atexit.register(self.teardown)
                self._atexit = True
            try:
                self._build()
            except NetlinkError as e:
                raise RackError(f"building rack {self.prefix}: {os.strerror(e.code)} ({e})") from e
            finally:
                self._cache = {}
            self._built = True
        return self

    def _build(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.mgmt_net is None:  # a crashed owner's choice
            self.mgmt_net = rack_state.earlier_mgmt_net(self.state_file)
        if self.scratch is None:  # a crashed owner's, if still there
            self.scratch = rack_state.earlier_scratch(self.state_file, self.prefix)
        write_state(self, self.state_file, self.scratch)  # first, so that a crash from here on is found
        if self.scratch is None:
            self.scratch = rack_state.make_scratch(self.prefix)
            write_state(self, self.state_file, self.scratch)
        present = set(list_netns())
        for name in self.namespaces:
            if name not in present:
                try:
                    create_netns(name)
                except OSError as e:
                    raise RackError(f"creating network namespace {name}: {e}") from e
        for name in self.namespaces:
            if name not in self._nl:
                self._nl[name] = netlink_in(name)
        self._cache = {name: links_by_name(self._nl[name]) for name in self.namespaces}
        for name in self.namespaces:
            self._nl[name].link("set", index=self._cache[name]["lo"]["index"], state="up")
        # no IPv6 on the links made from here on (no DAD, router or MLD chatter on measured links)
        run_in_netns_each({name: lambda: write_sysctls({
            "net/ipv6/conf/default/disable_ipv6": "1",
            "net/ipv4/conf/all/rp_filter": "0",
            "net/ipv4/conf/default/rp_filter": "0"}) for name in self.namespaces})
        with state_lock(), IPRoute() as root:
            self.mgmt_net = choose_mgmt_net(root, self, self.state_file)
            write_state(self, self.state_file, self.scratch)
            self._ensure_root_link(root)
        self._build_optical()
        if self._racks:
            self._build_electrical()
        self._build_mgmt()
        self._sw_index = {port: self._cache[self.sw_netns][port]["index"] for port in self._nic_of_port}

    def __enter__(self) -> "Rack":
        return self.build()

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _ensure_root_link(self, root: IPRoute) -> None:
        """The root namespace's one link into the management bridge, with the gateway address."""
        mgmt = self._nl[self.mgmt_netns]
        peer = self._cache[self.mgmt_netns].get("gw")
        exists = self.root_link in root_links()
        if exists != (peer is not None):  # one end without the other: start again
            if exists:
                root.link("del", index=socket.if_nametoindex(self.root_link))
            else:
                assert peer is not None  # exists != (peer is not None)
                del_link(mgmt, peer["index"])
            exists = False
        if not exists:  # made from the far side, whose index we choose; the root's is the kernel's
            gw_index = INDEX["gw"]
            while True:
                fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
                try:
                    add_veth(mgmt, "gw", gw_index, fd, self.root_link, 0, f"{self.mgmt_netns}/gw", "root namespace")
                finally:
                    os.close(fd)
                root_index = socket.if_nametoindex(self.root_link)
                if root_index != gw_index:
                    break
                del_link(mgmt, gw_index)  # the same index at both ends (see INDEX): again, above
                gw_index = root_index + 100  # where the root namespace numbers its next links
            self._cache[self.mgmt_netns]["gw"] = {"index": gw_index}
        index = socket.if_nametoindex(self.root_link)
        try:  # our own link: no IPv6 chatter from it
            Path(f"/proc/sys/net/ipv6/conf/{self.root_link}/disable_ipv6").write_text("1")
        except OSError:
            pass
        add_addr(root, index, self.mgmt_gateway, 24, f"{self.root_link} (root namespace)")
        root.link("set", index=index, state="up")

    def _shape(self, ns: str, index: int, rate_bit: float | None, what: str, **tbf) -> None:
        """tbf at rate_bit on the link's egress (None: its default qdisc back)."""
        ipr = self._nl[ns]
        try:
            if rate_bit is None:
                del_qdisc(ipr, index)
            else:
                ipr.tc("replace", "tbf", index, **tbf_args(rate_bit, **tbf))
        except NetlinkError as e:
            raise RackError(f"tbf at {rate_bit} bit/s on {what} ({ns}): {os.strerror(e.code)}") from e

    def _build_optical(self) -> None:
        sysctls: dict[str, dict[str, str]] = {}
        for (host, nic), (k, j, n) in self._nics.items():
            ns = self.netns(host)
            port = self._port_of[(host, nic)]
            ih, isw = ensure_veth(self._nl, self._cache, ns, n.ifname, INDEX["optical"] + j,
                                  self.sw_netns, port, port_index(k, j), alias=f"{host}/{nic}")
            ipr = self._nl[ns]
            address = self.optical_address(host, nic)
            add_addr(ipr, ih, address, OPTICAL_NET.prefixlen, f"{host}/{n.ifname}")
            ipr.link("set", index=ih, state="up")  # the far end stays as it is: down when new
            # replies from this NIC's address leave by it, not by the first route to the /24
            ensure_added(lambda: ipr.route("add", dst=str(OPTICAL_NET), oif=ih, prefsrc=address,
                                           table=POLICY_TABLE + j))
            ensure_added(lambda: ipr.rule("add", src=address, src_len=32, table=POLICY_TABLE + j,
                                          priority=POLICY_TABLE + j))
            self._shape(ns, ih, n.rate_mbit * 1e6, f"{host}/{n.ifname}")
            self._shape(self.sw_netns, isw, n.rate_mbit * 1e6, f"switch port {port} ({host}/{nic})")
            conf, neigh = f"net/ipv4/conf/{n.ifname}", f"net/ipv4/neigh/{n.ifname}"
            sysctls.setdefault(ns, {}).update({
                f"{conf}/rp_filter": "0",
                f"{neigh}/retrans_time_ms": str(NEIGH_RETRANS_MS),
                f"{neigh}/mcast_solicit": str(NEIGH_MCAST_SOLICIT),
                f"{neigh}/ucast_solicit": str(NEIGH_UCAST_SOLICIT),
            })
        for host in self._hosts:  # the fabric address, routed over the circuits (set_fabric_routes)
            ns = self.netns(host)
            # a veth whose peer stays in the host's namespace (this kernel may lack the dummy
            # driver): always up, and no packet ever leaves by it
            index, peer = ensure_veth(self._nl, self._cache, ns, FABRIC_IFNAME, INDEX["fabric"],
                                      ns, FABRIC_IFNAME + "x", INDEX["fabric"] + 1)
            ipr = self._nl[ns]
            add_addr(ipr, index, self.fabric_address(host), 32, f"{host}/{FABRIC_IFNAME}")
            ipr.link("set", index=peer, state="up")
            ipr.link("set", index=index, state="up")
        for host in self._hosts:  # two NICs of a host share a subnet: each answers only for its own
            sysctls.setdefault(self.netns(host), {}).update({
                "net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2",
                "net/ipv4/tcp_wmem": f"4096 16384 {TCP_WMEM_MAX}"})  # see UPLINK_WINDOWS
        run_in_netns_each({ns: functools.partial(write_sysctls, values) for ns, values in sysctls.items()})

    def _build_electrical(self) -> None:
        tor, tor_links = self._nl[self.tor_netns], self._cache[self.tor_netns]
        spine = ensure_bridge(tor, tor_links, self.tor_netns, "spine", INDEX["spine"])
        rate = self.spec.electrical_mbit * 1e6 if self.spec.electrical_mbit else None
        bridges = {}
        for r, rack in enumerate(self._racks):
            bridges[rack] = ensure_bridge(tor, tor_links, self.tor_netns, f"rack{r}", INDEX["rack"] + r)
            up, sp = ensure_veth(self._nl, self._cache, self.tor_netns, f"up{r}", INDEX["up"] + r,
                                 self.tor_netns, f"sp{r}", INDEX["sp"] + r, alias=f"uplink {rack}")
            tor.link("set", index=up, master=bridges[rack], state="up")
            tor.link("set", index=sp, master=spine, state="up")
        self._shape_uplinks(self.uplink_mbit)
        for k, h in enumerate(self.spec.hosts):
            if not h.electrical_ifname:
                continue
            ns = self.netns(h.name)
            ih, it = ensure_veth(self._nl, self._cache, ns, h.electrical_ifname, INDEX["electrical"],
                                 self.tor_netns, f"e{k}", INDEX["tor port"] + k, alias=f"{h.name}/electrical")
            address = self.electrical_address(h.name)
            assert address is not None  # it has an electrical_ifname
            add_addr(self._nl[ns], ih, address, ELECTRICAL_NET.prefixlen, f"{h.name}/{h.electrical_ifname}")
            self._nl[ns].link("set", index=ih, state="up")
            tor.link("set", index=it, master=bridges[h.rack], state="up")
            self._shape(ns, ih, rate, f"{h.name}/{h.electrical_ifname}")
            self._shape(self.tor_netns, it, rate, f"top-of-rack port e{k} ({h.name})")

    def _shape_uplinks(self, mbit: float | dict[str, float] | None) -> None:
        for r, rack in enumerate(self._racks):
            rate = mbit.get(rack) if isinstance(mbit, dict) else mbit
            for end in (f"up{r}", f"sp{r}"):  # rack -> spine, spine -> rack
                index = self._nl[self.tor_netns].link("get", ifname=end)[0]["index"]
                self._shape(self.tor_netns, index, rate * 1e6 if rate else None, f"uplink {end} of rack {rack}",
                            queue_min=UPLINK_QUEUE_MIN)

    def _build_mgmt(self) -> None:
        mgmt = self._nl[self.mgmt_netns]
        br = ensure_bridge(mgmt, self._cache[self.mgmt_netns], self.mgmt_netns, "br0", INDEX["br0"])
        mgmt.link("set", index=self._cache[self.mgmt_netns]["gw"]["index"], master=br, state="up")
        for k, h in enumerate(self.spec.hosts):
            ns = self.netns(h.name)
            ih, im = ensure_veth(self._nl, self._cache, ns, MGMT_IFNAME, INDEX["mgmt0"],
                                 self.mgmt_netns, f"m{k}", INDEX["mgmt port"] + k, alias=f"{h.name}/mgmt")
            for addr in self._nl[ns].addr("dump", family=socket.AF_INET, index=ih):  # of an earlier subnet
                if addr.get("address") != self.mgmt_address(h.name):
                    self._nl[ns].addr("del", index=ih, address=addr.get("address"), prefixlen=addr["prefixlen"])
            add_addr(self._nl[ns], ih, self.mgmt_address(h.name), 24, f"{h.name}/{MGMT_IFNAME}")
            self._nl[ns].link("set", index=ih, state="up")
            mgmt.link("set", index=im, master=br, state="up")

    # -- run time -------------------------------------------------------------------------

    @in_netlink_thread
    def set_carrier(self, host: str, nic: str, up: bool) -> int:
        """Light on (up) or off at the NIC: the switch end's admin state, one netlink request;
        the host end's carrier follows at once. time.monotonic_ns() right after the kernel's
        acknowledgement."""
        self._nic((host, nic))
        port = self._port_of[(host, nic)]
        with self._lock:
            ipr = self._sock(self.sw_netns)
            try:
                ipr.link("set", index=self._sw_index[port], state="up" if up else "down")
            except NetlinkError as e:
                raise RackError(f"carrier {'up' if up else 'down'} at {host}/{nic} "
                                f"(switch port {port}): {os.strerror(e.code)}") from e
            return time.monotonic_ns()

    @in_netlink_thread
    def carrier(self, host: str, nic: str) -> bool:
        """The host end's carrier as its kernel reports it (IFLA_CARRIER)."""
        _, _, n = self._nic((host, nic))
        with self._lock:
            link = self._sock(self.netns(host)).link("get", ifname=n.ifname)[0]
        return bool(link.get("carrier"))

    @in_netlink_thread
    def join(self, a: tuple[str, str], b: tuple[str, str]) -> None:
        """A circuit between two NICs: both switch ends into a bridge of their own (STP off,
        no forward delay: it forwards at once). Joining a joined pair does nothing; a NIC in
        another circuit leaves it first (that circuit is parted). A pair's bridge is kept once
        made (deleting a bridge costs the kernel tens of milliseconds; taking its ports out,
        one): joined again, it is used again."""
        pa, pb = self._circuit_ports(a, b)
        with self._lock:
            ipr = self._sock(self.sw_netns)
            ma, mb = (self._master(ipr, p) for p in (pa, pb))
            if ma and ma == mb:
                return
            name = "c" + "-".join(sorted((pa, pb)))
            try:
                for port, master in ((pa, ma), (pb, mb)):
                    if master:
                        ipr.link("set", index=self._sw_index[port], master=0)
                try:
                    br = ipr.link("get", ifname=name)[0]["index"]
                except NetlinkError as e:
                    if e.code != errno.ENODEV:
                        raise
                    br = add_bridge(ipr, name, circuit_index(self._sw_index[pa], self._sw_index[pb]), self.sw_netns)
                ipr.link("set", index=self._sw_index[pa], master=br)
                ipr.link("set", index=self._sw_index[pb], master=br)
                ipr.link("set", index=br, state="up")
            except NetlinkError as e:
                raise RackError(f"join {a[0]}/{a[1]} - {b[0]}/{b[1]} (bridge {name} in {self.sw_netns}): "
                                f"{os.strerror(e.code)}") from e

    @in_netlink_thread
    def part(self, a: tuple[str, str], b: tuple[str, str]) -> None:
        """Remove the circuit between two NICs (their ports leave its bridge); nothing if they
        are not joined."""
        pa, pb = self._circuit_ports(a, b)
        with self._lock:
            ipr = self._sock(self.sw_netns)
            ma, mb = (self._master(ipr, p) for p in (pa, pb))
            if ma and ma == mb:
                try:
                    for port in (pa, pb):
                        ipr.link("set", index=self._sw_index[port], master=0)
                except NetlinkError as e:
                    raise RackError(f"part {a[0]}/{a[1]} - {b[0]}/{b[1]}: {os.strerror(e.code)}") from e

    @in_netlink_thread
    def joined(self) -> set[frozenset]:
        """The circuits now, read back from the kernel: {frozenset({(host, nic), (host, nic)})}."""
        with self._lock:
            links = self._sock(self.sw_netns).link("dump")
        ports: dict[int, set] = {}
        for link in links:
            key = self._nic_of_port.get(link.get("ifname"))
            if key is not None and link.get("master"):
                ports.setdefault(link.get("master"), set()).add(key)
        return {frozenset(p) for p in ports.values() if len(p) >= 2}

    @in_netlink_thread
    def set_fabric_routes(self, pairs: set[frozenset]) -> None:
        """Route each host's fabric address over the circuits ``pairs`` (NIC pairs joined and
        lit): on host A, B's fabric address via B's NIC at the far end of a circuit from a NIC
        of A (the first in NIC order when several join them); routes to hosts no circuit
        reaches are removed."""
        wanted: dict[str, dict[str, tuple[int, str]]] = {h: {} for h in self._hosts}
        for pair in sorted(pairs, key=lambda p: sorted(p)):
            a, b = sorted(pair)
            for (near, nnic), (far, fnic) in ((a, b), (b, a)):
                if near != far:
                    wanted[near].setdefault(far, (self._nic((near, nnic))[1], self.optical_address(far, fnic)))
        with self._lock:
            for host in self._hosts:
                ipr = self._sock(self.netns(host))
                for far in self._hosts:
                    if far == host:
                        continue
                    dst = self.fabric_address(far)
                    try:
                        if far in wanted[host]:
                            j, gateway = wanted[host][far]  # NIC j is at index optical + j (INDEX)
                            ipr.route("replace", dst=dst, dst_len=32, gateway=gateway, oif=INDEX["optical"] + j,
                                      prefsrc=self.fabric_address(host), flags=4)  # RTNH_F_ONLINK: the gateway is the circuit's far end
                        else:
                            with contextlib.suppress(NetlinkError):
                                ipr.route("del", dst=dst, dst_len=32)
                    except NetlinkError as e:
                        raise RackError(f"fabric route to {far} ({dst}) on {host}: {os.strerror(e.code)}") from e

    def _master(self, ipr: IPRoute, port: str) -> int | None:
        return ipr.link("get", index=self._sw_index[port])[0].get("master") or None

    def _circuit_ports(self, a, b) -> tuple[str, str]:
        self._nic(a)
        self._nic(b)
        if tuple(a) == tuple(b):
            raise ValueError(f"a circuit joins two NICs, not {a[0]}/{a[1]} to itself")
        return self._port_of[tuple(a)], self._port_of[tuple(b)]

    @in_netlink_thread
    def set_uplink_mbit(self, mbit: float | dict[str, float] | None) -> None:
        """Reshape the racks' uplinks (both directions) to ``mbit``: one rate for every rack, or
        rack -> rate (None, or a rack not named: unshaped)."""
        if not self._racks:
            raise RackError(f"rack {self.prefix} has no electrical network")
        for rack, rate in (mbit.items() if isinstance(mbit, dict) else [("", mbit)]):
            if rate is not None:
                check_rate(f"uplink {rack}".strip(), rate)
        with self._lock:
            self._sock(self.tor_netns)
            self._shape_uplinks(mbit)
            self.uplink_mbit = mbit

    @in_netlink_thread
    def slow_mgmt(self, host: str, rate_kbit: float | None, queue_s: float = 2.0) -> None:
        """Shape the host's management link both ways to ``rate_kbit`` with room for
        ``queue_s`` of queue, so what it sends waits rather than drops: the queue's latency
        stands in for a slow agent link. None: back to full speed."""
        k = self._host(host)
        if rate_kbit is not None and not rate_kbit > 0:
            raise ValueError(f"slow_mgmt {host}: rate {rate_kbit} kb/s is not positive")
        rate = rate_kbit * 1e3 if rate_kbit is not None else None
        slow = {"burst_s": 0.01, "burst_min": 3028, "queue_s": queue_s, "queue_min": 16 * 1024}
        with self._lock:
            ns = self.netns(host)
            host_end = self._sock(ns).link("get", ifname=MGMT_IFNAME)[0]["index"]
            bridge_end = self._sock(self.mgmt_netns).link("get", ifname=f"m{k}")[0]["index"]
            self._shape(ns, host_end, rate, f"{host}/{MGMT_IFNAME}", **slow)
            self._shape(self.mgmt_netns, bridge_end, rate, f"management port m{k} ({host})", **slow)

    def run_in(self, host: str, fn: Callable[[], object]) -> object:
        """fn() in a thread of its own inside the host's namespace, and its result: what it
        opens (a socket) stays in that namespace, while the caller never leaves its own."""
        return run_in_netns(self.netns(host), fn)

    def pids(self, host: str) -> list[int]:
        """The processes in the host's namespace."""
        return sorted(pids_in([self.netns(host)])[self.netns(host)])

    def kill_processes(self, host: str, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every process in the host's namespace (SIGKILL: a power loss, returning once
        none is left there); the pids signalled."""
        return kill_in([self.netns(host)], sig)

    def _sock(self, ns: str) -> IPRoute:
        if not self._built or ns not in self._nl:
            raise RackError(f"rack {self.prefix} is not built (or was torn down)")
        return self._nl[ns]

    # -- teardown -------------------------------------------------------------------------

    @in_netlink_thread
    def teardown(self) -> None:
        """Kill the processes in the rack's namespaces, delete its namespaces and its root link,
        remove its scratch folder and its state file. Safe to call twice, and on a rack never built."""
        with self._lock:
            for ipr in self._nl.values():
                try:
                    ipr.close()
                except Exception:
                    pass
            self._nl.clear()
            self._sw_index.clear()
            if IPRoute is not None:
                remove_named(self.prefix, self.namespaces, [self.root_link])
            rack_state.remove_scratch(self.scratch, self.prefix)
            self.scratch = None
            self.state_file.unlink(missing_ok=True)
            if self._atexit:
                atexit.unregister(self.teardown)
                self._atexit = False
            self._built = False

    # -- what runs left behind on this machine (rack_state.py) ----------------------------

    leftovers = staticmethod(rack_state.leftovers)
    destroy = staticmethod(rack_state.destroy)
    clean_up_stale = staticmethod(rack_state.clean_up_stale)
    restore_after_killed_runs = staticmethod(rack_state.restore_after_killed_runs)
