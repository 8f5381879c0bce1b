"""The suites' pytest process, as ``lumion-hil run`` supervises it: found where the package is
installed, run in its own process group so that a terminal's Ctrl-C reaches the wrapper alone,
given SIGINT and SIGTERM to stop at a safe point, and killed with everything it started only
after its grace time, or when the wrapper ends."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import click

from lumion_hil.harness.exit_codes import ExitCode


def run_suites(cmd: list[str], grace_s: float, extra_env: dict[str, str] | None = None) -> int:
    """Run pytest in its own process group, so a terminal's Ctrl-C reaches this wrapper alone;
    forward SIGINT and SIGTERM to pytest (which stops at a safe point), and wait for it, at
    most ``grace_s`` after the first signal. Only then, or if this wrapper is killed, is the
    whole group killed. Returns pytest's exit status."""
    env = dict(os.environ, LUMION_HIL_RUN=os.environ.get("LUMION_HIL_RUN") or f"{os.getpid()}-{time.time_ns()}",
               LUMION_HIL_WRAPPER_PID=str(os.getpid()), **(extra_env or {}))
    child = subprocess.Popen(cmd, start_new_session=True, env=env)
    signals: list[int] = []
    first_at: list[float] = []

    def forward(signum, frame) -> None:
        signals.append(signum)
        if len(signals) == 1:
            first_at.append(time.monotonic())
            click.echo(f"\nlumion-hil: {signal.Signals(signum).name}: stopping at a safe point (restoring the "
                       f"baseline); waiting up to {grace_s:g} s; Ctrl-C again to cut the waits short", err=True)
        elif len(signals) == 2:
            click.echo("lumion-hil: second interrupt: cutting the waits short (switch commands still finish)",
                       err=True)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if first_at and time.monotonic() - first_at[0] > grace_s:
                click.echo(f"lumion-hil: the suites did not stop within {grace_s:g} s; killing them. The switch "
                           "may not be at its baseline: run `lumion-hil bench restore` before the next run", err=True)
                _kill_group(child)
                return ExitCode.INTERRUPTED
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _kill_group(child)


def _kill_group(child: subprocess.Popen) -> None:
    """Kill whatever is left of the suites' process group (pytest, agents it started)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def suites_dir() -> Path:
    spec = importlib.util.find_spec("lumion_hil.test_suites")
    if spec is None or not spec.submodule_search_locations:
        raise click.ClickException("the test_suites package is not installed; run `pip install -e .`")
    return Path(list(spec.submodule_search_locations)[0])
