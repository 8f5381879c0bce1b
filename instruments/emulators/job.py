"""One rank of the emulated training job: a real process the agent starts and follows like any
job. Like a PyTorch DDP job it sets up its NCCL communicator (the line NCCL prints with
NCCL_DEBUG=INFO: "... Init COMPLETE"), runs one small collective (a barrier), then steps: each
step costs compute plus an all-reduce of the gradients over the fabric NCCL_SOCKET_IFNAME picks
(the optical circuits lit now, or the electrical rack), with the world's cost model. It prints
one line per step; the harness times the steps by when the agent sees them, never by numbers
the job prints about itself. It dies like a CUDA process when its GPU fails, and stalls (as
NCCL would) while a link is down, until the NCCL timeout: then it fails with the watchdog's line,
as the namespaced bench's ring job does.

Its ranks need each other, as NCCL's do (instruments/emulators/communicator.py): init completes
only when every rank of the rank map has joined, and every collective (the barrier, each
step's all-reduce) only when every rank has entered it. A rank missing, dead or left over from
an earlier rank map stalls the others, which fail after the NCCL timeout with the message
PyTorch's watchdog prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lumion_hil.instruments.emulators.world_client import WorldClient


# Set by the emulated host's agent as it launches a rank: the instant (CLOCK_MONOTONIC, ns).
LAUNCHED_NS = "LUMION_HIL_LAUNCHED_NS"


def _launched_s_ago() -> float:
    """How long ago this process was launched: from the instant its agent launched it where the
    agent says (``LUMION_HIL_LAUNCHED_NS``), else from the process's own start (Linux:
    /proc/self/stat, to half a clock tick: 10 ms, a tenth of a start-up at time scale 0.2), 0
    where that cannot be read. The emulated start-up counts from there: the interpreter's own
    start (or the fork) is part of the launch the job emulates, not added to it (it is software
    that a busy machine slows by tenths of a second, which would drown the start-up the bench
    file sets)."""
    stamp = os.environ.get(LAUNCHED_NS, "")
    if stamp.isdigit():
        ago = (time.monotonic_ns() - int(stamp)) / 1e9
        if 0.0 <= ago < 60.0:
            return ago
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            after_name = fh.read().rsplit(")", 1)[1].split()  # from field 3 (state) on
        ticks = os.sysconf("SC_CLK_TCK")
        started_s = (int(after_name[19]) + 0.5) / ticks  # field 22: starttime, clock ticks since boot
        ago = time.clock_gettime(time.CLOCK_BOOTTIME) - started_s
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
    return ago if 0.0 <= ago < 60.0 else 0.0  # beyond: a clock that is not the kernel's boot clock (a namespace)


class _Peers:
    """This rank's side of the job's communicator, in the world service."""

    def __init__(self, world, key: str, ranks: list[str], rank: int, timeout_s: float, allowance_s: float = 0.0):
        self.world, self.key, self.ranks, self.rank, self.timeout_s = world, key, ranks, rank, timeout_s
        self.allowance_s = allowance_s  # real time a collective waits beyond the timeout for peers only late
        self.nranks = len(ranks)
        self.comm = None
        self.late: list[int] = []  # ranks whose own process start outlasted the emulated start-up

    def init(self, told: list[dict], late: bool = False) -> bool:
        """ncclCommInitRank: until every rank has joined, or the timeout. ``told``: what this rank
        says it has done as it first asks (its being ready); ``late``: its own process start
        outlasted the start-up it emulates."""
        until = time.monotonic() + self.timeout_s
        while True:
            left = until - time.monotonic()
            state = self.world.call("comm_join", key=self.key, nranks=self.nranks, rank=self.rank, pid=os.getpid(),
                                    wait_s=max(0.0, left), ranks=self.ranks, told=told, late=late)
            told = []
            if state["complete"]:
                self.comm = state["comm"]
                self.late = state.get("late") or []
                return True

            if time.monotonic() >= until:
                joined = self.nranks - len(state["missing"])
                print(f"torch.distributed.DistStoreError: Timed out after {self.timeout_s:.3g} seconds waiting for "
                      f"clients. {joined}/{self.nranks} clients joined. (missing ranks {state['missing']})", flush=True)
                return False

    def collective(self, seq: int, state: dict | None = None, started: float | None = None) -> bool:
        """A collective: until every rank has entered it, or the timeout (PyTorch's watchdog).
        ``state``: the answer of an entry already made at ``started`` (in the round trip that
        asked what the collective costs).

        Where the ranks still behind at the timeout are only late (alive, and nothing of the
        world holds them: communicator.py), the rank waits up to the allowance longer for them,
        and says so: at a scaled time a starved core makes a process later than NCCL's scaled
        timeout, which a real job's 30 s would never notice. A rank dead, or held by the world
        (a failed peer, a link down), fails it at the timeout as before."""
        started = time.monotonic() if started is None else started
        timeout = started + self.timeout_s
        until = timeout
        while True:
            if state is None:
                state = self.world.call("comm_enter", comm=self.comm, rank=self.rank, seq=seq,
                                        wait_s=max(0.0, until - time.monotonic()))
            if state["done"]:
                if until > timeout:
                    print(json.dumps({"event": "late_peers", "seq": seq, "rank": self.rank,
                                      "beyond_timeout_s": round(time.monotonic() - timeout, 4)}), flush=True)
                return True
            now = time.monotonic()
            if state.get("gone") or (now >= timeout and not state.get("late_only")) or now >= timeout + self.allowance_s:
                _watchdog(self.rank, seq, self.timeout_s, started, f"waiting for ranks {state['behind']}")
                return False
            if now >= timeout:
                until = timeout + self.allowance_s
            state = None


def _watchdog(rank: int, seq: int, timeout_s: float, started: float, why: str) -> None:
    """What PyTorch's NCCL watchdog prints as it takes the process down."""
    ran_ms = (time.monotonic() - started) * 1e3
    print(f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
          f"Timeout(ms)={timeout_s * 1e3:.0f}) ran for {ran_ms:.0f} milliseconds before timing out. ({why})",
          flush=True)


class _Stall:
    """A collective that cannot move (a link of its fabric down, a peer's GPU lost): NCCL stalls
    in it, and the watchdog fails the rank once it has waited the timeout."""

    since: float | None  # when the stall began (monotonic), None until then

    def __init__(self, rank: int, timeout_s: float):
        self.rank, self.timeout_s, self.since = rank, timeout_s, None

    def expired(self, seq: int, why: str | None) -> bool:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if now - self.since < self.timeout_s:
            return False
        _watchdog(self.rank, seq, self.timeout_s, self.since, f"stalled: {why or 'no path'}")
        return True


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
    parser.add_argument("--master-port", type=int, default=29500, help="the rendezvous: one communicator per job")
    parser.add_argument("--nccl-timeout-s", type=float, default=30.0,
                        help="how long a rank waits for its peers (at init and in a collective) before failing")
    parser.add_argument("--late-peer-allowance-s", type=float, default=0.0,
                        help="at a scaled time: real time a collective waits beyond the NCCL timeout for peers that "
                             "are only late (alive, and not held by the world); the bench's I/O allowance")
    parser.add_argument("--all-ranks-here", action="store_true",
                        help="this one process stands for every rank of the map (a rack with no agents of its own): "
                             "no peers to wait for")
    args = parser.parse_args(argv)
    world = WorldClient(args.world)
    ranks = args.ranks.split(",")
    ifname = os.environ.get("NCCL_SOCKET_IFNAME")
    scale = world.call("time_scale")
    host = ranks[args.rank]
    timeout_s = args.nccl_timeout_s * scale
    peers = None if args.all_ranks_here else _Peers(world, f"{args.master_port}/{args.ranks}", ranks, args.rank,
                                                    timeout_s, args.late_peer_allowance_s if scale != 1.0 else 0.0)
    # The emulated launch and communicator set-up take the bench's start-up in all, counted from
    # when this process was launched (the interpreter's own start, or the fork, is part of it).
    launched_s, startup_s = _launched_s_ago(), args.startup_time_s * scale
    late = launched_s > startup_s  # the machine made this process's own start longer than the one it emulates
    time.sleep(max(0.0, startup_s - launched_s))
    # What the rank has done, told to the world with its next question (ground truth: never a
    # round trip of its own, never before the job has printed it).
    told = [{"what": "ready", "t_ns": time.monotonic_ns()}]  # the world's clock too (CLOCK_MONOTONIC)
    if peers is not None:
        if not peers.init(told, late):
            return 1
        told = []
    if late or (peers is not None and peers.late):
        # said, so that a start-up measured from outside can be left out: the job's first
        # collective waited for the emulator's own process start, not for the bench file's start-up
        print(json.dumps({"event": "late_launch", "ranks": peers.late if peers is not None else [args.rank],
                          "startup_s": round(startup_s, 4)}), flush=True)
    print(f"{host}:{os.getpid()}:{os.getpid()} [0] NCCL INFO comm 0x{id(world):x} rank {args.rank} "
          f"nranks {len(ranks)} cudaDev 0 busId 17000 - Init COMPLETE", flush=True)
    stall = _Stall(args.rank, timeout_s)
    comm = peers.comm if peers is not None else None
    while True:  # a barrier: the first collective on the new communicator (entered as it is asked for)
        looked_ns = time.monotonic_ns()  # the world's clock: a change after this wakes the wait below
        entered = time.monotonic()
        barrier = world.call("collective", collective="all_reduce", ranks=ranks, size_bytes=4, socket_ifname=ifname,
                             told=told, rank=args.rank, comm=comm, seq=0, wait_s=timeout_s)
        told = []
        if barrier["time_s"] is not None:
            break
        if host in barrier.get("failed", []):  # its own GPU: CUDA fails at the first kernel
            print(f"CUDA error: unspecified launch failure (GPU of {host} is lost, XID 79)", flush=True)
            return 1
        if stall.expired(0, barrier.get("stalled")):
            return 1
        world.call("wait_change", timeout_s=min(1.0, timeout_s), since_ns=looked_ns)
    if peers is not None and not peers.collective(0, barrier["entered"], entered):
        return 1
    time.sleep(barrier["time_s"])
    told.append({"what": "collective", "t_ns": time.monotonic_ns()})
    print(json.dumps({"event": "collective", "op": "barrier", "rank": args.rank}), flush=True)
    step = 0
    while step < args.steps:
        # One round trip a step: what the rank did since it last asked (the last step's end),
        # this step's cost, and (where it can run) this rank in its all-reduce, as NCCL's ranks
        # enter it together.
        looked_ns = time.monotonic_ns()  # the world's clock: a change after this wakes the wait below
        entered = time.monotonic()
        cost = world.call("job_step", ranks=ranks, rank=args.rank, gradient_bytes=args.gradient_bytes,
                          compute_time_s=args.compute_time_s, socket_ifname=ifname, told=told, comm=comm,
                          seq=step + 1, wait_s=timeout_s)
        told = []
        if cost["failed"]:
            print(f"CUDA error: unspecified launch failure (GPU of {host} is lost, XID 79)", flush=True)
            return 1
        if cost["step_time_s"] is None:  # a collective waiting on a failed peer or a link
            if stall.expired(step + 1, cost.get("stalled")):
                return 1
            world.call("wait_change", timeout_s=min(1.0, timeout_s), since_ns=looked_ns)
            continue
        stall.since = None
        if peers is not None and not peers.collective(step + 1, cost["entered"], entered):  # every rank in it
            return 1
        time.sleep(cost["step_time_s"])  # the emulated step's compute and communication
        step += 1
        done_ns = time.monotonic_ns()  # the world's clock too (CLOCK_MONOTONIC)
        # What a training script logs about itself; the harness does not take its rate from here.
        print(json.dumps({"step": step, "step_time_s": round(cost["step_time_s"], 6),
                          "samples_per_s": round(args.batch / cost["step_time_s"], 3)}), flush=True)
        told.append({"what": "step", "step": step, "t_ns": done_ns})
    for event in told:  # the last step, told before the job ends
        world.call("job_event", host=host, rank=args.rank, what=event["what"], step=event.get("step"),
                   t_ns=event["t_ns"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
