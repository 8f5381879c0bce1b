"""A digital twin of a recorded bench (``lumion-hil calibrate``): the emulation sections of a
bench file fitted to one or more transcripts (``lumion-hil run --record``).

Fitted, each from what the harness saw through the drivers and agents (harness/transcript_analysis.py's
analysis of the exchanges), never from the recorded bench's own settings:

- switching time per connection, as a distribution (mean and spread): the switch commands'
  durations to ``*OPC?`` against the connections each made, less the commands' own round trip
  (the commands that made none);
- loss per port pair: each lit reading of a detector against the light its path launched
  (the NIC's launch power less its fibre and the connectors), the median per pair, read at the
  switch's own monitor where one is on the path (a meter's offset is not the pair's loss): the
  least lossy pair is the switch's insertion loss, each other pair's excess its connection loss;
- meter and monitor noise: the spread of back-to-back readings of an unchanged path;
- NIC lock and bring-up per host: a circuit lit to its NIC's carrier as the agent stamped it
  (the two are not separable from outside: split as the bench file splits them);
- the job's start-up: a job started to its first step, less one step.

Timings come at the transcript's time scale and are written at real time. What the harness's
own software adds to a timing (a process's start, a command's round trip) is in the recording
and in the twin alike; one refining replay of the transcript against the first fit corrects
the timings that carry it (switching per connection, the job's start, the NICs' bring-up as
their agents stamp it) by what still differs (``refine``). Every number carries its source: the
transcripts and how many samples.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lumion_hil.harness import transcript_analysis
from lumion_hil.harness.transcript_replay import Replayer
from lumion_hil.instruments import transcript


@dataclass
class Fit:
    """The fitted numbers: path in the bench file -> (value, source)."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def set(self, path: str, value: Any, source: str) -> None:
        self.values[path] = (value, source)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def fit(bench, transcripts: list[tuple[str, dict, list[dict]]]) -> Fit:
    """Fit the bench's emulation to the transcripts ((path, header, entries) each)."""
    out = Fit()
    names = ", ".join(Path(p).name for p, _, _ in transcripts)
    analyses = []
    for path, header, entries in transcripts:
        scale = header.get("time_scale") or 1.0
        analyses.append((transcript_analysis.analyse(bench, sorted(entries, key=lambda e: e["t_ns"])), scale))
    switch = f"instruments.{bench.topology.switch}.emulation"

    # Switching: duration = overhead + sum of the connections' times.
    durations, counts, overheads = [], [], []
    for a, scale in analyses:
        durations += [d / scale for d, _ in a.switch]
        counts += [n for _, n in a.switch]
        overheads += [o / scale for o in a.switch_overhead]
    if durations:
        o = _median(overheads) if overheads else 0.0
        var_o = statistics.pvariance(overheads) if len(overheads) > 1 else 0.0
        mean = max(0.0, sum(d - o for d in durations) / sum(counts))
        residual = sum((d - o - n * mean) ** 2 - var_o for d, n in zip(durations, counts))
        spread = math.sqrt(max(0.0, residual / sum(counts)))
        source = f"{names}: {len(durations)} switch commands, {sum(counts)} connections, less the round trip of " \
                 f"{len(overheads)} that made none"
        out.set(f"{switch}.switching_time_s", round(mean, 5), source)
        out.set(f"{switch}.switching_jitter_s", round(spread, 5), source)

    # Losses per pair.
    launch = {}
    for host in bench.topology.hosts:
        for nic in host.nics:
            launch[nic.tx_port] = nic.launch_dbm - nic.tx_fibre_loss_db
    # A pair's loss is read at the switch's own monitor where it has one on the path: a meter
    # elsewhere on it may read with an offset of its own (out of calibration), which is no loss
    # of the pair; pooled with the monitor's readings, the median took one or the other as the
    # two detectors' counts fell (fitted_on's 2-21 as 0 or 0.8 dB, run to run).
    by_detector: dict[tuple[int, int], dict[str, list[float]]] = {}
    for a, _ in analyses:
        for position, (ingress, egress) in a.paths.items():
            reading = a.readings[position]
            if ingress in launch:
                by_detector.setdefault((ingress, egress), {}).setdefault(reading.instrument, []).append(
                    launch[ingress] - bench.topology.connector_loss_db - reading.dbm)
    monitor = bench.topology.switch
    losses = {pair: at.get(monitor) or [v for values in at.values() for v in values] for pair, at in by_detector.items()}
    if losses:
        per_pair = {pair: _median(v) for pair, v in losses.items()}
        base = min(per_pair.values())
        n = sum(len(v) for v in losses.values())
        out.set(f"{switch}.insertion_loss_db", round(max(0.0, base), 3),
                f"{names}: the least lossy of {len(per_pair)} port pairs ({n} lit readings)")
        out.set(f"{switch}.port_loss_db", {}, "losses are fitted per port pair (connection_loss_db)")
        extra = {f"{i}-{e}": round(v - base, 3) for (i, e), v in sorted(per_pair.items()) if v - base > 0.05}
        out.set(f"{switch}.connection_loss_db", extra,
                f"{names}: median excess per port pair over the least lossy ({n} lit readings)")

    # Noise: back-to-back lit readings of one port with no change between them.
    spreads: dict[str, list[float]] = {}
    for a, _ in analyses:
        previous: dict[tuple[str, int], transcript_analysis.Reading] = {}
        for position, r in enumerate(a.readings):
            key = (r.instrument, r.port)
            p = previous.get(key)
            if p is not None and p.dbm > transcript_analysis.DARK_DBM and r.dbm > transcript_analysis.DARK_DBM and abs(r.dbm - p.dbm) < 1.0 \
                    and position in a.paths:
                spreads.setdefault(r.instrument, []).append(r.dbm - p.dbm)
            previous[key] = r
    for instrument, diffs in spreads.items():
        if len(diffs) < 5 or instrument not in bench.instruments:
            continue
        sigma = math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2)
        noise_key = "monitor_noise_db" if instrument == bench.topology.switch else "noise_db"
        out.set(f"instruments.{instrument}.emulation.{noise_key}", round(sigma, 4),
                f"{names}: {len(diffs)} back-to-back lit readings")

    # NIC bring-up per host.
    for host in bench.topology.hosts:
        use, alone = _bringup([(a, scale) for a, scale in analyses], host.name)
        if not use:
            continue
        total = _median(use)
        emu = host.emulation
        share = emu.lock_time_s / (emu.lock_time_s + emu.link_up_time_s) if emu.lock_time_s + emu.link_up_time_s else 0.05
        source = (f"{names}: {len(use)} carrier events after their circuit lit"
                  f"{' (circuits each made by a command of its own)' if alone else ''}; lock and bring-up split as the bench file "
                  f"splits them ({share:.0%} lock)")
        path = f"topology.hosts.{host.name}.emulation"
        out.set(f"{path}.lock_time_s", round(total * share, 5), source)
        out.set(f"{path}.link_up_time_s", round(total * (1 - share), 5), source)

    # Job start-up.
    steps = [s / scale for a, scale in analyses for s in a.step_s]
    step = _median(steps) if steps else 0.0
    starts = [v for a, scale in analyses for v in _startups(a, scale, step)]
    if starts and bench.job is not None:
        ready = sum(len(a.job_start.get("communicator ready", [])) for a, _ in analyses)
        out.set("job.startup_time_s", round(max(0.0, _median(starts)), 4),
                f"{names}: {len(starts)} job starts from their last rank's process start, {ready} to the ranks' "
                f"communicator ready, the others to their first step less one step ({len(steps)} steps)")
    return out


