"""What recording costs, and how fast fidelity replays.

1. The suites (circuit setup, link bring-up, light, recovery) against the default emulated
   bench at time scale 0.2, with and without ``--record``, alternating, N times each: wall
   time of each run, their medians, and the ratio (the recording's cost).
2. ``lumion-hil fidelity`` of the recording against the same bench: exchanges replayed per
   second of replay, and the replay's wall time against the recorded run's span (a replay keeps
   the recorded schedule, so it can be no shorter).

Measured on this machine; nothing here is a model figure.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benches" / "emulated.yaml"
SUITES = "circuit or link or light or recovery"


def run(results: Path, record: bool) -> float:
    cmd = [sys.executable, "-m", "lumion_hil", "run", "--bench", str(BENCH), "--time-scale", "0.2", "--results",
           str(results), "--no-report", "-q", "-k", SUITES] + (["--record"] if record else [])
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="?", type=int, default=3, help="runs with and without --record (default 3)")
    runs = parser.parse_args().runs
    from lumion_hil.harness.config import load_bench
    from lumion_hil.harness.transcript_replay import Replayer
    from lumion_hil.instruments import transcript

    with tempfile.TemporaryDirectory() as tmp:
        plain, recorded = [], []
        for i in range(runs):
            plain.append(run(Path(tmp) / f"plain{i}", False))
            recorded.append(run(Path(tmp) / f"rec{i}", True))
        print(f"suites ({SUITES}) at time scale 0.2, {runs} runs each, alternating:")
        print(f"  without --record: {', '.join(f'{x:.2f}' for x in plain)} s (median {statistics.median(plain):.2f})")
        print(f"  with --record:    {', '.join(f'{x:.2f}' for x in recorded)} s "
              f"(median {statistics.median(recorded):.2f})")
        print(f"  cost of recording: {statistics.median(recorded) / statistics.median(plain) - 1:+.1%} of the run")
        path = next((Path(tmp) / "rec0" / "records").glob("transcript-*.jsonl"))
        header, entries = transcript.read(path)
        span = (max(e.get("done_ns", e["t_ns"]) for e in entries) - header["t0_ns"]) / 1e9
        print(f"  transcript: {len(entries)} lines, {path.stat().st_size / 1e6:.2f} MB")
        bench = load_bench(BENCH, time_scale=header["time_scale"])
        started = time.perf_counter()
        replayed = Replayer(bench, header, entries).run()
        wall = time.perf_counter() - started
        print(f"fidelity replay: {len(replayed)} exchanges in {wall:.2f} s ({len(replayed) / wall:.0f} per second), "
              f"the recorded run spanning {span:.2f} s (replay / recording {wall / span:.2f})")


if __name__ == "__main__":
    main()
