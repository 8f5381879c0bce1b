"""How a command ends on an error: its message on standard error and its exit status
(harness/exit_codes.py). Here too are the inputs that end a command so when they cannot be read
(a bench file, a transcript), and the errors of work on an open bench (interrupted, busy, a
bench or instrument error)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import click

from lumion_hil.harness.config import Bench, load_bench
from lumion_hil.harness.errors import BenchFileError
from lumion_hil.harness.exit_codes import ExitCode


def fail(message: str, status: ExitCode = ExitCode.BENCH_OR_USAGE_ERROR, *, prefix: str = "lumion-hil: ") -> NoReturn:
    """Say ``message`` on standard error (after ``prefix``) and exit with ``status``."""
    click.echo(f"{prefix}{message}", err=True)
    sys.exit(status)


def load_or_exit(path: Path, time_scale: float | None, defects: tuple[str, ...] = ()) -> Bench:
    """The bench file at ``path``; one that cannot be read ends the command (exit 4), its
    problems said as they are (each with its field and line)."""
    try:
        return load_bench(path, time_scale=time_scale, defects=defects)
    except BenchFileError as exc:
        fail(str(exc), prefix="")


def read_transcript_or_exit(path: Path) -> dict:
    """The header of the transcript at ``path``; one that cannot be read ends the command (exit 4)."""
    from lumion_hil.instruments import transcript

    try:
        return transcript.read(path)[0]
    except ValueError as exc:
        fail(str(exc))


@contextlib.contextmanager
def stopping_safely(stopped: str) -> Iterator[None]:
    """Ctrl-C and SIGTERM stop what runs inside at a safe point (exit 2, saying ``stopped``);
    busy is exit 6, a bench or instrument error 4."""
    from lumion_hil.harness.errors import BenchInUseError, HarnessError
    from lumion_hil.harness.interrupts import INTERRUPTS, RunInterrupted
    from lumion_hil.instruments.protocols import InstrumentError

    INTERRUPTS.reset()
    INTERRUPTS.install()
    try:
        with INTERRUPTS.armed():
            yield
    except RunInterrupted as exc:
        fail(f"{exc}: stopped; {stopped}", ExitCode.INTERRUPTED)
    except BenchInUseError as exc:
        fail(str(exc), ExitCode.BENCH_BUSY)
    except (HarnessError, InstrumentError) as exc:
        fail(str(exc))
    finally:
        INTERRUPTS.uninstall()