def _startups(a, scale: float, step_s: float) -> list[float]:
    """A transcript's job start-ups at real time: to the communicator ready where the ranks
    said it, else to the first step less one step (``step_s``, real time)."""
    ready = [v / scale for v in a.job_start.get("communicator ready", [])]
    return ready + [max(0.0, v / scale - step_s) for v in a.job_start.get("first step", [])]


def _bringup(analyses, host: str) -> tuple[list[float], bool]:
    """A host's NIC bring-up samples (real time): those of circuits each made by a command of
    its own where there are any (the instant such a circuit lit is known best), else all; and
    which they are."""
    every, alone = [], []
    for a, scale in analyses:
        for _, h, _, lit, event, single in a.link_events:
            if h == host:
                every.append((event - lit) / 1e9 / scale)
                if single:
                    alone.append((event - lit) / 1e9 / scale)
    return (alone, True) if alone else (every, False)


def apply(data: dict, fitted: Fit) -> dict:
    """The bench file's data with the fitted values in place (paths through mappings; hosts by
    name)."""
    for path, (value, _) in fitted.values.items():
        parts = path.split(".")
        node = data
        i = 0
        while i < len(parts) - 1:
            key = parts[i]
            if key == "hosts":
                host = next(h for h in node["hosts"] if h.get("name") == parts[i + 1])
                node = host
                i += 2
                continue
            node = node.setdefault(key, {})
            i += 1
        node[parts[-1]] = value
    return data


