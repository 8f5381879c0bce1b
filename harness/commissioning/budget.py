"""The light budget of every circuit the topology can make, measured.

Every NIC's transmitter to every other host's receiver, made a round of disjoint circuits at a
time: the light at the switch input (the ingress monitor), what leaves the switch towards the
receiver (the egress monitor, or a meter's tap), the switch's loss on that path, the light at
the receiver (less the receive fibre the bench file states) and its margin over the receivers'
sensitivity, worst first.

What the bench file states is compared with what was measured: the light each transmitter
should put into the switch (``launch_dbm`` less ``tx_fibre_loss_db``), and each meter tap's
``tap_loss_db``. The switch's loss is split into a loss shared by every path, a loss of each
port (every path through a dirty or damaged connector loses it) and what is left to each path
(a median polish: robust to the one bad port it looks for).

A finding is named when its figure is beyond ``tolerance_db`` with 97.5% confidence (the lower
end of its two-sided 95% t interval, from the repeated readings or from the paths that share a
port): a port or transmitter exactly at the tolerance is named at most 2.5% of the time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from lumion_hil.harness.commissioning.walk import DARK_DBM, dbm_or_dark


@dataclass
class PathBudget:
    tx: str  # HOST.NIC
    rx: str
    ingress: int
    egress: int
    input_dbm: float | None  # at the switch input
    output_dbm: float | None  # leaving the switch towards the receiver
    at_receiver_dbm: float | None  # less the receive fibre the bench file states
    margin_db: float | None  # over the receivers' sensitivity (the bench's limit)
    readings: int = 0

    @property
    def path_loss_db(self) -> float | None:
        if self.input_dbm is None or self.output_dbm is None:
            return None
        return self.input_dbm - self.output_dbm


@dataclass(frozen=True)
class Finding:
    kind: str  # "transmitter", "port", "path", "tap"
    subject: str  # host1.p0, port 21, 3->21, a detector's name
    measured_db: float  # how far from what it should be (+: less light than it should)
    within_db: float  # half-width of its 95% interval
    text: str


@dataclass
class Budget:
    paths: list[PathBudget] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    shared_loss_db: float | None = None  # the switch's loss every path has (insertion and connectors)
    sensitivity_dbm: float = 0.0
    floor_dbm: float = 0.0  # sensitivity plus the lab's link margin
    skipped: list[str] = field(default_factory=list)
    duration_s: float = 0.0


# Student's t, 97.5th percentile, for 1..30 degrees of freedom (any statistics table); beyond,
# the normal's 1.96 is within 2% of it.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def _interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95% t interval (0 for a single value: no spread
    known; such a figure is named on its mean alone)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    se = statistics.stdev(values) / len(values) ** 0.5
    df = len(values) - 1
    return mean, (_T975[df - 1] if df <= len(_T975) else 1.96) * se


def _rounds(pairs: list[tuple]) -> list[list[tuple]]:
    """Disjoint circuits, as few rounds as a greedy pass over the pairs by shift finds."""
    rounds, remaining = [], list(pairs)
    while remaining:
        used_in, used_out, this = set(), set(), []
        for pair in remaining:
            if pair[2] not in used_in and pair[3] not in used_out:
                this.append(pair)
                used_in.add(pair[2])
                used_out.add(pair[3])
        rounds.append(this)
        remaining = [p for p in remaining if p not in this]
    return rounds


def measure_budget(session, *, readings: int = 5, tolerance_db: float = 1.0,
                   log: Callable[[str], None] = lambda _: None) -> Budget:
    """Measure the budget of every circuit the bench's topology can make (see the module's doc)
    on an open BenchSession, whose closing restores the baseline."""
    bench, switch = session.bench, session.switch
    started = time.perf_counter()
    limits = bench.limits
    out = Budget(sensitivity_dbm=limits.receiver_sensitivity_dbm.value, floor_dbm=limits.light_floor_dbm)
    nics = bench.nic_ports()
    pairs = []
    for ti, (th, tn) in enumerate(nics):
        for ri, (rh, rn) in enumerate(nics):
            if th.name == rh.name:
                continue
            if not (switch.may_switch(tn.tx_port) and switch.may_switch(rn.rx_port)):
                out.skipped.append(f"{th.name}.{tn.name} -> {rh.name}.{rn.name}: port {tn.tx_port} or "
                                   f"{rn.rx_port} is one this bench may not switch")
                continue
            pairs.append(((ri - ti) % len(nics), f"{th.name}.{tn.name}", tn.tx_port, rn.rx_port,
                          f"{rh.name}.{rn.name}"))
    pairs.sort()
    monitors = switch.has_power_monitors
    inputs: dict[int, list[float]] = {}
    if monitors:
        ports = sorted({p[2] for p in pairs})
        for _ in range(readings):
            for port, value in switch.port_power_dbm(ports).items():
                inputs.setdefault(port, []).append(dbm_or_dark(value))
    current = switch.connections()
    clear = sorted((i, e) for i, e in current.items() if switch.may_switch(i) and switch.may_switch(e))
    if clear:
        switch.disconnect(clear)
    outputs: dict[tuple[int, int], list[float]] = {}
    tapped: dict[str, list[float]] = {}  # detector name -> the meter's reading less the monitor's
    for round_ in _rounds(pairs):
        circuits = [(p[2], p[3]) for p in round_]
        switch.connect(circuits)
        try:
            for _ in range(readings):
                at = _egress_readings(session, [e for _, e in circuits], monitors, tapped)
                for ingress, egress in circuits:
                    if at.get(egress) is not None:
                        outputs.setdefault((ingress, egress), []).append(at[egress])
        finally:
            switch.disconnect(circuits)
        log(f"measured {len(circuits)} circuit(s): " + ", ".join(f"{i}->{e}" for i, e in circuits))
    for _, tx, ingress, egress, rx in pairs:
        lit = [v for v in inputs.get(ingress, []) if v > DARK_DBM]
        got = [v for v in outputs.get((ingress, egress), []) if v > DARK_DBM]
        input_dbm = statistics.fmean(lit) if lit else None
        output_dbm = statistics.fmean(got) if got else None
        at_rx = bench.at_receiver_dbm(egress, output_dbm) if output_dbm is not None else None
        out.paths.append(PathBudget(tx, rx, ingress, egress, input_dbm, output_dbm, at_rx,
                                    None if at_rx is None else at_rx - out.sensitivity_dbm, len(got)))
    out.paths.sort(key=lambda p: (p.margin_db is None, p.margin_db if p.margin_db is not None else 0.0))
    out.findings = _transmitters(bench, inputs, tolerance_db) + _ports(out, outputs, tolerance_db) + \
        _taps(bench, tapped, tolerance_db)
    out.duration_s = time.perf_counter() - started
    return out


def _egress_readings(session, egresses: list[int], monitors: bool, tapped: dict) -> dict[int, float]:
    """The light leaving the switch at each egress port: its monitor, else a meter's tap (plus
    the tap's loss, as the bench file states it). Where both see a port, the meter's reading
    less the monitor's is kept, to judge the tap's stated loss."""
    bench = session.bench
    at: dict[int, float] = {}
    if monitors:
        at = {p: dbm_or_dark(v) for p, v in session.switch.port_power_dbm(egresses).items()}
    for egress in egresses:
        det = bench.meter_detector_for_port(egress)
        if det is None:
            continue
        reading = dbm_or_dark(session.meters[det.instrument].read_dbm(det.channel))
        if reading <= DARK_DBM:
            continue
        if monitors and at.get(egress, DARK_DBM) > DARK_DBM:
            tapped.setdefault(det.name, []).append(at[egress] - reading)
        else:
            at[egress] = reading + det.tap_loss_db
    return at


def _transmitters(bench, inputs: dict[int, list[float]], tolerance_db: float) -> list[Finding]:
    found = []
    for host, nic in bench.nic_ports():
        lit = [v for v in inputs.get(nic.tx_port, []) if v > DARK_DBM]
        expected = nic.launch_dbm - nic.tx_fibre_loss_db
        if not lit:
            if nic.tx_port in inputs:
                found.append(Finding("transmitter", f"{host.name}.{nic.name}", float("inf"), 0.0,
                                     f"{host.name}.{nic.name}: no light at port {nic.tx_port}, where the bench file "
                                     f"puts its transmitter (expected {expected:.2f} dBm): run lumion-hil bench wiring"))
            continue
        mean, within = _interval(lit)
        short = expected - mean
        if abs(short) - within > tolerance_db:
            what = ("less light than the bench file says: a weak transmitter, or a lossy transmit fibre or "
                    "connector" if short > 0 else "more light than the bench file says: its launch_dbm is low")
            found.append(Finding("transmitter", f"{host.name}.{nic.name}", short, within,
                                 f"{host.name}.{nic.name}: {abs(short):.2f} +- {within:.2f} dB {what} at switch port "
                                 f"{nic.tx_port} (launch_dbm {nic.launch_dbm:g} less tx_fibre_loss_db "
                                 f"{nic.tx_fibre_loss_db:g} = {expected:.2f} dBm; measured {mean:.2f} dBm)"))
    return found


def _ports(out: Budget, outputs: dict, tolerance_db: float) -> list[Finding]:
    """The switch's loss split by median polish into shared + ingress port + egress port + path."""
    loss = {(p.ingress, p.egress): p.path_loss_db for p in out.paths if p.path_loss_db is not None}
    if len(loss) < 3:
        return []
    shared = statistics.median(loss.values())
    a = {i: 0.0 for i, _ in loss}
    b = {e: 0.0 for _, e in loss}
    for _ in range(4):
        for e in b:
            b[e] += statistics.median(loss[(i, x)] - shared - a[i] - b[x] for i, x in loss if x == e)
        for i in a:
            a[i] += statistics.median(loss[(x, e)] - shared - a[x] - b[e] for x, e in loss if x == i)
    out.shared_loss_db = shared
    by_port = {p.ingress: p.tx for p in out.paths} | {p.egress: p.rx for p in out.paths}
    found = []
    for side, excess, through in (("egress", b, lambda e, pair: pair[1] == e), ("ingress", a, lambda i, pair: pair[0] == i)):
        for port in sorted(excess):
            other = a if side == "egress" else b
            values = [loss[pair] - shared - other[pair[1] if side == "ingress" else pair[0]] for pair in loss
                      if through(port, pair)]
            mean, within = _interval(values)
            if mean - within > tolerance_db:
                owner = by_port.get(port, "")
                fibre = f"{owner}'s {'receive' if side == 'egress' else 'transmit'} side" if owner else side
                found.append(Finding("port", f"port {port}", mean, within,
                                     f"port {port} ({fibre}): every path through it loses {mean:.2f} +- {within:.2f} "
                                     f"dB more than the others ({len(values)} paths): a dirty or damaged connector"))
    for (i, e), value in sorted(loss.items()):
        left = value - shared - a[i] - b[e]
        got = outputs.get((i, e), [])
        within = _interval(got)[1] if len(got) > 1 else 0.0
        if left - within > tolerance_db:
            found.append(Finding("path", f"{i}->{e}", left, within,
                                 f"circuit {i}->{e}: {left:.2f} +- {within:.2f} dB more loss than its ports explain"))
    return found


def _taps(bench, tapped: dict[str, list[float]], tolerance_db: float) -> list[Finding]:
    found = []
    for det in bench.detectors:
        values = tapped.get(det.name)
        if not values:
            continue
        mean, within = _interval(values)
        if abs(mean - det.tap_loss_db) - within > tolerance_db:
            found.append(Finding("tap", det.name, mean - det.tap_loss_db, within,
                                 f"detector {det.name}: its meter reads {mean:.2f} +- {within:.2f} dB below the switch's "
                                 f"monitor at port {det.port}; the bench file's tap_loss_db is {det.tap_loss_db:g}"))
    return found
