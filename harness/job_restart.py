"""The job after a recovery as the harness sees it from the agents, never the controller's word
for it: the rank map (every rank on one host, in a process started after the fault), rank 0's
first step, when the job ran again, and the job's own account of its start (the lines each
rank printed: rendezvous, communicator ready, checkpoint loaded), and its last words where it
failed. The recovery suite times a recovery to these instants."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from lumion_hil.instruments.threads import at_once


class NotRestarted(AssertionError):
    """The job was not restarted as the harness sees it: a rank missing, or a stale one."""


@dataclass
class Restart:
    """The job after a recovery as the agents report it, never the controller's word for it."""

    ranks: list[str]  # the rank map: the host that runs each rank, rank 0 first
    started_ns: dict[str, int]  # when each of those hosts started its rank's process
    restarted_ns: int  # when the last of them started
    first_step_ns: int  # rank 0's first step after that
    ready_ns: int | None = None  # every rank's communicator ready (its own line, as its agent saw it); None: not said
    running_ns: int | None = None  # every rank's communicator ready and first collective done: the job runs again
    running_from: str = ""  # what ``running_ns`` was read from

    @property
    def lead(self) -> str:
        return self.ranks[0]


def rank_map(session, fault_ns: int, world_size: int | None = None) -> tuple[list[str], dict[str, int]]:
    """The job's rank map as the agents report it: ask every host which rank of the job it runs
    and when it started it. Every rank of the job (``world_size``, by default the bench's job)
    must run on one host, in a process started after the fault. Returns (hosts by rank, when
    each started); a rank no host runs, or one whose process predates the fault, raises
    :class:`NotRestarted`, never passes."""
    world_size = world_size or len(session.bench.job.ranks)
    running: dict[int, list[tuple[str, int | None]]] = {}
    asked = at_once({name: host.job_status for name, host in session.hosts.items()})  # every host at once
    for name, status in asked.items():
        if isinstance(status, Exception):
            raise status
        rank = status.fields.get("rank")
        if status.running and isinstance(rank, int):
            running.setdefault(rank, []).append((name, status.started_ns))
    missing = [r for r in range(world_size) if r not in running]
    doubled = {r: [h for h, _ in hs] for r, hs in running.items() if len(hs) > 1}
    if missing or doubled:
        seen = {r: [h for h, _ in hs] for r, hs in sorted(running.items())}
        raise NotRestarted(f"the agents report ranks {seen} of a job of {world_size}: "
                           + (f"no host runs rank(s) {missing}" if missing else f"rank(s) run twice: {doubled}"))
    ranks = [running[r][0][0] for r in range(world_size)]
    started = {running[r][0][0]: running[r][0][1] for r in range(world_size)}
    stale = sorted(h for h, t in started.items() if t is None or t <= fault_ns)
    if stale:
        raise NotRestarted(f"no rank process started after the fault on {stale} (rank map from the agents: {ranks})")
    return ranks, {h: t for h, t in started.items() if t is not None}  # every one, as stale is empty


def _every_rank(session, ranks: list[str], event: str) -> int | None:
    """When the last rank of ``ranks`` reported ``event`` (its first of this run, as its agent
    stamped it); None if a rank has not reported it."""
    instants = []
    for host in ranks:
        found = session.hosts[host].wait_job_event(event, 0).event
        if found is None:
            return None
        instants.append(found["t_ns"])
    return max(instants)


def observe_restart(session, fault_ns: int, world_size: int | None = None) -> Restart:
    """The restart as the harness sees it: the rank map from the agents (:func:`rank_map`), rank
    0's first step once the last rank had started, and when the job ran again: every rank's
    communicator ready and first collective done, from the lines each rank printed as its agent
    saw them (a job that reports no collective of its own: rank 0's first step, which needs
    every rank's all-reduce, stands for it)."""
    ranks, started = rank_map(session, fault_ns, world_size)
    restarted_ns = max(started.values())
    firsts = [t for step, t in session.hosts[ranks[0]].job_steps(0) if step == 1 and t > restarted_ns]
    if not firsts:
        raise NotRestarted(f"{ranks[0]} (rank 0) completed no first step after every rank of {ranks} had started")
    first_step_ns = min(firsts)
    # NCCL's Init COMPLETE line, or a job's own communicator_ready (gloo says nothing of its own)
    ready_ns = _every_rank(session, ranks, "nccl_init") or _every_rank(session, ranks, "communicator_ready")
    collective_ns = _every_rank(session, ranks, "collective")
    if collective_ns is not None:
        running_ns = max(collective_ns, ready_ns or collective_ns)
        running_from = "every rank's communicator ready and first collective done (the ranks' own lines)"
    else:
        running_ns, running_from = first_step_ns, "rank 0's first step (the job reports no collective of its own)"
    return Restart(ranks, started, restarted_ns, first_step_ns, ready_ns, min(running_ns, first_step_ns), running_from)


