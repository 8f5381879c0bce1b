"""A transcript replayed against an emulated bench (``lumion-hil fidelity``, ``calibrate``):
every exchange in its recorded order, each waiting for what it waited for in the recording and
starting as long after it, each instrument and host on its own connection, the faults the
recording's backend made made again; a driver's poll loop polled on until the reply that ended
it. What comes back is read and compared by harness/fidelity.py."""

from __future__ import annotations

import bisect
import re
import threading
import time
from typing import Any, Callable

from lumion_hil.harness.reply_diff import differ
from lumion_hil.harness.transcript_analysis import parse_number
from lumion_hil.instruments import registry

def _done(entry: dict) -> int:
    return entry.get("done_ns", entry["t_ns"])


def _wait_for(finished: dict, exchange: tuple[int, dict]) -> None:
    index, entry = exchange
    if not finished[index].wait(120):
        raise RuntimeError(f"replay: exchange #{index} ({entry.get('name')} "
                           f"{entry.get('command') or entry.get('method') or entry.get('type')}) did not end within 120 s")


# --- replaying -----------------------------------------------------------------------------------

def _address_map(recorded: dict, replay: dict) -> list[tuple[str, str]]:
    """What the recording's agents were started with against the replay's: the tokens that
    differ (a world service's address), in the forms jobs and paths carry them."""
    pairs: dict[str, str] = {}
    for host, argv in recorded.items():
        for old, new in zip(argv, replay.get(host, [])):
            if old != new:
                pairs[old] = new
                if re.fullmatch(r"[\w.]+:\d+", old) and re.fullmatch(r"[\w.]+:\d+", new):
                    pairs[old.replace(":", "-")] = new.replace(":", "-")
    return sorted(pairs.items(), key=lambda p: -len(p[0]))


