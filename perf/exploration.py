"""Failure-sequence exploration speed on the exploration bench, side by side with the code before
a change, and where the time goes.

1. The ci profile (its two shards on ``--workers`` pytest-xdist workers, as CI runs it, at the
   bench's time scale 0.02) through ``lumion-hil run``, with the same sequences and seed, on the
   code of ``--before`` (a git revision, unpacked to a temporary folder and run with this
   environment) and on this tree, one after the other in one run: sequences, wall time,
   sequences a minute, and their ratio.
2. For each, the wall time of what the explorer does (a reset, a recovery, a repair, a quiet
   step, the promises' check) split into the scaled physics the world accounts for, process
   start-up, harness CPU and waiting (perf/exploration_split.py says how each is measured); and
   the run's CPU by process (the harness, the agents, the fork servers, the ranks) beside the
   whole machine's (perf/process_cpu.py): on a machine the run keeps busy, what it costs in CPU
   is what sets its speed.
3. The floor the physics alone sets: the profile's physics, all of it, spread over the workers;
   the sequences a minute it allows, and how far each run is from it.

``--pairs N`` runs the two sides N times, in turn the code before first and this tree first, and
prints each pair's ratio and their median: one pair's ratio moves with what the machine does over
its minutes. ``--profiles`` also runs the nightly profile (its 8 shards over the workers) and the bench
profile (real time, a few sequences) on this tree, as before. Figures are wall time on this
machine: a loaded machine slows both sides of the comparison alike, not the floor."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from io import BytesIO
from pathlib import Path

from exploration_split import late_us  # this folder's: it runs as a script from here
from process_cpu import ByProcess, describe

ROOT = Path(__file__).resolve().parent.parent
# The code before failure sequences were made cheap (fork-served ranks, fewer world round trips,
# kept threads): main as this change was based on it; the default of --before.
BEFORE = "01c1b17"
KINDS = ("reset", "recovery", "repair", "quiet", "check")
PARTS = ("physics_s", "startup_s", "harness_s", "waiting_s")
# Beside each run, a process of its own that sleeps 1 ms again and again and notes how late it
# woke (microseconds), until it is stopped: the machine's scheduling alone, to read the same
# figure of the workers' threads against (perf/exploration_split.py).
WAKE_PROBE = """
import json, signal, sys, time
late = []
def stop(*_):
    with open(sys.argv[1], "w") as fh:
        json.dump(late, fh)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
clock = time.perf_counter_ns
while True:
    t0 = clock()
    time.sleep(0.001)
    late.append((clock() - t0 - 1_000_000) // 1000)
"""


def unpack(revision: str, into: Path) -> Path:
    """The tree at ``revision`` unpacked under ``into``, laid out as its installed package (each
    folder where its pyproject.toml maps it); returns the folder that holds that package. A run
    started there imports that tree (its folder comes first on the path: it is the current one),
    with this environment's packages."""
    try:
        data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision], check=True,
                              capture_output=True).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"--before {revision}: git archive failed: {exc.stderr.decode().strip()}") from None
    tree = into / "tree"
    tree.mkdir()
    with tarfile.open(fileobj=BytesIO(data)) as archive:
        archive.extractall(tree, filter="data")
    layout = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = into / "path" / "lumion_hil"
    top.mkdir(parents=True)
    for item in (tree / layout["lumion_hil"]).iterdir():
        (top / item.name).symlink_to(item, target_is_directory=item.is_dir())
    for package, folder in layout.items():
        if package != "lumion_hil":
            (top / package.split(".", 1)[1]).symlink_to(tree / folder, target_is_directory=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=False, capture_output=True)
    found = subprocess.run([sys.executable, "-c", "import lumion_hil.harness.exploration as m; print(m.__file__)"],
                           cwd=top.parent, capture_output=True, text=True).stdout.strip()
    if not found.startswith(str(top)):
        raise SystemExit(f"--before {revision}: the unpacked tree is not the one imported ({found!r})")
    return top.parent


