"""What a collective costs on a set of links: an alpha-beta model with message size in it.

Shared by the emulated world (whose emulated nccl-tests and training job take their figures from
it, over the circuits that are lit now) and the harness (which plans spares at rack and pod
scale with it). Pure functions, no I/O.

- A fabric is a set of directed links (capacity in Gb/s, latency in us) and a route between
  any two hosts (a list of link ids). Flows that share a link divide it: max-min fair share,
  by progressive filling.
- Ring collectives (NCCL's default over sockets) run on ``rings`` rings: one each way round
  when there are two (NCCL builds rings over both directions of bidirectional links:
  assumption). Each ring carries an equal share of the data; a ring is as fast as its
  slowest hop, and the collective as its slowest ring.
- All-reduce: 2(n-1) steps of S/(n r) bytes per ring; all-gather and reduce-scatter: n-1
  steps; broadcast and reduce: a pipelined chain from the root, (n-1) step latencies plus S/r
  over the slowest hop; all-to-all: every rank sends S/n to every other at once. Tree
  all-reduce (NCCL's double binary tree): 2 ceil(log2 n) step latencies and the same bandwidth
  term as the ring; the faster of the two is used, as NCCL's tuner does.
- nccl-tests' busbw = algbw x :func:`bus_factor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
COLLECTIVES = tuple(BUS_FACTORS)


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw, as nccl-tests computes it (its doc/PERFORMANCE.md)."""
    if collective not in BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    return BUS_FACTORS[collective](ranks) if ranks > 0 else 0.0


@dataclass(frozen=True)
class Link:
    capacity_gbps: float
    latency_us: float = 0.0


Route = tuple[Hashable, ...]


@dataclass
class Fabric:
    """Directed links, and how a flow from one host to another is routed (None: no path)."""

    links: dict[Hashable, Link]
    route: Callable[[Any, Any], Route | None]  # two ranks (host names; a pod's (rack, slot)) -> their route


@dataclass(frozen=True)
class Cost:
    collective: str
    ranks: int
    size_bytes: int
    time_s: float
    algorithm: str  # "ring", "tree", "chain", "pairwise" or "local"

    @property
    def algbw_gbps(self) -> float:
        """GB/s (10^9 bytes/s), as nccl-tests prints it."""
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * bus_factor(self.collective, self.ranks)


class NoPath(Exception):
    """Two ranks have no route between them: the collective would hang."""


def max_min_share(flows: list[Route], links: dict[Hashable, Link]) -> list[float]:
    """Each flow's rate in Gb/s when flows sharing a link divide it fairly (progressive filling:
    raise every unfrozen flow's rate together until a link fills; freeze its flows; repeat)."""
    rates = [0.0] * len(flows)
    active = {i for i, route in enumerate(flows) if route}
    left = {lid: links[lid].capacity_gbps for route in flows for lid in route}
    users: dict[Hashable, set[int]] = {}
    for i, route in enumerate(flows):
        for lid in route:
            users.setdefault(lid, set()).add(i)
    while active:
        step = min(left[lid] / len(users[lid] & active) for lid in left if users[lid] & active)
        for i in active:
            rates[i] += step
        for lid in list(left):
            sharing = users[lid] & active
            if sharing:
                left[lid] -= step * len(sharing)
        full = {lid for lid, cap in left.items() if cap <= 1e-12 and users[lid] & active}
        frozen = {i for lid in full for i in users[lid] & active}
        if not frozen:  # numerical corner: freeze the tightest link's flows
            tight = min((lid for lid in left if users[lid] & active), key=lambda lid: left[lid])
            frozen = users[tight] & active
        active -= frozen
    return rates


def _routes(fabric: Fabric, pairs: Iterable[tuple[Hashable, Hashable]]) -> list[Route]:
    out = []
    for a, b in pairs:
        route = fabric.route(a, b)
        if not route:
            raise NoPath(f"no path from {a} to {b}")
        out.append(tuple(route))
    return out


def _latency_us(fabric: Fabric, route: Route) -> float:
    return sum(fabric.links[lid].latency_us for lid in route)


