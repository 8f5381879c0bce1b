"""One worker of the PyTorch training job of the rack in a box, started by torchrun on every host
of the rank map as a lab starts its own (``python -m torch.distributed.run --nnodes N
--node-rank R --master-addr ... -m lumion_hil.instruments.emulators.torch_job ...``): a small
model fine-tuned with DistributedDataParallel on the gloo backend, its gradients sized so that a
step's all-reduce moves ``--gradient-bytes`` (float32), over the interface GLOO_SOCKET_IFNAME
names. The GPU's compute is the one thing emulated: ``time.sleep(--compute-time-s)`` beside the
CPU's own forward and backward pass of the small model.

What it prints is the job interface every job on these benches follows (the agent reads it,
instruments/gpu_host/jobs.py; README "One job interface"), one JSON object a line:

- ``{"event": "process_started", "rank": R}`` first, before ``import torch`` (what the
  process costs to start is the import's);
- ``{"event": "communicator_ready", "rank": R, "backend": "gloo"}`` once init_process_group
  has returned and a barrier has crossed every rank (gloo's full mesh connected), then
  ``{"event": "collective", "op": "barrier"}`` as the other jobs print it;
- ``{"event": "checkpoint_loaded", "step": S, "path": P}``: the newest checkpoint in
  ``--checkpoint-dir`` (step 0 and path null when there is none);
- ``{"step": k, "global_step": S + k, "step_time_s": ..., "samples_per_s": ...}`` per step,
  ``k`` counting the steps of this process from 1;
- ``{"event": "checkpoint_saved", "step": S + k, "path": P}`` every ``--checkpoint-every``
  steps (rank 0 writes, to a temporary name then renamed: a reader never sees half a file).

torchrun's own lines (its rendezvous, its worker group's start and failure) come before and
after. Failures are the framework's: a peer lost ends the others in gloo (a closed or reset
connection at once, a silent link at ``--timeout-s``) and torchrun fails the worker group; a
rank whose peers never come waits in torchrun's rendezvous until its timeout. With ``--world``
it also checks its GPU in the emulated world before each step (CUDA's error line and exit 1,
as the other emulated jobs do) and tells the world of each step (ground truth).

The checkpoint folder stands for the lab's shared storage (an NFS mount every host sees): a
spare that takes a failed rank's place loads what rank 0 last wrote there.
"""

from __future__ import annotations

import json
import os
import sys
import time


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def die_with_the_launcher() -> None:
    """torchrun starts its workers in sessions of their own: a stop that ends torchrun's process
    group (the agent's) would leave them training. The kernel kills this worker when torchrun
    goes (PR_SET_PDEATHSIG), as a lab's wrapper does with a scheduler's kill."""
    import ctypes
    import signal

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the launcher went before the request: go too
        os._exit(1)


RANK = int(os.environ.get("RANK", "0"))
die_with_the_launcher()
say(event="process_started", rank=RANK, pid=os.getpid())

import argparse  # noqa: E402
import datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

CUDA_ERROR = "CUDA error: unspecified launch failure (GPU of {host} is lost, XID 79)"  # as the other jobs print it
INPUT = 64  # features of the small model's input


def width_for(gradient_bytes: float, layers: int = 3) -> int:
    """The hidden width of an MLP of ``layers`` square layers whose float32 gradients come to
    about ``gradient_bytes`` (an input layer of INPUT features, then the square ones)."""
    params = max(1.0, gradient_bytes / 4)
    # INPUT*w + w + layers*(w*w + w) = params
    a, b, c = layers, INPUT + 1 + layers, -params
    return max(1, int((-b + (b * b - 4 * a * c) ** 0.5) / (2 * a)))


def model_for(gradient_bytes: float) -> torch.nn.Module:
    width = width_for(gradient_bytes)
    torch.manual_seed(0)  # every rank starts from the same weights, as a fine-tuning job's checkpoint
    return torch.nn.Sequential(torch.nn.Linear(INPUT, width), torch.nn.ReLU(),
                               *[torch.nn.Linear(width, width) for _ in range(3)])


def newest_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", required=True, help="comma-separated host names, rank 0 first")
    parser.add_argument("--gradient-bytes", type=float, default=16e6, help="bytes all-reduced each step (float32)")
    parser.add_argument("--compute-time-s", type=float, default=0.3, help="the emulated GPU's compute per step")
    parser.add_argument("--batch", type=int, default=8, help="samples per step on this rank")
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--timeout-s", type=float, default=30.0, help="gloo's timeout (init and each collective)")
    parser.add_argument("--checkpoint-dir", required=True, help="shared storage for checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=2, help="steps between checkpoints (0: never)")
    parser.add_argument("--world", default=None, help="HOST:PORT of the emulated world's service, if any")
    args = parser.parse_args(argv)
    ranks = args.ranks.split(",")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != len(ranks) or not 0 <= RANK < len(ranks):
        parser.error(f"RANK={RANK} WORLD_SIZE={world_size} (from torchrun) do not fit --ranks ({len(ranks)} hosts)")
    host = ranks[RANK]
    world = None
    scale = 1.0
    if args.world:
        from lumion_hil.instruments.emulators.world_client import WorldClient

        world = WorldClient(args.world)
        scale = world.call("time_scale")
        world.call("job_event", host=host, rank=RANK, what="ready")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s * scale))
    try:
        return _train(args, world, host, scale)
    finally:
        dist.destroy_process_group()


def _gpu_lost(world, host: str) -> bool:
    if world is not None and any(gpu.get("failed") for gpu in world.call("gpus", host=host)):
        print(CUDA_ERROR.format(host=host), flush=True)
        return True
    return False


def _train(args, world, host: str, scale: float) -> int:
    if _gpu_lost(world, host):
        return 1
    model = DistributedDataParallel(model_for(args.gradient_bytes))  # broadcasts rank 0's weights
    dist.barrier()
    say(event="communicator_ready", rank=RANK, backend=dist.get_backend(), world_size=dist.get_world_size())
    if world is not None:
        world.call("job_event", host=host, rank=RANK, what="collective")
    say(event="collective", op="barrier", rank=RANK)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    folder = Path(args.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    newest = newest_checkpoint(folder)
    if newest is not None:
        state = torch.load(newest, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    say(event="checkpoint_loaded", rank=RANK, step=start, path=str(newest) if newest else None)
    generator = torch.Generator().manual_seed(RANK)
    step = 0
    while step < args.steps:
        started = time.monotonic()
        if _gpu_lost(world, host):
            return 1
        inputs = torch.randn(args.batch, INPUT, generator=generator)
        loss = model(inputs).pow(2).mean()
        time.sleep(args.compute_time_s * scale)  # the emulated GPU's forward and backward pass
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over gloo, bucket by bucket
        optimizer.step()
        step += 1
        done_ns = time.monotonic_ns()
        step_time_s = time.monotonic() - started
        say(step=step, global_step=start + step, loss=round(float(loss), 6), step_time_s=round(step_time_s, 6),
            samples_per_s=round(args.batch / step_time_s, 3))
        if world is not None:
            world.call("job_event", host=host, rank=RANK, what="step", step=step, t_ns=done_ns)
        if args.checkpoint_every and (start + step) % args.checkpoint_every == 0 and RANK == 0:
            path = folder / f"step-{start + step}.pt"
            partial = path.with_suffix(".partial")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": start + step}, partial)
            os.replace(partial, path)
            for old in sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))[:-2]:
                old.unlink(missing_ok=True)  # the two newest are kept
            say(event="checkpoint_saved", rank=RANK, step=start + step, path=str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
