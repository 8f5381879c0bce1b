"""What the bench file alone predicts, before anything runs: the optical/electrical ratios of
all-reduce bus bandwidth and of training throughput once a spare is swapped in.

On an emulated bench these ratios are the bench file played back through the cost model
(instruments/collectives.py), so the run's figure is a model figure: it can agree with a paper,
never confirm it. What the run adds is the gap between this prediction and what it observed: a
link slower than its rate, a controller that wires the spare in some other way. The prediction
assumes what the reference controller does: the failed rank's place taken by the bench's first
spare, each host's optical ports split between its two ring neighbours, at the NICs' rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, TypedDict

from lumion_hil.harness.config import Bench
from lumion_hil.instruments.collectives import Fabric, Link, collective_cost, rack_fabric


class _CostOptions(TypedDict):
    """collective_cost's keyword arguments, the same for either fabric."""

    step_latency_us: float
    rings: int


@dataclass(frozen=True)
class Prediction:
    value: float
    why: str
    ranks: tuple[str, ...]


def _spare(bench: Bench, ranks: list[str]) -> str | None:
    return next((h.name for h in bench.topology.hosts if h.name not in ranks
                 and any(g.role == "spare" for g in h.gpus)), None)


def ranks_after_swap(bench: Bench) -> list[str]:
    """The job's ranks with rank 0 replaced by the first spare (the same for any rank: the ring
    is symmetric), or the job's ranks where the bench has no spare."""
    if bench.job is None:
        raise ValueError(f"bench {bench.name!r} has no job: there are no ranks to swap a spare into")
    ranks, spare = list(bench.job.ranks), _spare(bench, bench.job.ranks)
    return [spare, *ranks[1:]] if spare else ranks


def _optical(bench: Bench, ranks: list[str]) -> Fabric:
    latency = bench.collectives.optical_hop_latency_us.value
    links: dict[Hashable, Link] = {}
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        for x, y in ((a, b), (b, a)):
            xs, ys = bench.host(x).nics, bench.host(y).nics
            rate = min(min(n.rate_gbps for n in xs), min(n.rate_gbps for n in ys))
            # Each host's ports split between its two ring neighbours (all to the one of a pair).
            circuits = min(len(xs), len(ys)) if len(ranks) == 2 else max(1, min(len(xs), len(ys)) // 2)
            links[("optical", x, y)] = Link(rate * circuits, latency)
    return Fabric(links, lambda x, y: (("optical", x, y),) if ("optical", x, y) in links else None)


def _electrical(bench: Bench, ranks: list[str]) -> Fabric:
    rack = bench.electrical
    assert rack is not None, "the callers predict nothing for a bench without an electrical rack"
    return rack_fabric(ranks, rack.nic_gbps.value, rack.hop_latency_us.value, rack.oversubscription.value, rack.rack_of)


def _why(bench: Bench, ranks: list[str], ratio: float) -> str:
    rack = bench.electrical
    assert rack is not None, "the callers predict nothing for a bench without an electrical rack"
    racks = sorted({rack.rack_of(h) for h in ranks})
    if len(racks) == 1:
        return (f"every rank after the swap ({', '.join(ranks)}) is in rack {racks[0]}: the electrical ring never "
                f"crosses the {rack.oversubscription.value:g}:1 uplink, so it carries what its NICs do, about what "
                f"the circuits carry (predicted ratio {ratio:.2f})")
    away = [h for h in ranks if rack.rack_of(h) != rack.rack_of(ranks[-1])]
    return (f"the ranks after the swap span racks {', '.join(racks)} ({', '.join(away)} in another rack): the "
            f"electrical ring crosses the {rack.oversubscription.value:g}:1 uplink, which the circuits bypass "
            f"(predicted ratio {ratio:.2f})")


def busbw_ratio(bench: Bench, size_bytes: int, rings: int | None = None) -> Prediction | None:
    """Optical over electrical all-reduce bus bandwidth at ``size_bytes`` after the swap, for a
    library that runs ``rings`` rings (None: the bench file's ``collectives.rings``)."""
    if bench.job is None or bench.electrical is None or len(bench.job.ranks) < 2:
        return None
    ranks = ranks_after_swap(bench)
    kw = _CostOptions(step_latency_us=bench.collectives.step_latency_us.value, rings=rings or bench.collectives.rings)
    optical = collective_cost("all_reduce", ranks, size_bytes, _optical(bench, ranks), **kw)
    electrical = collective_cost("all_reduce", ranks, size_bytes, _electrical(bench, ranks), **kw)
    ratio = electrical.time_s / optical.time_s
    return Prediction(ratio, _why(bench, ranks, ratio), tuple(ranks))


def throughput_ratio(bench: Bench, rings: int | None = None) -> Prediction | None:
    """Optical over electrical training throughput after the swap: the emulated job's step is
    its compute plus a ring all-reduce of its gradients (``rings``: as for :func:`busbw_ratio`)."""
    if bench.job is None or bench.electrical is None or len(bench.job.ranks) < 2:
        return None
    ranks, job = ranks_after_swap(bench), bench.job
    kw = _CostOptions(step_latency_us=bench.collectives.step_latency_us.value, rings=rings or bench.collectives.rings)
    size = int(job.gradient_bytes)
    optical = job.compute_time_s + collective_cost("all_reduce", ranks, size, _optical(bench, ranks), **kw).time_s
    electrical = job.compute_time_s + collective_cost("all_reduce", ranks, size, _electrical(bench, ranks), **kw).time_s
    ratio = electrical / optical
    return Prediction(ratio, _why(bench, ranks, ratio), tuple(ranks))
