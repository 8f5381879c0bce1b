"""Carrier change to the agent's link event, median and p99:
- on the namespaced bench (rack in a box): the world's light goes (or comes), the data plane sets
  the carrier of the NIC's veth, the kernel tells the agent through netlink (RTNLGRP_LINK), the
  agent stamps when netlink woke it and reads /sys/class/net; judged against the carrier
  change (the middle of the data plane's netlink request: sent, then acknowledged by the
  kernel), and beside it, how late the data plane made that change after the world's physics
  said so;
- on the emulated bench, in the same run: the world's link model, read by the agent through the
  world service (the path every other emulated bench takes), against the world's own instant.

Needs root and sshd (what the namespaced bench needs); run it as
``.venv/bin/python perf/netns_links.py``."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from lumion_hil.harness.config import load_bench
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.emulators.netns import NetnsBench, available
from lumion_hil.instruments.gpu_host.client import AgentClient

ROOT = Path(__file__).resolve().parent.parent
HOST, NIC = "host0", "p0"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def toggles(backend, agent: AgentClient, events: int, truth) -> tuple[list[float], list[float]]:
    """Cut and restore the light into HOST.NIC ``events`` times each way; for every change, the
    agent's stamp minus ``truth(world, up, after_ns)`` (ms), and the data plane's lag (ms)."""
    world = backend.world
    rx_port = next(n.rx_port for n in backend.bench.host(HOST).nics if n.name == NIC)
    latencies, lags = [], []
    for i in range(2 * events):
        up = i % 2 == 1  # first cut the light, then bring it back, and so on
        got: dict = {}
        waiter = threading.Thread(target=lambda: got.setdefault("s", agent.wait_link(NIC, up, 5.0)))
        waiter.start()
        time.sleep(0.01)  # let the wait reach the agent before the light changes
        changed_ns = world.now_ns()
        world.set_extra_loss(rx_port, 0.0 if up else float("inf"), changed_ns)
        waiter.join()
        state = got["s"]
        assert not state.timed_out, f"{HOST}.{NIC}: the agent never saw the link go {'up' if up else 'down'}"
        true_ns, lag_ns = truth(world, up, changed_ns)
        latencies.append((state.t_ns - true_ns) / 1e6)
        if lag_ns is not None:
            lags.append(lag_ns / 1e6)
    return latencies, lags


def netns_truth(world, up: bool, after_ns: int) -> tuple[int, int]:
    """The kernel's carrier change (recorded by the data plane), and how late it came after the
    world's physics: light gone at once, or lock and bring-up after light came back."""
    for _ in range(200):  # the data plane notes the change just after making it: the agent may be first
        found = [e for e in world.events_of("netns.carrier", f"{HOST}.{NIC}") if e.t_ns >= after_ns
                 and e.detail["up"] == up]
        if found:
            break
        time.sleep(0.005)
    event = found[0]
    change = (event.t_ns + event.detail["acked_ns"]) // 2  # changed between request and acknowledgement
    physics = world.link_state(HOST, NIC, event.t_ns)[1]
    return change, change - physics


def world_truth(world, up: bool, after_ns: int) -> tuple[int, None]:
    """The world's own instant of the link's change (the emulated agent reads the model)."""
    state, since = world.link_state(HOST, NIC)
    return since, None


def summary(name: str, values: list[float]) -> str:
    return (f"  {name:58s} median {statistics.median(values):7.3f} ms  p99 {percentile(values, 0.99):7.3f} ms  "
            f"max {max(values):7.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50, help="changes each way (down, up) per path")
    args = parser.parse_args()
    ok, why = available()
    if not ok:
        raise SystemExit(f"netns_links: the namespaced bench cannot be built here: {why}")
    results = {}
    for name, path, truth in (("netns", "netns.yaml", netns_truth), ("emulated", "emulated.yaml", world_truth)):
        bench = load_bench(ROOT / "benches" / path)
        backend = (NetnsBench if name == "netns" else EmulatedBench)(bench)
        with backend:
            backend.world.replace_all(bench.safety.baseline)
            agent = AgentClient(HOST, backend.agent_argv(HOST), timeout_s=10)
            try:
                agent.sync_clock(16)
                assert agent.wait_link(NIC, True, 5.0).timed_out is False, "the baseline link never came up"
                results[name] = toggles(backend, agent, args.events, truth)
            finally:
                agent.close()
    print(f"Carrier change to the agent's event ({args.events} changes each way, {HOST}.{NIC}; clock mapping "
          "uncertainty included in each):")
    print(summary("namespaced bench: kernel carrier change -> agent (netlink)", results["netns"][0]))
    print(summary("emulated bench: world's link change -> agent (world service)", results["emulated"][0]))
    print(summary("namespaced bench: world's physics -> kernel carrier change", results["netns"][1]))


if __name__ == "__main__":
    main()
