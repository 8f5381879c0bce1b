"""Job control on a host: start a rank of the training job from an argv template, stop it,
restart it on a new rank map, and follow its progress.

Arguments are lists, never a shell string built from input: each template element is filled
with ``str.format`` from known fields ({rank} {world_size} {gpu} {master_addr} {master_port}
{heartbeat}) and passed to the process as one argument.

Progress comes from the job's own output, event-driven: a line that is a JSON object with
``step`` (the heartbeat format: also ``step_time_s``, ``samples_per_s``, ``tokens_per_s``, and
``t_monotonic_ns``, the host's CLOCK_MONOTONIC when the job says the step completed), or a line
matching ``step[ =:]<n>``. Each step is stamped with the agent's clock when the agent reads its
line: that is the time the harness uses, measured from outside the job. What the job claims
(``t_monotonic_ns``) is kept beside it as ``claimed_ns``. Other events are kept in order, with
the same stamp: a JSON line with ``event`` (``{"event": "collective"}``), NCCL's own
``Init COMPLETE`` line (NCCL_DEBUG=INFO) as ``nccl_init``, and torchrun's ``Rendezvous complete
for workers`` (its LOGLEVEL=INFO) as ``rendezvous``. Lines that say why a job failed (an error,
a timeout, a closed connection: ``ERROR_LINE``) are kept apart too, the last few, so a failure's
own words survive a launcher's report after them. Every line also goes to the job's log.

The events a job may print, in the order of a start (README, "One job interface"):
``process_started`` (before the framework's import), ``rendezvous``, ``communicator_ready`` (or
NCCL's ``nccl_init``), ``collective``, ``checkpoint_loaded`` (with the ``step`` loaded), then
its steps, and ``checkpoint_saved`` (with its ``step``) as it saves them.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

FIELDS = ("rank", "world_size", "gpu", "master_addr", "master_port", "heartbeat")
_STEP_RE = re.compile(r"\bstep[\s=:]+(\d+)", re.IGNORECASE)
_NCCL_INIT = re.compile(r"NCCL INFO comm \S+ rank \d+ nranks \d+ .*Init COMPLETE")
_TORCHRUN_RENDEZVOUS = re.compile(r"\] \[\w+\] Rendezvous complete for workers")
ERROR_LINE = re.compile(r"Error\b|error:|Timed out|timed out|[Cc]onnection (closed|reset)|Watchdog|ncclRemoteError|"
                        r"exitcode: -?\d+")
_ERRORS_KEPT = 5
_HISTORY = 10000  # steps and events kept per run of the job


class JobError(Exception):
    pass


_PLACEHOLDER = re.compile(r"\{(" + "|".join(FIELDS) + r")\}")


def fill_template(template: list[str], fields: dict) -> list[str]:
    """Replace the known placeholders in each argument; any other braces are left as they are
    (a job's JSON argument, say)."""
    if not isinstance(template, list) or not template or not all(isinstance(a, str) for a in template):
        raise JobError("the job command is a non-empty list of strings")
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise JobError(f"unknown template fields {sorted(unknown)}")

    def fill(m: re.Match) -> str:
        if m.group(1) not in fields:
            raise JobError(f"the job command uses {{{m.group(1)}}} but no value was given for it")
        return str(fields[m.group(1)])

    return [_PLACEHOLDER.sub(fill, arg) for arg in template]


def _popen(argv: list[str], env: dict) -> subprocess.Popen:
    """A rank's process: its own session (so that it and whatever it starts are signalled as one
    process group), stdout and stderr on one pipe, stdin closed."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def wait_exit(pid: int, timeout_s: float, unreaped: Callable[[], bool] | None = None) -> bool | None:
    """Until process ``pid`` ends, woken by its end through a pidfd (Linux 5.3 on), at most
    ``timeout_s``: True once it has ended, False at the timeout, None where no pidfd could be
    opened (no such process, or no pidfds here). ``unreaped``: where the caller's own child may
    be reaped meanwhile, a check that it has not been, made once the pidfd is open, so that the
    pidfd can only be that process's (a reaped pid may be another's); if it says reaped, True."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        if unreaped is not None and not unreaped():
            return True
        ended = select.poll()  # (not select.select: no limit on the descriptor's number)
        ended.register(fd, select.POLLIN)
        return bool(ended.poll(max(0.0, timeout_s) * 1000))
    finally:
        os.close(fd)


