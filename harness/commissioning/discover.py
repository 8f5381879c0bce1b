"""From the instruments and hosts on a desk to a drafted bench file.

The instruments are the addresses given and what pyvisa-py finds on this machine, each told by
its own identity query; the hosts are the ssh destinations given, each asked through its agent
for its GPUs (NVML) and its interfaces (the kernel). With a switch among them, the fibre walk
(walk.py) finds where each interface's fibres land and the light it puts into the switch; the
draft is the bench file that follows, each value marked with how it was obtained:

- ``read``: an instrument or host said so (its identity query, NVML, the kernel);
- ``measured``: the walk found it, by light and carrier;
- ``given``: the command line said so;
- ``assumption``: nothing could read it, and a lab replaces it with its own.
"""

from __future__ import annotations

import datetime
import fnmatch
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import yaml

from lumion_hil.harness.backends import load_backend
from lumion_hil.harness.commissioning.walk import FibreMap, WalkedNic, find_fibres
from lumion_hil.harness.config import Bench
from lumion_hil.harness.config_topology import Host, HostEmulation, Topology
from lumion_hil.harness.errors import HarnessError
from lumion_hil.instruments import registry
from lumion_hil.instruments.gpu_host.client import AgentClient, local_agent_argv, ssh_agent_argv
from lumion_hil.instruments.gpu_host.replies import GpuDevice, LinkState
from lumion_hil.instruments.identify import Found, identify, list_resources

# Receiver sensitivity by line rate, for the draft's limit (each an assumption to replace).
SENSITIVITY_DBM = {10: (-14.4, "IEEE 802.3 clause 52, 10GBASE-LR average receive power sensitivity")}
# The requirement drafted for a switch whose model's registry entry gives none (each entry gives
# its published or datasheet switching time +25%).
DEFAULT_SWITCH_TIME_S = (0.0625, "a beam-steering switch's 50 ms +25%")


class DiscoveryError(HarnessError):
    pass


@dataclass(frozen=True)
class Noted:
    """A value of the draft and how it was obtained (``read: ...``, ``measured: ...``, ...)."""

    value: Any
    how: str


@dataclass
class HostReading:
    name: str
    address: str
    python: str
    interfaces: list[LinkState] = field(default_factory=list)  # the agent's links
    gpus: list[GpuDevice] = field(default_factory=list)  # NVML's devices
    nvml: dict = field(default_factory=dict)
    problem: str | None = None


def host_spec(text: str) -> tuple[str, str]:
    """``NAME=ADDRESS`` or an ssh destination (``lab@gpu3.lab`` is host ``gpu3``)."""
    name, sep, address = text.partition("=")
    if sep:
        if not name or not address:
            raise DiscoveryError(f"{text!r}: expected NAME=ADDRESS or an ssh destination")
        return name, address
    short = text.split("@")[-1].split(".")[0].split(":")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "-", short) or "host", text


def _probe_bench(hosts: list[Host]) -> Bench:
    """A bench of these hosts alone, to ask its backend how each host's agent is started (a host
    of a served emulated world, ``world:HOST:PORT``, is reached through that world's)."""
    return Bench.model_construct(name="discovery", instruments={},
                                 topology=Topology.model_construct(switch="", hosts=hosts, connector_loss_db=0.0))


def probe_host(name: str, address: str, python: str = "python3", timeout_s: float = 10.0) -> HostReading:
    """What a host's agent says it has: interfaces (with carrier and rate) and GPUs."""
    reading = HostReading(name, address, python)
    host = Host.model_construct(name=name, address=address, python=python, gpus=[], nics=[],
                                emulation=HostEmulation())
    backend = load_backend(_probe_bench([host]))
    try:
        argv = backend.agent_argv(host) or (local_agent_argv(python) if address == "local"
                                            else ssh_agent_argv(address, python))
        try:
            client = AgentClient(name, argv, timeout_s=timeout_s)
        except Exception as exc:  # an unreachable host is reported, the others still drafted
            reading.problem = f"its agent did not answer: {exc}"
            return reading
        try:
            reading.nvml = client.hello.get("nvml", {})
            reading.interfaces = [s for s in client.links() if s.interface != "lo"]
            if reading.nvml.get("available"):
                reading.gpus = client.devices()
        except Exception as exc:
            reading.problem = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
        return reading
    finally:
        backend.stop()  # what it made for the agent (a served world's job-log folder)


