"""Recovery, many times over, on the emulated benches:
- the controller's overhead measured from outside (fault to first step on the harness's clock,
  minus the physics the world accounts for), median and p99 at time scales 1 and 0.02 side by
  side, with the figure summed from the controller's own phases beside it;
- the controller's overhead per phase (its phases minus the world's physical latency);
- the accuracy of the measured total (fault to first step) against the world's ground truth;
- recovery on the photonic-mesh profile vs the Polatis profile, side by side (same scale)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from lumion_hil.harness.config import load_bench
from lumion_hil.harness.controller import PHASES, load_controller
from lumion_hil.harness.faults import Fault, Injector
from lumion_hil.harness.recovery import controller_overhead, ground_truth, observe_restart
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
            assert session.hosts[ranks[0]].wait_step(1, 60).reached
            controller = load_controller(session, ranks)
            controller.arm()
            fault = Fault("gpu_failure", ranks[i % len(ranks)])
            before = session.switch.connections()
            fault_ns = injector.inject(fault)
            result = controller.recover(fault_ns)
            injector.repair(fault)
            if result.status != "recovered":
                raise SystemExit(f"recovery {i} on {bench_file}: {result.status}: {result.reason}")
            restart = observe_restart(session, fault_ns)
            truth = ground_truth(session.world, fault_ns, result, restart)
            overhead = controller_overhead(session, fault_ns, restart, before, session.switch.connections())
            out.append((result, fault_ns, truth, overhead))
        session.stop_job()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recoveries", type=int, default=30, help="recoveries per time scale")
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.02], help="time scales compared")
    parser.add_argument("--side-by-side", type=int, default=5, help="recoveries per profile for the comparison")
    parser.add_argument("--side-scale", type=float, default=0.1)
    args = parser.parse_args()

    by_scale = {scale: recoveries("emulated.yaml", scale, args.recoveries) for scale in args.scales}
    print(f"Controller overhead, {args.recoveries} GPU-failure recoveries per time scale, Polatis profile "
          "(ms, median / p99):")
    print(f"  {'time scale':>10s}  {'measured from outside':>22s}  {'summed from its phases':>22s}  budget")
    for scale, runs in by_scale.items():
        outside = [o.overhead_s * 1e3 for *_, o in runs]
        phases = [(sum(r.phase_s(p) - t.physical_s.get(p, 0.0) for p in r.phases) + t.between_phases_s) * 1e3
                  for r, _, t, _ in runs]
        print(f"  {scale:10g}  {statistics.median(outside):10.2f} / {p99(outside):9.2f}  "
              f"{statistics.median(phases):10.2f} / {p99(phases):9.2f}  250 ms (not scaled)")
    scale = min(by_scale)
    runs = by_scale[scale]
    print(f"Per phase at time scale {scale:g} (its phases minus the world's physics; ms, median / p99):")
    for phase in PHASES:
        overheads = [(r.phase_s(phase) - t.physical_s.get(phase, 0.0)) * 1e3 for r, _, t, _ in runs if phase in r.phases]
        if not overheads:
            continue  # a phase no recovery went through (retry)
        print(f"  {phase:11s} {statistics.median(overheads):8.3f} / {p99(overheads):8.3f}")
    between = [t.between_phases_s * 1e3 for _, _, t, _ in runs]
    print(f"  {'(between)':11s} {statistics.median(between):8.3f} / {p99(between):8.3f}")
    errors = [((r.first_step_ns - f) / 1e9 - t.total_s) * 1e3 for r, f, t, _ in runs]
    print(f"Measured total - ground truth (ms): median {statistics.median(errors):.3f}, "
          f"p99 {p99(errors):.3f}, max |error| {max(abs(e) for e in errors):.3f}")

    print(f"Recovery by profile, {args.side_by_side} GPU failures each, time scale {args.side_scale:g} "
          "(median s: fault to restart / fault to first step / switch phase):")
    for label, bench_file in (("Polatis (50 ms per connection)", "emulated.yaml"),
                              ("photonic mesh (3.7 us)", "emulated-mesh.yaml")):
        side = recoveries(bench_file, args.side_scale, args.side_by_side)
        restart = statistics.median((r.restarted_ns - f) / 1e9 for r, f, *_ in side)
        first = statistics.median((r.first_step_ns - f) / 1e9 for r, f, *_ in side)
        switch = statistics.median(r.phase_s("switch") for r, *_ in side)
        print(f"  {label:32s} {restart:8.4f} / {first:8.4f} / {switch:8.4f}")


if __name__ == "__main__":
    main()