def collective_cost(collective: str, ranks: Sequence[Hashable], size_bytes: int, fabric: Fabric, *,
                    step_latency_us: float, rings: int = 2, algorithm: str = "auto") -> Cost:
    """The time one collective of ``size_bytes`` takes over ``ranks`` (hosts, in ring order) on
    ``fabric``. Raises NoPath when two ranks that must talk cannot."""
    n = len(ranks)
    if collective not in BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if n < 2 or size_bytes == 0:
        return Cost(collective, n, size_bytes, step_latency_us * 1e-6, "local")
    bytes_ = float(size_bytes)
    if collective == "alltoall":
        pairs = [(a, b) for a in ranks for b in ranks if a != b]
        routes = _routes(fabric, pairs)
        rates = max_min_share(routes, fabric.links)
        slowest = min(rates)
        latency = max(_latency_us(fabric, r) for r in routes)
        time_s = (step_latency_us + latency) * 1e-6 + (bytes_ / n) * 8 / (slowest * 1e9)
        return Cost(collective, n, size_bytes, time_s, "pairwise")
    directions = [list(ranks)] if rings == 1 else [list(ranks), list(reversed(ranks))]
    ring_hops = [list(zip(order, order[1:] + order[:1])) for order in directions]
    flat = [hop for hops in ring_hops for hop in hops]
    routes = _routes(fabric, flat)
    rates = max_min_share(routes, fabric.links)
    per_ring, k = [], 0
    for hops in ring_hops:
        ring_rates = rates[k:k + len(hops)]
        ring_latency = max(_latency_us(fabric, r) for r in routes[k:k + len(hops)])
        per_ring.append((min(ring_rates), ring_latency))
        k += len(hops)
    alpha_us = step_latency_us + max(lat for _, lat in per_ring)
    share = bytes_ / len(directions)  # each ring carries an equal part
    slowest_gbps = min(rate for rate, _ in per_ring)
    if collective in ("broadcast", "reduce"):
        time_s = (n - 1) * alpha_us * 1e-6 + share * 8 / (slowest_gbps * 1e9)
        return Cost(collective, n, size_bytes, time_s, "chain")
    steps = 2 * (n - 1) if collective == "all_reduce" else n - 1
    bandwidth_s = steps * (share / n) * 8 / (slowest_gbps * 1e9)
    ring = Cost(collective, n, size_bytes, steps * alpha_us * 1e-6 + bandwidth_s, "ring")
    if collective != "all_reduce" or algorithm == "ring":
        return ring
    tree = Cost(collective, n, size_bytes, 2 * math.ceil(math.log2(n)) * alpha_us * 1e-6 + bandwidth_s, "tree")
    if algorithm == "tree":
        return tree
    return tree if tree.time_s < ring.time_s else ring


def rack_fabric(hosts: Iterable[str], nic_gbps: float, hop_latency_us: float, oversubscription: float,
                rack_of: Callable[[str], str], uplink_gbps: Mapping[str, float] | None = None) -> Fabric:
    """An electrical rack network: each server's NIC to its rack's packet switch; traffic to
    another rack crosses the rack's uplink, which under load gives each server
    1/oversubscription of its NIC rate each way (assumption: every server of the rack is busy).
    With ``uplink_gbps`` (rack -> rate), each rack's uplink is one link that every flow leaving
    or entering the rack shares, as on a rack built of bridges and shaped links."""
    hosts = list(hosts)
    share = nic_gbps / oversubscription
    links: dict = {}
    for host in hosts:
        links[("nic-tx", host)] = Link(nic_gbps, hop_latency_us)
        links[("nic-rx", host)] = Link(nic_gbps, 0.0)
        if uplink_gbps is None:
            links[("uplink", host)] = Link(share, hop_latency_us)  # its share of the rack's uplink to the spine
            links[("downlink", host)] = Link(share, hop_latency_us)
    for rack, rate in (uplink_gbps or {}).items():
        links[("uplink", rack)] = Link(rate, hop_latency_us)
        links[("downlink", rack)] = Link(rate, hop_latency_us)

    def via(host: str) -> str:
        return host if uplink_gbps is None else rack_of(host)

    def route(a: str, b: str):
        if rack_of(a) == rack_of(b):
            return (("nic-tx", a), ("nic-rx", b))
        return (("nic-tx", a), ("uplink", via(a)), ("downlink", via(b)), ("nic-rx", b))

    return Fabric(links, route)
