"""The agent of an emulated GPU host: the real agent program (instruments/gpu_host/agent.py)
with NVML, links and job served by the emulated world, and the faults an emulated host can be
made to show (instruments/backend.py AGENT_FAULTS). On the namespaced bench (``--links sysfs``)
its links are the host's own, read from /sys/class/net and woken by netlink, as on a real host.

    python -m lumion_hil.instruments.emulators.agent --world 127.0.0.1:PORT --host host1 --interfaces p0=p0,p1=p1
"""

from __future__ import annotations

import queue
import sys
import threading
import time

from lumion_hil.instruments.backend import AGENT_FAULTS
from lumion_hil.instruments.emulators.forkserver import ForkServer
from lumion_hil.instruments.emulators.job import LAUNCHED_NS
from lumion_hil.instruments.emulators.links import WorldLinks
from lumion_hil.instruments.emulators.nvml import FakeNvml
from lumion_hil.instruments.emulators.world_client import WorldClient
from lumion_hil.instruments.gpu_host.agent import Agent, clock_with_offset, parser as agent_parser
from lumion_hil.instruments.gpu_host.jobs import JobControl
from lumion_hil.instruments.gpu_host.links import SysfsLinks
from lumion_hil.instruments.gpu_host.nvml_backend import NvmlGpus

# The emulated benches' jobs (their ranks are forked, ready imported): the emulated training job
# and the namespaced bench's ring job.
EMULATED_JOBS = ("lumion_hil.instruments.emulators.job", "lumion_hil.instruments.emulators.ring_job")


class ManagementNetwork:
    """A network of ``round_trip_s`` between the harness and the agent: each request reaches the
    agent, and each reply the harness, half of it later, in order. It stands where the agent's
    stdin and stdout are (``.buffer``), so the agent itself is unchanged and its clock stamps
    stay half a round trip from either end, as over a real network."""

    def __init__(self, round_trip_s: float, stdin, stdout):
        self.one_way_s = round_trip_s / 2
        self._stdout = stdout
        self._in: queue.Queue = queue.Queue()
        self._out: queue.Queue = queue.Queue()
        threading.Thread(target=self._receive, args=(stdin,), daemon=True, name="network-in").start()
        self._sender = threading.Thread(target=self._send, daemon=True, name="network-out")
        self._sender.start()

    @property
    def buffer(self) -> "ManagementNetwork":
        return self

    def _receive(self, stdin) -> None:
        for line in stdin:
            self._in.put((time.monotonic() + self.one_way_s, line))
        self._in.put((time.monotonic() + self.one_way_s, None))

    def __iter__(self):
        while True:
            due, line = self._in.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if line is None:
                return
            yield line

    def write(self, data: bytes) -> int:
        self._out.put((time.monotonic() + self.one_way_s, bytes(data)))
        return len(data)

    def flush(self) -> None:
        pass

    def _send(self) -> None:
        while True:
            due, data = self._out.get()
            if data is None:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            self._stdout.write(data)
            self._stdout.flush()

    def close(self) -> None:
        """Deliver what is under way, then stop."""
        self._out.put((0.0, None))
        self._sender.join(timeout=5 + self.one_way_s)


def main(argv: list[str] | None = None) -> None:
    parser = agent_parser("python -m lumion_hil.instruments.emulators.agent")
    parser.description = __doc__
    parser.add_argument("--world", required=True, help="HOST:PORT of the emulated world service")
    parser.add_argument("--host", required=True, help="this host's name in the bench")
    parser.add_argument("--interfaces", default="", help="interface=nic,... pairs (default: every optical NIC the "
                                                         "world gives the host, as a kernel lists its interfaces)")
    parser.add_argument("--notify-latency-s", type=float, default=0.0,
                        help="how late the kernel tells the agent of a link change (a defect)")
    parser.add_argument("--management-latency-s", type=float, default=0.0,
                        help="round trip of the network between the harness and this agent, half each way")
    parser.add_argument("--links", choices=("world", "sysfs"), default="world",
                        help="where link state comes from: the world's model (default), or this host's own "
                             "/sys/class/net and netlink, as on a real host (the namespaced bench)")
    parser.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]",
                        help="start with this fault on (" + ", ".join(AGENT_FAULTS) + ")")
    args = parser.parse_args(argv)
    faults: dict[str, float | None] = {}
    for fault in args.fault:
        name, _, value = fault.partition("=")
        if name not in AGENT_FAULTS:
            parser.error(f"--fault {fault}: unknown fault {name!r}; known: {', '.join(AGENT_FAULTS)}")
        try:
            faults[name] = float(value) if value else None
        except ValueError:
            parser.error(f"--fault {fault}: {value!r} is not a number of seconds")
    offset = args.clock_offset_ns
    clock_ns = clock_with_offset(offset)
    world = WorldClient(args.world)
    interfaces = dict(pair.split("=", 1) for pair in args.interfaces.split(",") if pair)
    if not interfaces and args.links == "world":
        interfaces = world.call("nics", host=args.host)
    links = (SysfsLinks(args.sysfs, clock_ns) if args.links == "sysfs"
             else WorldLinks(world, args.host, interfaces, clock_ns, args.notify_latency_s))
    network = None
    if args.management_latency_s > 0:
        network = ManagementNetwork(args.management_latency_s, sys.stdin.buffer, sys.stdout.buffer)
        sys.stdin, sys.stdout = network, network  # the agent reads and answers through it
    # The emulated jobs' ranks are forked from a server that has imported them once: a restart
    # costs a fork, not an interpreter's start-up (forkserver.py).
    forks = ForkServer(EMULATED_JOBS)

    def launch(argv: list[str], env: dict):
        # the instant of the launch, for an emulated rank's start-up (instruments/emulators/job.py)
        return forks.popen(argv, {**env, LAUNCHED_NS: str(time.monotonic_ns())})

    try:
        Agent(NvmlGpus(FakeNvml(world, args.host), clock_ns), links,
              JobControl(args.log_dir, clock_ns, offset, read_latency_s=args.notify_latency_s, popen=launch),
              clock_ns, "emulated", faults).serve()
    finally:
        if network is not None:
            network.close()
            sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__


if __name__ == "__main__":
    main()
