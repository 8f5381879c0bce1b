"""The emulated host's side of the world service: what an emulated job, an agent or an emulated
nccl-tests program uses to reach the world. Kept apart from the service so that a program
that only talks to it starts without importing the world itself."""

from __future__ import annotations

import socket
import threading

from lumion_hil.instruments.gpu_host import wire


class WorldClient:
    """The emulated host's side: one connection per thread, so each may wait on its own."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self._address = (host, int(port))
        self._local = threading.local()
        self._ids = 0

    def _conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.create_connection(self._address, timeout=None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._local.conn = (sock, sock.makefile("rb"))
        return conn

    def call(self, method: str, **params):
        sock, reader = self._conn()
        self._ids += 1
        sock.sendall(wire.encode({"id": self._ids, "method": method, "params": params}))
        line = reader.readline()
        if not line:
            raise ConnectionError(f"world service at {self._address} closed the connection")
        reply = wire.decode(line)
        if not reply["ok"]:
            raise wire.RemoteError("world", method, reply["error"]["type"], reply["error"]["message"])
        return reply["result"]
