"""Which interfaces the ring's data connections use, read as NCCL reads ``NCCL_SOCKET_IFNAME``
(comma-separated prefixes, ``=`` for exact names, ``^`` to exclude; unset: every interface but
``lo`` and ``docker*``), and sockets bound to one of them, so that their traffic leaves by the
NIC a circuit joins whatever the routing table says."""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (SIOCGIFADDR), None when it has none or is absent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def select_interfaces(spec: str | None) -> list[tuple[str, str]]:
    """(name, IPv4 address) of each interface NCCL_SOCKET_IFNAME=``spec`` selects, as NCCL reads
    it: comma-separated name prefixes; ``=`` before the list for exact names; ``^`` to exclude.
    Interfaces without an IPv4 address are left out."""
    spec = (spec or "^docker,lo").strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [n.strip() for n in spec.lstrip("=").split(",") if n.strip()]

    def chosen(ifname: str) -> bool:
        hit = any(ifname == n if exact else ifname.startswith(n) for n in names)
        return hit != exclude

    found = []
    for _, ifname in socket.if_nameindex():
        address = interface_address(ifname) if chosen(ifname) else None
        if address is not None:
            found.append((ifname, address))
    if not exclude:  # in the order the list gives
        found.sort(key=lambda f: next(i for i, n in enumerate(names) if (f[0] == n if exact else f[0].startswith(n))))
    return found


def interface_with(address: str) -> str:
    """The name of the interface that holds ``address`` ("?" when none does)."""
    return next((n for _, n in socket.if_nameindex() if interface_address(n) == address), "?")


def bound_socket(ifname: str, address: str) -> socket.socket:
    """A TCP socket bound to ``address`` and, with SO_BINDTODEVICE, to interface ``ifname``: its
    traffic leaves by that interface whatever the routing table says."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, ifname.encode())
        sock.bind((address, 0))
    except OSError:
        sock.close()
        raise
    return sock
