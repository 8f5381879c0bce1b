"""Collective bandwidth and training throughput, measured from outside: nccl-tests run on the
hosts through their agents and read back with the parser; step rates from the instants at
which the agents see the job's steps (never from figures the job prints about itself)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from lumion_hil.harness.errors import HarnessError
from lumion_hil.instruments.gpu_host.nccl import NcclParseError, NcclResult, parse_runs


class MeasurementFailed(HarnessError):
    """A measurement could not be taken (nccl-tests failed, the job did not step)."""


@dataclass
class Sweep:
    """One nccl-tests run over some ranks on one fabric."""

    collective: str
    ranks: list[str]
    fabric: str
    result: NcclResult
    output: str
    started_ns: int
    ended_ns: int
    library: str = "nccl-tests"  # which library and launcher produced it (the backend's name for them)

    @property
    def wall_s(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9

    @property
    def largest(self):
        return max(self.result.rows, key=lambda r: r.size_bytes)


def run_sweep(session, collective: str, ranks: list[str], fabric: str = "optical",
              sizes: tuple[int, int] | None = None, library: str | None = None) -> Sweep:
    """Run ``<collective>_perf`` of ``library`` over ``ranks`` from the first rank's host and
    parse its output (``library``: one of the backend's ``collective_libraries()``, None: its
    first)."""
    library = library or session.backend.collective_libraries()[0]
    argv, env = session.nccl_tests_command(collective, ranks, fabric, sizes, library)
    timeout = session.bench.nccl_tests.timeout_s
    out = session.hosts[ranks[0]].run_nccl_tests(argv, timeout_s=timeout, env=env)
    source = f"{ranks[0]}: {' '.join(argv[:1])}"
    try:
        runs = parse_runs(out.stdout, source)
    except NcclParseError as exc:
        raise MeasurementFailed(f"{collective} over {ranks} ({fabric}): exit {out.returncode}, {exc}; "
                                f"stderr: {out.stderr[-500:]}") from None
    if len(runs) != 1:
        raise MeasurementFailed(f"{source}: {len(runs)} runs in one output; expected one")
    return Sweep(collective, list(ranks), fabric, runs[0], out.stdout, out.started_ns, out.ended_ns, library)


@dataclass
class StepRate:
    """Successive steps as the agent on rank 0's host saw them."""

    ranks: list[str]
    steps: list[tuple[int, int]]  # (step, harness ns)
    batch_per_rank: int
    intervals_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        ordered = sorted(self.steps)
        self.intervals_s = [(b[1] - a[1]) / 1e9 / (b[0] - a[0]) for a, b in zip(ordered, ordered[1:]) if b[0] > a[0]]

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.intervals_s)

    @property
    def samples_per_s(self) -> float:
        return self.batch_per_rank * len(self.ranks) / self.step_time_s

    @property
    def spread(self) -> float:
        """Largest relative deviation of one interval from the median (how steady it was)."""
        median = self.step_time_s
        return max(abs(i - median) / median for i in self.intervals_s)


def observe_step_rate(session, ranks: list[str], intervals: int = 3, timeout_s: float | None = None) -> StepRate:
    """Wait for ``intervals + 1`` more steps of the running job and time them by when the agent
    saw each."""
    lead = session.hosts[ranks[0]]
    timeout = session.bench.waits.recovery_s if timeout_s is None else timeout_s
    start = lead.job_status().step
    status = lead.wait_step(start + intervals + 1, timeout)
    if not status.reached:
        raise MeasurementFailed(f"the job on {ranks} did not take {intervals + 1} steps within {timeout:g} s "
                                f"({' | '.join(status.last_lines[-2:])})")
    steps = lead.job_steps(after_step=start)
    rate = StepRate(list(ranks), steps, session.bench.job.batch_per_rank)
    if not rate.intervals_s:
        raise MeasurementFailed(f"the agent on {ranks[0]} saw no two successive steps")
    return rate
