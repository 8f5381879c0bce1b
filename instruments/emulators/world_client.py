"""The emulated host's side of the world service: what an emulated job, an agent or an emulated
nccl-tests program uses to reach the world. Kept apart from the service so that a program
that only talks to it starts without importing the world itself."""

from __future__ import annotations

import itertools
import socket
import threading

from lumion_hil.instruments.gpu_host import wire


class WorldClient:
    """The emulated host's side. A call takes an idle connection (or opens one) and gives it
    back when answered, so that calls may wait at once, each on its own connection, and a
    thread that asks once (an agent answers each request in a thread of its own) does not
    open a connection, and the service a thread, for every question."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self._address = (host, int(port))
        self._idle: list = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _open(self):
        sock = socket.create_connection(self._address, timeout=None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, sock.makefile("rb")

    def call(self, method: str, **params):
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._open()
        sock, reader = conn
        try:
            sock.sendall(wire.encode({"id": next(self._ids), "method": method, "params": params}))
            line = reader.readline()
        except BaseException:
            sock.close()  # a call cut short leaves its answer unread: the connection is not reused
            raise
        if not line:
            sock.close()
            raise ConnectionError(f"world service at {self._address} closed the connection")
        with self._lock:
            self._idle.append(conn)
        reply = wire.decode(line)
        if not reply["ok"]:
            raise wire.RemoteError("world", method, reply["error"]["type"], reply["error"]["message"])
        return reply["result"]
