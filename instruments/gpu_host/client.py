"""The harness's side of a GPU host agent: a subprocess (local, or through ssh) spoken to in
JSON lines. Replies are matched to requests by id, so calls may wait concurrently."""

from __future__ import annotations

import collections
import itertools
import subprocess
import sys
import threading
import time
from typing import IO, overload

from lumion_hil.instruments import transcript
from lumion_hil.instruments.gpu_host import wire
from lumion_hil.instruments.gpu_host.replies import (EventWait, GpuDevice, GpuHealth, JobStarted, JobStatus, LinkState,
                                                     LinkWait, NcclRun, StepWait, TransmitterSet, XidEvent)
from lumion_hil.instruments.protocols import (AgentGone, ClockMapping, GpuHost, InstrumentError, InstrumentIOError,
                                              TransmitterControl)

# Calls that only read the host: after the agent's session is lost, the client starts it again and
# asks once more (nothing on the host changes by asking twice).
READ_ONLY = frozenset({"hello", "clock", "devices", "health", "links", "link", "job_status", "job_steps"})
# How long an agent may take to answer its first request: its process starting (an interpreter and
# its imports, through ssh on a remote host), which no time scale shortens and a busy machine
# lengthens. Later requests get the client's own timeout.
START_S = 10.0


def local_agent_argv(python: str = sys.executable, *extra: str) -> list[str]:
    return [python, "-m", "lumion_hil.agent", *extra]


def ssh_agent_argv(destination: str, python: str = "python3") -> list[str]:
    """The agent on another host: lumion-hil must be installed there for ``python``."""
    return ["ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", destination,
            python, "-m", "lumion_hil.agent"]


class _Gone(Exception):
    """The agent's process ended (its session was lost)."""

    def __init__(self, error: AgentGone):
        self.error = error


