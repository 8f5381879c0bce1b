"""The namespaced bench's real jobs, in one run:

- restart phases after a GPU failure, median (and range) of N recoveries by the reference
  controller, each from the fault to the phase on the new rank map's last rank, as the job
  printed it and its agent saw it (harness/recovery.py job_phases): processes started,
  rendezvous, communicator ready, checkpoint loaded, first step; for the PyTorch job under
  torchrun and, beside it, the light ring job (which prints no rendezvous or checkpoint);
- all-reduce busbw by size over the optical circuits and the electrical rack, from gloo
  (torch.distributed under torchrun), Open MPI (mpi4py under mpirun) and lumion-hil's ring
  (ring_perf.py), side by side.

Every figure is measured (real processes, real bytes); on a shared 2-core machine the start-up
phases are CPU-bound (`import torch` on every host at once) and move with the load, so they are
figures to compare within one run, not across machines. Needs root and sshd:
``.venv/bin/python perf/netns_jobs.py [--recoveries 5] [--time-scale 0.5]``."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from lumion_hil.harness.bandwidth import run_sweep
from lumion_hil.harness.config import load_bench
from lumion_hil.harness.controller import load_controller
from lumion_hil.harness.faults import Fault, Injector
from lumion_hil.harness.recovery import job_phases, observe_restart, recover_from
from lumion_hil.harness.session import BenchSession
from lumion_hil.instruments.emulators.netns import available

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("processes_started", "rendezvous", "workers_started", "communicator_ready", "checkpoint_loaded", "first_step")


def recoveries(session, count: int, light: bool) -> dict[str, list[float]]:
    """``count`` GPU failures on the job's ranks in turn, each recovered from a fresh job (past
    its first checkpoint, for a job that checkpoints); seconds from the fault to each phase."""
    session.use_light_job(light)
    ranks = list(session.bench.job.ranks)
    waits = session.bench.waits
    found: dict[str, list[float]] = {}
    for i in range(count):
        session.fresh_job(ranks)
        lead = session.hosts[ranks[0]]
        assert lead.wait_step(1, waits.recovery_s).reached, "the job did not start"
        if lead.job_events("checkpoint_loaded"):
            assert lead.wait_job_event("checkpoint_saved", waits.recovery_s).event, "no checkpoint saved"
        injector = Injector(session)
        fault = Fault("gpu_failure", ranks[i % len(ranks)])
        controller = load_controller(session, ranks)
        fault_ns, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault))
        assert result.status == "recovered", f"{fault.describe()}: {result.reason}"
        for phase in job_phases(session, observe_restart(session, fault_ns)):
            found.setdefault(phase.name, []).append((phase.t_ns - fault_ns) / 1e9)
        print(f"  {'light' if light else 'torch'} recovery {i + 1}: {fault.describe()}: "
              + ", ".join(f"{n} {v[-1]:.2f}" for n, v in found.items()), flush=True)
    session.stop_job()
    session.restore_baseline()
    session.use_light_job(False)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recoveries", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--min-bytes", type=int, default=1 << 10)
    parser.add_argument("--max-bytes", type=int, default=8 << 20)
    args = parser.parse_args()
    ok, why = available()
    if not ok:
        raise SystemExit(f"the namespaced bench cannot be built here: {why}")
    bench = load_bench(ROOT / "benches" / "netns.yaml", time_scale=args.time_scale)
    with BenchSession.open(bench) as session:
        print(f"restart phases after a GPU failure, seconds from the fault (median [min, max] of "
              f"{args.recoveries}), time scale {args.time_scale:g}", flush=True)
        both = {"torch": recoveries(session, args.recoveries, light=False),
                "light": recoveries(session, args.recoveries, light=True)}
        print(f"{'phase':>20s}  {'PyTorch job (torchrun, gloo)':>30s}  {'light ring job':>24s}")
        for phase in PHASES:
            cells = []
            for name in ("torch", "light"):
                values = both[name].get(phase)
                cells.append(f"{statistics.median(values):7.2f} [{min(values):.2f}, {max(values):.2f}]"
                             if values else "(not printed)")
            print(f"{phase:>20s}  {cells[0]:>30s}  {cells[1]:>24s}")

        ranks = list(bench.job.ranks)
        session.stop_job()
        session.restore_baseline()
        print(f"\nall-reduce busbw (GB/s, out of place) on {', '.join(ranks)}, "
              f"{args.min_bytes} B to {args.max_bytes} B", flush=True)
        table: dict[tuple[str, str], dict[int, float]] = {}
        walls = {}
        for library in ("gloo", "mpi", "ring"):
            for fabric in ("optical", "electrical"):
                started = time.monotonic()
                sweep = run_sweep(session, "all_reduce", ranks, fabric, (args.min_bytes, args.max_bytes), library)
                walls[(library, fabric)] = time.monotonic() - started
                table[(library, fabric)] = sweep.result.busbw_by_size()
        columns = list(table)
        print(f"{'size (B)':>10s}  " + "  ".join(f"{lib + ' ' + fab[:4]:>12s}" for lib, fab in columns))
        for size in sorted({s for by_size in table.values() for s in by_size}):
            print(f"{size:>10d}  " + "  ".join(f"{table[c].get(size, float('nan')):12.4f}" for c in columns))
        largest = max(table[columns[0]])
        print(f"{'opt/elec':>10s}  " + "  ".join(
            f"{table[(lib, 'optical')][largest] / table[(lib, 'electrical')][largest]:12.2f}" + " " * 14
            for lib in ("gloo", "mpi", "ring")))
        print(f"{'sweep (s)':>10s}  " + "  ".join(f"{walls[c]:12.1f}" for c in columns))


if __name__ == "__main__":
    main()