def _mapped(value: Any, mapping: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for old, new in mapping:
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {k: _mapped(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [_mapped(v, mapping) for v in value]
    return value


REPLAY_TIMEOUT_S = 30.0  # the longest a replayed exchange waits for its reply
# How long the replay goes on polling, where a recorded poll loop ended and the replayed bench
# has not yet given the reply that ended it (a logging function not yet complete)
POLL_EXIT_WITHIN_S = 5.0


def poll_exits(entries: list[dict]) -> dict[int, Any]:
    """The exchanges that ended a poll loop in the recording: a query its thread asked again and
    again on one instrument, until a reply naming a state (not a reading: a loop that watches
    light is timed, not repeated), the last of the run and not the one before, let the thread go
    on to something else. Index -> that reply.

    A driver polls until the instrument says what it waits for (a logging function's COMPLETE,
    an operation's end), and then acts on it (reads the result). A replay that sent the last
    poll once and went on would act too early where the replayed bench is a little slower: the
    result query then answers with an error and no reply, and the replay waits out its timeout.
    The replay polls such an exchange again as the driver would, until its reply is the
    recorded one."""
    out: dict[int, Any] = {}
    by_thread: dict[Any, list[tuple[int, dict]]] = {}
    for i, e in enumerate(entries):
        if e.get("type") in ("scpi", "serial"):
            by_thread.setdefault((e.get("thread"), e.get("name")), []).append((i, e))
    for exchanges in by_thread.values():
        for k in range(1, len(exchanges)):
            (_, before), (i, e) = exchanges[k - 1], exchanges[k]
            after = exchanges[k + 1][1] if k + 1 < len(exchanges) else None
            command = e.get("command") or ""
            if ("?" in command and before.get("command") == command and "error" not in e
                    and isinstance(e.get("reply"), str) and parse_number(e["reply"]) is None  # a state, not a reading
                    and e.get("reply") != before.get("reply")
                    and (after is None or after.get("command") != command)):
                out[i] = e.get("reply")
    return out


class Replayer:
    """Replays a transcript's exchanges against a bench (emulated): its own connections to each
    instrument, its own agents, the backend for the faults the recording's backend made."""

    def __init__(self, bench, header: dict, entries: list[dict], *, speed: float = 1.0):
        self.bench = bench
        self.header = header
        self.entries = sorted(entries, key=lambda x: x["t_ns"])
        self.speed = speed
        self.results: list[dict | None] = [None] * len(self.entries)
        self.poll_exits = poll_exits(self.entries)
        self._channels: dict[str, Any] = {}
        self._lock = threading.Lock()

    def run(self) -> list[dict]:
        from lumion_hil.harness.backends import load_backend
        from lumion_hil.harness.binding import _visa
        from lumion_hil.instruments.gpu_host.client import AgentClient

        if not self.bench.all_emulated:
            raise ValueError(f"bench {self.bench.name!r}: fidelity replays against an emulated bench (every "
                             "instrument and host 'emulated'), not a real one")
        backend = load_backend(self.bench).start()
        try:
            # One connection for each that the recording had (an instrument's own, and a probe's
            # beside it, as the recovery suite's light probe opens one)
            for channel in sorted({e["name"] for e in self.entries if e.get("type") in ("scpi", "serial")}):
                name = channel.removesuffix("-probe")
                spec = self.bench.instruments.get(name)
                if spec is None:
                    raise ValueError(f"the transcript talks to instrument {name!r}, which bench {self.bench.name!r} "
                                     f"does not have (it has {', '.join(self.bench.instruments)})")
                resource = backend.resources[name]
                # The replay compares replies, and their timing as timing: an emulator slowed by a
                # loaded machine past the instrument's own timeout still gives its reply here.
                spec = spec.model_copy(update={"timeout_s": max(spec.timeout_s, REPLAY_TIMEOUT_S)})
                entry = registry.model(spec.model)
                if entry.transport is registry.Transport.SERIAL:  # its own driver on its line
                    self._channels[channel] = entry.driver_class()(channel, resource, ingress=spec.ports[0],
                                                                   egress=spec.ports[1], baud_rate=spec.baud_rate,
                                                                   timeout_s=max(spec.timeout_s, 10))
                else:
                    self._channels[channel] = _visa(channel, spec, resource)
            argv: dict[str, list[str]] = {}
            for host in self.bench.topology.hosts:
                host_argv = backend.agent_argv(host)
                assert host_argv is not None, f"the emulated bench's backend starts {host.name}'s agent"
                argv[host.name] = host_argv
                backend.nccl_tests_folder(host)
                self._channels[host.name] = AgentClient(host.name, argv[host.name], timeout_s=self.bench.waits.opc_s)
            self.job_ranks = self._job_ranks() if self.bench.job is not None and not self.bench.job.command else {}
            session_note = next((e for e in self.entries if e.get("type") == "session"), {})
            self.mapping = _address_map(session_note.get("agents", {}), argv)
            self.backend = backend
            self._play()
        finally:
            for channel in self._channels.values():
                try:
                    channel.close()
                except Exception:
                    pass
            backend.stop()
        return [r for r in self.results if r is not None]

    def _job_ranks(self) -> dict[int, list[str]]:
        """For each job start, the ranks of its job: as its command names them (the emulated
        job's --ranks), else the hosts started one after another until the job's world size, in
        the order of the rank each was given."""
        starts = [(i, e) for i, e in enumerate(self.entries) if e.get("type") == "agent" and e.get("method") == "job_start"]
        out: dict[int, list[str]] = {}
        group: list[tuple[int, dict]] = []

        def close() -> None:
            ranked = sorted(group, key=lambda x: ((x[1].get("params") or {}).get("fields") or {}).get("rank", 0))
            for i, _ in group:
                out[i] = [x[1]["name"] for x in ranked]
            group.clear()

        for i, e in starts:
            params = e.get("params") or {}
            command = params.get("command") or []
            if "--ranks" in command[:-1]:
                out[i] = command[command.index("--ranks") + 1].split(",")
                continue
            group.append((i, e))
            if len(group) >= int((params.get("fields") or {}).get("world_size") or 1):
                close()
        if group:
            close()
        return out

    def _play(self) -> None:
        """Each exchange begins after every exchange that had ended before it began in the
        recording (what happened before it there happens before it here: a thread that joined
        its workers, a job started on a worker thread after another worker stopped the old one),
        and as long after the latest of those it most likely waited for (the previous exchange
        of its own thread, the other threads' exchanges that ended in the gap before it) as it
        did in the recording. Exchanges that overlapped there overlap here."""
        t0_rec = self.header["t0_ns"]
        t0 = time.perf_counter_ns()
        playable = [(i, e) for i, e in enumerate(self.entries)
                    if e.get("type") in ("scpi", "serial", "agent", "fault", "repair", "heal")]
        by_end = sorted((_done(e), position) for position, (_, e) in enumerate(playable))
        ends = [d for d, _ in by_end]
        finished = {i: threading.Event() for i, _ in playable}
        ended_ns: dict[int, int] = {}
        last_of_thread: dict[Any, int] = {}  # thread -> position of its latest exchange
        threads = []
        happened = 0  # by_end[:happened]: exchanges already seen to have ended in the replay
        for position, (index, entry) in enumerate(playable):
            thread_id = entry.get("thread")
            before = bisect.bisect_left(ends, entry["t_ns"])
            for _, j in by_end[happened:before]:
                _wait_for(finished, playable[j])
            happened = max(happened, before)
            # the gap is kept after what it most likely waited for: its own thread's previous
            # exchange and the other threads' that ended after that (a thread's first exchange:
            # the one begun just before it, if that had ended)
            prev = last_of_thread.get(thread_id)
            if prev is None:
                waited = [position - 1] if position and _done(playable[position - 1][1]) < entry["t_ns"] else []
            else:
                lo = bisect.bisect_left(ends, _done(playable[prev][1]))
                waited = [prev] + [j for _, j in by_end[lo:before] if playable[j][1].get("thread") != thread_id]
            latest = max(waited, key=lambda j: _done(playable[j][1]), default=None)
            if latest is None:
                due = t0 + int((entry["t_ns"] - t0_rec) / self.speed)
            else:
                _wait_for(finished, playable[latest])
                due = ended_ns[playable[latest][0]] + int((entry["t_ns"] - _done(playable[latest][1])) / self.speed)
            wait = due - time.perf_counter_ns()
            if wait > 0:
                time.sleep(wait / 1e9)  # the recorded gap: this exchange began this long after what it waited for
            last_of_thread[thread_id] = position
            thread = threading.Thread(target=self._one, args=(index, entry, finished[index], ended_ns, t0, t0_rec),
                                      daemon=True, name=f"replay-{entry.get('name') or entry['type']}")
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(timeout=120)

    def _one(self, index, entry, finished, ended_ns, t0, t0_rec) -> None:
        try:
            self.results[index] = self._exchange(index, entry, t0, t0_rec)
        finally:
            ended_ns[index] = time.perf_counter_ns()
            finished.set()

    def _line(self, query: Callable[[str], Any], write: Callable[[str], Any], command: str, index: int) -> Any:
        """A recorded line sent again: a query's reply (polled on where the recording's loop
        polled, see _poll_until), or None for a set command."""
        if "?" not in command:
            write(command)
            return None
        reply = query(command)
        if index in self.poll_exits:
            reply = self._poll_until(lambda: query(command), index, reply)
        return reply

    def _poll_until(self, ask: Callable[[], Any], index: int, reply: Any) -> Any:
        """The last poll of a recorded loop, asked again (at the loop's own pace) until the
        replayed bench gives the reply that ended the loop there, or POLL_EXIT_WITHIN_S passes
        (then the reply that differs is compared as it is)."""
        wanted = self.poll_exits[index]
        polls = [e["t_ns"] for e in self.entries[max(0, index - 50):index + 1]
                 if e.get("thread") == self.entries[index].get("thread")
                 and e.get("command") == self.entries[index].get("command")]
        pace_s = min(0.1, (polls[-1] - polls[-2]) / 1e9 / self.speed) if len(polls) > 1 else 0.01
        deadline = time.monotonic() + POLL_EXIT_WITHIN_S
        while differ(wanted, reply) is not None and time.monotonic() < deadline:
            time.sleep(max(0.0, pace_s))  # the driver's own pace between two polls
            reply = ask()
        return reply

    def _exchange(self, index: int, entry: dict, t0: int, t0_rec: int) -> dict:
        from lumion_hil.instruments.backend import Fault
        from lumion_hil.instruments.protocols import InstrumentError

        kind = entry["type"]
        out = {"type": kind, "name": entry.get("name"), "index": index}
        start = time.perf_counter_ns()
        try:
            if kind in ("fault", "repair"):
                if entry.get("by_backend"):
                    fault = Fault(**entry["fault"])
                    (self.backend.inject if kind == "fault" else self.backend.repair)(fault)
            elif kind == "heal":
                if self.backend.world is not None:
                    self.backend.world.heal()
            elif kind in ("scpi", "serial"):
                channel = self._channels[entry["name"]]
                command = entry["command"]
                out["command"] = command
                if kind == "scpi" and isinstance(entry.get("reply"), list):
                    out["reply"] = channel.query_binary_floats(command)
                elif kind == "scpi":
                    out["reply"] = self._line(channel.query, channel.write, command, index)
                else:  # a serial switch's driver: its own line exchange
                    out["reply"] = self._line(channel._query, channel._write, command, index)
            elif kind == "agent":
                client = self._channels[entry["name"]]
                params = _mapped(entry.get("params") or {}, self.mapping)
                if entry["method"] == "job_start" and index in self.job_ranks:
                    # this bench's own job on the same ranks (the recording's command is its bench's job)
                    ranks = self.job_ranks[index]
                    whole_rack = "--all-ranks-here" in (params.get("command") or [])
                    own = (self.backend.reserved_rack_job_argv if whole_rack else self.backend.job_argv)(
                        self.bench.job, ranks)
                    if own is not None:
                        params["command"] = own
                out["method"], out["params"] = entry["method"], params
                within = float(params.get("timeout_s") or 0) + 10.0
                result, remote, _, _ = client.call_timed(entry["method"], within, **params)
                out["result"], out["remote_ns"] = result, remote
        except InstrumentError as exc:
            out["error"] = exc.reason
        except Exception as exc:  # a replay goes on: the difference is reported
            out["error"] = f"{type(exc).__name__}: {exc}"
        end = time.perf_counter_ns()
        # On the recording's clock, so that one analysis reads both.
        out["t_ns"] = t0_rec + (start - t0)
        out["done_ns"] = t0_rec + (end - t0)
        return out


