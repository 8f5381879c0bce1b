"""The flake budget of CI's suites side by side: how often each test of the suites that judge
timing passes when run as `.ci/run` runs them.

Each run is CI's middle phases: the namespaced bench's suites (link bring-up, recovery,
collective bandwidth, training throughput at half of real time), beside the emulated benches'
suites one after another (the default bench at real time, the serial-switch and photonic-mesh
benches at a fifth of real time); with --busy-core, beside a busy loop held to every core but the
first (scripts/held) too, a harder condition than CI's. It prints each test's pass rate per
bench, the failures' first lines, the load average, and each run's time. It needs root (network
namespaces) and the --netns setup.

A test that fails here without a real regression is a defect of the test: its fix is a better
design (more samples, a stated decision), never a wider tolerance.

    .venv/bin/python perf/suite_flakes.py               # 20 runs: about 100 minutes on 2 cores
    .venv/bin/python perf/suite_flakes.py --runs 5 --keep /tmp/suite-flakes
    .venv/bin/python perf/suite_flakes.py --busy-core
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flakes import ROOT, _outcomes, count, print_tallies  # noqa: E402  (the JUnit reading and the tally)

LUMION = str(ROOT / ".venv" / "bin" / "lumion-hil")
# What .ci/run runs, bench by bench (the report left out: it judges nothing).
NETNS = ("netns", ["--bench", "benches/netns.yaml", "--time-scale", "0.5", "-k",
                   "link_bringup or recovery_time or collective_bandwidth or training_throughput"])
EMULATED = [("default", ["--bench", "benches/emulated.yaml"]),
            ("serial", ["--bench", "benches/emulated-serial.yaml", "--time-scale", "0.2"]),
            ("mesh", ["--bench", "benches/emulated-mesh.yaml", "--time-scale", "0.2"])]


def _run(name: str, args: list[str], tmp: Path, run: int, env: dict, keep: Path | None) -> dict[str, tuple[str, str]]:
    junit = tmp / f"{name}-{run}.xml"
    done = subprocess.run([LUMION, "run", *args, "--results", str(tmp / f"{name}-{run}"), "--no-report", "-q",
                           f"--junitxml={junit}"], cwd=ROOT, env=env, capture_output=True, text=True)
    outcomes = {f"{name}: {test}": outcome for test, outcome in _outcomes(junit).items()}
    if done.returncode != 0:
        if not outcomes:  # the run itself failed (a bench error, a crash): one line for it
            outcomes[f"{name}: the run"] = ("failed", f"exit {done.returncode}: {(done.stderr or done.stdout)[-160:]}")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"{name}-{run}.log").write_text(done.stdout + done.stderr)
            print(f"  kept: {keep / f'{name}-{run}.log'}", flush=True)
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="how many times CI's middle phases run (default 20)")
    parser.add_argument("--busy-core", action="store_true",
                        help="a busy loop beside the suites too, held to every core but the first")
    parser.add_argument("--keep", type=Path, default=None, help="keep the whole output of every failing run here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("suite_flakes: the namespaced bench needs root (network namespaces)", file=sys.stderr)
        return 4
    busy = None if not args.busy_core else subprocess.Popen(
        [str(ROOT / "scripts" / "held"), sys.executable, "-c", "while True: pass"])
    tallies: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: dict[str, list[str]] = collections.defaultdict(list)
    started, load_before = time.monotonic(), os.getloadavg()
    print(f"{'beside a held busy core' if busy else 'as CI runs them'}: {args.runs} runs; load average "
          f"{load_before[0]:.2f}", flush=True)
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            for run in range(1, args.runs + 1):
                t0 = time.monotonic()
                env = {**os.environ, "LUMION_HIL_LOCK_DIR": tempfile.mkdtemp(dir=tmp)}
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                outcomes: dict[str, tuple[str, str]] = {}
                took: dict[str, float] = {}

                def emulated() -> None:
                    for name, bench_args in EMULATED:
                        t = time.monotonic()
                        outcomes.update(_run(name, bench_args, tmp, run, env, args.keep))
                        took[name] = time.monotonic() - t

                beside = threading.Thread(target=emulated)
                beside.start()
                t = time.monotonic()
                netns = _run(*NETNS, tmp, run, env, args.keep)
                took["netns"] = time.monotonic() - t
                beside.join()
                outcomes.update(netns)
                bad = count(outcomes, run, tallies, failures)
                print(f"run {run}/{args.runs}: {len(outcomes)} tests in {time.monotonic() - t0:.0f} s ("
                      + ", ".join(f"{name} {s:.0f} s" for name, s in took.items()) + f"), {len(bad)} failed"
                      + (": " + ", ".join(bad) if bad else "") + f"; load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait()
    return print_tallies(tallies, failures, f"{args.runs} runs{', beside a held busy core' if busy else ''}", started,
                         load_before[0])


if __name__ == "__main__":
    sys.exit(main())