def emulated(data: dict) -> dict:
    """The bench file's data as an emulated bench: every instrument and host emulated, no place."""
    for spec in (data.get("instruments") or {}).values():
        spec["resource"] = "emulated"
    for host in (data.get("topology") or {}).get("hosts") or []:
        host["address"] = "emulated"
    data.pop("place", None)
    return data


def refine(bench_text: str, bench_name: str, fitted: Fit, transcripts, load) -> Fit:
    """Replay the first transcript against the first fit and correct each timing by what still
    differs (the software time the twin adds on its own)."""
    path, header, entries = transcripts[0]
    scale = header.get("time_scale") or 1.0
    twin = load(yaml.safe_dump(emulated(apply(yaml.safe_load(bench_text), fitted)), sort_keys=False), scale)
    replayed = Replayer(twin, header, entries).run()
    a = transcript_analysis.analyse(twin, sorted(entries, key=lambda e: e["t_ns"]))
    b = transcript_analysis.analyse(twin, sorted(replayed, key=lambda e: e["t_ns"]))
    out = Fit(dict(fitted.values))
    name = Path(path).name

    def corrected(key: str, delta_s: float, what: str) -> None:
        if key not in out.values:
            return
        value, source = out.values[key]
        out.set(key, round(max(0.0, value + delta_s), 5), f"{source}; refined by {delta_s * 1000:+.1f} ms from a "
                f"replay of {name} against the first fit ({what})")

    switch = f"instruments.{bench_name}.emulation"
    ra, rb = a.per_connection(), b.per_connection()
    if ra and rb:
        corrected(f"{switch}.switching_time_s", (_median(ra) - _median(rb)) / scale, "switching per connection")
    for host in twin.topology.hosts:
        # The carrier's stamp comes from the host's agent, as late as it sees the change: the
        # recording's lateness is in the first fit, and the twin's agents add their own.
        (la, alone_a), (lb, alone_b) = _bringup([(a, 1.0)], host.name), _bringup([(b, 1.0)], host.name)
        if la and lb and alone_a == alone_b:
            delta = (_median(la) - _median(lb)) / scale
            key = f"topology.hosts.{host.name}.emulation"
            lock, up = out.values.get(f"{key}.lock_time_s"), out.values.get(f"{key}.link_up_time_s")
            if lock and up:
                total = lock[0] + up[0]
                share = lock[0] / total if total else 0.0
                corrected(f"{key}.lock_time_s", delta * share, "link up after light")
                corrected(f"{key}.link_up_time_s", delta * (1 - share), "link up after light")
    # the same kind of start-up on both (their step is the same bench's: it cancels)
    ja, jb = _startups(a, 1.0, 0.0), _startups(b, 1.0, 0.0)
    if ja and jb and sorted(a.job_start) == sorted(b.job_start):
        corrected("job.startup_time_s", (_median(ja) - _median(jb)) / scale, "job start-up")
    return out


def render(bench_text: str, fitted: Fit, transcripts: list[str]) -> str:
    """The twin's bench file: the original with the fitted numbers, each with its source."""
    data = emulated(apply(yaml.safe_load(bench_text), fitted))
    data["name"] = f"{data.get('name', 'bench')}-twin"
    header = ["# A digital twin, written by lumion-hil calibrate from " + ", ".join(transcripts) + ".",
              "# Fitted (path = value: source):"]
    for path, (value, source) in sorted(fitted.values.items()):
        header.append(f"#   {path} = {value}: {source}")
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False)


def calibrate(bench_path: Path, transcript_paths: list[Path], load, *, refine_once: bool = True) -> str:
    """The twin's bench-file text. ``load(text, time_scale)`` validates a bench file's text."""
    bench_text = Path(bench_path).read_text()
    transcripts = []
    for p in transcript_paths:
        header, entries = transcript.read(p)
        transcripts.append((str(p), header, entries))
    scale = transcripts[0][1].get("time_scale") or 1.0
    bench = load(bench_text, scale)
    fitted = fit(bench, transcripts)
    if not fitted.values:
        raise ValueError("the transcripts hold nothing to fit: no switch command, reading, link or job was recorded")
    if refine_once:
        fitted = refine(bench_text, bench.topology.switch, fitted, transcripts, load)
    text = render(bench_text, fitted, [Path(p).name for p in transcript_paths])
    load(text, scale)  # the twin is a valid bench file
    return text
