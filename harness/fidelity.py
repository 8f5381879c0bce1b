"""How far an emulated bench is from a recorded one (``lumion-hil fidelity``).

A transcript (``lumion-hil run --record``, instruments/transcript.py) is replayed against a
bench's emulators: every exchange in its recorded order and at its recorded time from the
start, each instrument and host on its own thread (what overlapped in the recording overlaps
again; what followed an exchange's reply waits for it). Then, side by side:

- every reply that differs: numbers beyond a tolerance (powers in dB), text that is not the
  same, an error on one side only;
- the timing of each kind of exchange, as distributions: ``switch`` (a command that makes
  connections, to its completion, and per connection), ``light`` (a switch command to the first
  reading that sees its light), ``link_up`` (a circuit lit to its NIC's carrier, as the agent
  stamped it, per host), ``agent`` (a plain agent call's round trip, per host) and
  ``job_start`` (a job's start-up: its last rank's process start to the job's communicator
  ready, as its ranks say it (NCCL's ``Init COMPLETE``, a ``communicator_ready`` event), or
  where no one asked for that, to its first step);

and the bench-file parameters that the differences point at. The same analysis of a transcript
feeds ``lumion-hil calibrate`` (harness/calibrate.py).
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeGuard, cast

from lumion_hil.harness import decisions
from lumion_hil.instruments import registry, transcript

DARK_DBM = -40.0  # below this a detector sees no light (every emulated floor is under -50 dBm)

# Replies that name the instrument or host rather than its behaviour: shown, never judged.
IDENTITY_COMMANDS = re.compile(r"^\*IDN\?|SYST(EM)?:SENS(OR)?:IDN\?|^ID\?", re.IGNORECASE)
IDENTITY_METHODS = {"hello", "devices"}
# Agent result fields that are times, process ids or echoes of the request: never compared.
UNCOMPARED_KEYS = {"pid", "t_ns", "started_ns", "exit_ns", "remote_ns", "argv", "hostname", "last_lines", "stdout",
                   "stderr", "uuid", "progress", "step_time_s", "samples_per_s", "heartbeat", "fields", "event",
                   "steps", "seconds", "elapsed_s", "returncode",
                   # whether a link was already up when its wait began: a matter of when it was asked
                   "already",
                   # a link's carrier counters count flaps over its whole history: whether a link
                   # locked before its light went again is a matter of a few ms at the lock time,
                   # judged by the link_up kinds below (a CI replay counted 11 changes where the
                   # recording had 9, with host2's bring-up matching within 0.1 ms)
                   "carrier_changes", "carrier_up_count", "carrier_down_count"}
POLL_METHODS = {"job_steps"}  # progress so far: one more or one fewer is a matter of when it was asked
# A meter's function state, polled until COMPLETE (FUNC:STAT? -> LOGGING_STABILITY,PROGRESS): the
# same function one poll further on or behind is a matter of when it was asked, and the logged
# block that follows is judged as a trace. A CI replay saw COMPLETE two polls (38 ms) sooner.
POLL_COMMANDS = re.compile(r":?SENS(?:e)?\d*:FUNC(?:tion)?:STAT(?:e)?\?$", re.IGNORECASE)
FAST_METHODS = {"clock", "health", "links", "link", "job_status", "job_steps", "devices"}

# Numbers inside replies (other than the power readings, which are judged per detector below) are
# the emulators' and the instruments' settings and states: the same within this.
POWER_TOLERANCE_DB = 0.3


# --- reading a transcript ----------------------------------------------------------------------

_PAIRS = re.compile(r"\(@([\d,\s:]*)\)\s*,\s*\(@([\d,\s:]*)\)")
_CONNECT = re.compile(r":?OXC:SWIT(CH)?:CONN(ECT)?:(ADD|ONLY)\b", re.IGNORECASE)
_SUB = re.compile(r":?OXC:SWIT(CH)?:CONN(ECT)?:SUB\b", re.IGNORECASE)
_DISC_ALL = re.compile(r":?OXC:SWIT(CH)?:DISC(ONNECT)?:ALL\b", re.IGNORECASE)
_PMON = re.compile(r":?PMON(ITOR)?:POW(ER)?\?\s*\(@([\d,\s]+)\)", re.IGNORECASE)


def _entry(model: str | None) -> registry.InstrumentModel | None:
    """A model's registry entry: how its transcript reads (None for one not registered here)."""
    try:
        return registry.model(model) if model else None
    except registry.UnknownModel:
        return None


