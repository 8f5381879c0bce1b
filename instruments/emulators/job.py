"""One rank of the emulated training job: a real process the agent starts and follows like any
job. Like a PyTorch DDP job it sets up its NCCL communicator (the line NCCL prints with
NCCL_DEBUG=INFO: "... Init COMPLETE"), runs one small collective (a barrier), then steps: each
step costs compute plus an all-reduce of the gradients over the fabric NCCL_SOCKET_IFNAME picks
(the optical circuits lit now, or the electrical rack), with the world's cost model. It prints
one line per step; the harness times the steps by when the agent sees them, never by numbers
the job prints about itself. It dies like a CUDA process when its GPU fails, and stalls (as
NCCL would) while a peer is gone or a link is down."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lumion_hil.instruments.emulators.world_client import WorldClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", required=True)
    parser.add_argument("--ranks", required=True, help="comma-separated host names, rank 0 first")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--gradient-bytes", type=float, default=2.47e9)
    parser.add_argument("--compute-time-s", type=float, default=0.3)
    parser.add_argument("--startup-time-s", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10**9)
    args = parser.parse_args(argv)
    world = WorldClient(args.world)
    ranks = args.ranks.split(",")
    ifname = os.environ.get("NCCL_SOCKET_IFNAME")
    scale = world.call("time_scale")
    host = ranks[args.rank]
    time.sleep(args.startup_time_s * scale)  # emulated process launch and communicator set-up
    world.call("job_event", host=host, rank=args.rank, what="ready")
    print(f"{host}:{os.getpid()}:{os.getpid()} [0] NCCL INFO comm 0x{id(world):x} rank {args.rank} "
          f"nranks {len(ranks)} cudaDev 0 busId 17000 - Init COMPLETE", flush=True)
    while True:  # a barrier: the first collective on the new communicator
        barrier = world.call("collective", collective="all_reduce", ranks=ranks, size_bytes=4, socket_ifname=ifname)
        if barrier["time_s"] is not None:
            break
        if host in barrier.get("failed", []):  # its own GPU: CUDA fails at the first kernel
            print(f"CUDA error: unspecified launch failure (GPU of {host} is lost, XID 79)", flush=True)
            return 1
        world.call("wait_change", timeout_s=1.0)
    time.sleep(barrier["time_s"])
    world.call("job_event", host=host, rank=args.rank, what="collective")
    print(json.dumps({"event": "collective", "op": "barrier", "rank": args.rank}), flush=True)
    step = 0
    while step < args.steps:
        cost = world.call("job_step", ranks=ranks, rank=args.rank, gradient_bytes=args.gradient_bytes,
                          compute_time_s=args.compute_time_s, socket_ifname=ifname)
        if cost["failed"]:
            print(f"CUDA error: unspecified launch failure (GPU of {host} is lost, XID 79)", flush=True)
            return 1
        if cost["step_time_s"] is None:
            world.call("wait_change", timeout_s=1.0)  # a collective waiting on a missing peer or link
            continue
        time.sleep(cost["step_time_s"])  # the emulated step's compute and communication
        step += 1
        done_ns = time.monotonic_ns()  # the world's clock too (CLOCK_MONOTONIC)
        world.call("job_event", host=host, rank=args.rank, what="step", step=step, t_ns=done_ns)  # ground truth
        # What a training script logs about itself; the harness does not take its rate from here.
        print(json.dumps({"step": step, "step_time_s": round(cost["step_time_s"], 6),
                          "samples_per_s": round(args.batch / cost["step_time_s"], 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
