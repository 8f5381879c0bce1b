"""Spare swaps at rack and pod scale, as the papers simulate them: a 64-accelerator rack with 4
spares (Morphlux: 4 spares per rack cover over 95% of sampled failures), and a 4,096-accelerator
pod of 64 such racks. Every accelerator has two optical ports into its rack's circuit switch;
jobs run in rings (slices) of a few accelerators, one circuit each way between ring neighbours.
Racks join through a pod-level switch on a few uplink ports each.

After a failure :meth:`Pod.fail` picks a spare (a free one in the same rack first, else in the
nearest rack with a spare and free uplinks), computes the circuits to remove and add, applies
them, and recomputes the ring's bandwidth with the collective cost model. No bench needed: this
is planning, run by the perf benchmark and tested against cases worked by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from lumion_hil.instruments.collectives import Fabric, Link, collective_cost

Gpu = tuple[int, int]  # (rack, slot)
Circuit = tuple[Gpu, Gpu]  # a directed circuit from one accelerator's transmitter to another's receiver


@dataclass(frozen=True)
class PodSpec:
    racks: int = 64
    per_rack: int = 64
    spares_per_rack: int = 4
    slice_size: int = 4
    port_gbps: float = 10.0
    uplink_ports: int = 8  # per rack, to the pod switch; a cross-rack circuit takes one at each end
    hop_latency_us: float = 1.0
    pod_hop_latency_us: float = 2.0  # a circuit through the pod switch (assumption: one more switch, longer fibre)
    step_latency_us: float = 15.0
    message_bytes: int = 128 << 20  # the size the ring's bandwidth is quoted at

    @property
    def gpus(self) -> int:
        return self.racks * self.per_rack


@dataclass
class SwapPlan:
    failed: Gpu
    slice_id: int
    spare: Gpu | None
    remove: list[Circuit] = field(default_factory=list)
    add: list[Circuit] = field(default_factory=list)
    cross_rack: bool = False
    busbw_gbps: float = 0.0  # the slice's all-reduce bus bandwidth after the swap (GB/s)
    reason: str = ""

    @property
    def degraded(self) -> bool:
        return self.spare is None


class Pod:
    def __init__(self, spec: PodSpec = PodSpec()):
        self.spec = spec
        active = spec.per_rack - spec.spares_per_rack
        if active % spec.slice_size:
            raise ValueError(f"{active} active accelerators per rack do not divide into slices of {spec.slice_size}")
        self.slices: dict[int, list[Gpu]] = {}
        self.slice_of: dict[Gpu, int] = {}
        self.free_spares: dict[int, list[Gpu]] = {}
        for rack in range(spec.racks):
            for k in range(active // spec.slice_size):
                sid = len(self.slices)
                members = [(rack, k * spec.slice_size + i) for i in range(spec.slice_size)]
                self.slices[sid] = members
                for gpu in members:
                    self.slice_of[gpu] = sid
            self.free_spares[rack] = [(rack, slot) for slot in range(active, spec.per_rack)]
        self.uplinks_free = {rack: spec.uplink_ports for rack in range(spec.racks)}
        self.failed: set[Gpu] = set()
        self.circuits: set[Circuit] = {c for members in self.slices.values() for c in _ring_circuits(members)}

    # -- planning --------------------------------------------------------------------------------

    def fail(self, gpu: Gpu) -> SwapPlan:
        """An accelerator fails: plan its replacement, apply it, and say what the ring gets."""
        if gpu in self.failed:
            raise ValueError(f"accelerator {gpu} has already failed")
        self.failed.add(gpu)
        if gpu not in self.slice_of:  # a spare failed before anyone needed it
            rack_spares = self.free_spares[gpu[0]]
            if gpu in rack_spares:
                rack_spares.remove(gpu)
            return SwapPlan(gpu, -1, None, reason="a spare failed; nothing to rewire")
        sid = self.slice_of.pop(gpu)
        members = self.slices[sid]
        spare = self._pick_spare(gpu[0])
        if spare is None:
            return SwapPlan(gpu, sid, None, reason=f"no spare with a free path for rack {gpu[0]}: slice {sid} degraded")
        position = members.index(gpu)
        remove = [c for c in _ring_circuits(members) if gpu in c]
        members[position] = spare
        add = [c for c in _ring_circuits(members) if spare in c]
        cross = spare[0] != gpu[0]
        if cross:  # the spare's circuits leave its rack: one uplink each end per circuit
            self.uplinks_free[gpu[0]] -= len(add)
            self.uplinks_free[spare[0]] -= len(add)
        self.circuits.difference_update(remove)
        self.circuits.update(add)
        self.slice_of[spare] = sid
        return SwapPlan(gpu, sid, spare, remove, add, cross, self.ring_busbw_gbps(sid))

    def _pick_spare(self, rack: int) -> Gpu | None:
        own = self.free_spares[rack]
        if own:
            return own.pop(0)
        need = 2 * (2 if self.spec.slice_size > 2 else 1)  # circuits to and from both ring neighbours
        if self.uplinks_free[rack] < need:
            return None
        for distance in range(1, self.spec.racks):  # the nearest rack that can lend one
            for other in ((rack + distance) % self.spec.racks, (rack - distance) % self.spec.racks):
                if self.free_spares[other] and self.uplinks_free[other] >= need:
                    return self.free_spares[other].pop(0)
        return None

    # -- bandwidth -------------------------------------------------------------------------------

    def slice_fabric(self, sid: int) -> Fabric:
        spec = self.spec
        links: dict[Hashable, Link] = {}
        for a, b in _ring_circuits(self.slices[sid]):
            latency = spec.hop_latency_us if a[0] == b[0] else spec.pod_hop_latency_us
            links[(a, b)] = Link(spec.port_gbps, latency)
        return Fabric(links, lambda x, y: ((x, y),) if (x, y) in links else None)

    def ring_busbw_gbps(self, sid: int) -> float:
        """The slice's all-reduce bus bandwidth (GB/s) at ``spec.message_bytes``."""
        cost = collective_cost("all_reduce", self.slices[sid], self.spec.message_bytes, self.slice_fabric(sid),
                               step_latency_us=self.spec.step_latency_us, rings=2)
        return cost.busbw_gbps

    def healthy_active(self) -> list[Gpu]:
        return [g for g in self.slice_of if g not in self.failed]


def _ring_circuits(members: list[Gpu]) -> list[Circuit]:
    """One circuit each way between ring neighbours (a pair of two shares both directions)."""
    if len(members) < 2:
        return []
    out = []
    for a, b in zip(members, members[1:] + members[:1]):
        out += [(a, b), (b, a)]
    return list(dict.fromkeys(out))