def _ports(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ":" in part:
            a, b = part.split(":")
            out += list(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def _number(text: Any) -> float | None:
    try:
        return float(str(text).strip().strip('"'))
    except (TypeError, ValueError):
        return None


def _dbm(value: float, unit: str) -> float:
    if unit == "W":
        return -200.0 if value <= 0 else 10 * math.log10(value * 1000)
    return value


@dataclass
class Reading:
    done_ns: int
    port: int
    dbm: float
    index: int
    instrument: str = ""


@dataclass
class Analysis:
    """What a transcript shows, in seconds at the transcript's own time scale."""

    switch: list[tuple[float, int]] = field(default_factory=list)  # (duration, connections made)
    switch_overhead: list[float] = field(default_factory=list)  # commands that made no connection, *OPC? included
    light: list[float] = field(default_factory=list)
    link_up: dict[str, list[float]] = field(default_factory=dict)
    agent: dict[str, list[float]] = field(default_factory=dict)
    # A job's start-up, from its last rank's process start, by what ended it: "communicator
    # ready" (the ranks' own line) or "first step" (rank 0's first step seen: the start-up plus
    # the first collective and step)
    job_start: dict[str, list[float]] = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)
    paths: dict[int, tuple[int, int]] = field(default_factory=dict)  # reading index -> (ingress, egress) lit
    link_events: list[tuple] = field(default_factory=list)  # (exchange, host, rx port, lit, carrier up, alone)
    # The exchange each sample above came from, in the same order (a replayed exchange keeps its
    # recorded place): the recording's and the replay's samples of one exchange are a pair.
    switch_at: list[int] = field(default_factory=list)
    light_at: list[tuple[int, int]] = field(default_factory=list)  # (exchange, port)
    agent_at: dict[str, list[int]] = field(default_factory=dict)
    job_start_at: dict[str, list[int]] = field(default_factory=dict)

    def per_connection(self) -> list[float]:
        overhead = statistics.median(self.switch_overhead) if self.switch_overhead else 0.0
        return [max(0.0, d - overhead) / n for d, n in self.switch if n >= 1]

    def per_connection_at(self, single: bool) -> dict[int, float]:
        """Switching per connection, by exchange: of the commands that made one connection
        (``single``), or of those that made several."""
        overhead = statistics.median(self.switch_overhead) if self.switch_overhead else 0.0
        return {at: max(0.0, d - overhead) / n for (d, n), at in zip(self.switch, self.switch_at)
                if n >= 1 and (n == 1) == single}


def analyse(bench, entries: list[dict]) -> Analysis:
    """Timing and light of a transcript's exchanges (recorded or replayed: the same shape)."""
    out = Analysis()
    switch_name = bench.topology.switch
    ingress_count = bench.switch.ports[0]
    state: dict[int, int] = {}  # ingress -> egress, as commanded
    lit_at: dict[int, int] = {}  # egress -> estimated instant its circuit was lit
    command_at: dict[int, int] = {}  # egress -> start of the command that made its circuit
    alone: dict[int, bool] = {}  # egress -> its circuit was the one connection its command made
    moves_pending: list[tuple[int, int]] = []  # a switch with its own move commands: moved, not yet settled
    moves_started = 0
    last_reading: dict[int, Reading] = {}
    units: dict[tuple[str, int], str] = {}
    jobs: list[_JobStart] = []  # every job start, its ranks' process starts on the harness's clock
    last_step: dict[str, tuple] = {}  # host -> (step waited for, when it came)
    nic_of = {(h.name, (n.interface or n.name)): n for h in bench.topology.hosts for n in h.nics}
    registered = {name: _entry(spec.model) for name, spec in bench.instruments.items()}
    switch_entry = registered.get(switch_name)
    switch_moves = switch_entry.switch_moves if switch_entry else None

    def made(t_ns: int, done_ns: int, new: list[tuple[int, int]]) -> None:
        n = len(new)
        for k, (i, e) in enumerate(new, start=1):
            lit_at[e] = t_ns + (done_ns - t_ns) * k // n
            alone[e] = n == 1
            command_at[e] = t_ns

    ordered = sorted(entries, key=lambda x: x["t_ns"])
    # Each host's clock against the harness's, from its quickest plain call (its reply's clock
    # was read between sending and receiving: off by at most half that round trip).
    offsets: dict[str, tuple[int, int]] = {}
    for e in ordered:
        if e.get("type") == "agent" and e.get("method") in FAST_METHODS and e.get("remote_ns") and not e.get("error"):
            rtt = e["done_ns"] - e["t_ns"]
            if e["name"] not in offsets or rtt < offsets[e["name"]][0]:
                offsets[e["name"]] = (rtt, e["remote_ns"] - (e["t_ns"] + e["done_ns"]) // 2)
    for position, e in enumerate(ordered):
        index = e.get("index", position)  # a replayed exchange keeps the recorded one's place
        kind = e.get("type")
        name = str(e.get("name", "")).removesuffix("-probe")
        command = str(e.get("command") or "")
        t, done = e.get("t_ns", 0), e.get("done_ns", e.get("t_ns", 0))
        if kind in ("scpi", "serial") and name == switch_name and not e.get("error"):
            if switch_moves is not None:
                move = switch_moves.match_move(command)
                if move:
                    if not moves_pending:
                        moves_started = t
                    i, o = move
                    old = state.pop(i, None)
                    if old:
                        lit_at.pop(old, None)
                    if o:
                        state[i] = o + ingress_count
                        moves_pending.append((i, o + ingress_count))
                elif switch_moves.parks_all(command):
                    state.clear()
                elif switch_moves.settles(command) and moves_pending:
                    out.switch.append(((done - moves_started) / 1e9, len(moves_pending)))
                    out.switch_at.append(index)
                    made(moves_started, done, moves_pending)
                    moves_pending = []
                continue
            for part in command.split(";"):
                part = part.strip()
                pairs = _PAIRS.search(part)
                if _CONNECT.match(part) and pairs:
                    ins, outs = _ports(pairs.group(1)), _ports(pairs.group(2))
                    wanted = list(zip(ins, outs))
                    if re.search(r":ONLY\b", part, re.IGNORECASE):
                        for i in [i for i in state if (i, state[i]) not in wanted]:
                            lit_at.pop(state.pop(i), None)
                    new = [(i, o) for i, o in wanted if state.get(i) != o]
                    for i, o in new:
                        state[i] = o
                    if "*OPC?" in command.upper():
                        if new:
                            out.switch.append(((done - t) / 1e9, len(new)))
                            out.switch_at.append(index)
                            made(t, done, new)
                        else:
                            out.switch_overhead.append((done - t) / 1e9)
                elif _SUB.match(part) and pairs:
                    for i, o in zip(_ports(pairs.group(1)), _ports(pairs.group(2))):
                        if state.get(i) == o:
                            state.pop(i)
                            lit_at.pop(o, None)
                    if "*OPC?" in command.upper():
                        out.switch_overhead.append((done - t) / 1e9)
                elif _DISC_ALL.match(part):
                    state.clear()
                    lit_at.clear()
        if kind in ("scpi", "serial") and not e.get("error"):
            meter = registered.get(name)
            for port, dbm in _power_readings(e, meter.power_replies if meter else None, name, units, bench):
                reading = Reading(done, port, dbm, index, name)
                prev = last_reading.get(port)
                ingress = next((i for i, o in state.items() if o == port), None)
                if ingress is not None and dbm > DARK_DBM:
                    out.paths[len(out.readings)] = (ingress, port)
                if (prev is not None and prev.dbm <= DARK_DBM < dbm and port in command_at
                        and command_at[port] > prev.done_ns - 1):
                    out.light.append((done - command_at[port]) / 1e9)
                    out.light_at.append((index, port))  # one reading exchange may see light at several ports
                last_reading[port] = reading
                out.readings.append(reading)
        if kind == "agent" and not e.get("error"):
            # an agent's line always names its host (instruments/transcript.py)
            method, result, host = e.get("method"), e.get("result"), cast(str, e.get("name"))
            if method in FAST_METHODS:
                out.agent.setdefault(host, []).append((done - t) / 1e9)
                out.agent_at.setdefault(host, []).append(index)
            elif method == "job_start":
                job = jobs[-1] if jobs else None
                world_size = _world_size(e.get("params") or {})
                if job is None or job.ended is not None or host in job.started or len(job.started) >= job.world_size:
                    job = _JobStart(index, world_size)
                    jobs.append(job)
                stamp = result.get("started_ns") if isinstance(result, dict) else None
                job.started[host] = _on_harness_clock(offsets, host, stamp, e) if isinstance(stamp, int) else t
            elif method in ("job_wait_event", "job_events") and (
                    (e.get("params") or {}).get("event") in READY_EVENTS + (None,)):
                found = result.get("event") if isinstance(result, dict) else result
                found = [x for x in (found if isinstance(found, list) else [found]) if isinstance(x, dict)]
                ready = next((x for x in found if x.get("event") in READY_EVENTS), None)
                job = _job_of(jobs, host)
                if job is not None:
                    job.late |= _late(result) or any(x.get("event") == "late_launch" for x in found)
                    if ready is not None and isinstance(ready.get("t_ns"), int):
                        job.ready(_on_harness_clock(offsets, host, ready["t_ns"], e), "communicator ready")
            elif method == "job_wait_step" and isinstance(result, dict) and result.get("reached"):
                step = (e.get("params") or {}).get("step")
                job = _job_of(jobs, host)
                progress = result.get("progress") or {}
                if job is not None:
                    job.late |= _late(result)
                if step == 1 and job is not None and job.ended is None:
                    # On the host's own clock where it says (its first step's line read): a wait
                    # for the step asked after the step came tells only when it was asked, and
                    # is not counted (nor a start whose ranks' own process start, slowed by a
                    # busy machine, outlasted the start-up it emulates: it says so, late_launch).
                    seen_ns = progress.get("t_ns")
                    if isinstance(seen_ns, int):
                        if progress.get("step") == 1:
                            job.ready(_on_harness_clock(offsets, host, seen_ns, e), "first step")
                    else:
                        job.ready(done, "first step")
                previous = last_step.get(host)
                if previous is not None and isinstance(step, int) and step == previous[0] + 1:
                    out.step_s.append((done - previous[1]) / 1e9)
                last_step[host] = (step, done)
            elif method == "job_steps" and isinstance(result, list) and len(result) >= 2:
                stamps = [s[1] for s in result]
                out.step_s += [(b - a) / 1e9 for a, b in zip(stamps, stamps[1:])]
            elif method == "wait_link" and isinstance(result, dict) and (e.get("params") or {}).get("up") \
                    and result.get("carrier") == 1 and not result.get("timed_out") and e.get("remote_ns") \
                    and not result.get("already"):  # up before the wait began: stamped when asked, not when it came
                event = _on_harness_clock(offsets, host, result.get("t_ns", 0), e)
                nic = nic_of.get((host, result.get("interface")))
                lit = lit_at.get(nic.rx_port) if nic is not None else None
                if nic is not None and lit is not None and 0 < event - lit < 30e9:
                    out.link_up.setdefault(host, []).append((event - lit) / 1e9)
                    out.link_events.append((index, host, nic.rx_port, lit, event, alone.get(nic.rx_port, False)))
    for job in jobs:
        if job.ended is not None and job.started and not job.late:
            out.job_start.setdefault(job.ended_by, []).append((job.ended - max(job.started.values())) / 1e9)
            out.job_start_at.setdefault(job.ended_by, []).append(job.index)
    return out


READY_EVENTS = ("nccl_init", "communicator_ready")  # a job's communicator ready, in its ranks' own words


@dataclass
class _JobStart:
    """One start of the job: its ranks' process starts (harness clock) and what ended its start-up."""

    index: int  # the exchange of its first rank's start: the same in a recording and its replay
    world_size: int
    started: dict[str, int] = field(default_factory=dict)
    ended: int | None = None
    ended_by: str = ""
    # its ranks' own process start outlasted the start-up it emulates (an emulated job says so,
    # late_launch): its start-up is the machine's, not counted
    late: bool = False

    def ready(self, at_ns: int, by: str) -> None:
        # the ranks' own ready line is the start-up; a first step stands for it where no one asked
        if self.ended is None or (by == "communicator ready" and self.ended_by != by):
            self.ended, self.ended_by = at_ns, by


def _world_size(params: dict) -> int:
    command = params.get("command") or []
    if "--ranks" in command[:-1]:
        return len(str(command[command.index("--ranks") + 1]).split(","))
    try:
        return max(1, int((params.get("fields") or {}).get("world_size") or 1))
    except (TypeError, ValueError):
        return 1


def _job_of(jobs: list[_JobStart], host: str) -> _JobStart | None:
    """The latest start of the job with a rank on ``host``."""
    return next((job for job in reversed(jobs) if host in job.started), None)


def _late(result) -> bool:
    return isinstance(result, dict) and any("late_launch" in str(line) for line in result.get("last_lines") or [])


def _on_harness_clock(offsets: dict[str, tuple[int, int]], host: str, stamp: int, e: dict) -> int:
    """A host's stamp on the harness's clock (through the host's offset; without one, from this
    exchange's own reply)."""
    done = e.get("done_ns", e.get("t_ns", 0))
    offset = offsets[host][1] if host in offsets else (e["remote_ns"] - done if e.get("remote_ns") else 0)
    return stamp - offset


def _power_readings(e: dict, replies: registry.PowerReplies | None, name: str, units: dict,
                    bench) -> list[tuple[int, float]]:
    """(detector port, dBm) of each power reading in one exchange, read as the meter's model's
    registry entry says its replies read (``replies``); unit settings are tracked."""
    command = str(e.get("command") or "")
    reply = e.get("reply")
    found: list[tuple[int, float]] = []
    answers = str(reply).split(";") if isinstance(reply, str) else []
    parts = [p.strip() for p in command.split(";") if p.strip()]
    queries = [p for p in parts if p.split(None, 1)[0].endswith("?")]
    for part in parts:
        unit_set = replies.unit_set(part) if replies is not None else None
        if unit_set:
            units[(name, unit_set[0])] = unit_set[1]
    for part, answer in zip(queries, answers):
        pm = _PMON.match(part)
        if pm:
            values = [_number(v) for v in answer.strip().strip("()").split(",")]
            for port, value in zip(_ports(pm.group(3)), values):
                if value is not None:
                    found.append((port, value))
            continue
        channel = replies.reads(part) if replies is not None else None
        if replies is None or channel is None:
            continue
        unit = units.get((name, channel), replies.default_unit)
        value = _number(answer)
        det = next((d for d in bench.detectors if d.instrument == name and (d.channel or 1) == channel), None)
        if value is None or det is None or value > 1e20:
            continue
        found.append((det.port, _dbm(value, unit) + det.tap_loss_db))
    return found


# --- comparing replies -------------------------------------------------------------------------

def _numbers_equal(a: float, b: float, tol_db: float) -> bool:
    if a == b:
        return True
    if a > 0 and b > 0:
        if a < 1e-8 and b < 1e-8:  # both dark (below -50 dBm in watts)
            return True
        return abs(10 * math.log10(a / b)) <= tol_db
    if a <= -50 and b <= -50:  # both dark, in dBm
        return True
    return abs(a - b) <= tol_db


def _tokens(text: str) -> list[str]:
    return re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[A-Za-z_]+|[^\s\w]", text)


def differ(recorded: Any, replayed: Any, tol_db: float = POWER_TOLERANCE_DB) -> str | None:
    """Why two replies differ (None: they match within tolerance)."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in sorted(set(recorded) | set(replayed)):
            if key in UNCOMPARED_KEYS or key.endswith("_ns"):
                continue
            why = differ(recorded.get(key), replayed.get(key), tol_db)
            if why:
                return f"{key}: {why}"
        return None
    if isinstance(recorded, list) and isinstance(replayed, list):
        if len(recorded) != len(replayed):
            return f"{len(recorded)} items against {len(replayed)}"
        bad = [i for i, (a, b) in enumerate(zip(recorded, replayed)) if differ(a, b, tol_db)]
        if bad:
            return f"{len(bad)} of {len(recorded)} items differ (first: item {bad[0]}: " \
                   f"{differ(recorded[bad[0]], replayed[bad[0]], tol_db)})"
        return None
    if isinstance(recorded, bool) or isinstance(replayed, bool) or recorded is None or replayed is None:
        return None if recorded == replayed else f"{recorded!r} against {replayed!r}"
    if isinstance(recorded, (int, float)) and isinstance(replayed, (int, float)):
        return None if _numbers_equal(float(recorded), float(replayed), tol_db) else f"{recorded!r} against {replayed!r}"
    a, b = _tokens(str(recorded)), _tokens(str(replayed))
    if len(a) != len(b):
        return f"{str(recorded)[:60]!r} against {str(replayed)[:60]!r}"
    for x, y in zip(a, b):
        nx, ny = _number(x), _number(y)
        if nx is not None and ny is not None:
            if not _numbers_equal(nx, ny, tol_db):
                return f"{str(recorded)[:60]!r} against {str(replayed)[:60]!r}"
        elif x.upper() != y.upper():
            return f"{str(recorded)[:60]!r} against {str(replayed)[:60]!r}"
    return None


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
                    and isinstance(e.get("reply"), str) and _number(e["reply"]) is None  # a state, not a reading
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
            elif kind == "scpi":
                session = self._channels[entry["name"]]
                command = entry["command"]
                out["command"] = command
                if isinstance(entry.get("reply"), list):
                    out["reply"] = session.query_binary_floats(command)
                elif "?" in command:
                    out["reply"] = session.query(command)
                    if index in self.poll_exits:
                        out["reply"] = self._poll_until(lambda: session.query(command), index, out["reply"])
                else:
                    session.write(command)
                    out["reply"] = None
            elif kind == "serial":
                switch = self._channels[entry["name"]]
                command = entry["command"]
                out["command"] = command
                if "?" in command:
                    out["reply"] = switch._query(command)
                    if index in self.poll_exits:
                        out["reply"] = self._poll_until(lambda: switch._query(command), index, out["reply"])
                else:
                    switch._write(command)
                    out["reply"] = None
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


# --- the report --------------------------------------------------------------------------------

@dataclass
class Distribution:
    n: int
    median: float | None
    p10: float | None
    p90: float | None
    std: float | None
    spread: float | None  # robust: 1.4826 x the median absolute deviation (a normal's std; one late command moves it little)

    @classmethod
    def of(cls, values: Iterable[float]) -> "Distribution":
        v = sorted(values)
        if not v:
            return cls(0, None, None, None, None, None)
        q = (lambda p: v[min(len(v) - 1, int(p * len(v)))])
        median = statistics.median(v)
        return cls(len(v), median, q(0.1), q(0.9), statistics.pstdev(v) if len(v) > 1 else 0.0,
                   1.4826 * statistics.median(abs(x - median) for x in v))


# What difference matters, per kind, in the figure's own time base (the transcript's time scale):
# a fraction of the bench-file parameter that governs the kind, scaled as the bench scales it.
# A 10% change of a parameter is twice the margin: perf/fidelity_rates.py measures how often it is
# named, and how often a replay against the bench that made the recording is called different.
PARAMETER_MARGIN = 0.05  # switching per connection (and its spread), NIC bring-up, the job's start-up
LIGHT_MARGIN = 0.25  # light arrival: the harness's own polling of the meters is in it; of the recording's figure
AGENT_MARGIN = 1.0  # a plain agent call's round trip: software, at wall time (never scaled); of the quicker side's
POWER_MARGIN_DB = 0.25  # light at a detector (half of the 0.5 dB a lab must see; readings' noise: 0.02 dB)
# A detector's light takes a tenth of a timing kind's share of the report's false-alarm rate: its
# differences are tens of times its noise, the timings' a few times theirs.
LIGHT_WEIGHT = 0.1


def _paired(before: dict, after: dict) -> tuple[list[float], list[float], bool]:
    """The samples of the exchanges both sides have, as pairs (a replayed exchange keeps the
    recorded one's place, so its difference cancels what the two share: the command, the
    connections it made, the emulator's draw for them); where fewer than two pair, every sample
    of each side, unpaired."""
    common = sorted(set(before) & set(after))
    if len(common) >= 2:
        return [before[i] for i in common], [after[i] for i in common], True
    return list(before.values()), list(after.values()), False


def _by_index(values: list[float], at: list) -> dict:
    return dict(zip(at, values))


def _deviations(groups: list[dict[int, float]]) -> dict[int, float]:
    """Each sample's distance from its group's median: the spread, without the groups' own
    difference (one-connection commands against commands of several)."""
    out = {}
    for group in groups:
        if group:
            middle = statistics.median(group.values())
            out.update({at: abs(v - middle) for at, v in group.items()})
    return out


def _location(values: Iterable[float]) -> float:
    v = list(values)
    return float(decisions.stats.trim_mean(v, decisions.TRIM)) if v else 0.0


def compare(bench, recorded: list[dict], replayed: list[dict], time_scale: float, *,
            alpha: float = decisions.FIDELITY_ALPHA) -> dict:
    """The side-by-side report: replies that differ, each timing kind and each detector's light
    as a decision (harness/decisions.py; all of them together at the false-alarm rate
    ``alpha``), the bench-file parameters the differences point at, the differences no
    parameter that calibrate fits explains, and the verdict."""
    by_index = {r["index"]: r for r in replayed}
    ordered = sorted(recorded, key=lambda x: x["t_ns"])
    replies = []
    informational = 0
    shifted = 0
    starts = [e["t_ns"] for e in ordered]
    occurrences: dict[tuple, list[int]] = {}  # (channel, command) -> where it was sent, in order
    switch = bench.topology.switch
    changes = sorted((e["t_ns"], e.get("done_ns", e["t_ns"])) for e in ordered
                     if e.get("type") in ("fault", "repair", "heal") or
                     (e.get("name") == switch and re.search(r"CONN|DISC|PORT:(DIS|ENAB)|X\d+ CH", str(e.get("command")),
                                                            re.IGNORECASE)))
    for index, entry in enumerate(ordered):
        if entry.get("type") in ("scpi", "serial", "agent"):
            occurrences.setdefault((entry.get("name"), entry.get("command") or entry.get("method")), []).append(index)
    for index, entry in enumerate(ordered):
        if entry.get("type") not in ("scpi", "serial", "agent"):
            continue
        other = by_index.get(index)
        what = entry.get("command") or entry.get("method")
        if other is None:
            replies.append({"index": index, "name": entry.get("name"), "exchange": what, "why": "not replayed"})
            continue
        if bool(entry.get("error")) != bool(other.get("error")):
            why: str | None = f"error on the {'recording' if entry.get('error') else 'replay'} only: " \
                  f"{entry.get('error') or other.get('error')}"
        elif entry["type"] == "agent" and entry.get("method") in POLL_METHODS:
            # progress read at a moment: what both had by then must agree
            had = [s[0] if isinstance(s, list) and s else s for s in entry.get("result") or []]
            has = [s[0] if isinstance(s, list) and s else s for s in other.get("result") or []]
            why = differ(had[:len(has)], has[:len(had)]) if not entry.get("error") else None
        else:
            key = "result" if entry["type"] == "agent" else "reply"
            why = differ(entry.get(key), other.get(key)) if not entry.get("error") else None
        if why is None:
            continue
        identity = (entry["type"] == "agent" and entry.get("method") in IDENTITY_METHODS) or \
            (entry["type"] != "agent" and IDENTITY_COMMANDS.search(str(what)))
        if identity:
            informational += 1
            continue
        replied = other.get("result" if entry["type"] == "agent" else "reply")
        if entry["type"] == "scpi" and POLL_COMMANDS.match(str(what).strip()) and not entry.get("error") and \
                str(entry.get("reply")).split(",")[0] == str(replied).split(",")[0]:
            shifted += 1  # the same function, polled at another moment of its run
            continue
        if _near_a_change(changes, entry):
            shifted += 1  # what it saw was changing at that moment (a fault, a switch): timing
            continue
        if other.get("error") and not entry.get("error") and _still_running(ordered, by_index, index):
            shifted += 1  # a function's result asked for while the replay's run of it still went on: timing
            continue
        if not entry.get("error") and not other.get("error") and \
                _shifted(ordered, starts, occurrences.get((entry.get("name"), what), []), index, replied):
            shifted += 1  # the same answers, at another moment: timing, judged with the kinds below
            continue
        replies.append({"index": index, "name": entry.get("name"), "exchange": what, "why": why})
    a, b = analyse(bench, ordered), analyse(bench, sorted(replayed, key=lambda x: x["t_ns"]))
    family = decisions.Family(alpha, "fidelity")
    shown: dict[str, tuple[list[float], list[float], bool, str]] = {}  # label -> samples, paired, unit

    def add(label: str, before: dict[int, float], after: dict[int, float], margin: float, unit: str = "s") -> None:
        x, y, paired = _paired(before, after)
        shown[label] = (list(before.values()), list(after.values()), paired, unit)
        family.add(label, x, y, margin=margin, what=label, unit=unit, paired=paired)

    scale = time_scale or 1.0
    switching_s = bench.switch.emulation.switching_time_s * scale if bench.switch.emulation.switching_time_s else None
    single_a, single_b = a.per_connection_at(True), b.per_connection_at(True)
    multi_a, multi_b = a.per_connection_at(False), b.per_connection_at(False)
    per_connection_s = switching_s or _location(list(single_a.values()) + list(multi_a.values()))
    add("switch per connection", {**single_a, **multi_a}, {**single_b, **multi_b}, PARAMETER_MARGIN * per_connection_s)
    add("switch per connection (one-connection commands)", single_a, single_b, PARAMETER_MARGIN * per_connection_s)
    add("switch per connection (multi-connection commands)", multi_a, multi_b, PARAMETER_MARGIN * per_connection_s)
    add("switch per connection (spread)", _deviations([single_a, multi_a]), _deviations([single_b, multi_b]),
        PARAMETER_MARGIN * per_connection_s)
    light_a, light_b = _by_index(a.light, a.light_at), _by_index(b.light, b.light_at)
    add("light", light_a, light_b, LIGHT_MARGIN * _location(light_a.values()))
    hosts = {h.name: h for h in bench.topology.hosts}

    def bringup_s(host: str) -> float:
        emulation = hosts[host].emulation if host in hosts else None
        return (emulation.lock_time_s + emulation.link_up_time_s) * scale if emulation else 0.0

    every_a: dict[int, float] = {}
    every_b: dict[int, float] = {}
    in_commands_of_several: list[str] = []
    for host in sorted(set(a.link_up) | set(b.link_up)):
        # Circuits each made by a command of its own say best when their light came; where a
        # host has none, its NICs' bring-up is measured from an estimate inside a command of
        # several connections, which a difference of switching moves (not judged then).
        alone_a = {i: (e - l) / 1e9 for i, h, _, l, e, single in a.link_events if h == host and single}
        alone_b = {i: (e - l) / 1e9 for i, h, _, l, e, single in b.link_events if h == host and single}
        if alone_a and alone_b:
            label, x, y = f"link_up {host}", alone_a, alone_b
        else:
            label = f"link_up {host} (in multi-connection commands)"
            x = {i: (e - l) / 1e9 for i, h, _, l, e, _ in a.link_events if h == host}
            y = {i: (e - l) / 1e9 for i, h, _, l, e, _ in b.link_events if h == host}
            in_commands_of_several.append(label)
        add(label, x, y, PARAMETER_MARGIN * (bringup_s(host) or _location(x.values())))
        every_a.update(x)
        every_b.update(y)
    if len(set(a.link_up) | set(b.link_up)) > 1:
        # One NIC family for every host (a bench whose every NIC locks slower): few samples a host
        # cannot show it, all of them together can.
        bringups = [bringup_s(h) for h in sorted(set(a.link_up) | set(b.link_up))]
        add("link_up every host", every_a, every_b,
            PARAMETER_MARGIN * (statistics.mean(bringups) if all(bringups) else _location(every_a.values())))
        if in_commands_of_several:
            in_commands_of_several.append("link_up every host")
    for host in sorted(set(a.agent) | set(b.agent)):
        x, y = _by_index(a.agent.get(host, []), a.agent_at.get(host, [])), \
            _by_index(b.agent.get(host, []), b.agent_at.get(host, []))
        # a difference as large as the quicker side's own round trip
        add(f"agent {host}", x, y, AGENT_MARGIN * min(_location(x.values()) or 1.0, _location(y.values()) or 1.0))
    if a.job_start or b.job_start:
        # One start-up for every rank (job.startup_time_s): each start of the job, paired with
        # its replay (whatever ended it: the same exchanges on both sides)
        x = {i: v for k in a.job_start for i, v in zip(a.job_start_at[k], a.job_start[k])}
        y = {i: v for k in b.job_start for i, v in zip(b.job_start_at[k], b.job_start[k])}
        startup_s = bench.job.startup_time_s * scale if bench.job is not None and bench.job.startup_time_s else 0.0
        add("job_start", x, y, PARAMETER_MARGIN * (startup_s or _location(x.values())))
    light_samples = _light_samples(a, b)
    for (instrument, ingress, egress), (xs, ys) in sorted(light_samples.items()):
        family.add(("light", instrument, ingress, egress), xs, ys, margin=POWER_MARGIN_DB,
                   what=f"light {ingress}->{egress} at {instrument}", unit="dB", paired=True, weight=LIGHT_WEIGHT)
    decided = family.decide()
    switching = [decided[k] for k in ("switch per connection", "switch per connection (one-connection commands)",
                                      "switch per connection (multi-connection commands)")]
    switching_differs = any(d.verdict == decisions.Verdict.DIFFERS for d in switching)
    kinds: dict[str, dict] = {}
    for label, (xs, ys, paired, unit) in shown.items():
        decision = decided[label]
        judged = not (switching_differs and label in in_commands_of_several)
        match = {decisions.Verdict.DIFFERS: False, decisions.Verdict.SAME: True}.get(decision.verdict) if judged else None
        kinds[label] = {"recorded": Distribution.of(xs).__dict__, "replayed": Distribution.of(ys).__dict__,
                        "paired": paired, "decision": decision.as_dict(), "judged": judged, "match": match}
    powers = _powers(decided, light_samples)
    parameters, unexplained = _parameters(bench, kinds, powers)
    power_replies = {r.index for r in a.readings} | {r.index for r in b.readings}
    judged_replies = [r for r in replies if r["index"] not in power_replies]  # readings: judged per detector
    matched = not judged_replies and not powers["differing"] and all(k["match"] is not False for k in kinds.values())
    return {"time_scale": time_scale, "exchanges": len([e for e in ordered if e.get("type") in ("scpi", "serial", "agent")]),
            "replies_differing": judged_replies, "readings_differing": len(replies) - len(judged_replies),
            "identity_replies_differing": informational,
            "replies_shifted_in_time": shifted, "timing": kinds, "powers": powers, "parameters": parameters,
            "unexplained": unexplained, "false_alarm_rate": alpha, "decisions": family.size, "match": matched}


SHIFT_WINDOW_NS = 25_000_000  # a reply the recording gave to the same request this close in time
TRACE_SHIFT = 0.2  # a trace (a logged block) whose samples differ only at a light edge, this fraction at most


def _shifted(ordered: list[dict], starts: list[int], sent_at: list[int], index: int, replayed: Any) -> bool:
    """Whether a replayed reply is one the recording gave to the same command a little earlier
    or later (a poll that saw the light one poll sooner), or a trace whose light came a few
    samples sooner or later: a difference of timing, not of behaviour."""
    recorded = ordered[index].get("reply")
    if isinstance(recorded, list) and isinstance(replayed, list) and len(recorded) == len(replayed) and recorded:
        lit = [(_lit(a), _lit(b)) for a, b in zip(recorded, replayed)]
        edges = {i for i in range(1, len(lit)) for side in (0, 1) if lit[i][side] != lit[i - 1][side]}
        near_edge = {j for i in edges for j in (i - 1, i, i + 1)}
        mismatched = sum(x != y for x, y in lit)
        same_side_differ = any(differ(a, b) for i, ((x, y), a, b) in enumerate(zip(lit, recorded, replayed))
                               if x == y and i not in near_edge)
        return not same_side_differ and mismatched <= TRACE_SHIFT * len(recorded)
    key = "result" if ordered[index].get("type") == "agent" else "reply"
    t = ordered[index]["t_ns"]
    # ordered is in time order and sent_at in index order: the window's first sending by bisection
    lo = bisect.bisect_left(sent_at, bisect.bisect_left(starts, t - SHIFT_WINDOW_NS))
    window = []
    for j in sent_at[lo:]:
        if ordered[j]["t_ns"] > t + SHIFT_WINDOW_NS:
            break
        if j != index:
            window.append(ordered[j].get(key))
    if any(differ(reply, replayed) is None for reply in window):
        return True
    # a reading taken as the light came or went: between what the recording read around it
    value, numbers = _number(replayed), [_number(r) for r in window]
    around = [x for x in numbers if x is not None]
    return value is not None and len(around) >= 2 and min(around) <= value <= max(around)


def _still_running(ordered: list[dict], by_index: dict, index: int) -> bool:
    """Whether the replay's last poll of the same instrument's function, before this exchange,
    answered that it was still running (``...,PROGRESS``): a result asked for then is refused on
    the replay only for a matter of timing."""
    name = ordered[index].get("name")
    for j in range(index - 1, max(-1, index - 200), -1):
        entry = ordered[j]
        if entry.get("name") == name and POLL_COMMANDS.match(str(entry.get("command") or "").strip()):
            reply = (by_index.get(j) or {}).get("reply")
            return isinstance(reply, str) and reply.strip().upper().endswith("PROGRESS")
    return False


def _near_a_change(changes: list[tuple[int, int]], entry: dict) -> bool:
    """Whether a change of the bench (a fault made or undone, a switch command) was under way
    within SHIFT_WINDOW_NS of the exchange."""
    t, done = entry["t_ns"] - SHIFT_WINDOW_NS, entry.get("done_ns", entry["t_ns"]) + SHIFT_WINDOW_NS
    i = bisect.bisect_left(changes, (t - 60_000_000_000, 0))
    for start, end in changes[i:]:
        if start > done:
            return False
        if end >= t:
            return True
    return False


def _lit(value: Any) -> bool:
    """A sample that sees light: above -40 dBm, or above 0.1 uW where it is in watts."""
    x = _number(value)
    if x is None:
        return False
    return x > 1e-7 if 0 < x < 1 else x > DARK_DBM


def _light_samples(a: Analysis, b: Analysis) -> dict[tuple[str, int, int], tuple[list[float], list[float]]]:
    """Per detector and path (instrument, ingress, egress): the readings lit in both, as pairs
    (dBm), recording first. A path is the unit calibrate fits a loss to; a detector the unit
    that can read otherwise than another at the same port."""
    replayed = {(r.index, r.instrument, r.port): r for r in b.readings}
    out: dict[tuple[str, int, int], tuple[list[float], list[float]]] = {}
    for position, r in enumerate(a.readings):
        other = replayed.get((r.index, r.instrument, r.port))
        path = a.paths.get(position)
        if other is None or path is None or r.dbm <= DARK_DBM or other.dbm <= DARK_DBM:
            continue
        x, y = out.setdefault((r.instrument, *path), ([], []))
        x.append(r.dbm)
        y.append(other.dbm)
    return out


def _powers(decided: dict, samples: dict) -> dict:
    """The light decisions, per detector and path, and what differs."""
    per_detector = {}
    differing = []
    for (instrument, ingress, egress) in sorted(samples, key=lambda k: (k[2], k[1], k[0])):
        decision = decided[("light", instrument, ingress, egress)]
        per_detector[f"{ingress}->{egress} {instrument}"] = decision.as_dict()
        if decision.verdict == decisions.Verdict.DIFFERS:
            differing.append({"path": f"{ingress}->{egress}", "instrument": instrument, "db": round(decision.effect, 3)})
    return {"per_detector": per_detector, "differing": differing}


def _parameters(bench, kinds: dict, powers: dict) -> tuple[list[dict], list[dict]]:
    """The bench-file parameters that the differences point at (those ``calibrate`` fits), and
    the differences none of them explains (a lab's physics the emulation is not told)."""
    switch = f"instruments.{bench.topology.switch}.emulation"
    named: list[dict] = []
    unexplained: list[dict] = []

    def decision(label: str) -> dict | None:
        k = kinds.get(label)
        return k["decision"] if k is not None and k["judged"] else None

    def differs(d: dict | None) -> TypeGuard[dict]:
        return d is not None and d["verdict"] == decisions.Verdict.DIFFERS.value

    def ms(d: dict | None) -> str:
        assert d is not None, "a figure is shown only for a decision that was made"
        return f"{d['effect'] * 1000:+.2f} ms ({d['low'] * 1000:+.2f} .. {d['high'] * 1000:+.2f})"

    every = decision("switch per connection")
    one = decision("switch per connection (one-connection commands)")
    several = decision("switch per connection (multi-connection commands)")
    if differs(every) or differs(one) or differs(several):
        both = [d for d in (one, several) if d is not None and d["low"] is not None]
        # Switching differs alike in commands of one connection and of several: the switch's time
        # per connection. Differently (apart by more than the margin): time that depends on how
        # many a command makes, which no parameter of the emulated switch that calibrate fits has.
        apart = len(both) == 2 and (both[0]["low"] - both[1]["high"] > both[0]["margin"]
                                    or both[1]["low"] - both[0]["high"] > both[0]["margin"])
        if not apart or (differs(one) and differs(several) and (one["effect"] > 0) == (several["effect"] > 0)):
            named.append({"parameter": f"{switch}.switching_time_s", "because": "switching takes another time: "
                          + "; ".join(f"{what} {ms(d)}" for what, d in (("every command", every), ("one connection", one),
                                                                        ("several", several)) if differs(d))})
        if apart:
            unexplained.append({"what": "switch time per connection by command size",
                                "because": f"switching per connection differs by {ms(one)} in commands of one "
                                           f"connection and by {ms(several)} in commands of several: the switch's "
                                           "time per connection depends on how many a command makes (an emulated "
                                           f"switch: {switch}.multi_connection_extra_s)"})
    if differs(decision("switch per connection (spread)")):
        named.append({"parameter": f"{switch}.switching_jitter_s", "because": "switching times spread otherwise: "
                      + ms(decision("switch per connection (spread)"))})
    switching = differs(every) or differs(one) or differs(several)
    if differs(decision("light")) and not switching:
        unexplained.append({"what": "light arrival", "because": f"light reaches the detectors {ms(decision('light'))} "
                                                                "otherwise after a switch command that took its time"})
    link_hosts = []
    for label, k in kinds.items():
        if not differs(decision(label)):
            continue
        kind, _, host = label.partition(" ")
        host = host.split(" ")[0]
        d = decision(label)
        if kind == "link_up" and host != "every":
            link_hosts.append(host)
            named.append({"parameter": f"topology.hosts.{host}.emulation.lock_time_s+link_up_time_s",
                          "because": f"{host}'s NICs come up at another time after light: {ms(d)}"})
        elif kind == "agent":
            unexplained.append({"what": f"agent {host}",
                                "because": f"{host}'s agent answers a plain call {ms(d)} otherwise: the host or the "
                                           "network to it, which no parameter calibrate fits has (an emulated host: "
                                           f"topology.hosts.{host}.emulation.management_latency_s)"})
        elif kind == "job_start":
            named.append({"parameter": "job.startup_time_s", "because": f"the job starts at another time: {ms(d)}"})
    if differs(decision("link_up every host")) and not link_hosts:
        named.append({"parameter": "topology.hosts.*.emulation.lock_time_s+link_up_time_s",
                      "because": f"every host's NICs come up at another time after light: "
                                 f"{ms(decision('link_up every host'))}"})
    # Light, per path: where every detector of a path differs alike, the path has another loss;
    # where one differs while another on the same path does not (shown the same, or its estimate
    # within the margin where its few readings cannot show it), a detector reads otherwise (its
    # own offset), which no loss explains. The difference itself is the decision's; which of
    # the two it is, is read from the path's other detectors.
    by_path: dict[str, dict[str, dict]] = {}
    for key, d in powers["per_detector"].items():
        path, instrument = key.split(" ", 1)
        by_path.setdefault(path, {})[instrument] = d
    lossy: dict[int, list[float]] = {}
    offsets: dict[int, list[str]] = {}
    for path, at_path in by_path.items():
        off = {i: d for i, d in at_path.items() if d["verdict"] == decisions.Verdict.DIFFERS.value}
        if not off:
            continue
        egress = int(path.split("->")[1])
        agree = [i for i, d in at_path.items() if d["verdict"] == decisions.Verdict.SAME.value or (
            d["verdict"] != decisions.Verdict.DIFFERS.value and d["effect"] is not None
            and abs(d["effect"]) <= d["margin"])]
        if agree:
            offsets.setdefault(egress, []).extend(f"{i} reads {d['effect']:+.2f} dB otherwise on {path} where "
                                                  f"{', '.join(agree)} agrees" for i, d in off.items())
        else:
            lossy.setdefault(egress, []).extend(d["effect"] for d in off.values())
    for port, what in sorted(offsets.items()):
        unexplained.append({"what": f"detector offset at port {port}",
                            "because": "; ".join(what) + ": a detector's own offset, which no loss explains (an "
                                                         "emulated meter: instruments.<meter>.emulation.offset_db)"})
    if lossy:
        shifts = {port: statistics.mean(v) for port, v in lossy.items()}
        ports_lit = {int(path.split("->")[1]) for path in by_path}
        alike = set(shifts) == ports_lit and max(shifts.values()) - min(shifts.values()) <= POWER_MARGIN_DB
        named.append({"parameter": f"{switch}.{'insertion_loss_db' if alike else 'port_loss_db'}",
                      "because": "light differs at ports " + ", ".join(f"{p} ({m:+.2f} dB)"
                                                                       for p, m in sorted(shifts.items()))})
    return named, unexplained


def render(report: dict) -> str:
    """The report as text."""
    lines = [f"fidelity: {report['exchanges']} exchanges replayed (time scale {report['time_scale']:g}); "
             f"{report['decisions']} decisions, false-alarm rate {report['false_alarm_rate']:.2%} for all of them "
             "together (harness/decisions.py)"]

    def ms(x):
        return "-" if x is None else f"{x * 1000:.2f}"

    lines.append(f"{'kind':50} {'n rec':>5} {'median rec':>10} {'n rep':>5} {'median rep':>10}  "
                 "replay - recording (interval; margin), ms: verdict")
    for label, k in report["timing"].items():
        a, b, d = k["recorded"], k["replayed"], k["decision"]
        stat = "spread" if label.endswith("(spread)") else "median"
        what = f"{d['effect'] * 1000:+.2f} ({ms(d['low'])} .. {ms(d['high'])}; {ms(d['margin'])})" \
            if d["effect"] is not None and d["low"] is not None else f"({d['why']})"
        verdict = d["verdict"] if k["judged"] else "not judged (switching differs)"
        lines.append(f"{label:50} {a['n']:5} {ms(a[stat]):>10} {b['n']:5} {ms(b[stat]):>10}  {what}"
                     f"{' paired' if k['paired'] else ''}: {verdict}")
    detectors = report["powers"]["per_detector"]
    lines.append("light, replay minus recording (dB) per detector: " + (", ".join(
        f"{key}: {d['effect']:+.2f}{' DIFFERS' if d['verdict'] == 'differs' else ''}" for key, d in detectors.items())
        or "no lit readings"))
    differing = report["replies_differing"]
    lines.append(f"replies that differ: {len(differing)} (not judged here: power readings "
                 f"{report.get('readings_differing', 0)}, judged per detector above; identity replies "
                 f"{report['identity_replies_differing']}; the same replies at another moment, or while the bench "
                 f"was changing: {report['replies_shifted_in_time']})")
    for r in differing[:20]:
        lines.append(f"  #{r['index']} {r['name']} {r['exchange']!s:.50}: {r['why']}")
    if len(differing) > 20:
        lines.append(f"  ... and {len(differing) - 20} more")
    if report["parameters"]:
        lines.append("parameters that differ:")
        lines += [f"  {p['parameter']}: {p['because']}" for p in report["parameters"]]
    if report["unexplained"]:
        lines.append("differences no parameter that calibrate fits explains:")
        lines += [f"  {u['what']}: {u['because']}" for u in report["unexplained"]]
    lines.append("verdict: " + ("MATCH: no difference beyond its margin shown" if report["match"] else "DIFFERS"))
    return "\n".join(lines) + "\n"


def fidelity(bench, path, *, speed: float = 1.0) -> dict:
    """Replay the transcript at ``path`` against ``bench``; the report."""
    header, entries = transcript.read(path)
    replayed = Replayer(bench, header, entries, speed=speed).run()
    return compare(bench, entries, replayed, header.get("time_scale", 1.0))
