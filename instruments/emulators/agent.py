"""The agent of an emulated GPU host: the real agent program (instruments/gpu_host/agent.py)
with NVML, links and job served by the emulated world, and the faults an emulated host can be
made to show (instruments/backend.py AGENT_FAULTS). On the namespaced bench (``--links sysfs``)
its links are the host's own, read from /sys/class/net and woken by netlink, as on a real host.

    python -m lumion_hil.instruments.emulators.agent --world 127.0.0.1:PORT --host host1 --interfaces p0=p0,p1=p1
"""

from __future__ import annotations

from lumion_hil.instruments.backend import AGENT_FAULTS
from lumion_hil.instruments.emulators.forkserver import ForkServer
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


def main(argv: list[str] | None = None) -> None:
    parser = agent_parser("python -m lumion_hil.instruments.emulators.agent")
    parser.description = __doc__
    parser.add_argument("--world", required=True, help="HOST:PORT of the emulated world service")
    parser.add_argument("--host", required=True, help="this host's name in the bench")
    parser.add_argument("--interfaces", default="", help="interface=nic,... pairs (default: every optical NIC the "
                                                         "world gives the host, as a kernel lists its interfaces)")
    parser.add_argument("--notify-latency-s", type=float, default=0.0,
                        help="how late the kernel tells the agent of a link change (a defect)")
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
    # The emulated jobs' ranks are forked from a server that has imported them once: a restart
    # costs a fork, not an interpreter's start-up (forkserver.py).
    forks = ForkServer(EMULATED_JOBS)
    Agent(NvmlGpus(FakeNvml(world, args.host), clock_ns), links,
          JobControl(args.log_dir, clock_ns, offset, read_latency_s=args.notify_latency_s, popen=forks.popen),
          clock_ns, "emulated", faults).serve()


if __name__ == "__main__":
    main()
