"""A rank's start, as an emulated host's agent makes it: forked from the agent's fork server
(instruments/emulators/forkserver.py) beside a fresh interpreter (subprocess.Popen), in one run,
alternating: wall time from the agent's request to the rank's exit, median and p90, and CPU time
per start (the ranks' own, read from the kernel's accounting of their parent). The rank is the
emulated training job asked for its usage (``--help``: it parses its arguments, prints and exits),
so what differs is the start alone."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from lumion_hil.instruments.emulators.agent import EMULATED_JOBS
from lumion_hil.instruments.emulators.forkserver import ForkServer
from lumion_hil.instruments.gpu_host.jobs import _popen

JOB = "lumion_hil.instruments.emulators.job"


def children_cpu_s(pid: int) -> float:
    """CPU of the reaped children of ``pid`` (cutime + cstime, /proc/PID/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


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
    args = parser.parse_args()
    forks = ForkServer(EMULATED_JOBS).start(preload=(JOB,))
    if not forks.ready(30):
        raise SystemExit("the fork server did not start")
    walls: dict[str, list[float]] = {"forked": [], "fresh": []}
    cpu = {"forked": 0.0, "fresh": 0.0}
    for _ in range(args.starts):
        before = children_cpu_s(forks._proc.pid)
        walls["forked"].append(start(forks.popen))
        cpu["forked"] += children_cpu_s(forks._proc.pid) - before
        before = sum(os.times()[2:4])
        walls["fresh"].append(start(_popen))
        cpu["fresh"] += sum(os.times()[2:4]) - before
    forks.close()
    print(f"A rank's start to its exit ({args.starts} of each, alternating; load average {os.getloadavg()[0]:.2f}):")
    for kind, values in walls.items():
        ordered = sorted(values)
        print(f"  {kind:7s} median {statistics.median(values) * 1e3:7.2f} ms, p90 "
              f"{ordered[int(0.9 * (len(ordered) - 1))] * 1e3:7.2f} ms, CPU {cpu[kind] / args.starts * 1e3:6.2f} ms a start")
    print(f"  fresh / forked: {statistics.median(walls['fresh']) / statistics.median(walls['forked']):.1f}x the wall "
          f"time, {cpu['fresh'] / max(cpu['forked'], 1e-9):.1f}x the CPU")


if __name__ == "__main__":
    main()
