"""The spare pool: which hosts can take a rank, which are out of service and why, and the hosts
taken out on a guess (nothing showed which end of a link failed) to check again after a repair.

Which spare is taken is a policy: a callable ``policy(pool, ranks) -> host | None``
(:class:`SparePolicy`). The reference policy is :func:`first_healthy_spare`; a lab's own (the
spare nearest the failed host, the one on the least loaded uplink) is passed to
``ReferenceController(spare_policy=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from lumion_hil.instruments.protocols import AgentGone, InstrumentError

if TYPE_CHECKING:
    from lumion_hil.harness.config_topology import Host


def host_lost(session, host: str) -> bool:
    """A GPU of the host reports lost, or its agent is gone. A host whose agent cannot read
    NVML is not known to be lost (it may still be a spare)."""
    try:
        return any(gpu.lost for gpu in session.hosts[host].health())
    except AgentGone:
        return True
    except InstrumentError:
        return False


class SparePool:
    """A long-lived controller's memory of its hosts, across recoveries."""

    def __init__(self, session, policy: "SparePolicy | None" = None):
        self.session = session
        self.bench = session.bench
        self.policy = policy or first_healthy_spare
        # Hosts taken out of the job: never a spare again until the lab says they are repaired.
        self.out_of_service: dict[str, str] = {}
        # Hosts taken out on a guess while no spare was left to check it: the other end of the
        # link, tried in their place when the job resumes.
        self.guessed: dict[str, str] = {}
        self.recheck: set[str] = set()  # guessed hosts whose other end was repaired: check them
        # Guessed hosts repaired themselves, with the other end of their link: if their links are
        # still dark or dim, the guess was wrong and the other end is out of service.
        self.repaired_guesses: dict[str, str] = {}
        self.passed_over: dict[str, str] = {}  # why each candidate spare was not taken, at the last pick

    # -- what a policy reads ---------------------------------------------------------------------

    def lost(self, host: str) -> bool:
        return host_lost(self.session, host)

    def candidates(self, ranks: list[str]) -> list[Host]:
        """Hosts outside the job that could take a rank: a spare, or a former rank (repaired)."""
        original = set(self.bench.job.ranks) if self.bench.job else set()
        return [h for h in self.bench.topology.hosts if h.name not in ranks
                and (any(g.role == "spare" for g in h.gpus) or h.name in original)]

    def behind_protected_ports(self, host) -> list[int]:
        protected = set(self.bench.safety.protected_ports)
        return sorted({p for n in host.nics for p in (n.tx_port, n.rx_port)} & protected)

    # -- what the controller asks ----------------------------------------------------------------

    def pick(self, ranks: list[str]) -> str | None:
        """The spare the policy takes for a job on ``ranks`` (None: none is left)."""
        self.passed_over = {}
        return self.policy(self, list(ranks))

    def take_out(self, host: str, why: str) -> None:
        self.out_of_service[host] = why

    def return_to_service(self, host: str) -> None:
        self.out_of_service.pop(host, None)
        if host in self.guessed:
            self.repaired_guesses[host] = self.guessed.pop(host)
        for guess, other in list(self.guessed.items()):
            if other == host:  # the other end of a guess repaired: the guessed host may be healthy
                del self.guessed[guess]
                self.recheck.add(guess)

    def no_spare(self) -> str:
        why = "; ".join(f"{h} {reason}" for h, reason in self.passed_over.items())
        return f"no spare GPU is left{f' ({why})' if why else ''}"


class SparePolicy(Protocol):
    """Which host takes a rank next: the name of one of ``pool.candidates(ranks)`` (the hosts
    not running a rank of the job), or None where none will do. What it passes over and why goes into
    ``pool.passed_over``, which the controller's "no spare" answer quotes."""

    def __call__(self, pool: SparePool, ranks: list[str], /) -> str | None: ...


def first_healthy_spare(pool: SparePool, ranks: list[str]) -> str | None:
    """The first candidate in the bench file's order that is in service, healthy and reachable
    without switching a protected port; why each one before it was passed over is noted."""
    for host in pool.candidates(ranks):
        behind = pool.behind_protected_ports(host)
        if host.name in pool.out_of_service:
            pool.passed_over[host.name] = f"out of service: {pool.out_of_service[host.name]}"
        elif behind:
            pool.passed_over[host.name] = f"behind protected port(s) {behind}, never switched"
        elif pool.lost(host.name):
            pool.passed_over[host.name] = "its GPU is lost"
        else:
            return host.name
    return None
