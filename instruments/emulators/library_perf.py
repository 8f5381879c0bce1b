"""nccl-tests' ``all_reduce_perf`` run with a real collective library, for the rack in a box:
the sweep, timing, checking and output of ring_perf.py (nccl-tests 2.17's text and ``-J``'s
JSON, for the same parser), each all-reduce made by

- ``--library gloo``: ``torch.distributed.all_reduce`` on the gloo backend, one process per
  host started by the rack's ssh launcher (launch.py, as ``mpirun -H`` would), its rendezvous
  a TCPStore at rank 0's host on the management network (``LUMION_HIL_MASTER``), its data over
  the interface GLOO_SOCKET_IFNAME names (torchrun is the PyTorch job's launcher, torch_job.py:
  here it would only add a second ``import torch`` on every host);
- ``--library mpi``: mpi4py's ``Allreduce`` on Open MPI, every rank started by ``mpirun`` with
  a host file (as Morphlux relaunches its job), its data over the interfaces
  OMPI_MCA_btl_tcp_if_include names.

Environment, as for ring_perf.py: ``LUMION_HIL_RANKS`` (the hosts, rank 0 first); for gloo,
``LUMION_HIL_RANK`` and ``LUMION_HIL_MASTER`` (ADDR:PORT of the rendezvous), as the launcher
sets them; ``LUMION_HIL_TIMEOUT_S`` (the library's timeout, default 300). Out of place is a copy into the
output buffer and the library's in-place all-reduce for gloo (torch.distributed has no
out-of-place all-reduce), MPI's own out-of-place Allreduce for mpi. Only ``all_reduce_perf``:
the other programs are refused.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from lumion_hil.instruments.emulators import ring_perf  # noqa: E402
from lumion_hil.instruments.emulators.nccl_tests import PROGRAMS, parser_for, program_name  # noqa: E402

LIBRARIES = ("gloo", "mpi")


class TorchComm:
    """torch.distributed (gloo) with the calls ring_perf's sweep makes."""

    def __init__(self, hosts: list[str], timeout_s: float):
        rank = os.environ.get("LUMION_HIL_RANK", "")
        address, _, port = os.environ.get("LUMION_HIL_MASTER", "").rpartition(":")
        if not rank.isdigit() or int(rank) >= len(hosts) or not address or not port.isdigit():
            raise ValueError("LUMION_HIL_RANK (a rank of LUMION_HIL_RANKS) and LUMION_HIL_MASTER (ADDR:PORT) are set "
                             "by the launcher")
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=int(rank), world_size=len(hosts),
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.rank, self.nranks = dist.get_rank(), dist.get_world_size()
        gathered: list = [None] * self.nranks
        dist.all_gather_object(gathered, os.getpid())
        ifname = os.environ.get("GLOO_SOCKET_IFNAME", "(gloo's choice)")
        self.peers = [{"host": hosts[r], "pid": pid, "device_info": f"gloo via {ifname}"}
                      for r, pid in enumerate(gathered)]
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
                    "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.SUM}

    def all_reduce(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        out = send if recv is None else recv
        if out is not send:
            out[...] = send
        self.dist.all_reduce(self.torch.from_numpy(out), op=self.ops[op])
        return _average(out, op, self.nranks)

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


class MpiComm:
    """mpi4py's COMM_WORLD with the calls ring_perf's sweep makes."""

    def __init__(self, hosts: list[str]):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.nranks = self.comm.Get_rank(), self.comm.Get_size()
        if self.nranks != len(hosts):
            raise RuntimeError(f"mpirun started {self.nranks} ranks; LUMION_HIL_RANKS names {len(hosts)} hosts")
        pids = self.comm.allgather(os.getpid())
        ifname = os.environ.get("OMPI_MCA_btl_tcp_if_include", "(Open MPI's choice)")
        version = MPI.Get_library_version().split(",")[0].strip()
        self.peers = [{"host": hosts[r], "pid": pid, "device_info": f"{version} tcp via {ifname}"}
                      for r, pid in enumerate(pids)]
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "avg": MPI.SUM}

    def all_reduce(self, send: np.ndarray, recv: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
        if recv is None or recv is send:
            self.comm.Allreduce(self.MPI.IN_PLACE, send, op=self.ops[op])
            return _average(send, op, self.nranks)
        self.comm.Allreduce(send, recv, op=self.ops[op])
        return _average(recv, op, self.nranks)

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        pass


def _average(out: np.ndarray, op: str, n: int) -> np.ndarray:
    if op == "avg":
        if np.issubdtype(out.dtype, np.integer):
            np.floor_divide(out, n, out=out)
        else:
            np.divide(out, n, out=out)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    front = argparse.ArgumentParser(add_help=False)
    front.add_argument("--library", choices=LIBRARIES, required=True)
    known, rest = front.parse_known_args(argv)
    program = program_name(rest)
    if PROGRAMS.get(program) != "all_reduce":
        print(f"{program}: only all_reduce_perf is run with {known.library}", file=sys.stderr)
        return 2
    args = parser_for(program, emulated=False).parse_args(rest)
    if args.datatype not in ring_perf.DTYPES or args.op not in ring_perf.OPS:
        print(f"Invalid datatype '{args.datatype}' or reduction op '{args.op}'", file=sys.stderr)
        return 1
    hosts = [h for h in os.environ.get("LUMION_HIL_RANKS", "").split(",") if h]
    if not hosts:
        print(f"{program}: LUMION_HIL_RANKS names no hosts (the launcher sets it)", file=sys.stderr)
        return 2
    timeout_s = float(os.environ.get("LUMION_HIL_TIMEOUT_S", "300"))
    try:
        comm = TorchComm(hosts, timeout_s) if known.library == "gloo" else MpiComm(hosts)
    except Exception as exc:  # the library's own error, as it words it
        print(f"{program}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    build = ("torch.distributed gloo, launched over ssh: real bytes, no GPU" if known.library == "gloo" else
             "mpi4py Allreduce on Open MPI, launched by mpirun: real bytes, no GPU")
    try:
        return ring_perf._sweep(comm, program, args, rest, build)
    except Exception as exc:
        print(f"{program}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        comm.close()


if __name__ == "__main__":
    sys.exit(main())
