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
import ctypes
import errno
import fcntl
import functools
import ipaddress
import json
import os
import queue
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

try:
    from pyroute2 import IPRoute
    from pyroute2 import netns as _netns
    from pyroute2.netlink.exceptions import NetlinkError
except ImportError:  # not Linux, or not installed: available() says so
    IPRoute = None
    _netns = None

    class NetlinkError(Exception):  # type: ignore[no-redef]
        code = 0


STATE_DIR = "/run/lumion-hil/racks"
LOCK_FILE = "/run/lumion-hil/racks.lock"  # one for the machine, whatever a rack's state_dir
NETNS_DIR = "/run/netns"
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
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_PREFIX = re.compile(r"^[a-z0-9][a-z0-9-]{0,12}$")  # "P-m" fits in IFNAMSIZ
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")

# tbf: the token bucket holds BURST_S of the line rate (at least BURST_MIN bytes) and the queue
# behind it QUEUE_S more (at least QUEUE_MIN bytes). tbf counts whole frames, so a TCP transfer
# that fills the link carries 1448/1514 = 95.6% of the rate as payload. The bucket must outlast
# the lateness of tbf's timer on a loaded machine, or the tokens that overflow while it sleeps
# are lost (1 ms of bucket was too little on a busy machine, 5 ms enough: docs/rack.md); it is
# also what a transfer gets above the rate at its start. The queue lets TCP fill the link
# without loss where two shaped links in a row differ in rate, and is short so that ARP waiting
# behind data still resolves within the optical NICs' fast-failure window (mcast_solicit x
# retrans_time); its floor holds one 64 KiB GSO packet whole. tbf itself cuts GSO packets
# larger than the bucket.
BURST_S = 0.005
BURST_MIN = 16 * 1024
QUEUE_S = 0.02
QUEUE_MIN = 64 * 1024
# A rack's uplink is where TCP flows from different hosts meet, the one place in the rack whose
# queue fills from more than one sender (a host's own tbf is kept nearly empty by TCP's small
# queues). Cubic grows each window until that FIFO overflows: with QUEUE_S of queue there the
# cross-rack ring's flows lost whole GSO bursts, split the uplink unevenly and finished a tenth
# short of the cost model (docs/rack.md). So a host's TCP send buffer is capped at TCP_WMEM_MAX
# (a window of about 290 KB on the wire, over ten times the 25 KB a 1 ms round trip needs at
# 200 Mb/s) and the uplinks get a queue of their own that holds UPLINK_WINDOWS such windows
# whole: no drops, and the flows share the FIFO by their equal windows. Only electrical traffic
# crosses an uplink, so the optical NICs' ARP fast-failure window (QUEUE_S) is not behind this
# queue. This kernel offers no fair-queueing qdisc (docs/rack.md lists what was tried).
TCP_WMEM_MAX = 256 * 1024
UPLINK_WINDOWS = 4
UPLINK_QUEUE_MIN = UPLINK_WINDOWS * (TCP_WMEM_MAX + 64 * 1024)
TBF_MAX_BIT = 8 * (2**32 - 1)  # tbf's 32-bit rate in bytes/s as pyroute2 sends it: 34 Gb/s

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

# optical NICs: a connect() bound to one with no circuit behind it fails after
# mcast_solicit x retrans_time (60 ms) instead of the kernel's 3 s
NEIGH_RETRANS_MS = 20
NEIGH_MCAST_SOLICIT = 3
NEIGH_UCAST_SOLICIT = 1


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
                _check_rate(f"{h.name}/{n.nic}", n.rate_mbit)
            if h.electrical_ifname and not _IFNAME.match(h.electrical_ifname):
                raise ValueError(f"{h.name}: electrical interface {h.electrical_ifname!r} "
                                 f"is not 1-15 of [A-Za-z0-9_.-]")
        uplinks = self.uplink_mbit if isinstance(self.uplink_mbit, dict) else {"": self.uplink_mbit}
        for what, mbit in (("electrical_mbit", self.electrical_mbit),
                           *((f"uplink_mbit {rack}".strip(), rate) for rack, rate in uplinks.items())):
            if mbit is not None:
                _check_rate(what, mbit)


def _check_rate(what: str, mbit: float) -> None:
    if not mbit > 0 or mbit * 1e6 > TBF_MAX_BIT:
        raise ValueError(f"{what}: rate {mbit} Mb/s is not in (0, {TBF_MAX_BIT / 1e6:.0f}]")


# -- the machine ---------------------------------------------------------------------------------


_available: tuple[bool, str] | None = None


def available() -> tuple[bool, str]:
    """Whether this machine can build a rack, and why not: Linux, root (CAP_NET_ADMIN and
    CAP_SYS_ADMIN), pyroute2, and a probe namespace with a veth, a bridge and a tbf in it.
    The probe runs once per process."""
    global _available
    if _available is None:
        _available = _probe()
    return _available


