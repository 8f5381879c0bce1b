"""Real collectives over TCP sockets, for the rack in a box: a small communicator that does what
NCCL's socket transport does between hosts, on numpy buffers in place of GPU memory.

- Rendezvous (NCCL's bootstrap, PyTorch's TCPStore): rank 0 serves a tiny key-value store at
  ``master_addr:master_port``; that address is on the management network, as NCCL's bootstrap
  network usually is, never on the data interfaces (an optical NIC reaches only its circuit's
  far end). The store serves one job, named by the master port and the rank map: a rank of
  another (older) rank map is refused there and never joins. Each rank publishes its host, pid
  and one listening address per data interface; init completes when every rank has joined, or
  fails after the timeout as PyTorch says it (``DistStoreError: Timed out after ...``).
- Data interfaces: ``NCCL_SOCKET_IFNAME`` read as NCCL reads it (comma-separated prefixes,
  ``=`` for exact names, ``^`` to exclude; unset: every interface but ``lo`` and ``docker*``).
- Peer links: each ring is a ring of TCP connections, each rank connecting to its successor.
  To find which of its NICs a circuit joins to which of the successor's, a rank tries every
  (own interface, successor's address) pair at once, each socket bound to its interface with
  SO_BINDTODEVICE and a short connect timeout, and keeps the first that connects; pairs with no
  circuit behind them fail fast (no ARP answer). Listeners are bound to their interface too, so
  replies leave by the NIC the circuit joins. The handshake names the communicator (the job and
  the instance rank 0 made), the rank and the ring: a stale connection is refused.
- Collectives: ring all-reduce (reduce-scatter then all-gather), all-gather, reduce-scatter,
  and chains for broadcast and reduce, pipelined in chunks of :data:`CHUNK_BYTES`. With two
  rings, half of the buffer goes round each way at once (one ring per direction), so both
  directions of every link carry data, as NCCL's rings do. The data connections use cubic
  (:data:`CONGESTION_CONTROL`) where the kernel has it, so that measured bandwidth is steady.
- Failures as NCCL and PyTorch show them: every blocking socket operation is bounded by the
  timeout, after which the rank raises :class:`CollectiveTimeout` (PyTorch's watchdog line); a
  peer that closed its connection raises :class:`PeerClosed` at once (NCCL's
  ``NET/Socket : peer ... closed connection``). A failed communicator closes its sockets, so its
  neighbours fail at once too. ``str()`` of every :class:`CommError` is the lines to print.

Lines NCCL prints with NCCL_DEBUG=INFO (the interfaces, each channel's interface and peer,
``Init COMPLETE``) go to ``log``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import queue
import random
import select
import socket
import socketserver
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TextIO

import numpy as np

CHUNK_BYTES = 256 << 10  # one pipelined piece of a step (NCCL's socket transport: 512 KiB slots)
RCVLOWAT_BYTES = CHUNK_BYTES  # a receiver wakes up once per chunk (SO_RCVLOWAT), not per segment
CONNECT_TIMEOUT_S = 2.0  # one connect attempt through one interface pair (no circuit: ARP fails first)
RETRY_S = 0.2  # the longest wait between rounds of attempts while a peer or the store is not reachable yet
FIRST_RETRY_S = 0.01  # the first such wait; each next one twice as long, up to RETRY_S
STORE_CALL_S = 5.0  # a store request's own bound, beyond the time it may wait for a key
# The data connections' TCP congestion control, where the kernel has it: on tbf-shaped veths
# BBR's probing makes one operation's time differ from the next by up to a quarter; cubic keeps
# them steady at the TCP payload rate (about 94% of the line rate with a 1500-byte MTU).
CONGESTION_CONTROL = "cubic"
SIOCGIFADDR = 0x8915
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)

OPS: dict[str, Callable] = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
                            "avg": np.add}  # avg: the sum, divided by the rank count at the end
OP_TYPES = {"all_reduce": "ALLREDUCE", "all_gather": "ALLGATHER", "reduce_scatter": "REDUCE_SCATTER",
            "broadcast": "BROADCAST", "reduce": "REDUCE"}  # PyTorch's names in its watchdog line


# --- errors -------------------------------------------------------------------------------------


class CommError(RuntimeError):
    """A communicator failure; ``str()`` is what NCCL and PyTorch print for it (one or more lines)."""


class InitTimeout(CommError):
    """Not every rank joined the rendezvous in time (or the store was never reached)."""


class CollectiveTimeout(CommError):
    """A collective's socket operation did not complete within the timeout (PyTorch's watchdog)."""


class PeerClosed(CommError):
    """A peer closed its connection: its process exited or failed."""


class NetworkError(CommError):
    """Any other socket failure: no interface reaches a peer, a refused handshake, an errno."""


class _Failure(Exception):
    """Raised inside the ring loops; turned into a :class:`CommError` with the collective's context."""

    def __init__(self, kind: str, link: "Link", detail: str = ""):
        super().__init__(kind, detail)
        self.kind, self.link, self.detail = kind, link, detail


