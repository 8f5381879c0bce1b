"""Errors the harness raises. Each one names the thing at fault and the reason."""

from __future__ import annotations

from dataclasses import dataclass


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""


@dataclass(frozen=True)
class BenchProblem:
    """One thing wrong with a bench file."""

    path: str  # dotted field path, e.g. "topology.hosts[1].nics[0].tx_port"
    reason: str
    line: int | None = None

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        field = self.path or "(top level)"
        return f"{where}: {field}: {self.reason}"


class BenchFileError(HarnessError):
    """A bench file that cannot be used, with every problem found in it."""

    def __init__(self, file: str, problems: list[BenchProblem]):
        self.file = file
        self.problems = problems
        lines = [p.render(file) for p in problems]
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"bench file {file} has {len(problems)} {noun}:\n  " + "\n  ".join(lines))


class BenchInUseError(HarnessError):
    """Another run holds the lock on this bench."""


class SafetyError(HarnessError):
    """A request that would break a safety rule of the bench (a protected port, say)."""
