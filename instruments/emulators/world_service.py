"""The world, served to emulated hosts' agent subprocesses over loopback TCP (JSON lines, see
instruments/gpu_host/wire.py). Each connection is served in its own thread and handles one
request at a time; a client that waits (for an XID, a link) uses its own connection."""

from __future__ import annotations

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
        self._links: dict[tuple[str, str], tuple] = {}  # (host, nic) -> (light version, from, until, what it showed)
        self._server = _Server((host, 0), _Handler)
        self._server.service = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True, name="world-service")

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's: (host, port)
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
        news = world.gpu_wait(host)
        with world.lock:
            while True:
                events = world.gpu_events
                i = next((i for i in range(max(0, after), len(events)) if events[i].detail["host"] == host), None)
                if i is not None:
                    return {"seq": i, "t_ns": events[i].t_ns, **events[i].detail}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"seq": None}
                news.wait(remaining)

    def rpc_link(self, host: str, nic: str) -> dict:
        """What the host's kernel shows in /sys/class/net/<if>/: carrier, operstate and the
        carrier counters. No instants: the agent stamps what it sees, as on a real host. Kept
        while the light at the receiver is as it was and until its next change on its own (a
        host's every look at its links asks it)."""
        world = self.world
        spec, _ = world._nic(host, nic)
        with world.lock:
            t = world.now_ns()  # (under the lock: a command that got it first is in the past of t)
            version = world._version_of(spec.rx_port)
            kept = self._links.get((host, nic))
            if kept is not None and kept[0] == version and kept[1] <= t < kept[2]:
                return dict(kept[3])
            state, _ = world.link_state(host, nic, t)
            up = state == "up"
            shown = {"carrier": 1 if up else 0,
                     "operstate": "up" if up else ("lowerlayerdown" if state == "dark" else "down"),
                     "speed_mbps": int(spec.rate_gbps * 1000) if up else None,  # as sysfs: no speed while down
                     **world.carrier_counters(host, nic)}
            upcoming = world.next_link_change_ns(host, nic, t)
            self._links[(host, nic)] = (version, t, 2**63 if upcoming is None else upcoming, shown)
            return dict(shown)

    def rpc_nics(self, host: str) -> dict[str, str]:
        """The host's optical interfaces as its kernel lists them: interface -> the NIC it is."""
        if host not in self.world.hosts:
            raise KeyError(f"no host {host!r} in this world; hosts: {', '.join(self.world.hosts)}")
        return {n.interface or n.name: n.name for n in self.world.hosts[host].nics}

    def rpc_set_transmitter(self, host: str, nic: str, on: bool) -> int:
        """A host's agent turns a NIC's laser off or on."""
        return self.world.set_transmitter(host, nic, bool(on))

    def rpc_links(self, host: str, nics: list[str]) -> list[dict]:
        """``link`` for each of a host's NICs, at one instant (what a host reads of all its links)."""
        with self.world.lock:
            return [self.rpc_link(host, nic) for nic in nics]

    def rpc_wait_link(self, host: str, nic: str, up: bool, timeout_s: float) -> dict:
        """What netlink's RTNLGRP_LINK gives a real host, with the look at sysfs it wakes: the
        link as ``link`` shows it once its carrier is ``up`` (at once if it already is), or at
        the timeout; ``already``: it was so when asked. One question for a wait, where a look, a
        wake-up and a look again were three (each a round trip through the harness's process)."""
        deadline = time.monotonic() + timeout_s
        world = self.world
        news = world.light_wait(world._nic(host, nic)[0].rx_port)
        first = True
        with world.lock:
            while True:
                # One instant for the state and the next change after it: asked apart, a change
                # falling between the two would be missed and the wait would last to its timeout.
                t = world.now_ns()
                state, _ = world.link_state(host, nic, t)
                if (state == "up") == bool(up):
                    return {"link": self.rpc_link(host, nic), "already": first, "timed_out": False}
                first = False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"link": self.rpc_link(host, nic), "already": False, "timed_out": True}
                nxt = world.next_link_change_ns(host, nic, t)
                if nxt is not None:
                    remaining = min(remaining, max(0.0, (nxt - world.now_ns()) / 1e9) + 5e-5)
                news.wait(remaining)

    def rpc_job_event(self, host: str, rank: int, what: str, step: int | None = None, t_ns: int | None = None) -> int:
        """The emulated job says what it just did ("ready", "step") and when (the same clock);
        the world keeps the instant."""
        t = self.world.now_ns() if t_ns is None else t_ns
        self.world.record(t, f"job.{what}", host, rank=rank, step=step)
        return t

    def rpc_collective(self, collective: str, ranks: list[str], size_bytes: int, socket_ifname: str | None = None,
                       told: list[dict] | None = None, rank: int | None = None, comm: int | None = None,
                       seq: int | None = None, wait_s: float = 0.0) -> dict:
        """What one collective costs now, on the fabric NCCL_SOCKET_IFNAME picks: the time in
        the world's (scaled) seconds and in physical seconds, or why it cannot complete (a
        failed peer, no path). A rank of an emulated job may say in the same round trip what
        it has done (``told``, see :meth:`_tell`) and, where the collective can run, enter it
        (``comm``, ``seq``: as ``comm_enter``; ``entered``: its answer)."""
        self._tell(ranks, rank, told)
        world = self.world
        failed = [h for h in ranks if h in world.hosts and world.host_failed(h)]
        if failed:
            self._stalled(comm, rank)
            return {"time_s": None, "stalled": f"peer {failed[0]} failed", "failed": failed}
        fabric = world.fabric_name(socket_ifname)
        try:
            cost = world.collective_cost(collective, ranks, int(size_bytes), fabric)
        except NoPath as exc:
            self._stalled(comm, rank)
            return {"time_s": None, "stalled": f"{fabric}: {exc}"}
        # time_s: how long to wait, at the bench's time scale; physical_s: what the collective
        # truly costs on this fabric (what a program reports, at any time scale).
        out = {"time_s": world.scaled_ns(cost.time_s) / 1e9, "physical_s": cost.time_s, "fabric": fabric,
               "algorithm": cost.algorithm, "corrupt": any(world.corrupts_data(h) for h in ranks)}
        if comm is not None:
            if rank is None or seq is None:
                raise ValueError(f"collective: entering communicator {comm} takes a rank and a seq")
            out["entered"] = self.rpc_comm_enter(comm, rank, seq, wait_s)
        return out

    def _stalled(self, comm: int | None, rank: int | None) -> None:
        """A rank of communicator ``comm`` whose collective the world cannot run now: its peers
        wait on the world for it, not on a late process (communicator.py)."""
        if comm is not None and rank is not None:
            self.comms.stall(int(comm), int(rank))

    def _tell(self, ranks: list[str], rank: int | None, told: list[dict] | None) -> None:
        """What a rank of an emulated job has done since it last asked (``{"what": "step",
        "step": N, "t_ns": T}``, ``{"what": "collective", "t_ns": T}``...), recorded as
        ``job_event`` records it: told with its next question, so that telling costs the job no
        round trip of its own (and, as before, never delays what the job prints)."""
        for event in told or ():
            if rank is None:
                raise ValueError("what a rank has done is told with its rank")
            self.rpc_job_event(ranks[rank], rank, event["what"], step=event.get("step"), t_ns=event.get("t_ns"))

    def rpc_job_step(self, ranks: list[str], rank: int, gradient_bytes: float, compute_time_s: float,
                     socket_ifname: str | None = None, told: list[dict] | None = None, comm: int | None = None,
                     seq: int | None = None, wait_s: float = 0.0) -> dict:
        """What one data-parallel step costs now: compute, then an all-reduce of the gradients
        over the fabric the job's NCCL_SOCKET_IFNAME picks (instruments/collectives.py). In the
        same round trip, as a rank's step goes: what it has done since it last asked (``told``,
        the previous step's end: the ground truth) is recorded; and with ``comm``, where the
        step can run, the rank enters its all-reduce ``seq`` and waits (a slice at most) for the
        others, as ``comm_enter`` (``entered``: its answer)."""
        world = self.world
        host = ranks[rank]
        self._tell(ranks, rank, told)
        if host in world.hosts and world.host_failed(host):
            return {"failed": True, "step_time_s": None}
        cost = self.rpc_collective("all_reduce", ranks, int(gradient_bytes), socket_ifname)
        if cost["time_s"] is None:
            self._stalled(comm, rank)
            return {"failed": False, "step_time_s": None, "stalled": cost["stalled"]}
        out = {"failed": False, "step_time_s": world.scaled_ns(compute_time_s) / 1e9 + cost["time_s"],
               "fabric": cost["fabric"]}
        if comm is not None:
            if seq is None:
                raise ValueError(f"job_step: entering communicator {comm} takes a seq")
            out["entered"] = self.rpc_comm_enter(comm, rank, seq, wait_s)
        return out

    def rpc_comm_join(self, key: str, nranks: int, rank: int, pid: int, wait_s: float, ranks: list[str] | None = None,
                      told: list[dict] | None = None, late: bool = False) -> dict:
        """An emulated rank joins its job's NCCL communicator (instruments/emulators/communicator.py),
        having said what it has done (``told``, with ``ranks``: its being ready; ``late``: its own
        process start outlasted the start-up it emulates)."""
        if ranks is not None:
            self._tell(ranks, rank, told)
        return self.comms.join(key, int(nranks), int(rank), int(pid), float(wait_s), bool(late))

    def rpc_comm_enter(self, comm: int, rank: int, seq: int, wait_s: float) -> dict:
        """An emulated rank enters collective ``seq``: done once every rank has entered it."""
        return self.comms.enter(int(comm), int(rank), int(seq), float(wait_s))

    def rpc_wait_change(self, timeout_s: float, since_ns: int | None = None) -> None:
        self.world.wait_for_change(timeout_s, since_ns)

    # -- faults, for a harness driving a served bench (what a lab makes with its hands) ----------

    def rpc_fail_gpu(self, host: str, index: int = 0, xid: int = 79) -> int:
        return self.world.fail_gpu(host, index, xid).t_ns

    def rpc_repair_gpu(self, host: str, index: int = 0) -> None:
        self.world.repair_gpu(host, index)

    def rpc_set_extra_loss(self, port: int, loss_db: float) -> int:
        t = self.world.now_ns()
        self.world.set_extra_loss(port, float(loss_db), t)
        return t
