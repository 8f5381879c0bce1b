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

import re
import statistics
from dataclasses import dataclass
from typing import Iterable, TypeGuard

from lumion_hil.harness import decisions
from lumion_hil.harness.reply_diff import (IDENTITY_COMMANDS, IDENTITY_METHODS, POLL_COMMANDS, POLL_METHODS,
                                           differ, near_a_change, shifted_in_time, still_running)
from lumion_hil.harness.transcript_analysis import DARK_DBM, Analysis, analyse
from lumion_hil.harness.transcript_replay import Replayer
from lumion_hil.instruments import transcript

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
    from scipy import stats  # at the first report, as harness/decisions.py imports it

    v = list(values)
    return float(stats.trim_mean(v, decisions.TRIM)) if v else 0.0


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
        if entry["type"] != "agent" and entry.get("reply") is not None and other.get("reply") is None \
                and not entry.get("error") and not other.get("error"):
            # a query answered on the recording and not at all on the replay, with no error: the
            # line was not asked as a query (or not sent), never a matter of timing
            replies.append({"index": index, "name": entry.get("name"), "exchange": what, "why": why})
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
        if near_a_change(changes, entry):
            shifted += 1  # what it saw was changing at that moment (a fault, a switch): timing
            continue
        if other.get("error") and not entry.get("error") and still_running(ordered, by_index, index):
            shifted += 1  # a function's result asked for while the replay's run of it still went on: timing
            continue
        if not entry.get("error") and not other.get("error") and \
                shifted_in_time(ordered, starts, occurrences.get((entry.get("name"), what), []), index, replied):
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

