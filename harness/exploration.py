"""Exploring failure sequences: how much (the profiles, their shards, and the parts a profile is
spread over on several machines) and what a run must reach (the reference controller's detection
and recovery paths).

A failure sequence is a story (harness/stories.py): what happens to the bench step by step,
naming hosts and NICs, never indices. The explorer (harness/explorer.py) carries out its steps on
an open bench session and judges the promises (harness/promises.py) after every one; Hypothesis
chooses the steps (test_suites/test_failure_sequences.py), ``lumion-hil replay`` reads them from
a story file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Profile:
    """How much to explore: ``sequences`` in all (split over ``shards``, which pytest-xdist may
    run on several workers), each of 1 to ``max_steps`` steps (so about half that on average).
    With ``shrink``, a story that breaks a promise is told again, shorter and simpler, until it
    is as small as it can be (Hypothesis's shrinking); without, it is saved as it was found."""

    name: str
    sequences: int
    max_steps: int
    shards: int
    seed: int
    examples_dir: Path
    shrink: bool = True

    def database(self, bench) -> Path:
        """The per-bench example database (failing stories are tried first next time)."""
        return self.examples_dir / bench.name


PROFILES = {
    "ci": "a thousand sequences at the bench's time scale (or as many as the bench file says), in 2 shards (-n 2: "
          "both cores): every night's CI run",
    "nightly": "thousands, in 8 shards to spread over pytest-xdist workers (-n auto)",
    "bench": "a few at the bench's own speed (real time on a real bench): the default",
}
# sequences, most steps in one, shards
_SIZES = {"ci": (1000, 8, 2), "nightly": (4000, 12, 8), "bench": (5, 4, 1)}


def shards(name: str | None) -> int:
    """How many shards a profile's exploration is cut into (one test each)."""
    return _SIZES[name or "bench"][2]


def parse_part(text: str) -> tuple[int, int]:
    """``K/N`` (the K-th of N parts, 1-based) as (K, N)."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"{text!r} is not K/N (e.g. 2/4: the second of four parts)") from None
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"{text!r}: K must be 1 to N and N at least 1")
    return k, n


def is_a_part(part: str | None) -> bool:
    """Whether ``--explore-shard`` ``part`` makes a run one part of several (K/N, N above 1)."""
    return part is not None and parse_part(part)[1] > 1


def shards_of_part(name: str | None, part: str | None) -> list[int]:
    """The shards of profile ``name`` that part ``K/N`` runs: shard i in part i mod N + 1, so the
    N parts together run every shard once, each with the seed and the sequences it has in the
    whole profile (what the parts explore adds up to what the profile explores)."""
    count = shards(name)
    if part is None:
        return list(range(count))
    k, n = parse_part(part)
    if n > count:
        hint = "" if name == "nightly" else f" (the nightly profile has {shards('nightly')})"
        raise ValueError(f"profile {name or 'bench'!r} has {count} shard(s): it cannot be cut into {n} parts{hint}")
    return [i for i in range(count) if i % n == k - 1]


def profile(name: str, seed: int, examples_dir: Path, sequences: int | None = None, bench=None, *,
            shrink: bool = True) -> Profile:
    """Profile ``name``: ``sequences`` if given, else as many as the bench file says for it
    (``emulator.explore``), else the profile's own; a broken story shrunk unless ``shrink`` is false."""
    if name not in PROFILES:
        raise ValueError(f"unknown exploration profile {name!r}; known: {', '.join(PROFILES)}")
    count, max_steps, pieces = _SIZES[name]
    if not sequences and bench is not None:
        sequences = bench.emulator.explore.get(name)
    return Profile(name, sequences or count, max_steps, pieces, seed, examples_dir, shrink)


# The detection and recovery paths of the reference controller that a ci run on a bench that can
# make every fault must reach (Explorer.paths counts those taken; a prefix names a family).
REFERENCE_PATHS = (
    "detected: xid", "detected: link_down", "detected: margin_low", "detected: job_exit",
    "fade into the margin zone", "a guess at which end failed", "the spare lost on the way in", "degraded",
    "resume after a repair",
)


EVERY_PATH = "the ci profile reaches every detection and recovery path"  # the limit's source, where it applies


def reference_paths(bench) -> tuple[str, ...]:
    """The paths a ci run on ``bench`` must reach. The controller guesses which end of a dark
    link failed only where a receiver has no detector to tell: on a bench that sees every
    receiver, no guess is needed (or reachable)."""
    sees_all = all(bench.detectors_for_port(n.rx_port) for _, n in bench.nic_ports())
    return tuple(p for p in REFERENCE_PATHS if not (sees_all and p == "a guess at which end failed"))


def paths_missed(paths: dict[str, int], bench) -> list[str]:
    return missed_of(paths, reference_paths(bench))


def missed_of(paths: dict[str, int], reference) -> list[str]:
    """The reference paths (a prefix names a family) none of ``paths`` (path -> times taken) is."""
    return [p for p in reference if not any(k.startswith(p) for k in paths)]
