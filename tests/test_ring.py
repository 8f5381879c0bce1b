"""lumion-hil's real collectives (instruments/emulators/ring.py), its training job (ring_job.py)
and its nccl-tests (ring_perf.py), as real processes in network namespaces made here: three
hosts, each with optical NICs p0 and p1 whose veths meet in a switch namespace where bridges
make a ring of circuits (h0.p1-h1.p0, h1.p1-h2.p0, h2.p1-h0.p0), and an electrical bond0 on one
bridge that also carries the rendezvous. Skipped where namespaces cannot be made (not root)."""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from lumion_hil.instruments.collectives import Fabric, Link, collective_cost
from lumion_hil.instruments.emulators import ring_perf
from lumion_hil.instruments.emulators.ring import Communicator
from lumion_hil.instruments.emulators.ring_errors import InitTimeout
from lumion_hil.instruments.gpu_host import wire
from lumion_hil.instruments.gpu_host.jobs import _parse_event, _parse_progress
from lumion_hil.instruments.gpu_host.nccl import parse_runs
from conftest import missing

HOSTS = ("h0", "h1", "h2")
CIRCUITS = {"c01": ("h0p1", "h1p0"), "c12": ("h1p1", "h2p0"), "c20": ("h2p1", "h0p0")}
# tbf rate on every optical veth end in the bandwidth test: low enough that three ranks and the
# kernel's veth, bridge and tbf work keep up on two cores even when they are busy
SHAPED_MBIT = 100
BUSBW_TOLERANCE = 0.15  # measured large-message busbw against the cost model's


def optical(i: int, nic: int) -> str:
    return f"198.19.1.{2 * i + nic + 1}"


def electrical(i: int) -> str:
    return f"198.19.2.{i + 1}"


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True, timeout=10)


class Rack:
    """The namespaces of one test module: ``ns(host)`` and the switch ``ns('sw')``."""

    def __init__(self) -> None:
        self.prefix = f"lh-tr{secrets.token_hex(3)}-"
        self.made: list[str] = []

    def ns(self, name: str) -> str:
        return self.prefix + name

    def build(self) -> None:
        for name in (*HOSTS, "sw"):
            _ip("netns", "add", self.ns(name))
            self.made.append(self.ns(name))
        sw = self.ns("sw")
        for i, host in enumerate(HOSTS):
            ns = self.ns(host)
            for nic in (0, 1):
                _ip("link", "add", f"p{nic}", "netns", ns, "type", "veth", "peer", "name", f"{host}p{nic}", "netns", sw)
                _ip("-n", ns, "addr", "add", f"{optical(i, nic)}/24", "dev", f"p{nic}")
            _ip("link", "add", "bond0", "netns", ns, "type", "veth", "peer", "name", f"{host}e", "netns", sw)
            _ip("-n", ns, "addr", "add", f"{electrical(i)}/24", "dev", "bond0")
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                            "net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2",
                            "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                            *[f"net.ipv4.{key}" for nic in ("p0", "p1") for key in
                              (f"conf.{nic}.rp_filter=0", f"conf.{nic}.arp_ignore=1", f"neigh.{nic}.retrans_time_ms=20",
                               f"neigh.{nic}.mcast_solicit=3", f"neigh.{nic}.ucast_solicit=3")]],
                           check=True, capture_output=True, timeout=10)
            for ifname in ("lo", "p0", "p1", "bond0"):
                _ip("-n", ns, "link", "set", ifname, "up")
        for bridge, ports in {**CIRCUITS, "elec": ("h0e", "h1e", "h2e")}.items():
            _ip("-n", sw, "link", "add", bridge, "type", "bridge", "forward_delay", "0")
            for port in ports:
                _ip("-n", sw, "link", "set", port, "master", bridge, "up")
            _ip("-n", sw, "link", "set", bridge, "up")

    def optical_ends(self) -> list[tuple[str, str]]:
        """(namespace, interface) of both ends of every optical veth."""
        return [(self.ns(h), f"p{n}") for h in HOSTS for n in (0, 1)] + \
               [(self.ns("sw"), f"{h}p{n}") for h in HOSTS for n in (0, 1)]

    def remove(self) -> None:
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def rack():
    if sys.platform != "linux" or shutil.which("ip") is None:
        missing("netns", "needs Linux and iproute2's ip")
    probe = f"lh-tr{secrets.token_hex(3)}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        missing("netns", f"cannot make network namespaces here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    built = Rack()
    try:
        built.build()
        yield built
    finally:
        built.remove()


