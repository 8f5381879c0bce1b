"""What each rank sends and receives, step by step, in each of the ring's collectives: ring
all-reduce (reduce-scatter then all-gather), all-gather and reduce-scatter round the rings, and
chains for broadcast and reduce. With two rings, half of the buffer goes round each way at once
(ring 0 in rank order, ring 1 the other way), so both directions of every link carry data.

A plan is a function of (ring, this rank's position on it) that returns the rank's steps on
that ring; a collective has one plan per ring. Buffers are flat arrays of elements; spans are
[lo, hi) element ranges.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass(frozen=True)
class Step:
    """One step of a ring schedule for one rank: the elements it sends to its successor and
    those it receives from its predecessor (added in with ``reduce``, else copied)."""

    send: tuple[int, int] | None
    recv: tuple[int, int] | None
    reduce: bool = False


Plan = Callable[[int, int], list[Step]]


def split_span(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) in ``parts`` nearly equal pieces, the first ones one longer (as numpy.array_split)."""
    size, extra = divmod(hi - lo, parts)
    out, start = [], lo
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def chunks(span: tuple[int, int] | None, elements: int) -> Iterator[tuple[int, int]]:
    """The span in pieces of at most ``elements`` (none for no span)."""
    if span is not None:
        for lo in range(span[0], span[1], elements):
            yield lo, min(lo + elements, span[1])


def ring_order(nranks: int, ring: int) -> list[int]:
    """Ranks in ring order: ring 0 goes 0, 1, 2, ...; ring 1 the other way, 0, n-1, n-2, ..."""
    return list(range(nranks)) if ring == 0 else [(-q) % nranks for q in range(nranks)]


def neighbour(nranks: int, rank: int, ring: int, step: int) -> int:
    """The rank ``step`` places after ``rank`` on ``ring`` (+1 its successor, -1 its predecessor)."""
    order = ring_order(nranks, ring)
    return order[(order.index(rank) + step) % nranks]


def ring_steps(nranks: int, ring: int, position: int, blocks: list[tuple[int, int]], first: int,
               last: int) -> list[Step]:
    """Steps ``first`` to ``last`` - 1 of the ring all-reduce, whose step i sends the block
    of position p-i-1 and receives that of p-i-2 (blocks indexed by rank): steps 0 to n-2
    reduce-scatter (rank r ends with block r reduced), steps n-1 to 2n-3 all-gather."""
    order, n = ring_order(nranks, ring), nranks

    def block(q: int) -> tuple[int, int]:
        return blocks[order[q % n]]

    return [Step(block(position - i - 1), block(position - i - 2), i < n - 1) for i in range(first, last)]


def all_reduce_plans(nranks: int, rings: int, length: int) -> list[Plan]:
    """The ring all-reduce of a buffer of ``length`` elements: each ring takes its part of the
    buffer, cut in one block per rank."""
    plans: list[Plan] = []
    for part in split_span(0, length, max(1, rings)):
        blocks = split_span(*part, nranks)
        plans.append(functools.partial(ring_steps, nranks, blocks=blocks, first=0, last=2 * nranks - 2))
    return plans


def slot_plans(nranks: int, rings: int, m: int, first: int, last: int) -> list[Plan]:
    """Plans for a buffer of n slots of ``m`` elements, rank r's slot at r*m: each ring takes
    its part of every slot."""
    plans: list[Plan] = []
    for lo, hi in split_span(0, m, max(1, rings)):
        blocks = [(r * m + lo, r * m + hi) for r in range(nranks)]
        plans.append(functools.partial(ring_steps, nranks, blocks=blocks, first=first, last=last))
    return plans


def chain_plans(nranks: int, rings: int, length: int, root: int, reduce: bool) -> list[Plan]:
    """Broadcast: a chain from the root along each ring; reduce: a chain ending at the root
    (its first link leaves the root's successor)."""
    plans: list[Plan] = []
    for part in split_span(0, length, max(1, rings)):
        def plan(ring: int, p: int, part: tuple[int, int] = part) -> list[Step]:
            order, n = ring_order(nranks, ring), nranks
            c = (p - order.index(root) - (1 if reduce else 0)) % n  # place in the chain
            if c == 0:
                return [Step(part, None)]
            if c == n - 1:
                return [Step(None, part, reduce)]
            return [Step(None, part, reduce), Step(part, None)]
        plans.append(plan)
    return plans
