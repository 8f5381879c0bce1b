"""The connections between the ring's ranks. Each ring is a ring of TCP connections, each rank
connecting to its successor. To find which of its NICs a circuit joins to which of the
successor's, a rank tries every (own interface, successor's address) pair at once, each socket
bound to its interface with a short connect timeout, and keeps the first that connects
(:func:`race`); pairs with no circuit behind them fail fast (no ARP answer). Listeners are bound
to their interface too (:func:`listen`), so replies leave by the NIC the circuit joins. What a
connection carries first, the handshake, is one line (:func:`read_line`)."""

from __future__ import annotations

import errno
import queue
import socket
import threading
import time
from dataclasses import dataclass

from lumion_hil.instruments.emulators.ring_interfaces import bound_socket

CONNECT_TIMEOUT_S = 2.0  # one connect attempt through one interface pair (no circuit: ARP fails first)
RETRY_S = 0.2  # the longest wait between rounds of attempts while a peer or the store is not reachable yet
FIRST_RETRY_S = 0.01  # the first such wait; each next one twice as long, up to RETRY_S


def retry_waits():
    """The waits between rounds of connection attempts: short at first (ranks start together, and
    rank 0's store listens a few ms after the others first try), then doubling up to RETRY_S."""
    wait = FIRST_RETRY_S
    while True:
        yield wait
        wait = min(RETRY_S, 2 * wait)


@dataclass
class Link:
    """One ring's connection to a neighbour: ``send`` to the successor, ``recv`` from the predecessor."""

    ring: int
    direction: str  # "send" or "recv"
    peer: int
    ifname: str  # this rank's interface the connection goes through
    local: tuple[str, int]
    remote: tuple[str, int]
    sock: socket.socket

    @property
    def remote_text(self) -> str:
        return f"{self.remote[0]}<{self.remote[1]}>"


def read_line(sock: socket.socket, limit: int = 4096) -> bytes:
    """One handshake line, byte by byte: nothing after it is consumed."""
    line = b""
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionResetError(errno.ECONNRESET, "closed during the handshake")
        line += byte
        if len(line) > limit:
            raise ValueError("handshake line too long")
    return line


def listen(interfaces: list[tuple[str, str]]) -> list[tuple[str, str, socket.socket]]:
    """One listener per data interface, bound to it: a connection accepted there answers by it."""
    listeners = []
    for ifname, address in interfaces:
        sock = bound_socket(ifname, address)
        sock.listen(16)
        listeners.append((ifname, address, sock))
    return listeners


def race(targets, deadline: float, tried: list[str]):
    """Connect through every (interface, address, remote) target at once; (socket, interface, remote) of the first that
    connects, or Nones. Later winners are closed."""
    results: queue.Queue = queue.Queue()
    lock = threading.Lock()
    won: list[socket.socket] = []

    def attempt(ifname: str, address: str, remote: tuple[str, int]) -> None:
        try:
            sock = bound_socket(ifname, address)
        except OSError as exc:
            results.put((None, ifname, remote, exc))
            return
        try:
            sock.settimeout(max(0.05, min(CONNECT_TIMEOUT_S, deadline - time.monotonic())))
            sock.connect(remote)
        except OSError as exc:
            sock.close()
            results.put((None, ifname, remote, exc))
            return
        with lock:
            first = not won
            won.append(sock)
        if not first:
            sock.close()
        results.put((sock if first else None, ifname, remote, None))

    for target in targets:
        threading.Thread(target=attempt, args=target, daemon=True, name="connect").start()
    for _ in targets:
        sock, ifname, remote, exc = results.get()
        if sock is not None:
            return sock, ifname, remote
        if exc is not None:
            tried.append(f"{ifname}->{remote[0]}:{remote[1]} {exc.strerror or exc}")
    return None, None, None
