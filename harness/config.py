"""Bench files: YAML validated into typed models.

A bench file names every instrument, the fabric topology, the detectors, the limits to judge
against and the safety rules. ``load_bench`` turns it into a :class:`Bench` or raises a
:class:`~harness.errors.BenchFileError` naming the file, each field path, its line and the reason.
``bench_json_schema`` exports the JSON schema from the same models.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import yaml
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from lumion_hil.harness.config_base import Model
from lumion_hil.harness.config_instruments import Instrument, SwitchEmulation, SwitchInstrument
from lumion_hil.harness.config_settings import (
    CollectiveSettings,
    Deadlines,
    ElectricalRack,
    EmulatorSettings,
    Limits,
    NcclTests,
    NetnsSettings,
    PlaceSettings,
    RecoverySettings,
    Safety,
)
from lumion_hil.harness.config_topology import Detector, Host, Job, NicPort, Topology
from lumion_hil.harness.errors import BenchFileError, BenchProblem
from lumion_hil.harness.plugins import BACKENDS, CONTROLLERS, plugin_names


class Bench(Model):
    name: str
    description: str = ""
    emulator: EmulatorSettings = EmulatorSettings()
    backend: str | None = Field(default=None, description="the bench backend: module:factory, or a name registered "
                                "under the lumion_hil.backends entry points (emulated, served, netns, real); default: "
                                "from the bench (emulated instruments: emulated; hosts at world:HOST:PORT: served; "
                                "else real)")
    instruments: dict[str, Instrument] = Field(min_length=1)
    topology: Topology
    detectors: list[Detector] = []
    limits: Limits
    job: Job | None = None
    published: dict[str, dict] = Field(
        default={}, description="corrections to published numbers: {id: {value: ..., source: ...}}")
    recovery: RecoverySettings = RecoverySettings()
    deadlines: Deadlines = Deadlines()
    safety: Safety = Safety()
    electrical: ElectricalRack | None = None
    collectives: CollectiveSettings = CollectiveSettings()
    nccl_tests: NcclTests = NcclTests()
    netns: NetnsSettings = NetnsSettings()
    place: PlaceSettings | None = None

    # -- derived views -----------------------------------------------------------------------

    @property
    def switch(self) -> SwitchInstrument:
        return self.instruments[self.topology.switch]  # type: ignore[return-value]

    @property
    def time_scale(self) -> float:
        """The scale emulated latencies run at on this bench: a served emulated bench keeps the
        one it was served with; a real bench runs at 1."""
        served = any(h.world_address for h in self.topology.hosts)
        return self.emulator.time_scale if (self.any_emulated or served) else 1.0

    @property
    def waits(self) -> Deadlines:
        """The deadlines the harness waits on at this bench's time scale (see Deadlines)."""
        return self.deadlines.at_scale(self.time_scale)

    @property
    def any_emulated(self) -> bool:
        return any(i.emulated for i in self.instruments.values()) or self.any_emulated_host

    @property
    def all_emulated(self) -> bool:
        return all(i.emulated for i in self.instruments.values()) and all(h.emulated for h in self.topology.hosts)

    def nic_ports(self) -> list[tuple[Host, NicPort]]:
        return [(h, n) for h in self.topology.hosts for n in h.nics]

    def host(self, name: str) -> Host:
        for h in self.topology.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host named {name!r} in bench {self.name!r}")

    @property
    def any_emulated_host(self) -> bool:
        return any(h.emulated for h in self.topology.hosts)

    def nic_on_rx_port(self, egress: int) -> tuple[Host, NicPort] | None:
        return next(((h, n) for h, n in self.nic_ports() if n.rx_port == egress), None)

    def nic_on_tx_port(self, ingress: int) -> tuple[Host, NicPort] | None:
        return next(((h, n) for h, n in self.nic_ports() if n.tx_port == ingress), None)

    def detectors_for_port(self, port: int) -> list[Detector]:
        return [d for d in self.detectors if d.port == port]

    def reading_noise_db(self, detector: Detector) -> float:
        """The spread (standard deviation, dB) of one detector's readings of an unchanged light:
        its instrument's ``emulation`` section (the emulator's, or what ``lumion-hil calibrate``
        measured on the real instrument: a switch's monitors, a meter's channels)."""
        emulation = self.instruments[detector.instrument].emulation
        return emulation.monitor_noise_db if isinstance(emulation, SwitchEmulation) else emulation.noise_db

    def at_receiver_dbm(self, egress: int, port_dbm):
        """The light at the receiver fed by switch egress ``egress``, from the power read at that
        port: less the receive fibre of the NIC there (none: the port's own). A reading that is
        not a number (out of range) is passed on as it is. The one place this is computed."""
        if not isinstance(port_dbm, float):
            return port_dbm
        owner = self.nic_on_rx_port(egress)
        return port_dbm - (owner[1].rx_fibre_loss_db if owner else 0.0)

    def meter_detector_for_port(self, port: int) -> Detector | None:
        """A detector on a power meter (not a switch monitor) watching this port."""
        return next((d for d in self.detectors if d.port == port and d.instrument != self.topology.switch), None)

    def problems(self) -> list[BenchProblem]:
        """Checks across fields that a field validator cannot see."""
        out: list[BenchProblem] = []

        def bad(path: str, reason: str) -> None:
            out.append(BenchProblem(path, reason))

        switch = self.instruments.get(self.topology.switch)
        if switch is None:
            bad("topology.switch", f"no instrument named {self.topology.switch!r}")
        elif not isinstance(switch, SwitchInstrument):
            bad("topology.switch", f"instrument {self.topology.switch!r} is a {switch.kind}, not an optical_switch")
            switch = None

        _unique(bad, "topology.hosts", [h.name for h in self.topology.hosts], "host name")
        used_ports: dict[int, str] = {}
        for hi, host in enumerate(self.topology.hosts):
            _unique(bad, f"topology.hosts[{hi}].nics", [n.name for n in host.nics], "NIC port name")
            _unique(bad, f"topology.hosts[{hi}].gpus", [g.index for g in host.gpus], "GPU index")
            for ni, nic in enumerate(host.nics):
                where = f"topology.hosts[{hi}].nics[{ni}]"
                for field, port, side in (("tx_port", nic.tx_port, "ingress"), ("rx_port", nic.rx_port, "egress")):
                    if switch is not None:
                        valid = switch.ingress_ports if side == "ingress" else switch.egress_ports
                        if port not in valid:
                            bad(f"{where}.{field}", f"port {port} is not an {side} port of "
                                f"{self.topology.switch!r} ({valid.start}..{valid.stop - 1})")
                    owner = f"{host.name}.{nic.name}"
                    if port in used_ports:
                        bad(f"{where}.{field}", f"port {port} is already used by {used_ports[port]}")
                    used_ports[port] = owner

        for key in self.published:
            from lumion_hil.harness.published import all_published

            if key not in all_published():
                bad(f"published.{key}", f"no published number {key!r}; see harness/published.yaml")
        for path, spec, group in (("recovery.controller", self.recovery.controller, CONTROLLERS),
                                  ("backend", self.backend, BACKENDS)):
            if spec is not None and ":" not in spec and spec not in plugin_names(group):
                bad(path, f"expected module:factory, or one of the names registered in {group} "
                          f"({', '.join(plugin_names(group)) or 'none'})")
        if self.electrical is not None:
            hosts = {h.name for h in self.topology.hosts}
            for racked in self.electrical.racks:
                if racked not in hosts:
                    bad(f"electrical.racks.{racked}", f"no host named {racked!r}")
            optical = {n.interface or n.name for h in self.topology.hosts for n in h.nics}
            if self.electrical.interface in optical:
                bad("electrical.interface", f"{self.electrical.interface!r} is an optical NIC's interface")
        if self.job is not None:
            hosts = {h.name for h in self.topology.hosts}
            for ri, rank_host in enumerate(self.job.ranks):
                if rank_host not in hosts:
                    bad(f"job.ranks[{ri}]", f"no host named {rank_host!r}")
            _unique(bad, "job.ranks", self.job.ranks, "rank host")

        for di, det in enumerate(self.detectors):
            inst = self.instruments.get(det.instrument)
            where = f"detectors[{di}]"
            if inst is None:
                bad(f"{where}.instrument", f"no instrument named {det.instrument!r}")
                continue
            if isinstance(inst, SwitchInstrument):
                if not inst.power_monitors:
                    bad(f"{where}.instrument", f"switch {det.instrument!r} has no power monitors "
                        "(set power_monitors: true if it does)")
                if det.channel is not None:
                    bad(f"{where}.channel", "a switch monitor has no channel; leave it out")
            else:
                if det.channel is None:
                    bad(f"{where}.channel", f"meter {det.instrument!r} needs the channel that taps the port")
                elif det.channel > inst.channels:
                    bad(f"{where}.channel", f"meter {det.instrument!r} has {inst.channels} channel(s)")
            if switch is not None and det.port not in switch.ingress_ports and det.port not in switch.egress_ports:
                bad(f"{where}.port", f"port {det.port} is not a port of {self.topology.switch!r}")
        _unique(bad, "detectors", [d.name for d in self.detectors], "detector name")

        if self.safety.owned_ports is not None:
            owned = set(self.safety.owned_ports)
            for port, owner in sorted(used_ports.items()):
                if port not in owned:
                    bad("safety.owned_ports", f"port {port} ({owner}) is not one of the bench's own ports "
                        f"{port_ranges(owned)} (it shares the switch: the place's ports tag says which are its own)")
            for ingress, egress in self.safety.baseline:
                if not {ingress, egress} <= owned:
                    bad("safety.owned_ports",
                        f"baseline [{ingress}, {egress}] uses a port outside {port_ranges(owned)}")
        protected = set(self.safety.protected_ports)
        seen_in: set[int] = set()
        seen_out: set[int] = set()
        for bi, (ingress, egress) in enumerate(self.safety.baseline):
            where = f"safety.baseline[{bi}]"
            if switch is not None:
                if ingress not in switch.ingress_ports:
                    bad(where, f"{ingress} is not an ingress port of {self.topology.switch!r}")
                if egress not in switch.egress_ports:
                    bad(where, f"{egress} is not an egress port of {self.topology.switch!r}")
            if ingress in seen_in or egress in seen_out:
                bad(where, f"[{ingress}, {egress}] reuses a port of an earlier baseline cross-connect")
            if {ingress, egress} & protected:
                bad(where, f"[{ingress}, {egress}] touches a protected port; protected ports are never switched")
            seen_in.add(ingress)
            seen_out.add(egress)
        if switch is not None:
            for si, (a, b) in enumerate(switch.emulation.swapped_ports):
                if not ({a, b} <= set(switch.ingress_ports) or {a, b} <= set(switch.egress_ports)):
                    bad(f"instruments.{self.topology.switch}.emulation.swapped_ports[{si}]",
                        f"[{a}, {b}]: a fibre swap is between two ingress ports or two egress ports of "
                        f"{self.topology.switch!r}")
            for pi, port in enumerate(self.safety.protected_ports):
                if port not in switch.ingress_ports and port not in switch.egress_ports:
                    bad(f"safety.protected_ports[{pi}]", f"port {port} is not a port of {self.topology.switch!r}")
        return out