@dataclass
class Discovery:
    instruments: list[Found]
    hosts: list[HostReading]
    switch: Found | None
    meters: list[Found]
    names: dict[str, str]  # resource -> the name it gets in the draft
    fibres: FibreMap | None = None
    baseline_found: list[tuple[int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def discover_instruments(resources: list[str], *, scan: bool, timeout_s: float = 2.0,
                         log: Callable[[str], None] = lambda _: None) -> list[Found]:
    wanted = list(dict.fromkeys(resources + (list_resources() if scan else [])))
    found = []
    for resource in wanted:
        item = identify(resource, timeout_s=timeout_s)
        log(f"{resource}: " + (f"{item.identity} -> {item.model}" if item.model and not item.problem
                               else f"not used: {item.problem}"))
        found.append(item)
    return found


def discover(resources: list[str], hosts: list[str], *, scan: bool = True, python: str = "python3",
             protected: Sequence[int] = (), interfaces: str = "*", name: str = "drafted-bench", walk: bool = True,
             timeout_s: float = 2.0, log: Callable[[str], None] = lambda _: None) -> tuple[str, Discovery]:
    """Find what is there and draft its bench file. Returns (the draft's text, what was found)."""
    found = discover_instruments(resources, scan=scan, timeout_s=timeout_s, log=log)
    usable = [f for f in found if f.model and not f.problem]
    switches = [f for f in usable if f.kind == "optical_switch"]
    if len(switches) > 1:
        log(f"more than one switch answered ({', '.join(s.resource for s in switches)}): the first is the bench's")
    names: dict[str, str] = {}
    for f in usable:
        base = "ocs" if f.kind == "optical_switch" else "pm"
        count = sum(1 for n in names.values() if n.startswith(base))
        names[f.resource] = base if base == "ocs" and not count else f"{base}{count + 1}"
    found_hosts = []
    for spec in hosts:
        host_name, address = host_spec(spec)
        reading = probe_host(host_name, address, python)
        log(f"{host_name} ({address}): " + (reading.problem or f"{len(reading.gpus)} GPU(s), interfaces "
                                            + ", ".join(s.interface for s in reading.interfaces)))
        found_hosts.append(reading)
    disc = Discovery(found, found_hosts, switches[0] if switches else None,
                     [f for f in usable if f.kind == "power_meter"], names)
    for reading in found_hosts:
        reading.interfaces = [s for s in reading.interfaces if fnmatch.fnmatch(s.interface, interfaces)]
    if disc.switch is None:
        raise DiscoveryError("no optical switch answered at the addresses given"
                             + (" or among those pyvisa-py lists" if scan else "")
                             + ": a bench file needs one (--instrument RESOURCE)")
    if not [h for h in found_hosts if not h.problem and h.interfaces]:
        raise DiscoveryError("no host with an interface answered: a bench file needs one (--host NAME=ADDRESS)")
    if walk:
        _walk(disc, protected, name, log)
    return render(_structure(disc, protected, name)), disc


def _walk(disc: Discovery, protected: Sequence[int], name: str, log) -> None:
    from lumion_hil.harness.session import BenchSession

    prelim = Bench.model_validate(plain(_structure(disc, protected, name, placeholders=True)))
    nics = [WalkedNic(h.name, s.interface, s.interface) for h in disc.hosts if not h.problem
            for s in h.interfaces]
    session = BenchSession.open(prelim, restore=False)
    known = False  # until the switch has been read, closing must not "restore" it to nothing
    try:
        switch = session.switch
        if switch is None:
            raise DiscoveryError(f"the drafted bench's switch {prelim.topology.switch!r} did not open")
        # The baseline is the switch as it was found: closing the session puts it back.
        disc.baseline_found = sorted((i, e) for i, e in switch.connections().items()
                                     if switch.may_switch(i) and switch.may_switch(e))
        switch.baseline = list(disc.baseline_found)
        known = True
        disc.fibres = find_fibres(session, nics, only_lit=True, log=log)
    finally:
        session.close(restore=known)


def _structure(disc: Discovery, protected: Sequence[int], name: str, placeholders: bool = False) -> dict:
    """The draft as data with Noted values (``placeholders``: every interface given unique ports,
    before the walk, for a bench the walk can be opened on)."""
    sw = disc.switch
    # discover() refuses a desk without a switch; a usable one's model and size were read
    assert sw is not None and sw.model is not None and sw.ports is not None
    n_in, n_out = sw.ports
    instruments = {disc.names[sw.resource]: {
        "kind": "optical_switch", "model": Noted(sw.model, f"read: {sw.how['model']}"),
        "resource": Noted(sw.resource, "given" if not sw.resource.startswith("ASRL") else "read: pyvisa-py lists it"),
        "ports": Noted([n_in, n_out], f"read: {sw.how['ports']}"),
        "power_monitors": Noted(bool(sw.power_monitors), f"read: {sw.how['power_monitors']}")}}
    for meter in disc.meters:
        instruments[disc.names[meter.resource]] = {
            "kind": "power_meter", "model": Noted(meter.model, f"read: {meter.how['model']}"),
            "resource": Noted(meter.resource, "given"),
            "channels": Noted(meter.channels, f"read: {meter.how['channels']}"),
            "wavelength_nm": Noted(1310, "assumption: 10GBASE-LR light; the wavelength the meters are set to")}
    fibres = disc.fibres
    hosts: list[dict[str, Any]] = []
    ranks_rates: list[float] = []
    for h in disc.hosts:
        if h.problem:
            continue
        nics: list[dict[str, Any] | Noted] = []
        for s in h.interfaces:
            key = f"{h.name}.{s.interface}"
            found_rx = fibres.receivers.get(key) if fibres else None
            speed = s.speed_mbps or (found_rx.speed_mbps if found_rx else None)
            rate_gbps = speed / 1000 if speed else 10
            ranks_rates.append(rate_gbps)
            if placeholders:
                k = len([n for hh in hosts for n in hh["nics"]]) + len(nics)
                if k >= min(n_in, n_out):
                    raise DiscoveryError(f"more interfaces than the switch has ports ({n_in}x{n_out}): name the "
                                         "optical ones with --interfaces PATTERN")
                nics.append({"name": s.interface, "rate_gbps": rate_gbps, "launch_dbm": 0.0,
                             "tx_port": 1 + k, "rx_port": n_in + 1 + k})
                continue
            if fibres is None:
                raise DiscoveryError(f"{key}: the fibre walk was not run, so nothing says where its fibres land")
            tx, rx = fibres.transmitters.get(key), fibres.receivers.get(key)
            if tx is None or rx is None:
                disc.notes.append(f"{key} left out: " + "; ".join(fibres.not_found.get(key, ["not found"])))
                continue
            if tx.input_dbm is None:
                raise DiscoveryError(f"{key}: its transmitter was found through a meter, and no switch monitor read "
                                     "its light at the switch input: the draft has no launch_dbm to give it")
            how = (f"measured: transmits into port {tx.port}, receives from port {rx.port} (carrier "
                   f"{rx.carrier_after_s * 1e3:.0f} ms after light), {tx.input_dbm:.2f} dBm at the switch input; "
                   + ("read: rate_gbps (the kernel's link speed, once up); " if speed else "assumption: rate_gbps 10; ")
                   + "assumption: fibre losses 0 (launch_dbm is the light at the switch input)")
            nics.append(Noted({"name": s.interface, "rate_gbps": rate_gbps, "launch_dbm": round(tx.input_dbm, 2),
                               "tx_port": tx.port, "rx_port": rx.port, "tx_fibre_loss_db": 0.0,
                               "rx_fibre_loss_db": 0.0}, how))
        if not nics:
            continue
        gpus = [Noted({"index": g.index, "model": g.name or "unknown", "role": "active"},
                      "read: NVML; assumption: role") for g in h.gpus] or \
               [Noted({"index": 0, "model": "unknown", "role": "active"}, f"assumption: NVML said "
                      f"{h.nvml.get('reason', 'nothing')}")]
        hosts.append({"name": h.name, "address": Noted(h.address, "given"), "gpus": gpus, "nics": nics,
                      **({"python": Noted(h.python, "given")} if h.python != "python3" else {})})
    if not hosts:
        raise DiscoveryError("no host has an interface whose fibres were both found on the switch: "
                             + "; ".join(disc.notes))
    names = [h["name"] for h in hosts]
    spare = len(hosts) >= 3
    if spare:  # the last host's GPUs are the spare, the others run the job (assumptions)
        hosts[-1]["gpus"] = [Noted({**g.value, "role": "spare"}, g.how) for g in hosts[-1]["gpus"]]
    ranks = names[:-1] if spare else names
    data: dict[str, Any] = {
        "name": Noted(name, "given" if name != "drafted-bench" else "assumption: name it"),
        "description": f"Drafted by lumion-hil bench discover on {datetime.date.today().isoformat()}.",
        "instruments": instruments,
        "topology": {"switch": disc.names[sw.resource],
                     "connector_loss_db": Noted(0.0, "assumption: inside each path's measured loss"),
                     "hosts": hosts},
    }
    if not placeholders:
        data["detectors"] = _detectors(disc, hosts)
    rate = min(ranks_rates) if ranks_rates else 10
    sensitivity, source = SENSITIVITY_DBM.get(int(rate), (-14.4, "the 10GBASE-LR figure, for want of one for "
                                                          f"{rate:g} Gb/s"))
    switch_s, switch_source = registry.model(sw.model).switch_time_s or DEFAULT_SWITCH_TIME_S
    data["limits"] = {
        "receiver_sensitivity_dbm": Noted({"value": sensitivity, "source": f"assumption: {source}"},
                                          "assumption: your receivers' sensitivity"),
        "link_margin_db": Noted({"value": 3.0, "source": "assumption: lab practice, 3 dB above sensitivity"},
                                "assumption: your lab's margin"),
        "switch_time_per_connection_s": Noted({"value": switch_s, "source": f"assumption: {switch_source}"},
                                              "assumption: your requirement"),
    }
    data["job"] = {"ranks": Noted(ranks, "assumption: every host but the last, whose GPUs are the spare"
                                  if spare else "assumption: every host (no spare)"),
                   "command": Noted([], "assumption: your job's argv (empty: the emulated job, on an emulated "
                                    "host only)")}
    baseline = disc.baseline_found
    how = "read: the switch's cross-connects as the walk found them (restored after it)"
    if not baseline and not placeholders:
        baseline, how = _ring(hosts, ranks), "assumption: the switch had none; a ring over the job's ranks"
    data["safety"] = {"protected_ports": Noted(sorted(protected), "given" if protected else
                                               "assumption: none; name the ports carrying others' light"),
                      "baseline": Noted([list(p) for p in baseline], how)}
    return data


def _detectors(disc: Discovery, hosts: list[dict]) -> list:
    rx_owner = {n.value["rx_port"]: f"{h['name']}-{n.value['name']}" for h in hosts for n in h["nics"]}
    assert disc.switch is not None and disc.fibres is not None  # _structure's checks, after the walk
    out = []
    if disc.switch.power_monitors:
        for port, owner in sorted(rx_owner.items()):
            out.append(Noted({"name": f"rx-{owner}", "instrument": disc.names[disc.switch.resource], "port": port},
                             "read: the switch's monitor on its receive port"))
    meters = {disc.names[m.resource] for m in disc.meters}
    for tap in disc.fibres.taps:
        if tap.instrument not in meters:
            continue
        owner = rx_owner.get(tap.port, f"port{tap.port}")
        loss = round(tap.tap_loss_db, 2) if tap.tap_loss_db is not None else 0.0
        how = "measured: lit when light was sent to that port" + (
            "; tap_loss_db the switch's monitor less the meter" if tap.tap_loss_db is not None
            else "; assumption: tap_loss_db 0 (no monitor to compare with)")
        out.append(Noted({"name": f"tap-{owner}", "instrument": tap.instrument, "channel": tap.channel,
                          "port": tap.port, "tap_loss_db": loss}, how))
    return out


def _ring(hosts: list[dict], ranks: list[str]) -> list[tuple[int, int]]:
    """Each rank's first NIC to the next rank's second, both ways (a ring of the job's ranks)."""
    by = {h["name"]: [n.value for n in h["nics"]] for h in hosts}
    pairs: list[tuple[int, int]] = []
    if len(ranks) < 2 or any(len(by[r]) < 2 for r in ranks):
        return pairs
    for k, rank in enumerate(ranks):
        a, b = by[rank][0], by[ranks[(k + 1) % len(ranks)]][1]
        pairs += [(a["tx_port"], b["rx_port"]), (b["tx_port"], a["rx_port"])]
    return pairs


# --- the draft as text: YAML with each value's how beside it -----------------------------------


def plain(value: Any) -> Any:
    """The draft's data without the notes of how each value was obtained."""
    if isinstance(value, Noted):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _scalar(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
    return yaml.safe_dump(value, width=10**6).removesuffix("\n...\n").strip()


def _emit(mapping: dict, pad: str, lines: list[str], first: str | None = None) -> None:
    for n, (key, value) in enumerate(mapping.items()):
        lead = first if (first is not None and n == 0) else pad
        how = None
        if isinstance(value, Noted):
            how, value = value.how, value.value
        tail = f"  # {how}" if how else ""
        block_list = isinstance(value, list) and value and all(isinstance(v, (dict, Noted)) for v in value)
        if isinstance(value, dict) and value and not _is_leaf(value):
            lines.append(f"{lead}{key}:{tail}")
            _emit(value, pad + "  ", lines)
        elif block_list:
            lines.append(f"{lead}{key}:{tail}")
            for item in value:
                item_how = None
                if isinstance(item, Noted):
                    item_how, item = item.how, item.value
                if _is_leaf(item):
                    lines.append(f"{pad}  - {_scalar(item)}" + (f"  # {item_how}" if item_how else ""))
                else:
                    _emit(item, pad + "    ", lines, first=f"{pad}  - ")
        else:
            lines.append(f"{lead}{key}: {_scalar(value)}{tail}")


def _is_leaf(value: Any) -> bool:
    """Written on one line: a mapping or list of scalars (a NIC, a GPU, a limit, a port pair)."""
    if isinstance(value, dict):
        return all(not isinstance(v, (dict, list, Noted)) or (isinstance(v, list) and not v) for v in value.values())
    return not isinstance(value, (dict, list)) or all(not isinstance(v, (dict, Noted)) for v in value)


def render(data: dict) -> str:
    lines = ["# A bench file drafted by `lumion-hil bench discover`. Beside each value, how it was obtained:",
             "#   read        an instrument or host said so (its identity query, NVML, the kernel)",
             "#   measured    the fibre walk found it, by light and carrier",
             "#   given       the command line said so",
             "#   assumption  nothing could read it: replace it with your own",
             "# Check it with `lumion-hil bench check`, and the light with `lumion-hil bench budget`.", ""]
    _emit(data, "", lines)
    return "\n".join(lines) + "\n"


def summary(disc: Discovery) -> list[str]:
    """Lines for the terminal: what was left out, and the walk's figures."""
    out = list(disc.notes)
    if disc.fibres is not None and disc.fibres.switching_s:
        out.append(f"walk: {disc.fibres.duration_s:.2f} s, {len(disc.fibres.switching_s)} test circuit(s), median "
                   f"{statistics.median(disc.fibres.switching_s) * 1e3:.1f} ms each (command to completion)")
    if disc.baseline_found:
        out.append(f"the switch had {len(disc.baseline_found)} cross-connect(s); they are the draft's baseline and "
                   "were restored")
    return out


