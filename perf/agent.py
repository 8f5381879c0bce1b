"""GPU host agent:
- round trips per second over a local subprocess (JSON lines on stdin/stdout), beside the same
  number of calls to the world service over loopback TCP, in one run;
- XID detection latency: the world fails a GPU, the harness receives the event from the agent
  (world event -> world service -> agent's NVML event wait -> harness), median and 99th
  percentile over many events."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.emulators.world_client import WorldClient
from lumion_hil.instruments.gpu_host.client import AgentClient, local_agent_argv

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--events", type=int, default=200)
    args = parser.parse_args()

    agent = AgentClient("local", local_agent_argv())
    bench = load_bench(ROOT / "benches" / "emulated.yaml")
    with EmulatedBench(bench) as emulated:
        world = WorldClient(emulated.world_service.address)
        for _ in range(100):
            agent.call("clock"), world.call("now")
        start = time.perf_counter()
        for _ in range(args.calls):
            agent.call("clock")
        agent_rate = args.calls / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(args.calls):
            world.call("now")
        world_rate = args.calls / (time.perf_counter() - start)
        agent.close()
        print(f"Round trips ({args.calls} calls each, same run):")
        print(f"  agent over a local subprocess (stdin/stdout):  {agent_rate:8.0f} /s")
        print(f"  world service over loopback TCP:               {world_rate:8.0f} /s")

        host = AgentClient("host1", emulated.agent_argv("host1"))
        latencies = []
        for i in range(args.events):
            got = {}
            waiter = threading.Thread(target=lambda: got.setdefault("e", host.wait_xid(5)))
            waiter.start()
            time.sleep(0.01)  # let the wait reach the agent before the failure happens
            truth = emulated.world.fail_gpu("host1", 0, xid=13)  # an application XID: the GPU stays usable
            waiter.join()
            latencies.append((got["e"].t_ns - truth.t_ns) / 1e6)
        host.close()
    print(f"XID detection latency, world event to harness ({args.events} events):")
    print(f"  median {statistics.median(latencies):.3f} ms, p99 {percentile(latencies, 0.99):.3f} ms, "
          f"max {max(latencies):.3f} ms (clock mapping uncertainty included in each)")


if __name__ == "__main__":
    main()
