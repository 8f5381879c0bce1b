"""The exit status of ``lumion-hil run`` (and of pytest with the lumion-hil plugin), one table.

pytest's own codes are kept where they exist (0, 1, 2, 3, 4, 5); a busy bench is added."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    PASSED = 0  # every test passed (skips allowed)
    TESTS_FAILED = 1  # a test failed or a measurement was out of its limits
    INTERRUPTED = 2  # SIGINT or SIGTERM: stopped at a safe point, baseline restored
    CRASHED = 3  # the harness itself failed (a bug: please report it)
    BENCH_OR_USAGE_ERROR = 4  # a wrong bench file, option or argument, or a bench that cannot be opened
    NOTHING_COLLECTED = 5  # no suite matched (-k, paths): a failure of the run's purpose
    BENCH_BUSY = 6  # another run holds the bench's lock


MEANING = {
    ExitCode.PASSED: "passed",
    ExitCode.TESTS_FAILED: "failed",
    ExitCode.INTERRUPTED: "interrupted",
    ExitCode.CRASHED: "crashed",
    ExitCode.BENCH_OR_USAGE_ERROR: "bench or usage error",
    ExitCode.NOTHING_COLLECTED: "nothing collected",
    ExitCode.BENCH_BUSY: "bench busy",
}


def outcome_of(status: int) -> str:
    """The run record's closing ``outcome`` for an exit status."""
    try:
        return MEANING[ExitCode(status)]
    except ValueError:
        return f"exit {status}"