# The phases of a job's start after its processes started, each the instant its last rank
# reached it, read from what the job prints (README, "One job interface"); the first event
# named is the job's own, the later ones other jobs' words for the same thing (NCCL's Init
# COMPLETE line). A start goes through them in this order.
JOB_PHASES = (("rendezvous", ("rendezvous",)), ("communicator_ready", ("communicator_ready", "nccl_init")),
              ("checkpoint_loaded", ("checkpoint_loaded",)))
# Said beside them, in no fixed order: when a launcher's workers started (after its rendezvous
# under torchrun, before their own elsewhere).
JOB_EXTRAS = (("workers_started", ("process_started",)),)


@dataclass
class JobPhase:
    name: str
    t_ns: int  # when the last rank of the new rank map reached it (harness clock, as its agent saw it)
    by_rank_ns: dict[str, int]  # host -> when its rank reached it
    detail: dict = field(default_factory=dict)  # rank 0's event (the checkpoint's step, say)
    ordered: bool = True  # one of the phases a start goes through in order (not an extra)


def job_phases(session, restart: Restart) -> list[JobPhase]:
    """The restarted job's own account of its start, rank by rank, from the agents: when each
    host's process of the job was started (the agent starts the job's command: torchrun, say;
    ``processes_started``), then each phase of :data:`JOB_PHASES` the job printed on every
    rank, then rank 0's first step, and the :data:`JOB_EXTRAS` last. A phase not every rank
    printed is left out (a job that prints none gives processes started and first step)."""
    phases = [JobPhase("processes_started", restart.restarted_ns, dict(restart.started_ns))]
    events = {host: session.hosts[host].job_events() for host in restart.ranks}
    for name, names in JOB_PHASES + JOB_EXTRAS:
        by_rank, lead = {}, None
        for host in restart.ranks:
            found = next((e for wanted in names for e in events[host] if e["event"] == wanted), None)
            if found is not None:
                by_rank[host] = found["t_ns"]
                if host == restart.lead:
                    lead = found
        if len(by_rank) == len(restart.ranks):
            phases.append(JobPhase(name, max(by_rank.values()), by_rank,
                                   {k: v for k, v in (lead or {}).items() if k not in ("t_ns", "uncertainty_ns")},
                                   ordered=(name, names) in JOB_PHASES))
    first = JobPhase("first_step", restart.first_step_ns, {restart.lead: restart.first_step_ns})
    return [p for p in phases if p.ordered] + [first] + [p for p in phases if not p.ordered]


def checkpoint_saved_before(session, host: str) -> int | None:
    """The step of the newest checkpoint the job running on ``host`` has said it saved (None:
    none, or a job that says nothing of checkpoints)."""
    saved = session.hosts[host].job_events("checkpoint_saved")
    return max(int(e.get("step", 0)) for e in saved) if saved else None


def job_last_words(session, hosts: list[str], within_s: float) -> dict[str, list[str]]:
    """What the job said on each of ``hosts`` as it failed, once its process there has ended
    (waiting at most ``within_s`` for each, all at once: the framework's own timeouts take
    their time): its error lines where the agent kept some, else its last lines. A host whose
    job still runs at the end says so."""
    words: dict[str, list[str]] = {}

    def listen(host: str) -> None:
        status = session.hosts[host].wait_step(10**12, within_s)
        lines = status.error_lines or status.last_lines
        words[host] = (["(still running)"] if status.running else []) + list(lines)

    threads = [threading.Thread(target=listen, args=(h,), daemon=True) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(within_s + session.bench.waits.opc_s)
    return {h: words.get(h, ["(no answer from its agent)"]) for h in hosts}
