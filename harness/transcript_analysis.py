"""What a transcript (``lumion-hil run --record``, instruments/transcript.py) says happened on
a bench, read from outside as the harness saw it: the switch's connections and their durations,
the light each reading saw at each detector, each NIC's carrier after its light, each agent
call's round trip and each start of the job (its last rank's launch to its communicator ready,
or to its first step). ``lumion-hil fidelity`` (harness/fidelity.py) compares two of these, a
recording's and its replay's; ``lumion-hil calibrate`` (harness/calibrate.py) fits a twin to
one."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, cast

from lumion_hil.instruments import registry

# Agent calls that only ask (no waiting, no effect): their round trip is the agent's and its network's
FAST_METHODS = {"clock", "health", "links", "link", "job_status", "job_steps", "devices"}

DARK_DBM = -40.0  # below this a detector sees no light (every emulated floor is under -50 dBm)

# --- reading a transcript ----------------------------------------------------------------------

_PAIRS = re.compile(r"\(@([\d,\s:]*)\)\s*,\s*\(@([\d,\s:]*)\)")
_CONNECT = re.compile(r":?OXC:SWIT(CH)?:CONN(ECT)?:(ADD|ONLY)\b", re.IGNORECASE)
_SUB = re.compile(r":?OXC:SWIT(CH)?:CONN(ECT)?:SUB\b", re.IGNORECASE)
_DISC_ALL = re.compile(r":?OXC:SWIT(CH)?:DISC(ONNECT)?:ALL\b", re.IGNORECASE)
_PMON = re.compile(r":?PMON(ITOR)?:POW(ER)?\?\s*\(@([\d,\s]+)\)", re.IGNORECASE)


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


def parse_number(text: Any) -> float | None:
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
    # how each instrument's transcript reads: its model's registry entry (None: not registered here)
    registered = {name: registry.find(spec.model) for name, spec in bench.instruments.items()}
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
            values = [parse_number(v) for v in answer.strip().strip("()").split(",")]
            for port, value in zip(_ports(pm.group(3)), values):
                if value is not None:
                    found.append((port, value))
            continue
        channel = replies.reads(part) if replies is not None else None
        if replies is None or channel is None:
            continue
        unit = units.get((name, channel), replies.default_unit)
        value = parse_number(answer)
        det = next((d for d in bench.detectors if d.instrument == name and (d.channel or 1) == channel), None)
        if value is None or det is None or value > 1e20:
            continue
        found.append((det.port, _dbm(value, unit) + det.tap_loss_db))
    return found


