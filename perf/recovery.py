"""Recovery, many times over, on the emulated benches:
- the controller's overhead per phase (measured minus the world's physical latency), median and
  p99 over N recoveries at a reduced time scale;
- the accuracy of the measured total (fault to first step) against the world's ground truth;
- recovery on the photonic-mesh profile vs the Polatis profile, side by side (same scale)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from lumion_hil.harness.config import load_bench
from lumion_hil.harness.controller import PHASES, load_controller
from lumion_hil.harness.faults import Fault, Injector
from lumion_hil.harness.recovery import ground_truth
from lumion_hil.harness.session import BenchSession

ROOT = Path(__file__).resolve().parent.parent


def p99(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def recoveries(bench_file: str, scale: float, n: int):
    bench = load_bench(ROOT / "benches" / bench_file, time_scale=scale)
    out = []
    with BenchSession.open(bench) as session:
        injector = Injector(session, seed=bench.recovery.fault_seed)
        ranks = list(bench.job.ranks)
        for i in range(n):
            session.fresh_job(ranks)
            assert session.hosts[ranks[0]].wait_step(1, 60)["reached"]
            controller = load_controller(session, ranks)
            controller.arm()
            fault = Fault("gpu_failure", ranks[i % len(ranks)])
            fault_ns = injector.inject(fault)
            result = controller.recover(fault_ns)
            injector.repair(fault)
            if result.status != "recovered":
                raise SystemExit(f"recovery {i} on {bench_file}: {result.status}: {result.reason}")
            truth = ground_truth(session.world, fault_ns, result)
            out.append((result, fault_ns, truth))
        session.stop_job()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recoveries", type=int, default=100)
    parser.add_argument("--scale", type=float, default=0.02, help="emulated time scale for the overhead runs")
    parser.add_argument("--side-by-side", type=int, default=5, help="recoveries per profile for the comparison")
    parser.add_argument("--side-scale", type=float, default=0.1)
    args = parser.parse_args()

    runs = recoveries("emulated.yaml", args.scale, args.recoveries)
    print(f"Controller overhead per phase, {args.recoveries} GPU-failure recoveries, Polatis profile, "
          f"time scale {args.scale:g} (ms: median / p99):")
    totals = []
    for phase in PHASES:
        overheads = [(r.phase_s(phase) - t.physical_s.get(phase, 0.0)) * 1e3 for r, _, t in runs if phase in r.phases]
        if not overheads:
            continue  # a phase no recovery went through (retry)
        print(f"  {phase:11s} {statistics.median(overheads):8.3f} / {p99(overheads):8.3f}")
    between = [t.between_phases_s * 1e3 for _, _, t in runs]
    print(f"  {'(between)':11s} {statistics.median(between):8.3f} / {p99(between):8.3f}")
    for r, _, t in runs:
        totals.append((sum(r.phase_s(p) - t.physical_s.get(p, 0.0) for p in r.phases) + t.between_phases_s) * 1e3)
    print(f"  {'total':11s} {statistics.median(totals):8.3f} / {p99(totals):8.3f}")
    errors = [((r.first_step_ns - f) / 1e9 - t.total_s) * 1e3 for r, f, t in runs]
    print(f"Measured total - ground truth (ms): median {statistics.median(errors):.3f}, "
          f"p99 {p99(errors):.3f}, max |error| {max(abs(e) for e in errors):.3f}")

    print(f"Recovery by profile, {args.side_by_side} GPU failures each, time scale {args.side_scale:g} "
          "(median s: fault to restart / fault to first step / switch phase):")
    for label, bench_file in (("Polatis (50 ms per connection)", "emulated.yaml"),
                              ("photonic mesh (3.7 us)", "emulated-mesh.yaml")):
        side = recoveries(bench_file, args.side_scale, args.side_by_side)
        restart = statistics.median((r.restarted_ns - f) / 1e9 for r, f, _ in side)
        first = statistics.median((r.first_step_ns - f) / 1e9 for r, f, _ in side)
        switch = statistics.median(r.phase_s("switch") for r, _, _ in side)
        print(f"  {label:32s} {restart:8.4f} / {first:8.4f} / {switch:8.4f}")


if __name__ == "__main__":
    main()