def _probe() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform}): network namespaces are Linux's"
    if IPRoute is None:
        return False, "pyroute2 is not installed (pip install pyroute2)"
    try:
        caps = int(re.search(r"CapEff:\s*([0-9a-f]+)", Path("/proc/self/status").read_text()).group(1), 16)
    except (OSError, AttributeError):
        caps = 0
    missing = [name for bit, name in ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN")) if not caps >> bit & 1]
    if missing:
        return False, f"not root (uid {os.geteuid()}): {', '.join(missing)} missing"
    probe = f"lh-probe-{os.getpid()}"
    try:
        _create_netns(probe)
    except Exception as e:
        return False, f"creating network namespace {probe} was refused ({e}); try `ip netns add test`"
    step = "netlink socket"
    try:
        with _netlink_in(probe) as ipr:
            step = "veth"
            ipr.link("add", ifname="a", kind="veth", peer="b")
            step = "bridge"
            ipr.link("add", ifname="br", kind="bridge")
            step = "tbf"
            ipr.tc("add", "tbf", ipr.link_lookup(ifname="a")[0], **_tbf_args(100e6))
    except Exception as e:
        return False, f"the kernel refused a {step} in namespace {probe}: {e}"
    finally:
        _remove_netns(probe)
    return True, "root on Linux with network namespaces, veth, bridges and tbf"


def _tbf_args(rate_bit: float, burst_s: float = BURST_S, queue_s: float = QUEUE_S,
              burst_min: int = BURST_MIN, queue_min: int = QUEUE_MIN) -> dict:
    """pyroute2's tbf arguments for a rate in bit/s (see BURST_S for the choice)."""
    rate_bytes = rate_bit / 8
    burst = max(int(rate_bytes * burst_s), burst_min)
    return {"rate": f"{int(rate_bit)}bit", "burst": burst, "limit": burst + max(int(rate_bytes * queue_s), queue_min)}


def _run_in_netns(name: str, fn: Callable[[], object]) -> object:
    """fn() in a thread of its own moved into namespace ``name`` (setns is per thread, so the
    caller's thread never leaves its namespace); /proc/sys/net there is that namespace's."""
    return _run_in_netns_each({name: fn})[name]


def _run_in_netns_each(jobs: dict[str, Callable[[], object]]) -> dict[str, object]:
    """Each namespace's job at once, each in a thread of its own there; their results."""
    results: dict[str, object] = {}
    errors: list[BaseException] = []

    def target(name, fn):
        try:
            fd = os.open(f"{NETNS_DIR}/{name}", os.O_RDONLY)
            try:
                if _libc().setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns into network namespace {name}: {os.strerror(code)}")
            finally:
                os.close(fd)
            results[name] = fn()
        except BaseException as e:  # handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=target, args=job, name=f"netns {job[0]}") for job in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


_libc_handle = None


def _libc():
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
    return _libc_handle


def _write_sysctls(values: dict[str, str]) -> None:
    for path, value in values.items():
        with open(f"/proc/sys/{path}", "w") as f:
            f.write(value)


def _netns_key(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"{NETNS_DIR}/{name}")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pids_in(names: list[str]) -> dict[str, list[int]]:
    """The processes whose network namespace is each of ``names`` (zombies have none)."""
    keys = {k: n for n in names if (k := _netns_key(n)) is not None}
    found: dict[str, list[int]] = {n: [] for n in names}
    if not keys:
        return found
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        name = keys.get((st.st_dev, st.st_ino))
        if name is not None:
            found[name].append(int(entry))
    return found


def _kill_in(names: list[str], sig: int = signal.SIGKILL, wait_s: float = 2.0) -> list[int]:
    """Signal every process in the namespaces; SIGKILL again to what they start meanwhile,
    until none is left there (or wait_s has passed). The pids signalled."""
    pids = {p for ps in _pids_in(names).values() for p in ps}
    signalled: set[int] = set()
    deadline = time.monotonic() + wait_s
    while pids:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        signalled |= pids
        if sig != signal.SIGKILL or time.monotonic() > deadline:
            break
        time.sleep(0.005)
        pids = {p for ps in _pids_in(names).values() for p in ps}
    return sorted(signalled)


class _OneThread:
    """Runs calls in one daemon thread of its own: pyroute2 sets a socket up for each thread
    that uses it (from its namespace or its file descriptor), which only works reliably in the
    thread that made it, so every netlink call of a rack is made from its one thread."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=name)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            fn, box, done = self._calls.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[[], object]) -> object:
        if threading.current_thread() is self._thread:
            return fn()
        box: list = []
        done = threading.Event()
        self._calls.put((fn, box, done))
        done.wait()
        ok, value = box[0]
        if ok:
            return value
        raise value


def _in_netlink_thread(method):
    """The method runs in the rack's netlink thread (see _OneThread)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return self._netlink.call(lambda: method(self, *args, **kwargs))
    return wrapper


def _create_netns(name: str) -> None:
    """A named network namespace, made by ``ip netns add`` (a fork and exec). pyroute2's own
    way forks this Python process, and a fork of a process whose other threads hold locks (the
    harness's progress line, the emulators) can leave the child waiting on them for ever."""
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if done.returncode != 0 and not os.path.exists(f"{NETNS_DIR}/{name}"):
        raise OSError(f"ip netns add {name}: {done.stderr.strip() or f'exit {done.returncode}'}")


def _netlink_in(name: str) -> "IPRoute":
    """A netlink socket in namespace ``name``, opened by a thread that moved there (setns is per
    thread), so no process is forked (see _create_netns)."""
    fd = _run_in_netns(name, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM,
                                                    socket.NETLINK_ROUTE).detach())
    return IPRoute(fileno=fd)


