"""A rank's start, as an emulated host's agent makes it: forked from the agent's fork server
(instruments/emulators/forkserver.py) beside a fresh interpreter (subprocess.Popen), in one run,
alternating: wall time from the agent's request to the rank's exit, median and p90, and CPU time
per start (the ranks' own, read from the kernel's accounting of their parent). The rank is the
emulated training job asked for its usage (``--help``: it parses its arguments, prints and exits),
so what differs is the start alone.

Then the job restarted whole on the exploration bench (``--restarts``), as a failure story
restarts it: every rank stopped, started again from its agent's fork server, and waited for
until rank 0 has stepped: the ranks' CPU a start (their own, as their fork servers reaped them)
and the machine's CPU a restart (every process: the harness and its world, the agents, the fork
servers and the ranks, from /proc/stat; other work on the machine counts too), split by kind:
what each of those spent of it, read from the kernel's accounting before and after."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from lumion_hil.instruments.emulators.agent import EMULATED_JOBS
from lumion_hil.instruments.emulators.forkserver import ForkServer
from lumion_hil.instruments.gpu_host.jobs import _popen

from process_cpu import TICK, children_cpu_s, machine_busy_s, stat_fields  # this folder's: it runs as a script from here

JOB = "lumion_hil.instruments.emulators.job"


def cpu_by_kind(session) -> dict[str, float]:
    """CPU so far of the session's processes, by kind (perf/process_cpu.py's): the harness (this
    process: the drivers, the explorer's controller, the in-process emulators and world service),
    the agents and their fork servers (their own), and the ranks the fork servers have reaped,
    every host together (a fork server is its agent's child; another bench's on this machine is
    not counted)."""
    agents = {client._proc.pid for client in session.hosts.values() if getattr(client, "_proc", None)}
    own = os.times()
    out = {"harness": own.user + own.system, "agents": 0.0, "fork servers": 0.0, "ranks": 0.0}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = stat_fields(entry)
                if int(entry) in agents:
                    out["agents"] += (int(fields[11]) + int(fields[12])) / TICK
                elif int(fields[1]) in agents and b"emulators.forkserver" in open(f"/proc/{entry}/cmdline", "rb").read():
                    out["fork servers"] += (int(fields[11]) + int(fields[12])) / TICK
                    out["ranks"] += children_cpu_s(int(entry))
            except (OSError, ValueError, IndexError):  # gone meanwhile
                pass
    return out


def restarts(count: int) -> None:
    """The job restarted ``count`` times on the exploration bench, as a failure story restarts it."""
    from lumion_hil.harness.config import load_bench
    from lumion_hil.harness.session import BenchSession

    bench = load_bench(Path(__file__).resolve().parents[1] / "benches" / "exploration.yaml")
    ranks = list(bench.job.ranks)
    with BenchSession.open(bench) as session:
        lead = session.hosts[ranks[0]]
        session.start_job(ranks)
        if not lead.wait_step(1, 30).reached:
            raise SystemExit(f"the job did not start on {ranks}")
        before, machine_before, started = cpu_by_kind(session), machine_busy_s(), time.perf_counter()
        for _ in range(count):
            session.stop_job()
            session.start_job(ranks)
            if not lead.wait_step(1, 30).reached:
                raise SystemExit(f"the job did not step again on {ranks}")
        wall = time.perf_counter() - started
        session.stop_job()
        machine = machine_busy_s() - machine_before  # the same span as the kinds' below: the last stop too
        # The ranks each stop ended, reaped by their servers: the first start's and every
        # restart's but (where its server has not reaped them yet) the last: ``count`` starts of
        # every rank, give or take one.
        after = cpu_by_kind(session)
    spent = {kind: after[kind] - before[kind] for kind in after}
    starts = count * len(ranks)
    print(f"The job restarted on the exploration bench ({count} times, {len(ranks)} ranks; load average "
          f"{os.getloadavg()[0]:.2f}): {wall / count * 1e3:.1f} ms a restart to rank 0's first step")
    print(f"  ranks' own CPU {spent['ranks'] / starts * 1e3:6.2f} ms a start; the machine's CPU "
          f"{machine / count * 1e3:6.1f} ms a restart (harness, world, agents, fork servers, ranks)")
    print("  by kind, ms a restart: " + ", ".join(f"{kind} {cpu / count * 1e3:.1f}" for kind, cpu in spent.items()) +
          f"; beyond these {(machine - sum(spent.values())) / count * 1e3:.1f} (the kernel's own work, anything else)")


def start(popen) -> float:
    started = time.perf_counter()
    proc = popen([sys.executable, "-m", JOB, "--help"], dict(os.environ))
    proc.stdout.read()
    if proc.wait(30) != 0:
        raise SystemExit(f"the job exited with {proc.returncode}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=100, help="starts of each kind")
    parser.add_argument("--restarts", type=int, default=100, help="restarts of the job on the exploration bench (0: none)")
    args = parser.parse_args()
    forks = ForkServer(EMULATED_JOBS).start(preload=(JOB,))
    if not forks.ready(30):
        raise SystemExit("the fork server did not start")
    walls: dict[str, list[float]] = {"forked": [], "fresh": []}
    cpu = {"forked": 0.0, "fresh": 0.0}
    forked_before = children_cpu_s(forks._proc.pid)
    for _ in range(args.starts):
        walls["forked"].append(start(forks.popen))
        before = sum(os.times()[2:4])
        walls["fresh"].append(start(_popen))
        cpu["fresh"] += sum(os.times()[2:4]) - before
    # A forked rank is reaped by its server once the agent's side has its status, after the rank's
    # end is seen here: the server answers requests in order, so once it has forked one more
    # (not counted) it has reaped every rank before it.
    start(forks.popen)
    cpu["forked"] = children_cpu_s(forks._proc.pid) - forked_before
    forks.close()
    print(f"A rank's start to its exit ({args.starts} of each, alternating; load average {os.getloadavg()[0]:.2f}):")
    for kind, values in walls.items():
        ordered = sorted(values)
        print(f"  {kind:7s} median {statistics.median(values) * 1e3:7.2f} ms, p90 "
              f"{ordered[int(0.9 * (len(ordered) - 1))] * 1e3:7.2f} ms, CPU {cpu[kind] / args.starts * 1e3:6.2f} ms a start")
    print(f"  fresh / forked: {statistics.median(walls['fresh']) / statistics.median(walls['forked']):.1f}x the wall "
          f"time, {cpu['fresh'] / cpu['forked']:.1f}x the CPU" if cpu["forked"] else "time")
    if args.restarts:
        restarts(args.restarts)


if __name__ == "__main__":
    main()
