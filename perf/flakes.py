"""The flake budget, measured: how often each test that judges time passes beside a busy core.

Every test marked ``alone`` (scripts/tests runs them one at a time: they judge timing or
throughput against the emulator's ground truth or a recording) runs N times, one pytest after
another, as scripts/tests runs them, while a busy loop (``python3 -c "while True: pass"``,
started here and stopped at the end) takes one of the machine's cores: the most that the other
tests, held to every core but one, can take from them there. It prints each test's pass rate, its
failures' first lines, the load average before and after, and the time it took.

A test that fails here without a real regression is a defect of the test: its fix is a better
design (more samples, a stated decision, harness/decisions.py), never a wider tolerance.

    .venv/bin/python perf/flakes.py                  # every such test, 20 times (hours: the alone phase x 20)
    .venv/bin/python perf/flakes.py --runs 5 -k recovery
    .venv/bin/python perf/flakes.py --no-busy-core   # the same on a quiet machine
    .venv/bin/python perf/flakes.py --beside-others --runs 5   # as scripts/tests runs them (below)

--beside-others: instead of the busy loop, the other tests run beside the alone tests as
scripts/tests runs them (on two workers, held to every core but the first by scripts/held, the
ones marked scaled left out), and their outcomes are counted too: both sides of that phase.
    .venv/bin/python perf/flakes.py --keep /tmp/flakes   # each failing run's whole pytest output kept there
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed|failed|skipped, the first line of why) from pytest's JUnit XML."""
    out = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                why = (found.get("message") or found.text or "").strip().splitlines()[0][:160] if (
                    found.get("message") or found.text) else ""
                break
        out[test] = (outcome, why)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="how many times each test runs (default 20)")
    parser.add_argument("-k", dest="keyword", default=None, help="only the tests pytest's -k selects")
    parser.add_argument("--no-busy-core", action="store_true", help="no busy loop beside the tests")
    parser.add_argument("--beside-others", action="store_true",
                        help="the other tests beside them, held, as scripts/tests runs them (no busy loop)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the whole pytest output (and its JUnit XML) of every run with a failure here")
    args = parser.parse_args()
    keyword = ["-k", args.keyword] if args.keyword else []
    env = {**os.environ, "LUMION_HIL_LOCK_DIR": os.environ.get("LUMION_HIL_LOCK_DIR") or tempfile.mkdtemp(
        prefix="lumion-hil-flakes-")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    busy = None if args.no_busy_core or args.beside_others else subprocess.Popen(
        [sys.executable, "-c", "while True: pass"])
    beside = "beside the others, held" if args.beside_others else "beside a busy core" if busy else "on a quiet machine"
    tallies: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: dict[str, list[str]] = collections.defaultdict(list)
    started, load_before = time.monotonic(), os.getloadavg()
    print(f"{beside}: {args.runs} runs; load average "
          f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(1, args.runs + 1):
                junit = Path(tmp) / f"run-{run}.xml"
                t0 = time.monotonic()
                others = None
                if args.beside_others:
                    others_log = (Path(tmp) / f"others-{run}.log").open("w")
                    others = subprocess.Popen(
                        [str(ROOT / "scripts" / "held"), sys.executable, "-m", "pytest", "tests", "-n", "2", "--dist",
                         "loadgroup", "-m", "not alone and not scaled", "-q", "-p", "no:cacheprovider",
                         f"--junitxml={Path(tmp) / f'others-{run}.xml'}"],
                        cwd=ROOT, env=env, stdout=others_log, stderr=subprocess.STDOUT)
                done = subprocess.run([sys.executable, "-m", "pytest", "tests", "-m", "alone", *keyword, "-q",
                                       "-p", "no:cacheprovider", f"--junitxml={junit}"],
                                      cwd=ROOT, env=env, capture_output=True, text=True)
                outcomes = _outcomes(junit)
                if others is not None:
                    others.wait()
                    others_log.close()
                    outcomes.update({f"held beside: {test}": outcome
                                     for test, outcome in _outcomes(Path(tmp) / f"others-{run}.xml").items()})
                bad = count(outcomes, run, tallies, failures)
                if args.keep is not None and (bad or done.returncode not in (0, 5)):
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"run-{run}.log").write_text(done.stdout + done.stderr)
                    if junit.exists():
                        (args.keep / junit.name).write_bytes(junit.read_bytes())
                    if others is not None:
                        (args.keep / f"others-{run}.log").write_text((Path(tmp) / f"others-{run}.log").read_text())
                    print(f"  kept: {args.keep / f'run-{run}.log'}", flush=True)
                print(f"run {run}/{args.runs}: {len(outcomes)} tests in {time.monotonic() - t0:.0f} s, "
                      f"{len(bad)} failed{': ' + ', '.join(bad) if bad else ''}; load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait()
    return print_tallies(tallies, failures, f"{args.runs} runs, {beside}", started, load_before[0])


def count(outcomes: dict[str, tuple[str, str]], run: int, tallies: dict[str, collections.Counter],
          failures: dict[str, list[str]]) -> list[str]:
    """Adds one run's outcomes to the tallies and the failures' first lines; the tests that failed."""
    for test, (outcome, why) in outcomes.items():
        tallies[test][outcome] += 1
        if outcome == "failed":
            failures[test].append(f"run {run}: {why}")
    return [t for t, (o, _) in outcomes.items() if o == "failed"]


def print_tallies(tallies: dict[str, collections.Counter], failures: dict[str, list[str]], how: str, started: float,
                  load_before: float) -> int:
    """Each test's pass rate and its first failures, then the totals; 1 where any run failed."""
    print(f"\npass rate per test ({how}):")
    for test, tally in sorted(tallies.items()):
        runs = sum(tally.values())
        print(f"  {tally['passed']:3}/{runs - tally['skipped']:<3} {test}"
              + (f"  (skipped {tally['skipped']})" if tally["skipped"] else ""))
        for line in failures.get(test, [])[:5]:
            print(f"        {line}")
    load_after = os.getloadavg()
    print(f"\n{sum(t['failed'] for t in tallies.values())} failures in {sum(sum(t.values()) for t in tallies.values())} "
          f"test runs; {time.monotonic() - started:.0f} s; load average before {load_before:.2f}, after "
          f"{load_after[0]:.2f} (1 min), {load_after[2]:.2f} (15 min)")
    return 1 if any(t["failed"] for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