def _remove_netns(name: str) -> bool:
    """Unmount and remove a namespace's name; False if it had none."""
    path = f"{NETNS_DIR}/{name}"
    if not os.path.exists(path):
        return False
    try:
        _netns.remove(name)
    except FileNotFoundError:
        return False
    return True


def _root_links() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def _delete_root_links(names: list[str]) -> list[str]:
    removed = []
    present = set(_root_links())
    todo = [n for n in names if n in present]
    if not todo:
        return removed
    with IPRoute() as ipr:
        for name in todo:
            try:
                ipr.link("del", index=socket.if_nametoindex(name))
                removed.append(name)
            except (OSError, NetlinkError) as e:
                if getattr(e, "code", getattr(e, "errno", None)) not in (errno.ENODEV, errno.ENOENT):
                    raise RackError(f"deleting root-namespace link {name}: {e}") from e
    return removed


def _destroy(prefix: str, netns: list[str], links: list[str]) -> list[str]:
    """Kill what runs in the rack's namespaces, delete its root links and namespaces (and any
    other ``<prefix>-`` named ones); what it removed."""
    netns = sorted(set(netns) | {n for n in _list_netns() if n.startswith(prefix + "-")})
    links = sorted(set(links) | {n for n in _root_links() if n.startswith(prefix + "-")})
    _kill_in(netns)
    removed = _delete_root_links(links)
    removed += [n for n in netns if _remove_netns(n)]
    return removed


def _list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _process_start(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot (tells a pid from its reuse);
    None for no process, or one dead and not yet reaped (a zombie, or one exiting)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])


def _alive(pid: int, start: int | None) -> bool:
    """Whether the process that had ``pid`` (and started at ``start``, where known) still runs."""
    now = _process_start(pid)
    return now is not None and (start is None or now == start)


def _wait_exit(pid: int, timeout_s: float) -> None:
    """Until the process ends (woken by its exit, through a pidfd), at most ``timeout_s``."""
    if timeout_s <= 0:
        return
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return
    try:
        select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)