class Rank:
    """One rank's process in its host's namespace, its output lines read as they come."""

    def __init__(self, rack: Rack, index: int, argv: list[str], env: dict[str, str] | None = None):
        self.index = index
        self.proc = subprocess.Popen(["ip", "netns", "exec", rack.ns(HOSTS[index]), sys.executable, *argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: queue.Queue = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, kept in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, kept), daemon=True).start()

    def _read(self, stream, kept: list[str]) -> None:
        for line in stream:
            kept.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, wanted, timeout_s: float) -> str:
        """The first line from now on for which ``wanted(line)`` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"rank {self.index}: nothing wanted within {timeout_s} s; "
                                     f"out {self.out[-5:]}, err {self.err[-5:]}") from None
            if wanted(line):
                return line

    def finish(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        time.sleep(0.05)  # the reader threads take the last lines
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def ranks(rack: Rack, argv_of, count: int = 3, env_of=lambda r: {}):
    started = [Rank(rack, r, argv_of(r), env_of(r)) for r in range(count)]
    try:
        yield started
    finally:
        for rank in started:
            rank.kill()


# Each rank all-reduces (and the rest) several sizes, with one ring and with two, and prints
# what it found: whether every result was exact, and which interface reached which rank.
CHECK_SCRIPT = r"""
import json, sys
import numpy as np
from lumion_hil.instruments.emulators.ring import Communicator
rank, port = int(sys.argv[1]), int(sys.argv[2])
hosts, n = ["h0", "h1", "h2"], 3
def pattern(r, size):
    return ((np.arange(size) * 7 + r * 1000) % 4093).astype(np.float32)
def total(size):
    return sum(pattern(r, size) for r in range(n))
report = {"rank": rank, "wrong": [], "links": []}
for rings, ifname in ((1, "p0,p1"), (2, "p0,p1"), (2, "bond0")):
    with Communicator(hosts, rank, "198.19.2.1", port + rings + (10 if ifname == "bond0" else 0),
                      socket_ifname=ifname, timeout_s=20, rings=rings, log=None) as comm:
        sizes = (1, 2, 3, 1000, 65537, 1000003) if ifname != "bond0" else (100001,)
        for size in sizes:
            mine = pattern(rank, size)
            out = comm.all_reduce(mine, np.zeros(size, np.float32))
            if not np.array_equal(out, total(size)) or not np.array_equal(mine, pattern(rank, size)):
                report["wrong"].append(["all_reduce", rings, ifname, size])
            inplace = pattern(rank, size)
            if not np.array_equal(comm.all_reduce(inplace), total(size)):
                report["wrong"].append(["all_reduce in place", rings, ifname, size])
        size = 10007
        checks = {
            "all_gather": (comm.all_gather(pattern(rank, size)), np.concatenate([pattern(r, size) for r in range(n)])),
            "reduce_scatter": (comm.reduce_scatter(pattern(rank, n * size)), total(n * size)[rank * size:(rank + 1) * size]),
            "broadcast": (comm.broadcast(pattern(rank, size), root=2), pattern(2, size)),
            "reduce": (comm.reduce(pattern(rank, size), np.zeros(size, np.float32), root=1), total(size)),
        }
        for name, (got, expected) in checks.items():
            if (name != "reduce" or rank == 1) and not np.array_equal(got, expected):
                report["wrong"].append([name, rings, ifname, size])
        report["links"] += [[rings, ifname, l.ring, l.direction, l.peer, l.ifname] for l in comm.links]
