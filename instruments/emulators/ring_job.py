"""One rank of the real training job of the rack in a box: a process that, like a PyTorch DDP
job, sets up its communicator (instruments/emulators/ring.py, printing NCCL's "... Init
COMPLETE" line), runs a barrier, then steps. A step is compute, then a real ring all-reduce of
``--gradient-bytes`` of float32 gradients over the interfaces NCCL_SOCKET_IFNAME names (the
optical circuits lit now, or the electrical rack): real bytes through real sockets, its sums
checked. The GPU's compute is the one thing emulated: ``time.sleep(--compute-time-s)``.

It prints what job.py prints, line for line, so the agent follows both alike: NCCL's INFO
lines, ``{"event": "collective", "op": "barrier", "rank": R}``, then one JSON line per step
(``step``, ``step_time_s``, ``samples_per_s``); the harness times the steps by when the agent
sees them. It fails as a PyTorch job does: init that not every rank joins ends with
``torch.distributed.DistStoreError: Timed out after ...``; a collective that stalls (a link
down) with the watchdog's line after the NCCL timeout; a peer that died with NCCL's
``NET/Socket : peer ... closed connection`` at once; each with exit status 1.

With ``--world`` it also tells the world's service what it does (``job_event`` ready, collective,
and each step with its CLOCK_MONOTONIC instant, as job.py does), checks its GPU there before the
barrier and each step (a failed GPU: CUDA's error line and exit 1, as job.py), and takes the
world's time scale for its compute time and its timeout. Without it, it runs on its own.

``LUMION_HIL_RINGS`` (1 or 2, default 2) sets the rings, one each way round when two;
``LUMION_HIL_TCP_CONGESTION`` the data connections' TCP congestion control (default cubic,
empty for the system's)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# One thread for numpy's BLAS in each rank, as torchrun sets OMP_NUM_THREADS=1 for every process it
# starts unless told otherwise: without it OpenBLAS starts a thread a core at import, which
# nearly doubled the CPU time of each rank's start (0.14 s against 0.08 s here).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402 (after OMP_NUM_THREADS)

from lumion_hil.instruments.emulators.ring import CONGESTION_CONTROL, Communicator
from lumion_hil.instruments.emulators.ring_errors import CommError
from lumion_hil.instruments.emulators.world_client import WorldClient

CUDA_ERROR = "CUDA error: unspecified launch failure (GPU of {host} is lost, XID 79)"  # as job.py prints it


def _gpu_lost(world: WorldClient | None, host: str) -> bool:
    """Whether the world says a GPU of ``host`` has failed (the next kernel would fail)."""
    if world is None:
        return False
    if any(gpu.get("failed") for gpu in world.call("gpus", host=host)):
        print(CUDA_ERROR.format(host=host), flush=True)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", required=True, help="comma-separated host names, rank 0 first (ring order)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master-addr", default="127.0.0.1",
                        help="rank 0's address on the management network: the rendezvous (as NCCL's bootstrap)")
    parser.add_argument("--master-port", type=int, default=29500, help="the rendezvous: one communicator per job")
    parser.add_argument("--gradient-bytes", type=float, default=64e6, help="bytes all-reduced each step (float32)")
    parser.add_argument("--compute-time-s", type=float, default=0.3, help="the emulated GPU's compute per step")
    parser.add_argument("--batch", type=int, default=8, help="samples per step on this rank (for samples_per_s)")
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--nccl-timeout-s", type=float, default=30.0,
                        help="how long a rank waits for its peers (at init and in a collective) before failing")
    parser.add_argument("--world", default=None, help="HOST:PORT of the emulated world's service, if any")
    args = parser.parse_args(argv)
    ranks = args.ranks.split(",")
    if not 0 <= args.rank < len(ranks):
        parser.error(f"--rank {args.rank} is not in --ranks ({len(ranks)} hosts)")
    host = ranks[args.rank]
    world = WorldClient(args.world) if args.world else None
    scale = world.call("time_scale") if world is not None else 1.0
    rings = int(os.environ.get("LUMION_HIL_RINGS", "2"))
    if world is not None:
        world.call("job_event", host=host, rank=args.rank, what="ready")
    try:
        comm = Communicator(ranks, args.rank, args.master_addr, args.master_port,
                            socket_ifname=os.environ.get("NCCL_SOCKET_IFNAME"), timeout_s=args.nccl_timeout_s * scale,
                            rings=rings, log=sys.stdout,
                            congestion_control=os.environ.get("LUMION_HIL_TCP_CONGESTION", CONGESTION_CONTROL) or None)
    except CommError as exc:
        print(exc, flush=True)
        return 1
    with comm:
        return _train(comm, args, world, host, scale)


def _train(comm: Communicator, args, world: WorldClient | None, host: str, scale: float) -> int:
    if _gpu_lost(world, host):  # CUDA fails at the first kernel
        return 1
    try:
        comm.barrier()
    except CommError as exc:
        print(exc, flush=True)
        return 1
    if world is not None:
        world.call("job_event", host=host, rank=args.rank, what="collective")
    print(json.dumps({"event": "collective", "op": "barrier", "rank": args.rank}), flush=True)
    gradients = np.empty(max(1, int(args.gradient_bytes) // 4), np.float32)
    expected = comm.nranks * (comm.nranks + 1) / 2  # every rank's gradients are its rank + 1
    step = 0
    while step < args.steps:
        started = time.monotonic()
        if _gpu_lost(world, host):
            return 1
        time.sleep(args.compute_time_s * scale)  # the emulated GPU's forward and backward pass
        gradients.fill(args.rank + 1)
        try:
            comm.all_reduce(gradients)
        except CommError as exc:
            print(exc, flush=True)
            return 1
        wrong = int(np.count_nonzero(gradients != expected))
        if wrong:
            print(f"[Rank {args.rank}] all-reduce of step {step + 1} is wrong in {wrong} of {gradients.size} "
                  f"elements", flush=True)
            return 1
        step += 1
        done_ns = time.monotonic_ns()  # the world's clock too (CLOCK_MONOTONIC)
        step_time_s = time.monotonic() - started
        # What a training script logs about itself; the harness does not take its rate from here.
        print(json.dumps({"step": step, "step_time_s": round(step_time_s, 6),
                          "samples_per_s": round(args.batch / step_time_s, 3)}), flush=True)
        if world is not None:
            world.call("job_event", host=host, rank=args.rank, what="step", step=step, t_ns=done_ns)  # ground truth
    return 0


if __name__ == "__main__":
    sys.exit(main())
