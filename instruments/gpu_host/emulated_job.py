"""One rank of the emulated training job: a real process the agent starts and follows like any
job. Each step costs compute plus a ring all-reduce of the gradients over the optical links the
world has up now; it prints one heartbeat line (JSON) per step. It dies like a CUDA process
when its GPU fails, and stalls (as NCCL would) while a peer is gone or a link is down."""

from __future__ import annotations

import argparse
import json
import sys
import time

from instruments.emulators.world_service import WorldClient


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
    parser.add_argument("--fixed-bandwidth-gbps", type=float, default=None,
                        help="run outside the optical fabric at this bus bandwidth (migration baseline)")
    args = parser.parse_args(argv)
    world = WorldClient(args.world)
    ranks = args.ranks.split(",")
    scale = world.call("time_scale")
    host = ranks[args.rank]
    time.sleep(args.startup_time_s * scale)  # emulated process launch and communicator set-up
    world.call("job_event", host=host, rank=args.rank, what="ready")
    print(json.dumps({"event": "ready", "rank": args.rank, "world_size": len(ranks)}), flush=True)
    step = 0
    while step < args.steps:
        cost = world.call("job_step", ranks=ranks, rank=args.rank, gradient_bytes=args.gradient_bytes,
                          compute_time_s=args.compute_time_s, fixed_bandwidth_gbps=args.fixed_bandwidth_gbps)
        if cost["failed"]:
            print(f"CUDA error: unspecified launch failure (GPU of {ranks[args.rank]} is lost, XID 79)", flush=True)
            return 1
        if cost["step_time_s"] is None:
            world.call("wait_change", timeout_s=1.0)  # a collective waiting on a missing peer or link
            continue
        time.sleep(cost["step_time_s"])  # the emulated step's compute and communication
        step += 1
        done_ns = time.monotonic_ns()  # the world's clock too (CLOCK_MONOTONIC)
        world.call("job_event", host=host, rank=args.rank, what="step", step=step, t_ns=done_ns)  # ground truth
        print(json.dumps({"step": step, "t_monotonic_ns": done_ns, "step_time_s": round(cost["step_time_s"], 6),
                          "samples_per_s": round(args.batch / cost["step_time_s"], 3),
                          "bus_bandwidth_gbps": cost["bandwidth_gbps"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