print(json.dumps(report))
"""


def test_ring_collectives_are_exact_and_find_the_nic_each_circuit_joins(rack):
    with ranks(rack, lambda r: ["-c", CHECK_SCRIPT, str(r), "29600"]) as procs:
        codes = [p.finish(60) for p in procs]
        assert codes == [0, 0, 0], [p.err[-5:] for p in procs]
        reports = [json.loads(p.out[-1]) for p in procs]
    for report in reports:
        assert report["wrong"] == [], f"rank {report['rank']} got inexact results: {report['wrong']}"
    for r, report in enumerate(reports):
        links = {tuple(link[:5]): link[5] for link in report["links"]}
        after, before = (r + 1) % 3, (r - 1) % 3
        for rings in (1, 2):
            # ring 0 runs h0 -> h1 -> h2: out by p1 to the next host, in by p0 from the one before
            assert links[(rings, "p0,p1", 0, "send", after)] == "p1"
            assert links[(rings, "p0,p1", 0, "recv", before)] == "p0"
        # ring 1 runs the other way round, through the same circuits
        assert links[(2, "p0,p1", 1, "send", before)] == "p0"
        assert links[(2, "p0,p1", 1, "recv", after)] == "p1"
        assert {nic for key, nic in links.items() if key[1] == "bond0"} == {"bond0"}


def _model_busbw_gbps(size: int) -> float:
    """What instruments/collectives.py predicts for the shaped ring: each neighbour pair joined
    by a circuit of SHAPED_MBIT each way, two rings."""
    rate_gbps = SHAPED_MBIT / 1000
    links = {(a, b): Link(rate_gbps) for i, a in enumerate(HOSTS) for b in (HOSTS[(i + 1) % 3], HOSTS[(i - 1) % 3])}
    fabric = Fabric(links, lambda a, b: ((a, b),) if (a, b) in links else None)
    return collective_cost("all_reduce", list(HOSTS), size, fabric, step_latency_us=100.0, rings=2,
                           algorithm="ring").busbw_gbps


@pytest.mark.alone  # throughput of real sockets against the model: a busy core moves it (scripts/tests)
def test_ring_perf_output_parses_and_its_busbw_matches_the_cost_model(rack, tmp_path):
    """The shaper sets a ceiling the ring cannot pass; TCP reaches it in most sweeps and falls
    short now and then (0.84 of the model once in a clean-clone CI run's alone phase): the
    sweep runs again, up to three times, until its largest size is within the tolerance. One
    above it fails at once (the shaping does not hold)."""
    shaped = []
    env = {"LUMION_HIL_RANKS": ",".join(HOSTS), "LUMION_HIL_MASTER": "198.19.2.1:29700",
           "NCCL_SOCKET_IFNAME": "p0,p1", "LUMION_HIL_TIMEOUT_S": "30"}
    argv = ["-m", "lumion_hil.instruments.emulators.ring_perf", "--program", "all_reduce_perf",
            "-b", "256K", "-e", "4M", "-f", "16", "-w", "2", "-n", "3", "-c", "1"]
    try:
        for ns, ifname in rack.optical_ends():
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ifname, "root", "tbf", "rate",
                            f"{SHAPED_MBIT}mbit", "burst", "64kb", "latency", "100ms"], check=True, capture_output=True)
            shaped.append((ns, ifname))
        for attempt in range(3):
            json_file = tmp_path / f"all_reduce-{attempt}.json"
            with ranks(rack, lambda r: argv + (["-J", str(json_file)] if r == 0 else []),
                       env_of=lambda r: {**env, "LUMION_HIL_RANK": str(r)}) as procs:
                codes = [p.finish(60) for p in procs]
                assert codes == [0, 0, 0], [p.err[-5:] for p in procs]
            (precise,) = parse_runs(json_file.read_text())  # -J's JSON: the same run, unrounded
            big = precise.rows[-1]
            predicted = _model_busbw_gbps(big.size_bytes)
            ratios = [place.busbw_gbps / predicted for place in (big.out_of_place, big.in_place)]
            assert max(ratios) <= 1 + BUSBW_TOLERANCE, \
                f"busbw {max(ratios) * predicted:.4f} GB/s above the shaped model's {predicted:.4f} GB/s"
            if min(ratios) >= 1 - BUSBW_TOLERANCE:
                break
    finally:
        for ns, ifname in shaped:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", ifname, "root"], capture_output=True)
    assert procs[1].out == [] and procs[2].out == [], "only rank 0 prints the results"
    text = "\n".join(procs[0].out)
    assert "lumion-hil ring over TCP sockets" in text
    (run,) = parse_runs(text)
    assert run.collective == "all_reduce" and run.ranks == 3 and run.total_wrong == 0 and run.out_of_bounds == 0
    assert [row.size_bytes for row in run.rows] == [256 << 10, 4 << 20]
    for place in (big.out_of_place, big.in_place):
        assert abs(place.busbw_gbps / predicted - 1) <= BUSBW_TOLERANCE, \
            f"busbw {place.busbw_gbps:.4f} GB/s, the model says {predicted:.4f} GB/s (in {attempt + 1} sweeps)"
    assert abs(run.rows[-1].out_of_place.busbw_gbps - big.out_of_place.busbw_gbps) <= 0.005


def test_ring_perf_counts_the_elements_a_collective_got_wrong():
    """#wrong is a real count: here an all-reduce that gets five elements wrong."""

    class FaultyComm:  # rank 0 of 3: the right sums, but five elements off by one
        nranks, rank = 3, 0

        def all_reduce(self, send, recv, op):
            recv[:] = sum(ring_perf._tiled(ring_perf._period(r, op), len(send), send.dtype) for r in range(3))
            recv[:5] += 1

    case = ring_perf._Case(FaultyComm(), "all_reduce", 1000, np.float32, "sum", 0, in_place=False)
    assert case.wrong() == 5


def _job_argv(r: int, port: int, timeout_s: float = 30.0, steps: int = 1000) -> list[str]:
    return ["-m", "lumion_hil.instruments.emulators.ring_job", "--ranks", ",".join(HOSTS), "--rank", str(r),
            "--master-addr", "198.19.2.1", "--master-port", str(port), "--gradient-bytes", "2e6",
            "--compute-time-s", "0.05", "--nccl-timeout-s", str(timeout_s), "--steps", str(steps)]


OPTICAL = {"NCCL_SOCKET_IFNAME": "p0,p1"}


def test_ring_job_prints_what_the_agent_reads_and_a_killed_rank_fails_the_others_at_once(rack):
    with ranks(rack, lambda r: _job_argv(r, 29800), env_of=lambda r: OPTICAL) as procs:
        for p in procs:
            assert _parse_event(p.wait_for(lambda line: "Init COMPLETE" in line, 20)) == {"event": "nccl_init"}
            barrier = _parse_event(p.wait_for(lambda line: '"barrier"' in line, 20))
            assert barrier == {"event": "collective", "op": "barrier", "rank": p.index}
            step = _parse_progress(p.wait_for(lambda line: '"step": 2' in line, 20))
            assert step["step"] == 2 and step["step_time_s"] > 0.05 and step["samples_per_s"] > 0
        procs[2].proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for p in procs[:2]:
            assert p.finish(10) == 1
            assert time.monotonic() - killed < 5, "a dead peer is seen at once, not after the NCCL timeout"
            assert any("NCCL WARN NET/Socket : peer" in line and "closed connection" in line for line in p.out), p.out[-3:]


def test_a_dark_circuit_stalls_the_collective_until_the_watchdog(rack):
    sw = rack.ns("sw")
    with ranks(rack, lambda r: _job_argv(r, 29810, timeout_s=2.0), env_of=lambda r: OPTICAL) as procs:
        for p in procs:
            p.wait_for(lambda line: '"step": 1' in line, 20)
        _ip("-n", sw, "link", "set", "h1p1", "down")  # the circuit h1-h2 goes dark
        try:
            codes = [p.finish(15) for p in procs]
        finally:
            _ip("-n", sw, "link", "set", "h1p1", "up")
    assert codes == [1, 1, 1]
    watchdog = [line for p in procs for line in p.out if "Watchdog caught collective operation timeout" in line]
    assert watchdog and all("OpType=ALLREDUCE" in line and "Timeout(ms)=2000" in line for line in watchdog)


def test_a_rank_that_never_comes_makes_init_time_out(rack):
    with ranks(rack, lambda r: _job_argv(r, 29820, timeout_s=2.0), count=2, env_of=lambda r: OPTICAL) as procs:
        codes = [p.finish(20) for p in procs]
    assert codes == [1, 1]
    for p in procs:
        assert any("torch.distributed.DistStoreError: Timed out after 2 seconds waiting for clients. "
                   "2/3 clients joined. (missing ranks [2])" in line for line in p.out), p.out[-3:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_rank_of_another_rank_map_is_refused(tmp_path):
    """The rendezvous serves one job (its port and rank map): a rank left from an older rank
    map never joins the newer communicator, and that one still waits for its own rank."""
    port, errors = _free_port(), {}

    def join(ranks_: list[str], rank: int) -> None:
        try:
            Communicator(ranks_, rank, "127.0.0.1", port, socket_ifname="lo", timeout_s=1.5, log=None)
        except InitTimeout as exc:
            errors[ranks_[rank]] = str(exc)

    threads = [threading.Thread(target=join, args=(["h0", "h1", "h3"], 0)),
               threading.Thread(target=join, args=(["h0", "h1", "h2"], 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "1/3 clients joined. (missing ranks [1, 2])" in errors["h0"]
    assert "refused this rank" in errors["h1"] and "h0,h1,h3" in errors["h1"]


class _World(socketserver.ThreadingTCPServer):
    """The world's service as ring_job meets it: time_scale, gpus (the GPU fails at the
    ``fail_at``-th look), job_event (recorded)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fail_at: int):
        self.fail_at, self.looks, self.events = fail_at, 0, []

        class Handler(socketserver.StreamRequestHandler):
            def handle(handler) -> None:
                for line in handler.rfile:
                    request = wire.decode(line)
                    handler.wfile.write(wire.encode({"id": request["id"], "ok": True,
                                                     "result": self.answer(request["method"], request["params"])}))

        super().__init__(("127.0.0.1", 0), Handler)

    def answer(self, method: str, params: dict):
        if method == "time_scale":
            return 0.5
        if method == "gpus":
            self.looks += 1
            return [{"host": params["host"], "index": 0, "name": "H100", "failed": self.looks >= self.fail_at}]
        if method == "job_event":
            self.events.append(params)
            return time.monotonic_ns()
        raise KeyError(method)


def test_ring_job_tells_the_world_and_dies_with_its_gpu():
    world = _World(fail_at=5)  # a look before the barrier and one per step: steps 1 to 3 run, step 4 fails
    threading.Thread(target=world.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run([sys.executable, "-m", "lumion_hil.instruments.emulators.ring_job", "--ranks", "h0",
                               "--rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                               "--gradient-bytes", "4096", "--compute-time-s", "0.2", "--world",
                               f"127.0.0.1:{world.server_address[1]}"],
                              capture_output=True, text=True, timeout=30, env={**os.environ, "NCCL_SOCKET_IFNAME": "lo"})
    finally:
        world.shutdown()
        world.server_close()
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and lines[-1] == "CUDA error: unspecified launch failure (GPU of h0 is lost, XID 79)"
    steps = [_parse_progress(line) for line in lines if line.startswith('{"step"')]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(0.1 <= s["step_time_s"] < 0.2 for s in steps), "compute at the world's time scale (0.5)"
    assert [e["what"] for e in world.events] == ["ready", "collective", "step", "step", "step"]
    assert [e.get("step") for e in world.events[2:]] == [1, 2, 3] and all(isinstance(e["t_ns"], int)
                                                                          for e in world.events[2:])
