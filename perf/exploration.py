"""Failure-sequence exploration speed, per profile, on the exploration bench: sequences per minute,
steps per sequence and recoveries per minute, as the suite itself measures them (it records
``sequences_explored``, ``sequence_length_mean`` and ``sequences_per_minute`` in the run record).

Each profile runs through `lumion-hil run` with fewer sequences than it would explore in full:
ci (its two shards one after the other in one process, at the bench's time scale 0.02; CI runs
them on two workers), nightly (its 8 shards over pytest-xdist workers),
bench (real time: a few sequences, as on a lab's bench)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benches" / "exploration.yaml"


def explore(profile: str, sequences: int, *extra: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        cmd = [sys.executable, "-m", "lumion_hil", "run", "--bench", str(BENCH), "--results", str(results), "--no-report",
               "--explore", profile, "-k", "failure_sequences", "--explore-sequences", str(sequences),
               "--explore-seed", "1", "-q", *extra]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.monotonic() - started
        if proc.returncode != 0:
            stories = "\n".join(p.read_text() for p in (results / "stories").glob("*.yaml"))
            raise SystemExit(f"{profile}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{stories}")
        lines = [json.loads(line) for record in (results / "records").glob("*.jsonl") for line in record.open()]
    taken = [m for m in lines if m.get("type") == "measurement"]
    explored = sum(m["value"] for m in taken if m["name"] == "sequences_explored")
    lengths = [m["value"] for m in taken if m["name"] == "sequence_length_mean"]
    recoveries = sum(m["attrs"].get("recoveries", 0) for m in taken if m["name"] == "sequences_per_minute")
    return {"sequences": explored, "wall_s": wall, "per_min": 60 * explored / wall,
            "mean_steps": sum(lengths) / len(lengths) if lengths else 0.0, "recoveries_per_min": 60 * recoveries / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ci", type=int, default=120, help="sequences for the ci profile")
    parser.add_argument("--nightly", type=int, default=96, help="sequences for the nightly profile (8 shards)")
    parser.add_argument("--workers", default="2", help="pytest-xdist workers for the nightly profile")
    parser.add_argument("--bench", type=int, default=3, help="sequences for the bench profile (real time)")
    args = parser.parse_args()
    runs = [("ci", explore("ci", args.ci)),
            (f"nightly (-n {args.workers})", explore("nightly", args.nightly, "-n", args.workers)),
            ("bench (real time)", explore("bench", args.bench, "--time-scale", "1"))]
    print(f"Failure-sequence exploration on {BENCH.name} (wall time of the whole run, set-up included):")
    for name, r in runs:
        print(f"  {name:20s} {r['sequences']:5.0f} sequences in {r['wall_s']:6.1f} s: {r['per_min']:6.1f} per minute, "
              f"{r['mean_steps']:.1f} steps each on average, {r['recoveries_per_min']:6.1f} recoveries per minute")


if __name__ == "__main__":
    main()
