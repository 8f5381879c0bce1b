"""The bandwidth tests' programs on the namespaced bench: each nccl-tests program the run folder
holds (``<run>/nccl-tests/all_reduce_perf`` and the others, one folder per library) runs this
module, which starts the library's program on every rank's host: through ssh by launch.py
(lumion-hil's ring, gloo) or by mpirun (Open MPI), with the rank map from the rack's map
(``rack.json`` in the run folder) and ``LUMION_HIL_RANKS``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from lumion_hil.instruments.emulators.nccl_tests import PROGRAMS

# The folder of each library's programs (nccl-tests' names) in the run folder.
FOLDERS = {"ring": "nccl-tests", "gloo": "gloo-tests", "mpi": "mpi-tests"}


def _nccl_tests(args) -> int:
    """One nccl-tests program over the ranks LUMION_HIL_RANKS names (what ``mpirun -H`` would
    tell the real programs): started on every rank's host through ssh by the launcher."""
    rack_map = json.loads(Path(args.rack).read_text(encoding="utf-8"))
    ranks = [r for r in os.environ.get("LUMION_HIL_RANKS", "").split(",") if r]
    unknown = [r for r in ranks if r not in rack_map["hosts"]]
    if not ranks or unknown:
        print(f"{args.program}: LUMION_HIL_RANKS={os.environ.get('LUMION_HIL_RANKS', '')!r} names "
              f"{'no hosts' if not ranks else 'hosts not on this rack: ' + ', '.join(unknown)}", file=sys.stderr)
        return 2
    env = {"LUMION_HIL_RANKS": ",".join(ranks), "LUMION_HIL_MASTER": f"{rack_map['mgmt'][ranks[0]]}:{rack_map['port']}"}
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "LUMION_HIL_TIMEOUT_S"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    if args.library == "mpi":
        argv = _mpirun(rack_map, ranks, args)
    else:
        program = (["-m", "lumion_hil.instruments.emulators.library_perf", "--library", "gloo"]
                   if args.library == "gloo" else ["-m", "lumion_hil.instruments.emulators.ring_perf"])
        argv = [rack_map["python"], "-m", "lumion_hil.instruments.emulators.launch", "--ssh-config",
                rack_map["ssh_config"], "--hosts", ",".join(rack_map["hosts"][r] for r in ranks)]
        for key, value in env.items():
            argv += ["--env", f"{key}={value}"]
        argv += ["--", rack_map["python"], *program, "--program", args.program, *args.rest]
    os.execv(argv[0], argv)
    return 127  # not reached


def _mpirun(rack_map: dict, ranks: list[str], args) -> list[str]:
    """mpirun with a host file of the ranks' management addresses, one slot each, as Morphlux
    relaunches its job: Open MPI starts its daemons there through ssh (the rack's keys), its
    out-of-band channel on the management network, the ranks' bytes over the TCP transport on
    the interface OMPI_MCA_btl_tcp_if_include names (the caller's environment)."""
    hostfile = Path(rack_map["run_dir"]) / f"mpi-hosts-{'-'.join(ranks)}.txt"  # removed with the run's folder
    hostfile.write_text("".join(f"{rack_map['mgmt'][r]} slots=1\n" for r in ranks), encoding="utf-8")
    return [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "-np", str(len(ranks)), "--hostfile", str(hostfile),
            "--mca", "plm_rsh_agent", f"ssh -F {rack_map['ssh_config']}", "--mca", "oob_tcp_if_include", "mgmt0",
            "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
            # ranks that wait yield the core (Open MPI polls for progress: three ranks spinning on
            # a 2-core machine starve the kernel's own work on the shaped links)
            "--mca", "mpi_yield_when_idle", "1",
            # the tuned component's ring all-reduce: its default for three ranks here carried a third
            # of a link (0.0037 GB/s, 50 s a sweep); the ring carries a link's rate (0.0119, 18 s)
            "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4",
            "-x", f"LUMION_HIL_RANKS={','.join(ranks)}", "-x", "OMPI_MCA_btl_tcp_if_include", "-x", "OMP_NUM_THREADS=1",
            rack_map["python"], "-m", "lumion_hil.instruments.emulators.library_perf", "--library", "mpi",
            "--program", args.program, *args.rest]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lumion_hil.instruments.emulators.netns_perf",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tests = sub.add_parser("nccl-tests", help="run a nccl-tests program over the rack's hosts (the hosts' build/ "
                           "folder); every other argument is the program's own")
    tests.add_argument("--rack", required=True, help="the rack's map (rack.json in the run folder)")
    tests.add_argument("--program", required=True, choices=sorted(PROGRAMS))
    tests.add_argument("--library", choices=sorted(FOLDERS), default="ring",
                       help="ring: lumion-hil's ring over ssh; gloo: torch.distributed over ssh; mpi: mpi4py "
                       "on Open MPI under mpirun")
    args, rest = parser.parse_known_args(argv)
    args.rest = rest
    return _nccl_tests(args)


if __name__ == "__main__":
    sys.exit(main())
