"""`lumion-hil bench wiring` on the default emulated bench at real time: its wall time beside the
floor the switch's and the NICs' physics set.

The walk's physics (model figures, from the bench file's emulation sections): each receiver is
found by one test circuit, which takes the switch's switching time to make, then the receiving
NIC's lock and link-up time before its agent can see carrier; turning a transmitter off and on
costs no emulated time. The command also restores the baseline when it opens the bench (the
in-process bench starts with no circuits) and again when it closes it: one switching time per
baseline cross-connect each. What is above the floor is the walk's own time (agent and SCPI
round trips, polling) and, for the command, starting Python, the emulators and the agents.

Wall times are measured (median of --runs), floors are model figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lumion_hil.harness.config import load_bench

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benches" / "emulated.yaml"


def floors(bench) -> tuple[float, float]:
    """(the walk's floor, the command's floor) in seconds, from the bench's emulation (model)."""
    switching = bench.switch.emulation.switching_time_s
    walk = sum(switching + h.emulation.lock_time_s + h.emulation.link_up_time_s for h, _ in bench.nic_ports())
    return walk, walk + 2 * switching * len(bench.safety.baseline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bench = load_bench(BENCH)
    walk_floor, command_floor = floors(bench)
    walks, commands = [], []
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": tempfile.mkdtemp(prefix="lumion-hil-perf-")}
    for _ in range(args.runs):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "lumion_hil", "bench", "wiring", str(BENCH)],
                              capture_output=True, text=True, env=env, timeout=300)
        commands.append(time.perf_counter() - started)
        if proc.returncode != 0:
            sys.exit(f"bench wiring failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        walks.append(float(re.search(r"walk ([\d.]+) s", proc.stdout).group(1)))
    walk, command = statistics.median(walks), statistics.median(commands)
    nics = len(bench.nic_ports())
    print(f"bench wiring on {BENCH.name} at real time, {nics} NIC ports, median of {args.runs} runs (measured):")
    print(f"  the walk (transmitters, then receivers):  {walk:6.2f} s   floor {walk_floor:5.2f} s (model)   "
          f"{walk / walk_floor:4.2f}x the floor, {(walk - walk_floor) / nics * 1e3:5.1f} ms per NIC above it")
    print(f"  the whole command (start to exit):        {command:6.2f} s   floor {command_floor:5.2f} s (model)   "
          f"{command / command_floor:4.2f}x the floor")
    print("  floor: per NIC one test circuit (switching_time_s) and its NIC's lock_time_s + link_up_time_s; the "
          f"command adds the baseline ({len(bench.safety.baseline)} cross-connects) restored at open and at close")


if __name__ == "__main__":
    main()