def _wait(proc, timeout_s: float) -> None:
    """``proc.wait(timeout_s)``, woken by the process's end. Popen's wait with a timeout polls,
    sleeping from half a millisecond doubling to 50 ms between looks, so a job that ends between
    two looks is seen up to 50 ms late, and a recovery that stops the job pays it in full. (The
    job's follower reaps it, under Popen's lock: hence the check that it is still unreaped.)"""
    if isinstance(proc, subprocess.Popen):
        if wait_exit(proc.pid, timeout_s, unreaped=lambda: proc.poll() is None) is False:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    proc.wait(timeout=timeout_s)  # at once, or once the follower has reaped it


class JobControl:
    def __init__(self, log_dir: str, clock_ns=time.monotonic_ns, offset_ns: int = 0, read_latency_s: float = 0.0,
                 popen=_popen):
        self.log_dir = Path(log_dir)
        # How a rank's process is started: (argv, env) -> a Popen (or an object with its poll,
        # wait, pid, returncode and stdout), as _popen starts it. An emulated host's agent
        # starts its emulated ranks from a fork server (instruments/emulators/forkserver.py).
        self.popen = popen
        self.read_latency_s = read_latency_s  # emulated: how late the job's lines reach the agent (a defect)
        self.clock_ns = clock_ns
        self.offset_ns = offset_ns  # what the agent adds to CLOCK_MONOTONIC (tests of clock mapping)
        self._proc: subprocess.Popen | None = None
        self._changed = threading.Condition()
        self._progress: dict = {}
        self._started_ns: int | None = None
        self._argv: list[str] = []
        self._fields: dict = {}
        self._exit_ns: int | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=20)
        self._steps: collections.deque[tuple[int, int]] = collections.deque(maxlen=_HISTORY)  # (step, when read)
        self._events: collections.deque[dict] = collections.deque(maxlen=_HISTORY)
        self._errors: collections.deque[str] = collections.deque(maxlen=_ERRORS_KEPT)

    def start(self, template: list[str], fields: dict, env: dict | None = None) -> dict:
        if self._proc is not None and self._proc.poll() is None:
            raise JobError(f"a job is already running (pid {self._proc.pid}); stop it first")
        argv = fill_template(template, fields)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"rank{fields.get('rank', 0)}.log"
        with self._changed:
            self._progress, self._exit_ns = {}, None
            for kept in (self._tail, self._steps, self._events, self._errors):
                kept.clear()
            launched_ns = self.clock_ns()  # the process's start: as the agent launches it
            try:
                self._proc = self.popen(argv, {**os.environ, **(env or {})})
            except OSError as exc:
                raise JobError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
            self._started_ns, self._argv, self._fields = launched_ns, argv, dict(fields)
        threading.Thread(target=self._follow, args=(self._proc, log_path), daemon=True, name="job-output").start()
        return {"pid": self._proc.pid, "argv": argv, "started_ns": self._started_ns, "log": str(log_path)}

    def _follow(self, proc: subprocess.Popen, log_path: Path) -> None:
        assert proc.stdout is not None  # popen gives the job's output on a pipe
        with open(log_path, "a", encoding="utf-8") as log:
            for raw in proc.stdout:
                if self.read_latency_s:
                    time.sleep(self.read_latency_s)
                seen_ns = self.clock_ns()  # when the agent saw the line: the harness's measurement
                line = raw.decode("utf-8", "replace").rstrip("\n")
                log.write(line + "\n")
                log.flush()
                progress = _parse_progress(line)
                event = _parse_event(line)
                with self._changed:
                    if proc is not self._proc:  # an earlier job's last words, read after the next one started
                        continue
                    self._tail.append(line)
                    if ERROR_LINE.search(line):
                        self._errors.append(line)
                    if progress is not None:
                        own = progress.pop("t_monotonic_ns", None)
                        claimed = own + self.offset_ns if isinstance(own, int) else None
                        self._progress = {**progress, "t_ns": seen_ns, "claimed_ns": claimed, "stamped_by": "agent"}
                        self._steps.append((progress["step"], seen_ns))
                    if event is not None:
                        self._events.append({**event, "t_ns": seen_ns})
                    self._changed.notify_all()
        proc.wait()
        with self._changed:
            if proc is self._proc:  # (an earlier job's end is not the running one's)
                self._exit_ns = self.clock_ns()
                self._changed.notify_all()

    def stop(self, timeout_s: float = 10.0) -> dict:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return self.status()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            _wait(proc, timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _wait(proc, timeout_s)
        except ProcessLookupError:
            pass
        return self.status()

    def kill(self) -> None:
        """SIGKILL the job's process group now (the host lost power)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def status(self) -> dict:
        with self._changed:
            proc = self._proc
            running = proc is not None and proc.poll() is None
            return {"running": running, "pid": proc.pid if proc else None,
                    "returncode": None if proc is None or running else proc.returncode,
                    "started_ns": self._started_ns, "exit_ns": self._exit_ns, "argv": self._argv,
                    "fields": dict(self._fields),
                    "progress": dict(self._progress), "last_lines": list(self._tail)[-5:],
                    "error_lines": list(self._errors)}

    def steps(self, after_step: int = 0) -> list[tuple[int, int]]:
        """(step, when the agent saw it) for every step after ``after_step`` of this run."""
        with self._changed:
            return [s for s in self._steps if s[0] > after_step]

    def events(self, event: str | None = None) -> list[dict]:
        """Every event of this run (or only those named ``event``), in order, with the agent's stamp."""
        with self._changed:
            return [e for e in self._events if event is None or e["event"] == event]

    def wait_event(self, event: str, timeout_s: float) -> dict:
        """Until the job reports ``event`` (or exits, or the deadline passes): the first one of
        this run, with the agent's stamp."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = next((e for e in self._events if e["event"] == event), None)
                exited = self._proc is None or self._exit_ns is not None
                remaining = deadline - time.monotonic()
                if found or exited or remaining <= 0:
                    return {"event": found, "timed_out": found is None and not exited, "running": not exited,
                            "last_lines": list(self._tail)[-5:]}
                self._changed.wait(remaining)

    def wait_step(self, step: int, timeout_s: float) -> dict:
        """Until the job reports ``step`` (or exits, or the deadline passes)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                reached = self._progress.get("step", -1) >= step
                exited = self._proc is None or (self._exit_ns is not None)
                remaining = deadline - time.monotonic()
                if reached or exited or remaining <= 0:
                    return {**self.status(), "reached": reached, "timed_out": not reached and not exited and remaining <= 0}
                self._changed.wait(remaining)


def _parse_event(line: str) -> dict | None:
    text = line.strip()
    if _NCCL_INIT.search(text):
        return {"event": "nccl_init"}
    if _TORCHRUN_RENDEZVOUS.search(text):
        return {"event": "rendezvous"}
    if text.startswith("{") and '"event"' in text:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        if isinstance(data, dict) and isinstance(data.get("event"), str):
            return {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool))}
    return None


def _parse_progress(line: str) -> dict | None:
    text = line.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and "event" in data:
            return None  # an event that names a step (a checkpoint's) is not a step done
        if isinstance(data, dict) and isinstance(data.get("step"), int):
            return {k: data[k] for k in ("step", "step_time_s", "samples_per_s", "tokens_per_s", "t_monotonic_ns")
                    if k in data}
    m = _STEP_RE.search(text)
    return {"step": int(m.group(1))} if m else None
