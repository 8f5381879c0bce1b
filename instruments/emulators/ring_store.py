"""The ring's rendezvous (NCCL's bootstrap, PyTorch's TCPStore): rank 0 serves a tiny key-value
store at ``master_addr:master_port``, JSON lines over TCP; that address is on the management
network, as NCCL's bootstrap network usually is, never on the data interfaces (an optical NIC
reaches only its circuit's far end). The store serves one job, named by the master port and the
rank map: a rank of another (older) rank map is refused there and never joins. It lives and dies
with rank 0's process, as the job's own store does, so a job started again meets a new one.

This is the job's own rendezvous, not the emulated world's: the world service
(world_service.py) serves the harness's physics to the emulated hosts, and its communicators
stand for the emulated job's NCCL; here real ranks meet each other with no world between them.
"""

from __future__ import annotations

import errno
import json
import random
import socket
import socketserver
import threading
import time

from lumion_hil.instruments.emulators.ring_errors import InitTimeout
from lumion_hil.instruments.emulators.ring_links import CONNECT_TIMEOUT_S, retry_waits

STORE_CALL_S = 5.0  # a store request's own bound, beyond the time it may wait for a key


class _StoreHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        store: StoreServer = self.server  # type: ignore[assignment]
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


class StoreServer(socketserver.ThreadingTCPServer):
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


def serve_store(address: tuple[str, int], job: str, deadline: float) -> StoreServer:
    """Rank 0's store, listening at ``address`` (any local address when that one is not this
    host's), tried again while the port is still held (an earlier job's rank 0 on its way out)."""
    waits = retry_waits()
    while True:
        try:
            try:
                server = StoreServer(address, job)
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                server = StoreServer(("0.0.0.0", address[1]), job)
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


class StoreClient:
    """One rank's connection to the store, once the store has said it serves this job."""

    def __init__(self, address: tuple[str, int], job: str, nranks: int, deadline: float, timeout_s: float):
        refused = None
        waits = retry_waits()
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