class _Slot:
    """A call waiting for its reply from the agent's process ``proc``: ``done`` is set once
    ``reply`` is in (None: that process is gone)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.done = threading.Event()
        self.reply: dict | None = None
        self.received_ns: int | None = None  # harness time the reply was read


class AgentClient(GpuHost, TransmitterControl):
    def __init__(self, name: str, argv: list[str], *, timeout_s: float = 10.0, clock_ns=time.perf_counter_ns):
        self.name = name
        self.argv = argv
        self.timeout_s = timeout_s
        self.clock_ns = clock_ns
        self._ids = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        # Agents' processes whose output has ended: no reply comes from them. A call made after
        # its reader woke the waiters would otherwise wait its whole timeout (ssh's session killed,
        # its client still on its way out, its stdin still open).
        self._silent: set[subprocess.Popen] = set()
        self._stderr: collections.deque[str] = collections.deque(maxlen=30)
        self._write_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._not_replies: collections.deque[bytes] = collections.deque(maxlen=5)
        self.restarts = 0
        self._start()
        try:
            self.hello = self.call("hello", max(self.timeout_s, START_S))
            self.clock = self.sync_clock()
        except BaseException:
            self.close()
            raise

    # -- transport ------------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE)
        except OSError as exc:
            raise InstrumentError(self.name, " ".join(self.argv[:3]),
                                  f"cannot start the agent: {exc.strerror or exc}") from None
        proc = self._proc
        threading.Thread(target=self._read, args=(proc,), daemon=True, name=f"agent-{self.name}").start()
        threading.Thread(target=self._drain_stderr, args=(proc,), daemon=True, name=f"agent-{self.name}-err").start()

    @property
    def _stdin(self) -> IO[bytes]:
        stdin = self._proc.stdin
        assert stdin is not None  # the agent is started with stdin=PIPE
        return stdin

    @property
    def alive(self) -> bool:
        """The agent's process (its ssh session, for a remote host) is running."""
        return self._proc.poll() is None

    def _restart(self, method: str) -> None:
        """The agent's session was lost (ssh dropped, host rebooted): start it again."""
        with self._start_lock:
            old = self._proc
            try:
                old.wait(timeout=2)  # its output has ended: it is on its way out
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait(timeout=5)
            if self._proc is not old:
                return  # another caller already started a new one
            self._start()
            with self._lock:
                self._silent.discard(old)  # replaced: no call reaches it any more
            self.restarts += 1
            try:
                self._call_once("hello", max(self.timeout_s, START_S), {})  # started (see START_S)
            except _Gone as gone:
                raise gone.error from None
            self.clock = self.sync_clock(restart=False)  # a session that dies again is an error, not a loop

    def _decode(self, line: bytes) -> dict | None:
        """A reply line; a line that starts with the rest of a broken one is read from the first
        reply that begins inside it."""
        try:
            return wire.decode(line)
        except ValueError:
            pass
        start = line.find(b'{"id":', 1)
        while start > 0:
            try:
                reply = wire.decode(line[start:])
            except ValueError:
                start = line.find(b'{"id":', start + 1)
                continue
            self._not_replies.append(line[:start])
            return reply
        self._not_replies.append(line)
        return None

    def _read(self, proc) -> None:
        for line in proc.stdout:
            reply = self._decode(line)
            if reply is None:
                continue
            rid = reply.get("id")
            with self._lock:
                slot = self._pending.get(rid) if rid is not None else None
            if slot is not None:
                slot.reply = reply
                slot.received_ns = self.clock_ns()
                slot.done.set()
        with self._lock:  # the agent is gone: wake its waiters, and refuse those to come
            self._silent.add(proc)
            for slot in self._pending.values():
                if slot.proc is proc:  # not a call to the agent started again since (its first, say)
                    slot.done.set()

    def _drain_stderr(self, proc) -> None:
        for line in proc.stderr:
            self._stderr.append(line.decode("utf-8", "replace").rstrip())

    def call_timed(self, method: str, reply_within_s: float | None = None, **params) -> tuple[object, int, int, int]:
        """(result, agent clock at reply, harness time sent, harness time received). A read-only
        call whose agent is gone starts it again and asks once more."""
        try:
            return self._call_once(method, reply_within_s, params)
        except _Gone as gone:
            if method not in READ_ONLY:
                raise gone.error from None
            try:
                self._restart(method)
            except InstrumentError as exc:
                raise AgentGone(self.name, method, f"{gone.error.reason}; starting it again failed: "
                                f"{exc.reason}") from None
            try:
                return self._call_once(method, reply_within_s, params)
            except _Gone as again:
                raise again.error from None

    def _call_once(self, method: str, reply_within_s: float | None, params: dict) -> tuple[object, int, int, int]:
        if transcript.current() is None:
            return self._call_once_unrecorded(method, reply_within_s, params)
        t_ns = time.perf_counter_ns()
        try:
            result = self._call_once_unrecorded(method, reply_within_s, params)
        except InstrumentError as exc:
            transcript.exchange("agent", self.name, t_ns, method=method, params=params, error=exc.reason)
            raise
        except _Gone as gone:
            transcript.exchange("agent", self.name, t_ns, method=method, params=params, error=gone.error.reason)
            raise
        transcript.exchange("agent", self.name, t_ns, method=method, params=params, result=result[0],
                            remote_ns=result[1])
        return result

    def _call_once_unrecorded(self, method: str, reply_within_s: float | None,
                              params: dict) -> tuple[object, int, int, int]:
        rid = next(self._ids)
        with self._lock:
            proc = self._proc
            slot = _Slot(proc)
            silent = proc in self._silent
            if not silent:
                self._pending[rid] = slot
        if silent:
            raise _Gone(self._gone(method))
        sent = self.clock_ns()
        stdin = proc.stdin
        assert stdin is not None  # the agent is started with stdin=PIPE
        try:
            with self._write_lock:
                stdin.write(wire.encode({"id": rid, "method": method, "params": params}))
                stdin.flush()
        except (BrokenPipeError, OSError):
            with self._lock:
                self._pending.pop(rid, None)
            raise _Gone(self._gone(method)) from None
        limit = self.timeout_s if reply_within_s is None else reply_within_s
        answered = slot.done.wait(limit)
        with self._lock:
            self._pending.pop(rid, None)
        if not answered:
            junk = f"; it sent what is not a reply: {self._not_replies[-1][:80]!r}" if self._not_replies else ""
            self._not_replies.clear()
            raise InstrumentIOError(self.name, method, f"no reply from the agent within {limit:g} s{junk}")
        reply = slot.reply
        if reply is None:
            raise _Gone(self._gone(method))
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise InstrumentError(self.name, method, f"agent error {err.get('type')}: {err.get('message')}")
        assert slot.received_ns is not None  # read with the reply
        return reply.get("result"), reply["clock_ns"], sent, slot.received_ns

    def call(self, method: str, reply_within_s: float | None = None, **params):
        """Call an agent method; ``reply_within_s`` bounds the wait for its reply."""
        return self.call_timed(method, reply_within_s, **params)[0]

    def _gone(self, method: str) -> AgentGone:
        try:
            code = self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        tail = " | ".join(list(self._stderr)[-5:]) or "no output"
        return AgentGone(self.name, method, f"the agent is not running (exit {code}): {tail}")

    # -- clock ----------------------------------------------------------------------------------

    def sync_clock(self, samples: int = 8, restart: bool = True) -> ClockMapping:
        """Offset of the host's clock from the harness's, from the round trip with the least
        delay: the reply's clock was read between sending and receiving, so the midpoint is off
        by at most half the round trip. ``restart``: start a lost session again (not while
        starting one)."""
        best = None
        for _ in range(samples):
            if restart:
                _, agent_ns, sent, received = self.call_timed("clock")
            else:
                try:
                    _, agent_ns, sent, received = self._call_once("clock", None, {})
                except _Gone as gone:
                    raise gone.error from None
            rtt = received - sent
            if best is None or rtt < best[0]:
                best = (rtt, agent_ns - (sent + received) // 2)
        if best is None:
            raise ValueError(f"{self.name}: syncing the clock takes at least one sample, not {samples}")
        self.clock = ClockMapping(best[1], (best[0] + 1) // 2)
        return self.clock

    @overload
    def _mapped(self, event: dict, *keys: str) -> dict: ...

    @overload
    def _mapped(self, event: None, *keys: str) -> None: ...

    def _mapped(self, event: dict | None, *keys: str) -> dict | None:
        if event is None:
            return None
        out = dict(event)
        for key in keys:
            if out.get(key) is not None:
                out[f"host_{key}"] = out[key]
                out[key] = self.clock.to_harness(out[key])
        out["uncertainty_ns"] = self.clock.uncertainty_ns
        return out

    # -- GpuHost --------------------------------------------------------------------------------

    def devices(self) -> list[GpuDevice]:
        return [GpuDevice.from_json(d) for d in self.call("devices")]

    def health(self) -> list[GpuHealth]:
        return [GpuHealth.from_json(h) for h in self.call("health")]

    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        event = self._mapped(self.call("wait_xid", timeout_s + self.timeout_s, timeout_s=timeout_s), "t_ns")
        return None if event is None else XidEvent.from_json(event)

    def links(self) -> list[LinkState]:
        return [LinkState.from_json(self._mapped(s, "t_ns")) for s in self.call("links")]

    def wait_link(self, interface: str, up: bool, timeout_s: float) -> LinkWait:
        state = self.call("wait_link", timeout_s + self.timeout_s, interface=interface, up=up, timeout_s=timeout_s)
        return LinkWait.from_json(self._mapped(state, "t_ns"))

    def set_transmitter(self, interface: str, on: bool) -> TransmitterSet:
        """Turn the interface's transmitter (its laser) off or on; ``t_ns`` on the harness clock.
        The agent turns any it left off on again when its session ends."""
        return TransmitterSet.from_json(self._mapped(self.call("transmitter", interface=interface, on=bool(on)), "t_ns"))

    def start_job(self, command: list[str], fields: dict, env: dict | None = None) -> JobStarted:
        return JobStarted.from_json(self._mapped(self.call("job_start", command=command, fields=fields, env=env or {}),
                                                 "started_ns"))

    def stop_job(self, timeout_s: float = 10.0) -> JobStatus:
        """Stop the job (SIGTERM to its process group, SIGKILL after ``timeout_s``): its status then."""
        return JobStatus.from_json(self._job_clock(self.call("job_stop", timeout_s + self.timeout_s, timeout_s=timeout_s)))

    def job_status(self) -> JobStatus:
        """The job as its agent sees it; instants (started_ns, exit_ns, progress) on the harness clock."""
        return JobStatus.from_json(self._job_clock(self.call("job_status")))

    def wait_step(self, step: int, timeout_s: float) -> StepWait:
        """Until the job reports ``step``, its process ends, or ``timeout_s`` passes."""
        status = self.call("job_wait_step", timeout_s + self.timeout_s, step=step, timeout_s=timeout_s)
        return StepWait.from_json(self._job_clock(status))

    def _job_clock(self, status: dict) -> dict:
        """A job status's instants, its progress's too, on the harness clock."""
        status = self._mapped(status, "started_ns", "exit_ns")
        progress = status.get("progress") or {}
        for key in ("t_ns", "claimed_ns"):
            if progress.get(key) is not None:
                progress[key] = self.clock.to_harness(progress[key])
        return status

    def job_steps(self, after_step: int = 0) -> list[tuple[int, int]]:
        """(step, harness time the agent saw it) for each step after ``after_step``."""
        return [(step, self.clock.to_harness(t)) for step, t in self.call("job_steps", after_step=after_step)]

    def job_events(self, event: str | None = None) -> list[dict]:
        """Every event the job of this run printed (or those named ``event``), in order, each
        ``t_ns`` on the harness clock as the agent saw it (``process_started``, ``rendezvous``,
        ``communicator_ready``, ``checkpoint_loaded``...: README, "One job interface")."""
        out = []
        for found in self.call("job_events", event=event):
            found["t_ns"] = self.clock.to_harness(found["t_ns"])
            found["uncertainty_ns"] = self.clock.uncertainty_ns
            out.append(found)
        return out

    def wait_job_event(self, event: str, timeout_s: float) -> EventWait:
        """The job's first ``event`` of this run (``nccl_init``, ``collective``), its ``t_ns`` on
        the harness clock as the agent saw it; ``event`` is None if it did not come."""
        status = self.call("job_wait_event", timeout_s + self.timeout_s, event=event, timeout_s=timeout_s)
        if status.get("event"):
            status["event"]["t_ns"] = self.clock.to_harness(status["event"]["t_ns"])
            status["event"]["uncertainty_ns"] = self.clock.uncertainty_ns
        return EventWait.from_json(status)

    def run_nccl_tests(self, argv: list[str], timeout_s: float = 600.0, env: dict | None = None) -> NcclRun:
        """Run nccl-tests on the host: its exit status and output, when it started and ended
        (the instants on the harness clock)."""
        out = self.call("nccl_run", timeout_s + self.timeout_s, argv=argv, timeout_s=timeout_s, env=env or {})
        return NcclRun.from_json(self._mapped(out, "started_ns", "ended_ns"))

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the agent to leave (it stops its job); kill it after ``timeout_s``."""
        if self._proc.poll() is None:
            try:
                with self._write_lock:
                    self._stdin.write(wire.encode({"id": 0, "method": "bye", "params": {}}))
                    self._stdin.flush()
                self._stdin.close()
                self._proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(timeout=5)
