"""Netlink, as the rack in a box uses it: pyroute2 (where installed), one thread for every
netlink call of a rack (:class:`OneThread`), the calls that make links, bridges, addresses and
routes and may find them already made, and tbf's shaping: the bucket and queue each link gets.
"""

from __future__ import annotations

import errno
import functools
import os
import queue
import threading
from typing import Callable

from lumion_hil.instruments.emulators.rack_spec import NETNS_DIR, RackError

try:
    from pyroute2 import IPRoute
    from pyroute2 import netns as pyroute2_netns
    from pyroute2.netlink.exceptions import NetlinkError
except ImportError:  # not Linux, or not installed: rack_machine.available() says so
    IPRoute = None
    pyroute2_netns = None

    class NetlinkError(Exception):  # type: ignore[no-redef]
        code = 0


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


def tbf_args(rate_bit: float, burst_s: float = BURST_S, queue_s: float = QUEUE_S,
             burst_min: int = BURST_MIN, queue_min: int = QUEUE_MIN) -> dict:
    """pyroute2's tbf arguments for a rate in bit/s (see BURST_S for the choice)."""
    rate_bytes = rate_bit / 8
    burst = max(int(rate_bytes * burst_s), burst_min)
    return {"rate": f"{int(rate_bit)}bit", "burst": burst, "limit": burst + max(int(rate_bytes * queue_s), queue_min)}


class OneThread:
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


def in_netlink_thread(method):
    """The method runs in its object's netlink thread (its ``_netlink``, a :class:`OneThread`)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return self._netlink.call(lambda: method(self, *args, **kwargs))
    return wrapper


def links_by_name(ipr: IPRoute) -> dict[str, dict]:
    """The namespace's links by name."""
    return {link.get("ifname"): link for link in ipr.link("dump")}


def link_kind(link) -> str | None:
    info = link.get("IFLA_LINKINFO")
    return info.get("IFLA_INFO_KIND") if info is not None else None


def del_link(ipr: IPRoute, index: int) -> None:
    try:
        ipr.link("del", index=index)
    except NetlinkError as e:
        if e.code != errno.ENODEV:
            raise


def del_qdisc(ipr: IPRoute, index: int) -> None:
    try:
        ipr.tc("del", index=index, handle=0, parent=0xFFFFFFFF)
    except NetlinkError as e:
        if e.code not in (errno.ENOENT, errno.EINVAL):
            raise


def add_addr(ipr: IPRoute, index: int, address: str, prefixlen: int, what: str) -> None:
    try:
        ipr.addr("add", index=index, address=address, prefixlen=prefixlen)
    except NetlinkError as e:
        if e.code != errno.EEXIST:
            raise RackError(f"address {address}/{prefixlen} on {what}: {os.strerror(e.code)}") from e


def ensure_added(add: Callable[[], object]) -> None:
    """A netlink add that may already have been done."""
    try:
        add()
    except NetlinkError as e:
        if e.code != errno.EEXIST:
            raise


def add_veth(ipr: IPRoute, name: str, index: int, peer_netns_fd: int, peer: str, peer_index: int,
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


def add_bridge(ipr: IPRoute, name: str, index: int, ns: str) -> int:
    """A bridge that forwards at once: STP off, no forward delay."""
    try:
        ipr.link("add", index=index, ifname=name, kind="bridge", br_stp_state=0, br_forward_delay=0)
    except NetlinkError as e:
        raise RackError(f"bridge {name} (index {index}) in {ns}: {os.strerror(e.code)}") from e
    return index


def ensure_veth(sockets: dict[str, IPRoute], links: dict[str, dict], ns_a: str, name_a: str, index_a: int,
                ns_b: str, name_b: str, index_b: int, alias: str | None = None) -> tuple[int, int]:
    """A veth pair, end a in ns_a and end b in ns_b, at the indexes given (see rack_spec.INDEX),
    made unless both ends exist as veths (the far end's alias, if given, names what it stands
    for); their indexes. ``sockets`` holds a netlink socket per namespace, ``links`` the links
    known in each namespace by name, kept up to date here."""
    a_nl, b_nl = sockets[ns_a], sockets[ns_b]
    a, b = links[ns_a].get(name_a), links[ns_b].get(name_b)
    if a is not None and b is not None and link_kind(a) == "veth" and link_kind(b) == "veth":
        return a["index"], b["index"]
    for nl, link in ((a_nl, a), (b_nl, b)):
        if link is not None:
            del_link(nl, link["index"])
    fd = os.open(f"{NETNS_DIR}/{ns_b}", os.O_RDONLY)
    try:
        add_veth(a_nl, name_a, index_a, fd, name_b, index_b, f"{ns_a}/{name_a}", f"{ns_b}/{name_b}")
    finally:
        os.close(fd)
    if alias:
        b_nl.link("set", index=index_b, ifalias=alias)
    links[ns_a][name_a] = {"index": index_a}
    links[ns_b][name_b] = {"index": index_b}
    return index_a, index_b


def ensure_bridge(ipr: IPRoute, links: dict[str, dict], ns: str, name: str, index: int) -> int:
    """A bridge that forwards at once (STP off, no forward delay), up, made unless ``links``
    (the namespace's, by name; kept up to date) has one; its index."""
    link = links.get(name)
    if link is not None and link_kind(link) != "bridge":
        del_link(ipr, link["index"])
        link = None
    if link is None:
        add_bridge(ipr, name, index, ns)
        link = links[name] = {"index": index}
    ipr.link("set", index=link["index"], state="up")
    return link["index"]
