"""nccl-tests for real over lumion-hil's ring (instruments/emulators/ring.py): ``all_reduce_perf``
and its siblings with nccl-tests' flags and output (shared with the emulated programs,
nccl_tests.py), each size really run between real processes over real sockets. One process per
rank, as ``mpirun`` starts them:

- ``LUMION_HIL_RANKS``: the ranks' hosts, comma-separated, rank 0 first (ring order);
- ``LUMION_HIL_RANK``: this process's rank (else ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK`` or
  ``SLURM_PROCID``, as a launcher sets them); ``LUMION_HIL_WORLD_SIZE``, when set, must agree;
- ``LUMION_HIL_MASTER``: ``ADDR:PORT`` of the rendezvous rank 0 serves (management network);
- ``NCCL_SOCKET_IFNAME``: the data interfaces, as for NCCL;
- ``LUMION_HIL_RINGS``: 1 or 2 (default 2, one each way round);
- ``LUMION_HIL_TIMEOUT_S``: how long init and each socket operation may wait (default 300);
- ``LUMION_HIL_TCP_CONGESTION``: the data connections' TCP congestion control (default cubic,
  empty for the system's).

Each size runs out of place, then in place: warm-up iterations, a barrier, the timed
iterations, each rank timing its own loop from the barrier, and their times combined as ``-a``
says (by default their average, as nccl-tests does). busbw = algbw x
:func:`~lumion_hil.instruments.collectives.bus_factor`. With ``-c 1`` every rank fills its
input with a known pattern, runs once more and counts the elements that differ from the exact
result; ``#wrong`` is the sum over the ranks. Rank 0 prints the nccl-tests 2.17 text (and writes
``-J``'s JSON); the other ranks print nothing on stdout. NCCL's INFO lines, and any failure, go
to stderr; a failure exits 1. all-to-all is refused: on optical circuits a rank reaches only
its two ring neighbours.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# One thread for numpy's BLAS in each rank, as torchrun sets OMP_NUM_THREADS=1 for every process it
# starts unless told otherwise: without it OpenBLAS starts a thread a core at import, which
# nearly doubled the CPU time of each rank's start (0.14 s against 0.08 s here).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402 (after OMP_NUM_THREADS)

from lumion_hil.instruments.emulators.nccl_tests import (PROGRAMS, Report, device_line, parser_for, program_name,
                                                          sizes)
from lumion_hil.instruments.emulators.ring import CONGESTION_CONTROL, OPS, Communicator
from lumion_hil.instruments.emulators.ring_errors import CommError

DTYPES = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
          "uint64": np.uint64, "half": np.float16, "float16": np.float16, "float": np.float32, "float32": np.float32,
          "double": np.float64, "float64": np.float64}  # numpy has no bfloat16
AVERAGE = {1: "avg", 2: "min", 3: "max"}  # -a: how the ranks' times are combined (0: rank 0's own)
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
BUILD = "lumion-hil ring over TCP sockets: real bytes, no GPU, not NCCL"


PERIOD = {"prod": 2}  # the input pattern repeats with this period (13 for the other reductions)


def _period(rank: int, op: str) -> np.ndarray:
    """One period of what ``rank`` puts in its input: small integers, so every reduction is
    exact in every type (products of 1s and 2s)."""
    i = np.arange(PERIOD.get(op, 13))
    return 1 + (i + rank) % 2 if op == "prod" else 1 + (i * 3 + rank * 7) % 13


def _tiled(period: np.ndarray, length: int, dtype) -> np.ndarray:
    return np.resize(period.astype(dtype), length)


class _Case:
    """One collective at one size, out of place or in place: its buffers, its call, its check."""

    def __init__(self, comm: Communicator, collective: str, count: int, dtype, op: str, root: int, in_place: bool):
        self.comm, self.collective, self.count = comm, collective, count
        self.dtype, self.op, self.root = dtype, op, root
        n, r = comm.nranks, comm.rank
        sizes_in = {"all_gather": count, "reduce_scatter": n * count}
        sizes_out = {"all_gather": n * count, "reduce_scatter": count}
        if not in_place:
            self.send = np.zeros(sizes_in.get(collective, count), dtype)
            self.recv = np.zeros(sizes_out.get(collective, count), dtype)
        elif collective == "all_gather":
            self.recv = np.zeros(n * count, dtype)
            self.send = self.recv[r * count:(r + 1) * count]
        elif collective == "reduce_scatter":
            self.send = np.zeros(n * count, dtype)
            self.recv = self.send[r * count:(r + 1) * count]
        else:
            self.send = self.recv = np.zeros(count, dtype)

    def run(self) -> None:
        comm, op = self.comm, self.op
        if self.collective == "all_reduce":
            comm.all_reduce(self.send, self.recv, op)
        elif self.collective == "all_gather":
            comm.all_gather(self.send, self.recv)
        elif self.collective == "reduce_scatter":
            comm.reduce_scatter(self.send, self.recv, op)
        elif self.collective == "broadcast":
            comm.broadcast(self.send, self.recv, self.root)
        else:
            comm.reduce(self.send, self.recv, self.root, op)

    def wrong(self) -> int:
        """Fill the inputs, run once, and count this rank's elements that are not the exact
        result (worked out on one period of the pattern: quick, so the links barely idle)."""
        n, r, count, op = self.comm.nranks, self.comm.rank, self.count, self.op
        self.recv[...] = 0
        self.send[...] = _tiled(_period(r, op), len(self.send), self.dtype)
        self.run()
        if self.collective == "all_gather":
            expected = np.concatenate([_tiled(_period(q, op), count, self.dtype) for q in range(n)])
        elif self.collective == "broadcast":
            expected = _tiled(_period(self.root, op), count, self.dtype)
        elif self.collective == "reduce" and r != self.root:
            return 0  # only the root's output is defined
        else:
            period = _period(0, op).astype(self.dtype)
            for q in range(1, n):
                OPS[op](period, _period(q, op).astype(self.dtype), out=period)
            if op == "avg":
                period = period // n if np.issubdtype(self.dtype, np.integer) else period / n
            if self.collective == "reduce_scatter":  # this rank's slot of the reduced input
                expected = _tiled(period, n * count, self.dtype)[r * count:(r + 1) * count]
            else:
                expected = _tiled(period, count, self.dtype)
        return int(np.count_nonzero(self.recv != expected))


def _measure(comm: Communicator, case: _Case, args) -> tuple[float, int | None]:
    """(seconds per operation, wrong elements over every rank or None), as nccl-tests measures:
    a barrier, then each rank times its own loop, and the ranks' times are combined as ``-a``
    says (0: rank 0's, 1: their average, 2: the least, 3: the most)."""
    ops = args.agg_iters
    with np.errstate(all="ignore"):  # repeated in-place sums may overflow; only the timing counts here
        for _ in range(args.warmup_iters * ops):
            case.run()
        comm.barrier()
        started = time.perf_counter()
        for _ in range(args.iters * ops):
            case.run()
        seconds = (time.perf_counter() - started) / max(1, args.iters * ops)
    if args.average in AVERAGE:
        seconds = float(comm.all_reduce(np.array([seconds]), op=AVERAGE[args.average])[0])
    if not args.check:
        return seconds, None
    wrong = comm.all_reduce(np.array([case.wrong()], np.int64))  # summed over the ranks, as nccl-tests does
    return seconds, int(wrong[0])


def _environment() -> tuple[list[str], int, tuple[str, int]]:
    ranks = [r for r in os.environ.get("LUMION_HIL_RANKS", "").split(",") if r]
    if not ranks:
        raise ValueError("LUMION_HIL_RANKS names no hosts (the launcher sets it)")
    rank_text = next((os.environ[k] for k in ("LUMION_HIL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
                      if os.environ.get(k)), None)
    if rank_text is None or not rank_text.isdigit() or int(rank_text) >= len(ranks):
        raise ValueError(f"LUMION_HIL_RANK={rank_text!r} is not a rank of LUMION_HIL_RANKS ({len(ranks)} hosts)")
    size = os.environ.get("LUMION_HIL_WORLD_SIZE")
    if size and int(size) != len(ranks):
        raise ValueError(f"LUMION_HIL_WORLD_SIZE={size} but LUMION_HIL_RANKS names {len(ranks)} hosts")
    master = os.environ.get("LUMION_HIL_MASTER", "")
    address, _, port = master.rpartition(":")
    if not address or not port.isdigit():
        raise ValueError(f"LUMION_HIL_MASTER={master!r} is not ADDR:PORT (rank 0's rendezvous)")
    return ranks, int(rank_text), (address, int(port))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    invoked = os.path.basename(sys.argv[0])
    program = program_name(argv, invoked if invoked in PROGRAMS else "all_reduce_perf")
    if program not in PROGRAMS or PROGRAMS[program] not in RING_COLLECTIVES:
        print(f"{program}: not a program of lumion-hil's ring; known: "
              f"{', '.join(p for p, c in PROGRAMS.items() if c in RING_COLLECTIVES)}", file=sys.stderr)
        return 2
    args = parser_for(program, emulated=False).parse_args(argv)
    if args.datatype not in DTYPES:
        print(f"Invalid datatype '{args.datatype}'" + (" (numpy, and so this ring, has no bfloat16)"
                                                       if args.datatype == "bfloat16" else ""), file=sys.stderr)
        return 1
    if args.op not in OPS:
        print(f"Invalid reduction op '{args.op}'", file=sys.stderr)
        return 1
    if args.nthreads != 1 or args.ngpus != 1:
        print(f"{program}: lumion-hil's ring runs one rank per process: -t and -g are 1", file=sys.stderr)
        return 2
    try:
        ranks, rank, master = _environment()
    except ValueError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return 2
    collective = PROGRAMS[program]
    if collective in ("broadcast", "reduce") and not 0 <= args.root < len(ranks):
        print(f"{program}: root {args.root} is not a rank (0 to {len(ranks) - 1})", file=sys.stderr)
        return 2
    try:
        comm = Communicator(ranks, rank, *master, socket_ifname=os.environ.get("NCCL_SOCKET_IFNAME"),
                            timeout_s=float(os.environ.get("LUMION_HIL_TIMEOUT_S", "300")),
                            rings=int(os.environ.get("LUMION_HIL_RINGS", "2")), log=sys.stderr,
                            congestion_control=os.environ.get("LUMION_HIL_TCP_CONGESTION", CONGESTION_CONTROL) or None)
    except CommError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 1
    with comm:
        try:
            return _sweep(comm, program, args, argv)
        except CommError as exc:
            print(exc, file=sys.stderr, flush=True)
            return 1


def _sweep(comm, program: str, args, argv: list[str], build: str = BUILD) -> int:
    """Every size of the sweep over ``comm`` (this ring's Communicator, or another library's
    with the same calls: library_perf.py), printed by rank 0."""
    lead = comm.rank == 0
    report = Report(program, args, comm.nranks, build, nccl_version=0)
    devices = [{"rank": r, "group": 0, "pid": peer["pid"], "hostname": peer["host"], "device": 0, "device_hex": "0x00",
                "device_info": peer.get("device_info") or "socket ring via " + ",".join(a[0] for a in peer["addresses"])}
               for r, peer in enumerate(comm.peers)]
    if lead:
        print(report.header([device_line(d["rank"], d["pid"], d["hostname"], d["device"], d["device_info"],
                                         d["device_hex"]) for d in devices]), flush=True)
    dtype = DTYPES[args.datatype]
    for size in sizes(args):
        count, nbytes = report.shape(size)
        places = [_measure(comm, _Case(comm, report.collective, count, dtype, args.op, args.root, in_place), args)
                  for in_place in (False, True)]
        line = report.row(nbytes, count, places)
        if lead:
            print(line, flush=True)
    if lead:
        print(report.footer(), flush=True)
        if args.output_file:
            Path(args.output_file).write_text(json.dumps(report.document(argv, devices)), encoding="utf-8")
    if report.wrong_total:
        print(f"{program}: rank {comm.rank}: {report.wrong_total} wrong elements over the sweep", file=sys.stderr)
    return 1 if report.wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())
