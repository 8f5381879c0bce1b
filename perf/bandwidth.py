"""Bandwidth planning and measurement, timed:
- plan a spare swap and recompute the ring's bandwidth, for a 64-accelerator rack and for a
  4,096-accelerator pod (64 racks), median and p99 over N random failures (target: under 10 ms
  median for the pod);
- the emulated nccl-tests all-reduce sweep, 8 B to 128 MiB, wall time at real time, on the
  optical circuits and on the electrical rack, with the bus bandwidth it reports at 128 MiB."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from lumion_hil.harness.bandwidth import run_sweep
from lumion_hil.harness.config import load_bench
from lumion_hil.harness.pod import Pod, PodSpec
from lumion_hil.harness.session import BenchSession

ROOT = Path(__file__).resolve().parent.parent


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def planning(spec: PodSpec, failures: int, seed: int, reset_every: int) -> tuple[list[float], dict]:
    rng = random.Random(seed)
    times, outcomes = [], {"same rack": 0, "another rack": 0, "degraded": 0}
    pod = Pod(spec)
    for i in range(failures):
        if i % reset_every == 0:
            pod = Pod(spec)  # everything repaired
        gpu = rng.choice(pod.healthy_active())
        started = time.perf_counter()
        plan = pod.fail(gpu)
        times.append((time.perf_counter() - started) * 1e3)
        outcomes["degraded" if plan.degraded else "another rack" if plan.cross_rack else "same rack"] += 1
    return times, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--failures", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=1.0, help="for the nccl-tests sweep (1: real time)")
    args = parser.parse_args()

    for label, spec, reset in (("64-accelerator rack", PodSpec(racks=1), 5), ("4,096-accelerator pod", PodSpec(), 200)):
        times, outcomes = planning(spec, args.failures, args.seed, reset)
        print(f"Plan a spare swap and recompute ring bandwidth, {label}, {args.failures} random failures "
              f"(all repaired every {reset}): median {statistics.median(times):.3f} ms, p99 {p99(times):.3f} ms, "
              f"max {max(times):.3f} ms; {', '.join(f'{k} {v}' for k, v in outcomes.items())}")

    bench = load_bench(ROOT / "benches" / "emulated.yaml", time_scale=args.time_scale)
    with BenchSession.open(bench) as session:
        ranks = list(bench.job.ranks)
        run_sweep(session, "all_reduce", ranks, "optical", sizes=(8, 8))  # the programs' first start, untimed
        for fabric in ("optical", "electrical"):
            started = time.perf_counter()
            sweep = run_sweep(session, "all_reduce", ranks, fabric)
            wall = time.perf_counter() - started
            print(f"Emulated all_reduce_perf -b {bench.nccl_tests.min_bytes} -e {bench.nccl_tests.max_bytes} "
                  f"-f {bench.nccl_tests.step_factor} -n {bench.nccl_tests.iters} -w {bench.nccl_tests.warmup_iters}, "
                  f"{len(ranks)} ranks, {fabric}, time scale {args.time_scale:g}: wall {wall:.2f} s "
                  f"({len(sweep.result.rows)} sizes), busbw at {sweep.largest.size_bytes} B "
                  f"{sweep.largest.out_of_place.busbw_gbps:.3f} GB/s")


if __name__ == "__main__":
    main()