def explore(tree: Path, shim: Path | None, profile: str, sequences: int, *extra: str, split: bool = True,
            bench: str = "exploration.yaml") -> dict:
    """One ``lumion-hil run`` of the failure-sequence suite; its figures from the run record and,
    with ``split``, the split of its time."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as .ci/run
        env["PYTHONPATH"] = str(ROOT / "perf")  # this plug-in, on either tree
        env["LUMION_HIL_LOCK_DIR"] = env.get("LUMION_HIL_LOCK_DIR", str(Path(tmp) / "locks"))
        if split:
            env["LUMION_HIL_SPLIT_OUT"] = str(Path(tmp) / "split")
        cmd = [sys.executable, "-m", "lumion_hil", "run", "--bench", str(tree / "benches" / bench),
               "--results", str(results), "--no-report", "--explore", profile, "-k", "failure_sequences",
               "--explore-sequences", str(sequences), "--explore-seed", "1", "-q", "-p", "exploration_split", *extra]
        for attempt in range(3):
            probe = subprocess.Popen([sys.executable, "-c", WAKE_PROBE, str(Path(tmp) / "wake.json")])
            try:
                started = time.monotonic()
                run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       cwd=shim or ROOT, env=env)
                watch = ByProcess(run.pid).start()
                try:
                    stdout, stderr = run.communicate()
                except BaseException:  # interrupted: the run is not left going (as subprocess.run would not)
                    run.kill()
                    run.wait()
                    raise
                finally:
                    cpu = watch.stop()
                proc = subprocess.CompletedProcess(cmd, run.returncode, stdout, stderr)
                wall = time.monotonic() - started
            finally:  # an interrupted run leaves no probe behind
                probe.terminate()
                probe.wait()
            if proc.returncode == 0 or attempt == 2:
                break
            # A run that broke is not a speed: say why, and run it again. On a busy machine the code
            # before the start-up allowance had its agents miss their first reply (no tests ran), and
            # a story at a fiftieth of real time can miss a deadline the load, not the code, missed.
            broke = [line.strip() for p in (results / "stories").glob("*.yaml") for line in p.read_text().splitlines()
                     if line.startswith("broke:")]
            why = broke[0][:160] if broke else "no tests ran" if "no tests ran" in proc.stdout else f"exit {proc.returncode}"
            print(f"  ({'before' if shim else 'this tree'}: the run broke ({why}); run again)", flush=True)
            shutil.rmtree(results, ignore_errors=True)
            shutil.rmtree(Path(tmp) / "split", ignore_errors=True)
        if proc.returncode != 0:
            stories = "\n".join(p.read_text() for p in (results / "stories").glob("*.yaml"))
            raise SystemExit(f"{profile} ({tree}): exit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
                             f"\n{stories}")
        lines = [json.loads(line) for record in (results / "records").glob("*.jsonl") for line in record.open()]
        parts = [json.loads(line) for f in (Path(tmp) / "split").glob("*.jsonl") for line in f.open()] if split else []
        alone = json.loads((Path(tmp) / "wake.json").read_text()) if (Path(tmp) / "wake.json").exists() else []
    taken = [m for m in lines if m.get("type") == "measurement"]
    explored = sum(m["attrs"].get("sequences_run", 0) for m in taken if m["name"] == "sequences_explored")
    distinct = sum(m["value"] for m in taken if m["name"] == "sequences_explored")
    lengths = [m["value"] for m in taken if m["name"] == "sequence_length_mean"]
    recoveries = sum(m["attrs"].get("recoveries", 0) for m in taken if m["name"] == "sequences_per_minute")
    return {"sequences": explored, "distinct": distinct, "wall_s": wall, "per_min": 60 * explored / wall,
            "mean_steps": sum(lengths) / len(lengths) if lengths else 0.0, "recoveries": recoveries,
            "recoveries_per_min": 60 * recoveries / wall, "parts": parts, "wake_alone": late_us(alone), "cpu": cpu}


def floor(run: dict, workers: int) -> dict:
    """The physics floor of a run: all its physics, spread over the workers."""
    ops = [p for p in run["parts"] if p.get("kind") in KINDS and "error" not in p]
    physics = sum(p["physics_s"] for p in ops)
    shards = [p for p in run["parts"] if p.get("kind") == "shard"]
    shard_wall = max((sum(p["wall_s"] for p in shards) / workers), 1e-9)
    floor_s = physics / workers
    return {"floor_s": floor_s, "per_min": 60 * run["sequences"] / floor_s if floor_s else float("inf"),
            "shard_wall_s": shard_wall, "of_run": run["wall_s"] / floor_s if floor_s else float("inf"),
            "of_shards": shard_wall / floor_s if floor_s else float("inf")}


def print_split(name: str, run: dict) -> None:
    ops = [p for p in run["parts"] if p.get("kind") in KINDS and "error" not in p]
    errors = [p for p in run["parts"] if "error" in p]
    print(f"  {name}: per operation, mean ms (wall = physics + start-up + harness CPU + waiting), and its total s")
    print(f"    {'':9s} {'count':>6s} {'wall':>8s} {'physics':>8s} {'start-up':>8s} {'harness':>8s} {'waiting':>8s}"
          f" {'total s':>8s} {'ranks started':>14s}")
    for kind in KINDS:
        mine = [p for p in ops if p["kind"] == kind]
        if not mine:
            continue
        mean = {k: 1e3 * sum(p[k] for p in mine) / len(mine) for k in ("wall_s",) + PARTS}
        print(f"    {kind:9s} {len(mine):6d} {mean['wall_s']:8.1f} {mean['physics_s']:8.1f} {mean['startup_s']:8.1f} "
              f"{mean['harness_s']:8.1f} {mean['waiting_s']:8.1f} {sum(p['wall_s'] for p in mine):8.1f} "
              f"{sum(p.get('ranks_started', 0) for p in mine):14d}")
    if not ops:
        print("    (no operation was timed: the split's timers do not fit this code's explorer)")
    shards = [p for p in run["parts"] if p.get("kind") == "shard"]
    timed = sum(p["wall_s"] for p in ops)
    total = sum(p["wall_s"] for p in shards)
    print(f"    the shards' tests took {total:.1f} s in all ({sum(p['cpu_s'] for p in shards):.1f} s of their "
          f"processes' CPU); the operations above {timed:.1f} s of it, the rest ({total - timed:.1f} s) is what "
          "they leave out (a fade's step short of a recovery, a fault's making), Hypothesis drawing the steps, "
          "the explorer's bookkeeping, and this split's own accounting after each operation")
    if errors:
        print(f"    ({len(errors)} operation(s) could not be split: {errors[0]['error']})")
    wakes = [p for p in run["parts"] if p.get("kind") == "wake" and p.get("n")]
    alone = run.get("wake_alone", {})
    if wakes and alone.get("n"):
        def fmt(w: dict) -> str:
            return f"{w['p50']}/{w['p90']}/{w['p99']}"

        print(f"    a thread's wake from a 1 ms sleep, late by (median/p90/p99 us): in each worker "
              f"{', '.join(fmt(w) for w in wakes)}; in a process of its own {fmt(alone)} (the difference: the "
              "worker's threads waiting for their turn at its interpreter lock)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ci", type=int, default=200, help="sequences of the ci profile on each side (default 200)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2, as CI)")
    parser.add_argument("--before", default=BEFORE, metavar="REVISION",
                        help=f"the code to compare with (default {BEFORE}); 'none': this tree alone")
    parser.add_argument("--bench", default="exploration.yaml", metavar="FILE",
                        help="the bench file under benches/ (default exploration.yaml; netns.yaml: the namespaced "
                             "bench, as root, at --time-scale 0.05 as CI runs it)")
    parser.add_argument("--time-scale", type=float, default=None, help="the bench's time scale (default: its own)")
    parser.add_argument("--pairs", type=int, default=1, metavar="N",
                        help="run the two sides N times, in turn before first and this tree first, and print each "
                             "pair's ratio and their median (default 1: a ratio of two runs moves with the machine)")
    parser.add_argument("--profiles", action="store_true",
                        help="also the nightly profile over the workers and the bench profile at real time")
    parser.add_argument("--nightly", type=int, default=96, help="sequences for the nightly profile (8 shards)")
    parser.add_argument("--bench-sequences", type=int, default=3, help="sequences for the bench profile (real time)")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs}: at least 1")
    workers = ["-n", str(args.workers)] if args.workers > 1 else []
    workers += ["--time-scale", str(args.time_scale)] if args.time_scale else []
    load = os.getloadavg()
    print(f"Failure sequences on {args.bench}{f' at time scale {args.time_scale:g}' if args.time_scale else ''}, ci profile, {args.ci} sequences, seed 1, {args.workers} worker(s); "
          f"{os.cpu_count()} cores, load average {load[0]:.2f} at the start")
    runs, ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        shim = unpack(args.before, Path(tmp)) if args.before != "none" else None
        for k in range(args.pairs):
            sides = [("this tree", ROOT, None)]
            if shim is not None:
                before = (f"before ({args.before})", Path(tmp) / "tree", shim)
                # Each pair in the other order from the last: a load that comes or goes over the
                # minutes of a measurement favours neither side.
                sides = [before, *sides] if k % 2 == 0 else [*sides, before]
            done = {name: explore(tree, where, "ci", args.ci, *workers, bench=args.bench) for name, tree, where in sides}
            runs += [(name + (f" #{k + 1}" if args.pairs > 1 else ""), done[name]) for name, *_ in sides]
            if shim is not None:
                ratios.append(done["this tree"]["per_min"] / done[before[0]]["per_min"])
    print(f"  {'':22s} {'sequences':>9s} {'wall s':>8s} {'per min':>8s} {'recoveries':>10s} {'steps each':>10s}  "
          "physics floor: s, per min, run / floor, shards / floor")
    for name, r in runs:
        f = floor(r, args.workers)
        # a run whose explorer the split could not time (code older than --before's) has no floor
        floor_text = (f"{f['floor_s']:6.1f} {f['per_min']:8.1f} {f['of_run']:6.2f}x {f['of_shards']:6.2f}x"
                      if f["floor_s"] else "  (not split: no physics read)")
        print(f"  {name:22s} {r['sequences']:9.0f} {r['wall_s']:8.1f} {r['per_min']:8.1f} {r['recoveries']:10.0f} "
              f"{r['mean_steps']:10.2f}  {floor_text}")
    if len(ratios) == 1:
        print(f"  this tree / before: {ratios[0]:.2f}x the sequences a minute "
              "(same profile, seed and machine, one after the other)")
    elif ratios:
        print(f"  this tree / before, pair by pair: {', '.join(f'{r:.2f}x' for r in ratios)}; median "
              f"{statistics.median(ratios):.2f}x the sequences a minute (same profile, seed and machine; each pair "
              "one after the other, in turn before first and this tree first)")
    if args.pairs > 1:
        over = [floor(r, args.workers)["of_run"] for name, r in runs if name.startswith("this tree")]
        print(f"  this tree over its physics floor, run by run: {', '.join(f'{x:.2f}x' for x in over)}; median "
              f"{statistics.median(over):.2f}x")
    print("Where the time goes (perf/exploration_split.py):")
    for name, r in runs:
        print_split(name, r)
    print("The run's CPU by process, s (perf/process_cpu.py):")
    for name, r in runs:
        print(f"  {name}: {describe(r['cpu'], r['wall_s'])}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine slows both sides)")
    if args.profiles and args.bench == "exploration.yaml":
        more = [(f"nightly (-n {args.workers})", explore(ROOT, None, "nightly", args.nightly, *workers, split=False)),
                ("bench (real time)", explore(ROOT, None, "bench", args.bench_sequences, "--time-scale", "1", split=False))]
        for name, r in more:
            print(f"  {name:20s} {r['sequences']:5.0f} sequences in {r['wall_s']:6.1f} s: {r['per_min']:6.1f} per "
                  f"minute, {r['mean_steps']:.1f} steps each, {r['recoveries_per_min']:6.1f} recoveries per minute")


if __name__ == "__main__":
    main()
