"""Real collectives over TCP sockets, for the rack in a box: a small communicator that does what
NCCL's socket transport does between hosts, on numpy buffers in place of GPU memory.

- Rendezvous (ring_store.py): rank 0 serves a tiny key-value store at ``master_addr:master_port``
  on the management network; each rank publishes its host, pid and one listening address per
  data interface; init completes when every rank has joined, or fails after the timeout as
  PyTorch says it (``DistStoreError: Timed out after ...``).
- Data interfaces: ``NCCL_SOCKET_IFNAME`` read as NCCL reads it (ring_interfaces.py).
- Peer links (ring_links.py): each ring is a ring of TCP connections, each rank connecting to its
  successor through whichever of its NICs a circuit joins to one of the successor's. The
  handshake names the communicator (the job and the instance rank 0 made), the rank and the
  ring: a stale connection is refused.
- Collectives: ring all-reduce (reduce-scatter then all-gather), all-gather, reduce-scatter,
  and chains for broadcast and reduce (ring_schedule.py), pipelined in chunks of
  :data:`CHUNK_BYTES`. With two rings, half of the buffer goes round each way at once (one ring
  per direction), so both directions of every link carry data, as NCCL's rings do. The data
  connections use cubic (:data:`CONGESTION_CONTROL`) where the kernel has it, so that measured
  bandwidth is steady.
- Failures as NCCL and PyTorch show them (ring_errors.py): every blocking socket operation is
  bounded by the timeout, after which the rank raises :class:`CollectiveTimeout` (PyTorch's
  watchdog line); a peer that closed its connection raises :class:`PeerClosed` at once (NCCL's
  ``NET/Socket : peer ... closed connection``). A failed communicator closes its sockets, so its
  neighbours fail at once too. ``str()`` of every :class:`CommError` is the lines to print.

Lines NCCL prints with NCCL_DEBUG=INFO (the interfaces, each channel's interface and peer,
``Init COMPLETE``) go to ``log``.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TextIO

import numpy as np

from lumion_hil.instruments.emulators.ring_errors import (CollectiveTimeout, CommError, InitTimeout, NetworkError,
                                                          PeerClosed)
from lumion_hil.instruments.emulators.ring_interfaces import interface_with, select_interfaces
from lumion_hil.instruments.emulators.ring_links import Link, listen, race, read_line, retry_waits
from lumion_hil.instruments.emulators.ring_schedule import (Plan, Step, all_reduce_plans, chain_plans, chunks,
                                                            neighbour, ring_order, slot_plans)
from lumion_hil.instruments.emulators.ring_store import StoreClient, StoreServer, serve_store

CHUNK_BYTES = 256 << 10  # one pipelined piece of a step (NCCL's socket transport: 512 KiB slots)
RCVLOWAT_BYTES = CHUNK_BYTES  # a receiver wakes up once per chunk (SO_RCVLOWAT), not per segment
# The data connections' TCP congestion control, where the kernel has it: on tbf-shaped veths
# BBR's probing makes one operation's time differ from the next by up to a quarter; cubic keeps
# them steady at the TCP payload rate (about 94% of the line rate with a 1500-byte MTU).
CONGESTION_CONTROL = "cubic"
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)

OPS: dict[str, Callable] = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
                            "avg": np.add}  # avg: the sum, divided by the rank count at the end
OP_TYPES = {"all_reduce": "ALLREDUCE", "all_gather": "ALLGATHER", "reduce_scatter": "REDUCE_SCATTER",
            "broadcast": "BROADCAST", "reduce": "REDUCE"}  # PyTorch's names in its watchdog line


class _Failure(Exception):
    """Raised inside the ring loops; turned into a :class:`CommError` with the collective's context."""

    def __init__(self, kind: str, link: "Link", detail: str = ""):
        super().__init__(kind, detail)
        self.kind, self.link, self.detail = kind, link, detail


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
        self._store: StoreServer | None = None
        self._client: StoreClient | None = None
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
            self._store = serve_store(master, self.job, deadline)
        self._client = StoreClient(master, self.job, self.nranks, deadline, self.timeout_s)
        self.comm_id = self._client.comm_id
        self._say("INFO", f"Bootstrap : Using {interface_with(self._client.sock.getsockname()[0])}:"
                          f"{self._client.sock.getsockname()[0]}<0> (store {master[0]}:{master[1]})")
        self._say("INFO", "NET/Socket : Using " + " ".join(f"[{i}]{n}:{a}<0>" for i, (n, a) in enumerate(interfaces)))
        listeners = [] if self.rings == 0 else listen(interfaces)
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
        assert self.congestion_control is not None  # chosen only where one is set
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
        assert self._client is not None  # init's store client, made before this
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
            hello = json.loads(read_line(conn))
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
        waits = retry_waits()
        while True:
            tried: list[str] = []
            sock, ifname, remote = race(targets, deadline, tried)
            if sock is not None:
                try:
                    sock.settimeout(max(0.05, deadline - time.monotonic()))
                    sock.sendall(json.dumps({"comm": self.comm_id, "job": self.job, "rank": self.rank,
                                             "ring": ring}).encode() + b"\n")
                    answer = json.loads(read_line(sock))
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

    # -- collectives -------------------------------------------------------------------------------

    def all_reduce(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        """``recv`` (``send`` itself when None: in place) = the reduction of every rank's ``send``."""
        out = self._output(send, recv, len(send))
        self._run("all_reduce", out, all_reduce_plans(self.nranks, self.rings, len(out)), op)
        return self._average(out, op)

    def all_gather(self, send: np.ndarray, recv: np.ndarray | None = None) -> np.ndarray:
        """``recv`` (n times ``send``'s length) = every rank's ``send``, rank 0's first. In place
        when ``send`` is this rank's slot of ``recv``."""
        m = len(send)
        out = np.empty(m * self.nranks, send.dtype) if recv is None else recv
        if not np.shares_memory(out[self.rank * m:(self.rank + 1) * m], send):
            out[self.rank * m:(self.rank + 1) * m] = send
        plans = slot_plans(self.nranks, self.rings, m, self.nranks - 1, 2 * self.nranks - 2)
        self._run("all_gather", out, plans, "sum")
        return out

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        """``recv`` (1/n of ``send``) = this rank's slot of the reduction of every rank's ``send``."""
        m = len(send) // self.nranks
        work = send[:m * self.nranks].copy()  # the slots of the other ranks are scratch here
        self._run("reduce_scatter", work, slot_plans(self.nranks, self.rings, m, 0, self.nranks - 1), op)
        out = np.empty(m, send.dtype) if recv is None else recv
        out[:] = work[self.rank * m:(self.rank + 1) * m]
        return self._average(out, op)

    def broadcast(self, send: np.ndarray, recv: np.ndarray | None = None, root: int = 0) -> np.ndarray:
        """``recv`` = root's ``send`` on every rank, down a chain from the root (one each way)."""
        out = self._output(send, recv, len(send)) if self.rank == root else (send if recv is None else recv)
        self._run("broadcast", out, chain_plans(self.nranks, self.rings, len(out), root, reduce=False), "sum")
        return out

    def reduce(self, send: np.ndarray, recv: np.ndarray | None = None, root: int = 0, op: str = "sum") -> np.ndarray:
        """On the root, ``recv`` = the reduction of every rank's ``send``, up a chain to the root;
        other ranks' buffers are left as they were."""
        out = self._output(send, recv, len(send)) if self.rank == root else send.copy()
        self._run("reduce", out, chain_plans(self.nranks, self.rings, len(out), root, reduce=True), op)
        return self._average(out, op) if self.rank == root else (send if recv is None else recv)

    def barrier(self) -> None:
        """Every rank has entered it: a 4-byte all-reduce, as PyTorch's barrier is."""
        self.all_reduce(np.zeros(1, np.float32))

    def _neighbour(self, ring: int, step: int) -> int:
        return neighbour(self.nranks, self.rank, ring, step)

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

    def _run(self, collective: str, buf: np.ndarray, plans: list[Plan], op: str) -> None:
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
        assert self._pool is not None  # made by init, which a communicator is not without
        futures = []
        for ring in range(self.rings):
            steps = plans[ring](ring, ring_order(self.nranks, ring).index(self.rank))
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

    def _send_loop(self, link: Link, steps: list[Step], buf: np.ndarray, ready: queue.SimpleQueue,
                   chunk: int, deadline: float) -> None:
        for i, step in enumerate(steps):
            forwarded = i > 0 and steps[i - 1].recv is not None  # what the previous step received
            for lo, hi in chunks(step.send, chunk):
                if forwarded:
                    try:
                        if not ready.get(timeout=max(0.0, deadline - time.monotonic()) + 1.0):
                            return  # the receiver stopped: its failure is the one reported
                    except queue.Empty:
                        raise _Failure("timeout", link, "waiting for data to forward") from None
                self._io(link, deadline, lambda: link.sock.sendall(buf[lo:hi].data))

    def _recv_loop(self, link: Link, steps: list[Step], buf: np.ndarray, ready: queue.SimpleQueue,
                   chunk: int, deadline: float, ufunc) -> None:
        scratch = np.empty(chunk, buf.dtype)
        try:
            for i, step in enumerate(steps):
                forward = i + 1 < len(steps) and steps[i + 1].send is not None
                for lo, hi in chunks(step.recv, chunk):
                    target = scratch[:hi - lo] if step.reduce else buf[lo:hi]
                    self._recv_into(link, target.data.cast("B"), deadline)
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
        cls: type[CommError]
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
