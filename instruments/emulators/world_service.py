"""The world, served to emulated hosts' agent subprocesses over loopback TCP (JSON lines, see
instruments/gpu_host/wire.py). Each connection is served in its own thread and handles one
request at a time; a client that waits (for an XID, a link) uses its own connection."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

from lumion_hil.instruments.collectives import NoPath
from lumion_hil.instruments.emulators.communicator import Communicators
from lumion_hil.instruments.emulators.world import World
from lumion_hil.instruments.emulators.world_client import WorldClient  # noqa: F401  (where it was)
from lumion_hil.instruments.gpu_host import wire


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        service: WorldService = self.server.service  # type: ignore[attr-defined]
        while True:
            try:
                line = self.rfile.readline()
            except ConnectionError:  # a client that was killed (a job, an agent): nothing to answer
                return
            if not line:
                return
            request = wire.decode(line)
            try:
                result = getattr(service, f"rpc_{request['method']}")(**request.get("params", {}))
                reply = {"id": request.get("id"), "ok": True, "result": result}
            except Exception as exc:  # reported to the caller, the service keeps serving
                reply = {"id": request.get("id"), "ok": False,
                         "error": {"type": type(exc).__name__, "message": str(exc)}}
            try:
                self.wfile.write(wire.encode(reply))
                self.wfile.flush()
            except (ConnectionError, BrokenPipeError):
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False


class WorldService:
    def __init__(self, world: World, host: str = "127.0.0.1"):
        self.world = world
        self.comms = Communicators()
        self._server = _Server((host, 0), _Handler)
        self._server.service = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True, name="world-service")

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> "WorldService":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- calls ------------------------------------------------------------------------------------

    def rpc_now(self) -> int:
        return self.world.now_ns()

    def rpc_time_scale(self) -> float:
        return self.world.time_scale

    def rpc_gpus(self, host: str) -> list[dict]:
        with self.world.lock:
            return [dict(vars(g), failed=self.world.gpu_failed(g.host, g.index))
                    for (h, _), g in sorted(self.world.gpus.items()) if h == host]

    def rpc_wait_gpu_event(self, host: str, after: int, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        world = self.world
        with world.lock:
            while True:
                new = [(i, e) for i, e in enumerate(world.gpu_events) if i >= after and e.detail["host"] == host]
                if new:
                    i, event = new[0]
                    return {"seq": i, "t_ns": event.t_ns, **event.detail}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"seq": None}
                world.changed.wait(remaining)

    def rpc_link(self, host: str, nic: str) -> dict:
        """What the host's kernel shows in /sys/class/net/<if>/: carrier, operstate and the
        carrier counters. No instants: the agent stamps what it sees, as on a real host."""
        state, _ = self.world.link_state(host, nic)
        up = state == "up"
        return {"carrier": 1 if up else 0, "operstate": "up" if up else ("lowerlayerdown" if state == "dark" else "down"),
                **self.world.carrier_counters(host, nic)}

    def rpc_wait_link_event(self, host: str, nic: str, carrier: int, timeout_s: float) -> bool:
        """What netlink's RTNLGRP_LINK gives a real host: a wake-up when the link's carrier is no
        longer ``carrier``, as it changes (the world knows when its next change is due). True if
        it changed, False at the timeout."""
        deadline = time.monotonic() + timeout_s
        world = self.world
        with world.lock:
            while True:
                # One instant for the state and the next change after it: asked apart, a change
                # falling between the two would be missed and the wait would last to its timeout.
                t = world.now_ns()
                state, _ = world.link_state(host, nic, t)
                if (1 if state == "up" else 0) != carrier:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                nxt = world.next_link_change_ns(host, nic, t)
                if nxt is not None:
                    remaining = min(remaining, max(0.0, (nxt - world.now_ns()) / 1e9) + 5e-5)
                world.changed.wait(remaining)

    def rpc_job_event(self, host: str, rank: int, what: str, step: int | None = None, t_ns: int | None = None) -> int:
        """The emulated job says what it just did ("ready", "step") and when (the same clock);
        the world keeps the instant."""
        t = self.world.now_ns() if t_ns is None else t_ns
        self.world.record(t, f"job.{what}", host, rank=rank, step=step)
        return t

    def rpc_collective(self, collective: str, ranks: list[str], size_bytes: int, socket_ifname: str | None = None) -> dict:
        """What one collective costs now, on the fabric NCCL_SOCKET_IFNAME picks: the time in
        the world's (scaled) seconds and in physical seconds, or why it cannot complete (a
        failed peer, no path)."""
        world = self.world
        failed = [h for h in ranks if h in world.hosts and world.host_failed(h)]
        if failed:
            return {"time_s": None, "stalled": f"peer {failed[0]} failed", "failed": failed}
        fabric = world.fabric_name(socket_ifname)
        try:
            cost = world.collective_cost(collective, ranks, int(size_bytes), fabric)
        except NoPath as exc:
            return {"time_s": None, "stalled": f"{fabric}: {exc}"}
        # time_s: how long to wait, at the bench's time scale; physical_s: what the collective
        # truly costs on this fabric (what a program reports, at any time scale).
        return {"time_s": world.scaled_ns(cost.time_s) / 1e9, "physical_s": cost.time_s, "fabric": fabric,
                "algorithm": cost.algorithm, "corrupt": any(world.corrupts_data(h) for h in ranks)}

    def rpc_job_step(self, ranks: list[str], rank: int, gradient_bytes: float, compute_time_s: float,
                     socket_ifname: str | None = None) -> dict:
        """What one data-parallel step costs now: compute, then an all-reduce of the gradients
        over the fabric the job's NCCL_SOCKET_IFNAME picks (instruments/collectives.py)."""
        world = self.world
        host = ranks[rank]
        if host in world.hosts and world.host_failed(host):
            return {"failed": True, "step_time_s": None}
        comm = self.rpc_collective("all_reduce", ranks, int(gradient_bytes), socket_ifname)
        if comm["time_s"] is None:
            return {"failed": False, "step_time_s": None, "stalled": comm["stalled"]}
        return {"failed": False, "step_time_s": world.scaled_ns(compute_time_s) / 1e9 + comm["time_s"],
                "fabric": comm["fabric"]}

    def rpc_comm_join(self, key: str, nranks: int, rank: int, pid: int, wait_s: float, late: bool = False) -> dict:
        """An emulated rank joins its job's NCCL communicator (instruments/emulators/communicator.py)."""
        return self.comms.join(key, int(nranks), int(rank), int(pid), float(wait_s), bool(late))

    def rpc_comm_enter(self, comm: int, rank: int, seq: int, wait_s: float) -> dict:
        """An emulated rank enters collective ``seq``: done once every rank has entered it."""
        return self.comms.enter(int(comm), int(rank), int(seq), float(wait_s))

    def rpc_wait_change(self, timeout_s: float) -> None:
        self.world.wait_for_change(timeout_s)

    # -- faults, for a harness driving a served bench (what a lab makes with its hands) ----------

    def rpc_fail_gpu(self, host: str, index: int = 0, xid: int = 79) -> int:
        return self.world.fail_gpu(host, index, xid).t_ns

    def rpc_repair_gpu(self, host: str, index: int = 0) -> None:
        self.world.repair_gpu(host, index)

    def rpc_set_extra_loss(self, port: int, loss_db: float) -> int:
        t = self.world.now_ns()
        self.world.set_extra_loss(port, float(loss_db), t)
        return t