def _unique(bad, path: str, values: list, what: str) -> None:
    seen = set()
    for i, v in enumerate(values):
        if v in seen:
            bad(f"{path}[{i}]", f"duplicate {what} {v!r}")
        seen.add(v)


# --- loading ----------------------------------------------------------------------------------


def port_ranges(ports: Iterable[int]) -> str:
    """Ports as ``1-8,33-40``."""
    out: list[str] = []
    run: list[int] = []
    for p in sorted(ports):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [p]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def load_bench(path: str | Path, *, time_scale: float | None = None, defects: list[str] | tuple = ()) -> Bench:
    """Read and validate a bench file, with its defects (the file's ``emulator.defects`` and
    ``defects``) applied. Raises BenchFileError with every problem found."""
    path = Path(path)
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchFileError(shown, [BenchProblem("", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchFileError(shown, [BenchProblem("", f"cannot read: {exc}")]) from None
    return parse_bench(text, shown, time_scale=time_scale, defects=defects)


def parse_bench(text: str, file: str = "<bench>", *, time_scale: float | None = None,
                defects: list[str] | tuple = ()) -> Bench:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise BenchFileError(file, [BenchProblem("", f"not valid YAML: {reason}", line)]) from None
    if root is None:
        raise BenchFileError(file, [BenchProblem("", "the file is empty")])
    duplicates = list(_duplicate_keys(root, ""))
    if duplicates:
        raise BenchFileError(file, duplicates)
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise BenchFileError(file, [BenchProblem("", "a bench file is a mapping of sections (name, instruments, ...)", 1)])
    held = os.environ.get("LUMION_HIL_PLACE")
    if held:  # `lumion-hil run` holds the bench's labgrid place: addresses and ports from it
        from lumion_hil.harness.places import apply_place

        data = apply_place(data, json.loads(held))
    if time_scale is not None:
        data.setdefault("emulator", {})
        if isinstance(data["emulator"], dict):
            data["emulator"]["time_scale"] = time_scale
    try:
        bench = Bench.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = err["loc"] + (("kind",) if err["type"].startswith("union_tag") else ())
            path, line = _locate(root, loc)
            problems.append(BenchProblem(path, _reason(err), line))
        raise BenchFileError(file, problems) from None
    cross = bench.problems()
    if cross:
        raise BenchFileError(file, [BenchProblem(p.path, p.reason, _line_of(root, p.path)) for p in cross])
    wanted = list(bench.emulator.defects) + [d for d in defects if d not in bench.emulator.defects]
    if wanted:
        from lumion_hil.harness.defects import DefectError, apply_defects

        emulated = bench.any_emulated or any(h.world_address for h in bench.topology.hosts)
        try:
            data = apply_defects(bench.model_dump(mode="json"), wanted, emulated=emulated, bench_name=bench.name)
            bench = Bench.model_validate(data)
        except DefectError as exc:
            raise BenchFileError(file, [BenchProblem("emulator.defects", str(exc), _line_of(root, "emulator"))]) from None
        except ValidationError as exc:
            raise BenchFileError(file, [BenchProblem("emulator.defects", f"{', '.join(wanted)}: makes an invalid "
                                                     f"bench: {exc}", _line_of(root, "emulator"))]) from None
    return bench


def bench_json_schema() -> str:
    return json.dumps(Bench.model_json_schema(), indent=2)


def _reason(err: ErrorDetails) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return "required field is missing"
    if err["type"] == "extra_forbidden":
        return "unknown field (check its spelling against `lumion-hil bench schema`)"
    if err["type"] == "union_tag_invalid":
        return f"unknown kind {err.get('input', {}).get('kind')!r}; expected optical_switch or power_meter"
    if err["type"] == "union_tag_not_found":
        return "required field is missing; expected optical_switch or power_meter"
    if "input" in err and not isinstance(err["input"], (dict, list)) and repr(err["input"]) not in msg:
        return f"{msg} (got {err['input']!r})"
    return msg


def _locate(root: yaml.Node, loc: tuple) -> tuple[str, int | None]:
    """Turn a pydantic error location into a readable path and the YAML line it points at.

    Location parts that are not in the document (a union's tag, say) are dropped."""
    node = root
    parts: list[str] = []
    line = root.start_mark.line + 1
    for depth, key in enumerate(loc):
        child = _child(node, key)
        if child is None:
            last = depth == len(loc) - 1
            if last and isinstance(key, str) and isinstance(node, yaml.MappingNode):
                parts.append(f".{key}" if parts else key)  # a missing field: point at its parent
            continue  # otherwise a union's tag, which the document does not spell out
        parts.append(f"[{key}]" if isinstance(key, int) else (f".{key}" if parts else str(key)))
        node = child
        line = node.start_mark.line + 1
    return "".join(parts), line


def _line_of(root: yaml.Node, dotted: str) -> int | None:
    keys: list[str | int] = []
    for part in dotted.replace("]", "").replace("[", ".").split("."):
        if part:
            keys.append(int(part) if part.isdigit() else part)
    return _locate(root, tuple(keys))[1]


def _child(node: yaml.Node, key) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(key, str):
        for k, v in node.value:
            if k.value == key:
                return v
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key]
    return None


def _duplicate_keys(node: yaml.Node, path: str):
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            sub = f"{path}.{k.value}" if path else str(k.value)
            if k.value in seen:
                yield BenchProblem(sub, "key appears twice (YAML would silently keep the last)", k.start_mark.line + 1)
            seen.add(k.value)
            yield from _duplicate_keys(v, sub)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            yield from _duplicate_keys(v, f"{path}[{i}]")