# --- interfaces ---------------------------------------------------------------------------------


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


def _interface_with(address: str) -> str:
    return next((n for _, n in socket.if_nameindex() if interface_address(n) == address), "?")


def _bound_socket(ifname: str, address: str) -> socket.socket:
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


# --- the rendezvous store -----------------------------------------------------------------------


class _StoreHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        store: _StoreServer = self.server  # type: ignore[assignment]
        while True:
            try:
                line = self.rfile.readline()
            except OSError:
                return
            if not line:
                return
            try:
                answer = store.answer(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                answer = {"ok": False, "error": f"bad request: {exc}"}
            try:
                self.wfile.write(json.dumps(answer).encode() + b"\n")
            except OSError:
                return


class _StoreServer(socketserver.ThreadingTCPServer):
    """Rank 0's key-value store: ``hello`` (is this the job's store?), ``set``, ``get`` (waiting
    up to ``wait_s`` for the key), ``check`` (which keys exist)."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address: tuple[str, int], job: str):
        super().__init__(address, _StoreHandler)
        self.job = job
        self.comm_id = f"{random.getrandbits(64):016x}"  # this instance of the job's communicator
        self.values: dict[str, object] = {}
        self.changed = threading.Condition()

    def answer(self, request: dict) -> dict:
        op = request.get("op")
        if op == "hello":
            if request.get("job") != self.job:
                return {"ok": False, "error": f"this store serves job {self.job!r}"}
            return {"ok": True, "comm_id": self.comm_id}
        with self.changed:
            if op == "set":
                self.values[request["key"]] = request["value"]
                self.changed.notify_all()
                return {"ok": True}
            if op == "get":
                self.changed.wait_for(lambda: request["key"] in self.values, timeout=float(request["wait_s"]))
                return {"ok": True, "value": self.values.get(request["key"])}
            if op == "check":
                return {"ok": True, "present": [k for k in request["keys"] if k in self.values]}
        return {"ok": False, "error": f"unknown request {op!r}"}


def _serve_store(address: tuple[str, int], job: str, deadline: float) -> _StoreServer:
    """Rank 0's store, listening at ``address`` (any local address when that one is not this
    host's), tried again while the port is still held (an earlier job's rank 0 on its way out)."""
    waits = _retry_waits()
    while True:
        try:
            try:
                server = _StoreServer(address, job)
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                server = _StoreServer(("0.0.0.0", address[1]), job)
        except OSError as exc:
            if time.monotonic() >= deadline:
                name = errno.errorcode.get(exc.errno or 0, "?")
                raise InitTimeout(f"torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                                  f"local network address. port: {address[1]}, useIpv6: 0, code: -{exc.errno}, "
                                  f"name: {name}, message: {exc.strerror}") from None
            time.sleep(next(waits))
            continue
        threading.Thread(target=server.serve_forever, daemon=True, name="store").start()
        return server


def _retry_waits():
    """The waits between rounds of connection attempts: short at first (ranks start together, and
    rank 0's store listens a few ms after the others first try), then doubling up to RETRY_S."""
    wait = FIRST_RETRY_S
    while True:
        yield wait
        wait = min(RETRY_S, 2 * wait)


class _StoreClient:
    """One rank's connection to the store, once the store has said it serves this job."""

    def __init__(self, address: tuple[str, int], job: str, nranks: int, deadline: float, timeout_s: float):
        refused = None
        waits = _retry_waits()
        while True:
            left = deadline - time.monotonic()
            try:
                self.sock = socket.create_connection(address, timeout=max(0.05, min(CONNECT_TIMEOUT_S, left)))
            except OSError:
                pass
            else:
                self.reader = self.sock.makefile("rb")
                try:
                    hello = self.call("hello", job=job)
                except (OSError, ValueError):
                    hello = {"ok": False, "error": None}
                if hello["ok"]:
                    self.comm_id = hello["comm_id"]
                    return
                refused = hello["error"] or refused
                self.close()
            if time.monotonic() >= deadline:
                if refused:
                    raise InitTimeout(f"torch.distributed.DistStoreError: Timed out after {timeout_s:.3g} seconds "
                                      f"waiting for clients. 0/{nranks} clients joined. (the store at "
                                      f"{address[0]}:{address[1]} refused this rank: {refused}, not {job!r})")
                raise InitTimeout(f"torch.distributed.DistNetworkError: The client socket has timed out after "
                                  f"{timeout_s:.3g}s while trying to connect to ({address[0]}, {address[1]}).")
            time.sleep(next(waits))

    def call(self, op: str, wait_s: float = 0.0, **params) -> dict:
        self.sock.settimeout(wait_s + STORE_CALL_S)
        self.sock.sendall(json.dumps({"op": op, "wait_s": wait_s, **params}).encode() + b"\n")
        line = self.reader.readline()
        if not line:
            raise ConnectionResetError(errno.ECONNRESET, "the store closed the connection")
        return json.loads(line)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


# --- links --------------------------------------------------------------------------------------


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


def _read_line(sock: socket.socket, limit: int = 4096) -> bytes:
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


@dataclass(frozen=True)
class _Step:
    """One step of a ring schedule for one rank: the elements it sends to its successor and
    those it receives from its predecessor (added in with ``reduce``, else copied)."""

    send: tuple[int, int] | None
    recv: tuple[int, int] | None
    reduce: bool = False


def _split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) in ``parts`` nearly equal pieces, the first ones one longer (as numpy.array_split)."""
    size, extra = divmod(hi - lo, parts)
    out, start = [], lo
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def _chunks(span: tuple[int, int] | None, elements: int):
    if span is not None:
        for lo in range(span[0], span[1], elements):
            yield lo, min(lo + elements, span[1])


# --- the communicator ---------------------------------------------------------------------------


class Communicator:
    """One rank's communicator: constructing it runs init (the rendezvous, then the peer links)
    and returns once every rank has joined and its links are up, or raises :class:`CommError`.

    ``ranks`` are host names in ring order, rank 0 first; ``timeout_s`` bounds init and every
    socket operation of a collective (the NCCL timeout); ``rings`` is 1 or 2 (one each way);
    ``congestion_control`` names the data connections' TCP congestion control (None: the
    system's; see :data:`CONGESTION_CONTROL`)."""

    def __init__(self, ranks: list[str], rank: int, master_addr: str, master_port: int, *,
                 socket_ifname: str | None = None, timeout_s: float = 1800.0, rings: int = 2,
                 congestion_control: str | None = CONGESTION_CONTROL, log: TextIO | None = sys.stdout):
        if not 0 <= rank < len(ranks):
            raise ValueError(f"rank {rank} is not in a rank map of {len(ranks)}")
        if rings not in (1, 2):
            raise ValueError(f"rings is 1 or 2, not {rings}")
        self.ranks, self.rank, self.nranks = list(ranks), rank, len(ranks)
        self.host = self.ranks[rank]
        self.rings = rings if self.nranks > 1 else 0
        self.timeout_s = timeout_s
        self.congestion_control = congestion_control
        self.job = f"{master_port}/{','.join(self.ranks)}"  # as the emulated job names its communicator
        self.log = log
        self.links: list[Link] = []
        self.peers: list[dict] = []  # what each rank published: host, pid, addresses
        self.seq = 0  # the next collective's sequence number (PyTorch's SeqNum)
        self._store: _StoreServer | None = None
        self._client: _StoreClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._aborted = False  # a failure (or close) shut the links: loops still running stop
        self._closed = False
        self._send: dict[int, Link] = {}
        self._recv: dict[int, Link] = {}
        try:
            self._init((master_addr, int(master_port)), socket_ifname)
        except BaseException:
            self.close()
            raise

    # -- init --------------------------------------------------------------------------------------

    def _init(self, master: tuple[str, int], socket_ifname: str | None) -> None:
        deadline = time.monotonic() + self.timeout_s
        interfaces = select_interfaces(socket_ifname)
        if not interfaces:
            raise NetworkError(f"{self._prefix()} NCCL WARN NET/Socket : no interface with an IPv4 address matches "
                               f"NCCL_SOCKET_IFNAME={socket_ifname or ''}")
        if self.rank == 0:
            self._store = _serve_store(master, self.job, deadline)
        self._client = _StoreClient(master, self.job, self.nranks, deadline, self.timeout_s)
        self.comm_id = self._client.comm_id
        self._say("INFO", f"Bootstrap : Using {_interface_with(self._client.sock.getsockname()[0])}:"
                          f"{self._client.sock.getsockname()[0]}<0> (store {master[0]}:{master[1]})")
        self._say("INFO", "NET/Socket : Using " + " ".join(f"[{i}]{n}:{a}<0>" for i, (n, a) in enumerate(interfaces)))
        listeners = [] if self.rings == 0 else self._listen(interfaces)
        inbound: queue.Queue = queue.Queue()
        if listeners:
            threading.Thread(target=self._accept, args=(listeners, inbound, deadline), daemon=True,
                             name="accept").start()
        try:
            self._client.call("set", key=f"rank/{self.rank}",
                              value={"host": self.host, "pid": os.getpid(),
                                     "addresses": [[n, a, s.getsockname()[1]] for n, a, s in listeners]})
            self.peers = self._wait_for_all(deadline)
            for ring in range(self.rings):
                successor = self._neighbour(ring, +1)
                self._send[ring] = self._connect(ring, successor, interfaces, deadline)
            while len(self._recv) < self.rings:
                try:
                    link = inbound.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    missing = [self._neighbour(r, -1) for r in range(self.rings) if r not in self._recv]
                    raise NetworkError(f"{self._prefix()} NCCL WARN Bootstrap : no connection from rank(s) {missing} "
                                       f"within {self.timeout_s:.3g} s") from None
                self._recv[link.ring] = link
                self._say("INFO", f"Channel {link.ring:02d}/{self.rings:02d} : {link.peer}[0] -> {self.rank}[0] "
                                  f"[receive] via NET/Socket/{link.ifname} ({link.remote[0]} -> {link.local[0]})")
        finally:
            for _, _, sock in listeners:
                sock.close()
        self.links = [self._send[r] for r in range(self.rings)] + [self._recv[r] for r in range(self.rings)]
        for link in self.links:
            link.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.links and self.congestion_control:
            self._choose_congestion_control()
        self._pool = ThreadPoolExecutor(max_workers=max(1, 2 * self.rings), thread_name_prefix="ring")
        self._say("INFO", f"comm 0x{id(self):x} rank {self.rank} nranks {self.nranks} cudaDev -1 busId 0 "
                          f"commId 0x{self.comm_id} - Init COMPLETE")

    def _choose_congestion_control(self) -> None:
        try:
            for link in self.links:
                link.sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, self.congestion_control.encode())
        except OSError as exc:
            self._say("INFO", f"NET/Socket : TCP congestion control {self.congestion_control} not available "
                              f"({exc.strerror}): the system's")
        else:
            self._say("INFO", f"NET/Socket : TCP congestion control {self.congestion_control}")

    def _wait_for_all(self, deadline: float) -> list[dict]:
        keys = [f"rank/{r}" for r in range(self.nranks)]
        found = {}
        for key in keys:
            reply = self._client.call("get", key=key, wait_s=max(0.0, deadline - time.monotonic()))
            if reply["value"] is None:
                present = set(self._client.call("check", keys=keys)["present"])
                missing = [r for r, k in enumerate(keys) if k not in present]
                raise InitTimeout(f"torch.distributed.DistStoreError: Timed out after {self.timeout_s:.3g} seconds "
                                  f"waiting for clients. {len(present)}/{self.nranks} clients joined. "
                                  f"(missing ranks {missing})")
            found[key] = reply["value"]
        return [found[k] for k in keys]

    def _listen(self, interfaces: list[tuple[str, str]]) -> list[tuple[str, str, socket.socket]]:
        """One listener per data interface, bound to it: a connection accepted there answers by it."""
        listeners = []
        for ifname, address in interfaces:
            sock = _bound_socket(ifname, address)
            sock.listen(16)
            listeners.append((ifname, address, sock))
        return listeners

    def _accept(self, listeners, inbound: queue.Queue, deadline: float) -> None:
        """Accept connections until init ends; each is let in once its handshake names this
        communicator and a predecessor of this rank on the ring it names."""
        expected = {ring: self._neighbour(ring, -1) for ring in range(self.rings)}
        by_socket = {sock: ifname for ifname, _, sock in listeners}
        while time.monotonic() < deadline and len(self._recv) < self.rings:
            try:
                readable, _, _ = select.select(list(by_socket), [], [], 0.1)
                accepted = [(by_socket[listener], *listener.accept()) for listener in readable]
            except (OSError, ValueError):  # closed: init is over
                return
            for ifname, conn, remote in accepted:
                threading.Thread(target=self._admit, args=(conn, ifname, remote, expected, inbound, deadline),
                                 daemon=True, name="handshake").start()

    def _admit(self, conn: socket.socket, ifname: str, remote, expected: dict, inbound: queue.Queue,
               deadline: float) -> None:
        try:
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            hello = json.loads(_read_line(conn))
            ring, peer = hello.get("ring"), hello.get("rank")
            if hello.get("comm") != self.comm_id:
                refusal = f"communicator {hello.get('comm')} ({hello.get('job')}) is not {self.comm_id} ({self.job})"
            elif ring not in expected or expected[ring] != peer:
                refusal = f"rank {peer} is not this rank's predecessor on ring {ring}"
            else:
                refusal = None
            conn.sendall(json.dumps({"ok": refusal is None, "error": refusal}).encode() + b"\n")
            if refusal is not None:
                self._say("WARN", f"NET/Socket : refused a connection from {remote[0]}<{remote[1]}>: {refusal}")
                conn.close()
                return
            conn.settimeout(None)
            inbound.put(Link(ring, "recv", peer, ifname, conn.getsockname(), remote, conn))
        except (OSError, ValueError):  # a losing parallel attempt, closed before its handshake
            conn.close()

    def _connect(self, ring: int, peer: int, interfaces, deadline: float) -> Link:
        """The connection to ``peer``, the successor on ``ring``: every (own interface, peer's
        address) pair tried at once, the first to connect kept; rounds again until the timeout."""
        targets = [(ifname, address, (peer_address, port)) for ifname, address in interfaces
                   for _, peer_address, port in self.peers[peer]["addresses"]]
        waits = _retry_waits()
        while True:
            tried = []
            sock, ifname, remote = self._race(targets, deadline, tried)
            if sock is not None:
                try:
                    sock.settimeout(max(0.05, deadline - time.monotonic()))
                    sock.sendall(json.dumps({"comm": self.comm_id, "job": self.job, "rank": self.rank,
                                             "ring": ring}).encode() + b"\n")
                    answer = json.loads(_read_line(sock))
                except (OSError, ValueError) as exc:
                    sock.close()
                    tried.append(f"{ifname}->{remote[0]}:{remote[1]} handshake: {exc}")
                else:
                    if not answer.get("ok"):
                        sock.close()
                        raise NetworkError(f"{self._prefix()} NCCL WARN NET/Socket : rank {peer} "
                                           f"({self.ranks[peer]}) refused ring {ring}: {answer.get('error')}")
                    sock.settimeout(None)
                    link = Link(ring, "send", peer, ifname, sock.getsockname(), remote, sock)
                    self._say("INFO", f"Channel {ring:02d}/{self.rings:02d} : {self.rank}[0] -> {peer}[0] [send] "
                                      f"via NET/Socket/{ifname} ({link.local[0]} -> {remote[0]})")
                    return link
            if time.monotonic() >= deadline:
                raise NetworkError(f"{self._prefix()} NCCL WARN NET/Socket : Connect to rank {peer} "
                                   f"({self.ranks[peer]}) failed: no interface reaches it within "
                                   f"{self.timeout_s:.3g} s (tried {'; '.join(tried)})")
            time.sleep(next(waits))

    @staticmethod
    def _race(targets, deadline: float, tried: list[str]):
        """Connect through every pair at once; (socket, interface, remote) of the first that
        connects, or Nones. Later winners are closed."""
        results: queue.Queue = queue.Queue()
        lock = threading.Lock()
        won = []

        def attempt(ifname: str, address: str, remote: tuple[str, int]) -> None:
            try:
                sock = _bound_socket(ifname, address)
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

    # -- collectives -------------------------------------------------------------------------------

    def all_reduce(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        """``recv`` (``send`` itself when None: in place) = the reduction of every rank's ``send``."""
        out = self._output(send, recv, len(send))
        plans = []
        for part in _split(0, len(out), max(1, self.rings)):
            blocks = _split(*part, self.nranks)
            plans.append(lambda ring, p, blocks=blocks: self._ring_steps(ring, p, blocks, 0, 2 * self.nranks - 2))
        self._run("all_reduce", out, plans, op)
        return self._average(out, op)

    def all_gather(self, send: np.ndarray, recv: np.ndarray | None = None) -> np.ndarray:
        """``recv`` (n times ``send``'s length) = every rank's ``send``, rank 0's first. In place
        when ``send`` is this rank's slot of ``recv``."""
        m = len(send)
        out = np.empty(m * self.nranks, send.dtype) if recv is None else recv
        if not np.shares_memory(out[self.rank * m:(self.rank + 1) * m], send):
            out[self.rank * m:(self.rank + 1) * m] = send
        self._run("all_gather", out, self._slot_plans(m, self.nranks - 1, 2 * self.nranks - 2), "sum")
        return out

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        """``recv`` (1/n of ``send``) = this rank's slot of the reduction of every rank's ``send``."""
        m = len(send) // self.nranks
        work = send[:m * self.nranks].copy()  # the slots of the other ranks are scratch here
        self._run("reduce_scatter", work, self._slot_plans(m, 0, self.nranks - 1), op)
        out = np.empty(m, send.dtype) if recv is None else recv
        out[:] = work[self.rank * m:(self.rank + 1) * m]
        return self._average(out, op)

    def broadcast(self, send: np.ndarray, recv: np.ndarray | None = None, root: int = 0) -> np.ndarray:
        """``recv`` = root's ``send`` on every rank, down a chain from the root (one each way)."""
        out = self._output(send, recv, len(send)) if self.rank == root else (send if recv is None else recv)
        self._run("broadcast", out, self._chain_plans(len(out), root, reduce=False), "sum")
        return out

    def reduce(self, send: np.ndarray, recv: np.ndarray | None = None, root: int = 0, op: str = "sum") -> np.ndarray:
        """On the root, ``recv`` = the reduction of every rank's ``send``, up a chain to the root;
        other ranks' buffers are left as they were."""
        out = self._output(send, recv, len(send)) if self.rank == root else send.copy()
        self._run("reduce", out, self._chain_plans(len(out), root, reduce=True), op)
        return self._average(out, op) if self.rank == root else (send if recv is None else recv)

    def barrier(self) -> None:
        """Every rank has entered it: a 4-byte all-reduce, as PyTorch's barrier is."""
        self.all_reduce(np.zeros(1, np.float32))

    # -- schedules ---------------------------------------------------------------------------------

    def _order(self, ring: int) -> list[int]:
        """Ranks in ring order: ring 0 goes 0, 1, 2, ...; ring 1 the other way, 0, n-1, n-2, ..."""
        n = self.nranks
        return list(range(n)) if ring == 0 else [(-q) % n for q in range(n)]

    def _neighbour(self, ring: int, step: int) -> int:
        order = self._order(ring)
        return order[(order.index(self.rank) + step) % self.nranks]

    def _ring_steps(self, ring: int, position: int, blocks: list[tuple[int, int]], first: int, last: int):
        """Steps ``first`` to ``last`` - 1 of the ring all-reduce, whose step i sends the block
        of position p-i-1 and receives that of p-i-2 (blocks indexed by rank): steps 0 to n-2
        reduce-scatter (rank r ends with block r reduced), steps n-1 to 2n-3 all-gather."""
        order, n = self._order(ring), self.nranks

        def block(q: int) -> tuple[int, int]:
            return blocks[order[q % n]]

        return [_Step(block(position - i - 1), block(position - i - 2), i < n - 1) for i in range(first, last)]

    def _slot_plans(self, m: int, first: int, last: int):
        """Plans for a buffer of n slots of ``m`` elements, rank r's slot at r*m: each ring takes
        its part of every slot."""
        plans = []
        for lo, hi in _split(0, m, max(1, self.rings)):
            blocks = [(r * m + lo, r * m + hi) for r in range(self.nranks)]
            plans.append(lambda ring, p, blocks=blocks: self._ring_steps(ring, p, blocks, first, last))
        return plans

    def _chain_plans(self, length: int, root: int, reduce: bool):
        """Broadcast: a chain from the root along each ring; reduce: a chain ending at the root
        (its first link leaves the root's successor)."""
        plans = []
        for part in _split(0, length, max(1, self.rings)):
            def plan(ring: int, p: int, part=part):
                order, n = self._order(ring), self.nranks
                c = (p - order.index(root) - (1 if reduce else 0)) % n  # place in the chain
                if c == 0:
                    return [_Step(part, None)]
                if c == n - 1:
                    return [_Step(None, part, reduce)]
                return [_Step(None, part, reduce), _Step(part, None)]
            plans.append(plan)
        return plans

    def _output(self, send: np.ndarray, recv: np.ndarray | None, length: int) -> np.ndarray:
        if recv is None or recv is send:
            return send
        if not np.shares_memory(recv, send):
            recv[:length] = send[:length]
        return recv

    def _average(self, out: np.ndarray, op: str) -> np.ndarray:
        if op == "avg":
            if np.issubdtype(out.dtype, np.integer):
                np.floor_divide(out, self.nranks, out=out)
            else:
                np.divide(out, self.nranks, out=out)
        return out

    # -- the engine --------------------------------------------------------------------------------

    def _run(self, collective: str, buf: np.ndarray, plans, op: str) -> None:
        """Run one collective on ``buf`` in place: each ring's sender and receiver at once, the
        receiver handing each chunk it has finished to the sender for the next step."""
        if op not in OPS:
            raise ValueError(f"unknown reduction {op!r}; known: {', '.join(OPS)}")
        if self._closed or self._error is not None:
            raise CommError(f"{self._prefix()} NCCL WARN the communicator is "
                            f"{'closed' if self._closed else 'aborted: ' + str(self._error)}")
        seq, self.seq = self.seq, self.seq + 1
        if buf.ndim != 1 or not buf.flags.c_contiguous:
            raise ValueError("collectives take one-dimensional contiguous arrays")
        if self.nranks == 1:
            return
        started = time.monotonic()
        deadline = started + self.timeout_s
        chunk = max(1, CHUNK_BYTES // buf.itemsize)
        futures = []
        for ring in range(self.rings):
            steps = plans[ring](ring, self._order(ring).index(self.rank))
            if all((s.send is None or s.send[0] == s.send[1]) and (s.recv is None or s.recv[0] == s.recv[1])
                   for s in steps):
                continue
            ready: queue.SimpleQueue = queue.SimpleQueue()
            futures.append(self._pool.submit(self._guard, self._send_loop, self._send[ring], steps, buf, ready,
                                             chunk, deadline))
            futures.append(self._pool.submit(self._guard, self._recv_loop, self._recv[ring], steps, buf, ready,
                                             chunk, deadline, OPS[op]))
        for future in futures:
            future.result()
        if self._error is not None:
            raise self._described(self._error, collective, seq, started)

    def _guard(self, loop, link: Link, *args) -> None:
        """Run one loop; its first failure aborts the communicator (every socket shut, so the
        other loops stop at once, and so do the neighbours)."""
        try:
            loop(link, *args)
        except _Failure as failure:
            self._abort(failure)
        except Exception as exc:  # a bug here must not leave the other loops waiting
            self._abort(exc)

    def _abort(self, failure: BaseException) -> None:
        with self._lock:
            if self._aborted:
                return  # the first failure is the cause; what follows is its consequence
            self._error, self._aborted = failure, True
        for link in self.links:
            try:
                link.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _send_loop(self, link: Link, steps: list[_Step], buf: np.ndarray, ready: queue.SimpleQueue,
                   chunk: int, deadline: float) -> None:
        for i, step in enumerate(steps):
            forwarded = i > 0 and steps[i - 1].recv is not None  # what the previous step received
            for lo, hi in _chunks(step.send, chunk):
                if forwarded:
                    try:
                        if not ready.get(timeout=max(0.0, deadline - time.monotonic()) + 1.0):
                            return  # the receiver stopped: its failure is the one reported
                    except queue.Empty:
                        raise _Failure("timeout", link, "waiting for data to forward") from None
                self._io(link, deadline, lambda: link.sock.sendall(buf[lo:hi]))

    def _recv_loop(self, link: Link, steps: list[_Step], buf: np.ndarray, ready: queue.SimpleQueue,
                   chunk: int, deadline: float, ufunc) -> None:
        scratch = np.empty(chunk, buf.dtype)
        try:
            for i, step in enumerate(steps):
                forward = i + 1 < len(steps) and steps[i + 1].send is not None
                for lo, hi in _chunks(step.recv, chunk):
                    target = scratch[:hi - lo] if step.reduce else buf[lo:hi]
                    self._recv_into(link, memoryview(target).cast("B"), deadline)
                    if step.reduce:
                        ufunc(buf[lo:hi], target, out=buf[lo:hi])
                    if forward:
                        ready.put(True)
        finally:
            ready.put(False)  # wakes a sender still waiting, whatever happened here

    def _recv_into(self, link: Link, view: memoryview, deadline: float) -> None:
        got, lowat = 0, 1
        while got < len(view):
            wanted = min(len(view) - got, RCVLOWAT_BYTES)
            if wanted != lowat:  # wake up for a good piece of the chunk, not for every segment
                try:
                    link.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, wanted)
                except OSError:  # shut: the receive below says why
                    pass
                lowat = wanted
            received = self._io(link, deadline, lambda: link.sock.recv_into(view[got:]))
            if received == 0:
                raise _Failure("closed", link)
            got += received

    def _io(self, link: Link, deadline: float, operation):
        """One blocking socket operation, bounded by what is left of the collective's timeout."""
        if self._aborted:
            raise _Failure("aborted", link)
        try:
            link.sock.settimeout(max(0.001, deadline - time.monotonic()))
            return operation()
        except socket.timeout:
            raise _Failure("timeout", link) from None
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            raise _Failure("closed", link) from None
        except OSError as exc:
            raise _Failure("error", link, exc.strerror or str(exc)) from None

    def _described(self, error: BaseException, collective: str, seq: int, started: float) -> CommError:
        """The lines NCCL and PyTorch print for a failed collective."""
        op_type = OP_TYPES[collective]
        ran_ms = (time.monotonic() - started) * 1e3
        if not isinstance(error, _Failure):
            return CommError(f"{self._prefix()} NCCL WARN {collective} failed: {error!r}")
        link = error.link
        if error.kind == "timeout":
            waiting = "sending to" if link.direction == "send" else "receiving from"
            return CollectiveTimeout(
                f"[Rank {self.rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                f"OpType={op_type}, Timeout(ms)={self.timeout_s * 1e3:.0f}) ran for "
                f"{ran_ms:.0f} milliseconds before timing out. ({waiting} rank {link.peer} on ring {link.ring} "
                f"via {link.ifname})")
        if error.kind == "closed":
            last = f"NET/Socket : peer {link.remote_text} closed connection"
            cls = PeerClosed
        else:
            verb = "send to" if link.direction == "send" else "recv from"
            last = f"NET/Socket : {verb} {link.remote_text} failed: {error.detail or error.kind}"
            cls = NetworkError
        return cls(f"{self._prefix()} NCCL WARN {last} (rank {link.peer}, ring {link.ring}, via {link.ifname})\n"
                   f"torch.distributed.DistBackendError: [Rank {self.rank}] NCCL error in SeqNum={seq}, "
                   f"OpType={op_type}: remote process exited or there was a network error, ncclRemoteError: {last}")

    # -- the rest ----------------------------------------------------------------------------------

    def _prefix(self) -> str:
        return f"{self.host}:{os.getpid()}:{threading.get_native_id()} [0]"

    def _say(self, level: str, text: str) -> None:
        if self.log is not None:
            print(f"{self._prefix()} NCCL {level} {text}", file=self.log, flush=True)

    def close(self) -> None:
        """Close the links and the store (rank 0's goes with it): NCCL's ncclCommDestroy."""
        self._aborted = self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for link in self.links or [*self._send.values(), *self._recv.values()]:
            link.sock.close()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._store is not None:
            self._store.shutdown()
            self._store.server_close()
            self._store = None

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