def _run_wrapper() -> int | None:
    """The pid of the `lumion-hil run` this process runs under (its LUMION_HIL_RUN), if any."""
    run = os.environ.get("LUMION_HIL_RUN", "")
    head = run.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _rack_states(state_dir: str, prefix: str) -> list[dict]:
    """The state files of the racks under ``prefix``, as read."""
    states = []
    for path in sorted(Path(state_dir).glob("*.json")) if Path(state_dir).is_dir() else []:
        try:
            state = json.loads(path.read_text())
            state["owner_pid"] = int(state["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(state.get("prefix"), str) and state["prefix"].startswith(prefix):
            states.append(state)
    return states


# -- the rack ------------------------------------------------------------------------------------


class Rack:
    """An emulated rack's data plane (see the module's docstring for what it builds and how it
    names it). ``build`` makes it (and repairs a half-built one), the run-time operations drive
    it (``set_carrier``, ``join``/``part``, ``set_uplink_mbit``, ``slow_mgmt``,
    ``kill_processes``), ``teardown`` removes every trace. Also a context manager (build on
    enter, teardown on exit). One netlink socket per namespace stays open for the rack's life,
    used from the rack's one netlink thread (every netlink call runs there), so threads may
    share a rack."""

    def __init__(self, spec: RackSpec, prefix: str | None = None, state_dir: str = STATE_DIR):
        self.spec = spec
        self.prefix = prefix or f"lh-{secrets.token_hex(3)}"
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"rack prefix {self.prefix!r}: 1-13 of [a-z0-9-] (it names links of at most 15)")
        self.state_dir = Path(state_dir)
        self.state_file = self.state_dir / f"{self.prefix}.json"
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
        self.uplink_mbit = spec.uplink_mbit
        self.mgmt_net: ipaddress.IPv4Network | None = None
        self._nl: dict[str, IPRoute] = {}
        self._cache: dict[str, dict] = {}  # links by namespace and name, during build
        self._sw_index: dict[str, int] = {}
        self._lock = threading.RLock()
        self._netlink = _OneThread(f"rack {self.prefix} netlink")
        self._built = False
        self._atexit = False

    # -- names and addresses --------------------------------------------------------------

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
        key = tuple(key)
        if key not in self._nics:
            self._host(key[0])
            raise KeyError(f"no NIC {key[1]!r} on host {key[0]} in rack {self.prefix} "
                           f"(NICs: {', '.join(n for h, n in self._nics if h == key[0])})")
        return self._nics[key]

    def _mgmt(self) -> ipaddress.IPv4Network:
        if self.mgmt_net is None:
            raise RackError(f"rack {self.prefix} is not built: its management network is chosen by build()")
        return self.mgmt_net

    # -- build ----------------------------------------------------------------------------

    @_in_netlink_thread
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
        if self.mgmt_net is None and self.state_file.exists():  # a crashed owner's choice
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                self.mgmt_net = ipaddress.IPv4Network(json.loads(self.state_file.read_text()).get("mgmt_net"))
        self._write_state()  # first, so that a crash from here on is found
        present = set(_list_netns())
        for name in self.namespaces:
            if name not in present:
                try:
                    _create_netns(name)
                except OSError as e:
                    raise RackError(f"creating network namespace {name}: {e}") from e
        for name in self.namespaces:
            if name not in self._nl:
                self._nl[name] = _netlink_in(name)
        self._cache = {name: _links(self._nl[name]) for name in self.namespaces}
        for name in self.namespaces:
            self._nl[name].link("set", index=self._cache[name]["lo"]["index"], state="up")
        # no IPv6 on the links made from here on (no DAD, router or MLD chatter on measured links)
        _run_in_netns_each({name: lambda: _write_sysctls({
            "net/ipv6/conf/default/disable_ipv6": "1",
            "net/ipv4/conf/all/rp_filter": "0",
            "net/ipv4/conf/default/rp_filter": "0"}) for name in self.namespaces})
        with self._state_lock(), IPRoute() as root:
            self.mgmt_net = self._choose_mgmt_net(root)
            self._write_state()
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

    @staticmethod
    @contextlib.contextmanager
    def _state_lock():
        """One machine-wide lock over choosing a management subnet and taking it."""
        Path(LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_state(self) -> None:
        run = _run_wrapper()  # the `lumion-hil run` this rack's owner runs under, if any
        state = {"prefix": self.prefix, "owner_pid": os.getpid(), "owner_start": _process_start(os.getpid()),
                 "run_pid": run, "run_start": _process_start(run) if run else None,
                 "netns": self.namespaces, "links": [self.root_link],
                 "mgmt_net": str(self.mgmt_net) if self.mgmt_net else None,
                 "hosts": [h.name for h in self.spec.hosts]}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    def _choose_mgmt_net(self, root: IPRoute) -> ipaddress.IPv4Network:
        """The management /24: the one the root link already has, else the one chosen before
        (by this rack, or by a crashed owner of its prefix) if still free, else the first in
        MGMT_SPACE that no root address or route and no other rack's state file uses."""
        if self.root_link in _root_links():
            for addr in root.addr("dump", family=socket.AF_INET, index=socket.if_nametoindex(self.root_link)):
                net = ipaddress.IPv4Network(f"{addr.get('address')}/{addr['prefixlen']}", strict=False)
                if net.subnet_of(MGMT_SPACE):
                    return net
        used = []
        for addr in root.addr("dump", family=socket.AF_INET):
            used.append(ipaddress.IPv4Network(f"{addr.get('address')}/{addr['prefixlen']}", strict=False))
        for route in root.route("dump", family=socket.AF_INET):
            if route["dst_len"] and route.get("dst"):
                used.append(ipaddress.IPv4Network(f"{route.get('dst')}/{route['dst_len']}", strict=False))
        for path in self.state_dir.glob("*.json"):
            if path == self.state_file:
                continue
            try:
                other = json.loads(path.read_text()).get("mgmt_net")
            except (OSError, ValueError, AttributeError):
                continue
            if other:
                used.append(ipaddress.IPv4Network(other))
        candidates = list(MGMT_SPACE.subnets(new_prefix=24))[1:]
        for net in ([self.mgmt_net] if self.mgmt_net else []) + candidates:
            if not any(net.overlaps(u) for u in used):
                return net
        raise RackError(f"rack {self.prefix}: every /24 of {MGMT_SPACE} is in use in the root namespace")

    def _ensure_root_link(self, root: IPRoute) -> None:
        """The root namespace's one link into the management bridge, with the gateway address."""
        mgmt = self._nl[self.mgmt_netns]
        peer = self._cache[self.mgmt_netns].get("gw")
        exists = self.root_link in _root_links()
        if exists != (peer is not None):  # one end without the other: start again
            if exists:
                root.link("del", index=socket.if_nametoindex(self.root_link))
            else:
                _del_link(mgmt, peer["index"])
            exists = False
        if not exists:  # made from the far side, whose index we choose; the root's is the kernel's
            gw_index = INDEX["gw"]
            while True:
                fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
                try:
                    _add_veth(mgmt, "gw", gw_index, fd, self.root_link, 0, f"{self.mgmt_netns}/gw", "root namespace")
                finally:
                    os.close(fd)
                root_index = socket.if_nametoindex(self.root_link)
                if root_index != gw_index:
                    break
                _del_link(mgmt, gw_index)  # the same index at both ends (see INDEX): again, above
                gw_index = root_index + 100  # where the root namespace numbers its next links
            self._cache[self.mgmt_netns]["gw"] = {"index": gw_index}
        index = socket.if_nametoindex(self.root_link)
        try:  # our own link: no IPv6 chatter from it
            Path(f"/proc/sys/net/ipv6/conf/{self.root_link}/disable_ipv6").write_text("1")
        except OSError:
            pass
        _add_addr(root, index, str(self.mgmt_net[1]), 24, f"{self.root_link} (root namespace)")
        root.link("set", index=index, state="up")

    @staticmethod
    def _netns_fd(name: str) -> int:
        return os.open(f"{NETNS_DIR}/{name}", os.O_RDONLY)

    def _veth(self, ns_a: str, name_a: str, index_a: int, ns_b: str, name_b: str, index_b: int,
              alias: str | None = None) -> tuple[int, int]:
        """A veth pair, end a in ns_a and end b in ns_b, at the indexes given (see INDEX), made
        unless both ends exist as veths (the far end's alias, if given, names what it stands
        for); their indexes."""
        a_nl, b_nl = self._nl[ns_a], self._nl[ns_b]
        a, b = self._cache[ns_a].get(name_a), self._cache[ns_b].get(name_b)
        if a is not None and b is not None and _kind(a) == "veth" and _kind(b) == "veth":
            return a["index"], b["index"]
        for nl, link in ((a_nl, a), (b_nl, b)):
            if link is not None:
                _del_link(nl, link["index"])
        fd = self._netns_fd(ns_b)
        try:
            _add_veth(a_nl, name_a, index_a, fd, name_b, index_b, f"{ns_a}/{name_a}", f"{ns_b}/{name_b}")
        finally:
            os.close(fd)
        if alias:
            b_nl.link("set", index=index_b, ifalias=alias)
        self._cache[ns_a][name_a] = {"index": index_a}
        self._cache[ns_b][name_b] = {"index": index_b}
        return index_a, index_b

    def _shape(self, ns: str, index: int, rate_bit: float | None, what: str, **tbf) -> None:
        """tbf at rate_bit on the link's egress (None: its default qdisc back)."""
        ipr = self._nl[ns]
        try:
            if rate_bit is None:
                _del_qdisc(ipr, index)
            else:
                ipr.tc("replace", "tbf", index, **_tbf_args(rate_bit, **tbf))
        except NetlinkError as e:
            raise RackError(f"tbf at {rate_bit} bit/s on {what} ({ns}): {os.strerror(e.code)}") from e

    def _build_optical(self) -> None:
        sysctls: dict[str, dict[str, str]] = {}
        for (host, nic), (k, j, n) in self._nics.items():
            ns = self.netns(host)
            port = self._port_of[(host, nic)]
            ih, isw = self._veth(ns, n.ifname, INDEX["optical"] + j, self.sw_netns, port, _port_index(k, j),
                                 alias=f"{host}/{nic}")
            ipr = self._nl[ns]
            address = self.optical_address(host, nic)
            _add_addr(ipr, ih, address, OPTICAL_NET.prefixlen, f"{host}/{n.ifname}")
            ipr.link("set", index=ih, state="up")  # the far end stays as it is: down when new
            # replies from this NIC's address leave by it, not by the first route to the /24
            _ensure(lambda: ipr.route("add", dst=str(OPTICAL_NET), oif=ih, prefsrc=address,
                                      table=POLICY_TABLE + j))
            _ensure(lambda: ipr.rule("add", src=address, src_len=32, table=POLICY_TABLE + j,
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
            index, peer = self._veth(ns, FABRIC_IFNAME, INDEX["fabric"], ns, FABRIC_IFNAME + "x", INDEX["fabric"] + 1)
            ipr = self._nl[ns]
            _add_addr(ipr, index, self.fabric_address(host), 32, f"{host}/{FABRIC_IFNAME}")
            ipr.link("set", index=peer, state="up")
            ipr.link("set", index=index, state="up")
        for host in self._hosts:  # two NICs of a host share a subnet: each answers only for its own
            sysctls.setdefault(self.netns(host), {}).update({
                "net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2",
                "net/ipv4/tcp_wmem": f"4096 16384 {TCP_WMEM_MAX}"})  # see UPLINK_WINDOWS
        _run_in_netns_each({ns: lambda values=values: _write_sysctls(values) for ns, values in sysctls.items()})

    def _bridge(self, ns: str, name: str, index: int) -> int:
        """A bridge that forwards at once (STP off, no forward delay), up; its index."""
        ipr = self._nl[ns]
        link = self._cache[ns].get(name)
        if link is not None and _kind(link) != "bridge":
            _del_link(ipr, link["index"])
            link = None
        if link is None:
            _add_bridge(ipr, name, index, ns)
            link = self._cache[ns][name] = {"index": index}
        ipr.link("set", index=link["index"], state="up")
        return link["index"]

    def _build_electrical(self) -> None:
        tor = self._nl[self.tor_netns]
        spine = self._bridge(self.tor_netns, "spine", INDEX["spine"])
        rate = self.spec.electrical_mbit * 1e6 if self.spec.electrical_mbit else None
        bridges = {}
        for r, rack in enumerate(self._racks):
            bridges[rack] = self._bridge(self.tor_netns, f"rack{r}", INDEX["rack"] + r)
            up, sp = self._veth(self.tor_netns, f"up{r}", INDEX["up"] + r, self.tor_netns, f"sp{r}", INDEX["sp"] + r,
                                alias=f"uplink {rack}")
            tor.link("set", index=up, master=bridges[rack], state="up")
            tor.link("set", index=sp, master=spine, state="up")
        self._shape_uplinks(self.uplink_mbit)
        for k, h in enumerate(self.spec.hosts):
            if not h.electrical_ifname:
                continue
            ns = self.netns(h.name)
            ih, it = self._veth(ns, h.electrical_ifname, INDEX["electrical"], self.tor_netns, f"e{k}",
                                INDEX["tor port"] + k, alias=f"{h.name}/electrical")
            _add_addr(self._nl[ns], ih, self.electrical_address(h.name), ELECTRICAL_NET.prefixlen,
                      f"{h.name}/{h.electrical_ifname}")
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
        br = self._bridge(self.mgmt_netns, "br0", INDEX["br0"])
        mgmt.link("set", index=self._cache[self.mgmt_netns]["gw"]["index"], master=br, state="up")
        for k, h in enumerate(self.spec.hosts):
            ns = self.netns(h.name)
            ih, im = self._veth(ns, MGMT_IFNAME, INDEX["mgmt0"], self.mgmt_netns, f"m{k}", INDEX["mgmt port"] + k,
                                alias=f"{h.name}/mgmt")
            for addr in self._nl[ns].addr("dump", family=socket.AF_INET, index=ih):  # of an earlier subnet
                if addr.get("address") != self.mgmt_address(h.name):
                    self._nl[ns].addr("del", index=ih, address=addr.get("address"), prefixlen=addr["prefixlen"])
            _add_addr(self._nl[ns], ih, self.mgmt_address(h.name), 24, f"{h.name}/{MGMT_IFNAME}")
            self._nl[ns].link("set", index=ih, state="up")
            mgmt.link("set", index=im, master=br, state="up")

    # -- run time -------------------------------------------------------------------------

    @_in_netlink_thread
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

    @_in_netlink_thread
    def carrier(self, host: str, nic: str) -> bool:
        """The host end's carrier as its kernel reports it (IFLA_CARRIER)."""
        _, _, n = self._nic((host, nic))
        with self._lock:
            link = self._sock(self.netns(host)).link("get", ifname=n.ifname)[0]
        return bool(link.get("carrier"))

    @_in_netlink_thread
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
                    br = _add_bridge(ipr, name, _circuit_index(self._sw_index[pa], self._sw_index[pb]), self.sw_netns)
                ipr.link("set", index=self._sw_index[pa], master=br)
                ipr.link("set", index=self._sw_index[pb], master=br)
                ipr.link("set", index=br, state="up")
            except NetlinkError as e:
                raise RackError(f"join {a[0]}/{a[1]} - {b[0]}/{b[1]} (bridge {name} in {self.sw_netns}): "
                                f"{os.strerror(e.code)}") from e

    @_in_netlink_thread
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

    @_in_netlink_thread
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

    @_in_netlink_thread
    def set_fabric_routes(self, pairs: set[frozenset]) -> None:
        """Route each host's fabric address over the circuits ``pairs`` (NIC pairs joined and
        lit): on host A, B's fabric address via B's NIC at the far end of a circuit from a NIC
        of A (the first in NIC order when several join them); routes to hosts no circuit
        reaches are removed."""
        wanted: dict[str, dict[str, tuple[str, str]]] = {h: {} for h in self._hosts}
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

    @_in_netlink_thread
    def set_uplink_mbit(self, mbit: float | dict[str, float] | None) -> None:
        """Reshape the racks' uplinks (both directions) to ``mbit``: one rate for every rack, or
        rack -> rate (None, or a rack not named: unshaped)."""
        if not self._racks:
            raise RackError(f"rack {self.prefix} has no electrical network")
        for rack, rate in (mbit.items() if isinstance(mbit, dict) else [("", mbit)]):
            if rate is not None:
                _check_rate(f"uplink {rack}".strip(), rate)
        with self._lock:
            self._sock(self.tor_netns)
            self._shape_uplinks(mbit)
            self.uplink_mbit = mbit

    @_in_netlink_thread
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
        return _run_in_netns(self.netns(host), fn)

    def pids(self, host: str) -> list[int]:
        """The processes in the host's namespace."""
        return sorted(_pids_in([self.netns(host)])[self.netns(host)])

    def kill_processes(self, host: str, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every process in the host's namespace (SIGKILL: a power loss, returning once
        none is left there); the pids signalled."""
        return _kill_in([self.netns(host)], sig)

    def _sock(self, ns: str) -> IPRoute:
        if not self._built or ns not in self._nl:
            raise RackError(f"rack {self.prefix} is not built (or was torn down)")
        return self._nl[ns]

    # -- teardown -------------------------------------------------------------------------

    @_in_netlink_thread
    def teardown(self) -> None:
        """Kill the processes in the rack's namespaces, delete its namespaces and its root link,
        remove its state file. Safe to call twice, and on a rack never built."""
        with self._lock:
            for ipr in self._nl.values():
                try:
                    ipr.close()
                except Exception:
                    pass
            self._nl.clear()
            self._sw_index.clear()
            if _netns is not None:
                _destroy(self.prefix, self.namespaces, [self.root_link])
            self.state_file.unlink(missing_ok=True)
            if self._atexit:
                atexit.unregister(self.teardown)
                self._atexit = False
            self._built = False

    @staticmethod
    def leftovers(prefix: str = "lh-") -> dict[str, list[str]]:
        """What is on this machine under ``prefix``: namespaces, root-namespace links, and the
        processes inside those namespaces (as "pid namespace command"). Random prefixes have one
        length, so one rack's prefix never starts another's."""
        netns = [n for n in _list_netns() if n.startswith(prefix)]
        links = [n for n in _root_links() if n.startswith(prefix)]
        pids = _pids_in(netns)
        return {"netns": netns, "links": links,
                "processes": [f"{pid} {ns} {_comm(pid)}" for ns in netns for pid in sorted(pids[ns])]}

    @staticmethod
    def destroy(prefix: str) -> list[str]:
        """Remove every namespace and root link named ``<prefix>-...``, killing the processes in
        those namespaces, whoever owns them; what it removed. For a rack's exact prefix only."""
        if not _PREFIX.match(prefix):
            raise ValueError(f"rack prefix {prefix!r}: 1-13 of [a-z0-9-]")
        ok, why = available()
        if not ok:
            raise RackUnavailable(why)
        return _destroy(prefix, [], [])

    @staticmethod
    def restore_after_killed_runs(state_dir: str = STATE_DIR, prefix: str = "lh-",
                                  wait_s: float = 60.0) -> tuple[list[str], dict[str, list[str]]]:
        """What ``bench restore`` does on this machine after a run was killed. A rack whose run's
        wrapper died while its owner lives is being torn down by that owner (sent SIGTERM on its
        wrapper's death, it stops at a safe point): wait for the owner to end, at most ``wait_s``.
        Then tear down every rack whose owner is dead, and everything under ``prefix`` that no
        live rack owns, and wait for the processes killed to be gone. Returns (what it removed,
        what is still there that no live run owns: namespaces, links, processes)."""
        deadline = time.monotonic() + wait_s
        for state in _rack_states(state_dir, prefix):
            if _alive(state["owner_pid"], state.get("owner_start")) and state.get("run_pid") \
                    and not _alive(state["run_pid"], state.get("run_start")):
                _wait_exit(state["owner_pid"], deadline - time.monotonic())
        removed = Rack.clean_up_stale(state_dir, prefix)
        live = [s["prefix"] for s in _rack_states(state_dir, prefix) if _alive(s["owner_pid"], s.get("owner_start"))]

        def orphans() -> dict[str, list[str]]:
            found = Rack.leftovers(prefix)
            return {kind: [x for x in names if not any(f" {p}-" in f" {x}" or x.startswith(p + "-") for p in live)]
                    for kind, names in found.items()}

        for name in orphans()["netns"] + orphans()["links"]:
            rack_prefix = name.rsplit("-", 1)[0]
            if _PREFIX.match(rack_prefix) and rack_prefix not in live:
                removed += _destroy(rack_prefix, [], [])
        settle = time.monotonic() + 5.0
        while any(orphans().values()) and time.monotonic() < settle:
            time.sleep(0.05)  # killed: each process is gone once the kernel has reaped it
        return removed, orphans()

    @staticmethod
    def clean_up_stale(state_dir: str = STATE_DIR, prefix: str = "lh-") -> list[str]:
        """Tear down the racks (under ``prefix``) whose owner process is dead, as their state
        files in ``state_dir`` list them, with any other namespace or root link named with their
        prefix; what it removed (names, and the state files' paths)."""
        directory = Path(state_dir)
        if not directory.is_dir() or not any(directory.glob("*.json")):
            return []
        ok, why = available()
        if not ok:
            raise RackUnavailable(why)
        removed: list[str] = []
        for path in sorted(directory.glob("*.json")):
            try:
                state = json.loads(path.read_text())
                rack_prefix, pid = state["prefix"], int(state["owner_pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not rack_prefix.startswith(prefix) or not _PREFIX.match(rack_prefix):
                continue
            start = _process_start(pid)
            if start is not None and start == state.get("owner_start", start):
                continue  # its owner lives
            mine = [n for n in [*state.get("netns", []), *state.get("links", [])]
                    if isinstance(n, str) and n.startswith(rack_prefix + "-")]  # never another's names
            removed += _destroy(rack_prefix, [n for n in mine if n in state.get("netns", [])],
                                [n for n in mine if n in state.get("links", [])])
            path.unlink(missing_ok=True)
            removed.append(str(path))
        return removed


# -- netlink helpers -----------------------------------------------------------------------------


def _links(ipr: IPRoute) -> dict[str, dict]:
    """The namespace's links by name."""
    return {link.get("ifname"): link for link in ipr.link("dump")}


def _kind(link) -> str | None:
    info = link.get("IFLA_LINKINFO")
    return info.get("IFLA_INFO_KIND") if info is not None else None


def _del_link(ipr: IPRoute, index: int) -> None:
    try:
        ipr.link("del", index=index)
    except NetlinkError as e:
        if e.code != errno.ENODEV:
            raise


def _del_qdisc(ipr: IPRoute, index: int) -> None:
    try:
        ipr.tc("del", index=index, handle=0, parent=0xFFFFFFFF)
    except NetlinkError as e:
        if e.code not in (errno.ENOENT, errno.EINVAL):
            raise


def _add_addr(ipr: IPRoute, index: int, address: str, prefixlen: int, what: str) -> None:
    try:
        ipr.addr("add", index=index, address=address, prefixlen=prefixlen)
    except NetlinkError as e:
        if e.code != errno.EEXIST:
            raise RackError(f"address {address}/{prefixlen} on {what}: {os.strerror(e.code)}") from e


def _ensure(add: Callable[[], object]) -> None:
    """A netlink add that may already have been done."""
    try:
        add()
    except NetlinkError as e:
        if e.code != errno.EEXIST:
            raise


def _add_veth(ipr: IPRoute, name: str, index: int, peer_netns_fd: int, peer: str, peer_index: int,
              what: str, peer_what: str) -> None:
    """A veth pair at chosen indexes (0: the kernel's choice); pyroute2's ``peer=`` shortcut
    cannot set the peer's index, so the link info is spelled out."""
    peer_msg = {"attrs": [["IFLA_IFNAME", peer], ["IFLA_NET_NS_FD", peer_netns_fd]], "index": peer_index}
    try:
        ipr.link("add", index=index, ifname=name, IFLA_LINKINFO={"attrs": [
            ["IFLA_INFO_KIND", "veth"], ["IFLA_INFO_DATA", {"attrs": [["VETH_INFO_PEER", peer_msg]]}]]})
    except NetlinkError as e:
        raise RackError(f"veth {what} (index {index}) <-> {peer_what} (index {peer_index or 'any'}): "
                        f"{os.strerror(e.code)}") from e


def _add_bridge(ipr: IPRoute, name: str, index: int, ns: str) -> int:
    """A bridge that forwards at once: STP off, no forward delay."""
    try:
        ipr.link("add", index=index, ifname=name, kind="bridge", br_stp_state=0, br_forward_delay=0)
    except NetlinkError as e:
        raise RackError(f"bridge {name} (index {index}) in {ns}: {os.strerror(e.code)}") from e
    return index


def _port_index(k: int, j: int) -> int:
    return INDEX["switch port"] + MAX_NICS_PER_HOST * k + j


def _circuit_index(a: int, b: int) -> int:
    """One index per pair of switch ports, above theirs."""
    a, b = sorted((a - INDEX["switch port"], b - INDEX["switch port"]))
    return INDEX["circuit"] + 256 * a + b
