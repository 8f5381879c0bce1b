"""Named defects of the emulated bench, and controllers with named bugs: each exists to show
that a verdict turns red when the device or the controller is wrong (tests/test_defects.py runs
each one against the suite it should break; the README has the table).

A defect is ``NAME`` or ``NAME=VALUE``, from the bench file (``emulator.defects``), from
``lumion-hil run --defect`` or ``lumion-hil emulate --defect``. Device defects change what the
emulators do (never a limit); controller defects swap in a controller with that bug
(harness/testing.py). Defects edit the bench's data only: the bench file's loader validates the
result again, so a defect can never make a bench invalid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from lumion_hil.harness.errors import HarnessError


class DefectError(HarnessError):
    pass


@dataclass(frozen=True)
class Defect:
    name: str
    description: str
    default: str | None  # the value when none is given
    apply: Callable[[dict, str | None], None]  # edits the bench's data in place
    device: bool = True  # False: a controller's bug (any bench); True: needs the part emulated


def _switch(data: dict) -> dict:
    return data["instruments"][data["topology"]["switch"]]


def _emulation(node: dict) -> dict:
    return node.setdefault("emulation", {})


def _hosts(data: dict, which: str | None) -> list[dict]:
    hosts = data["topology"]["hosts"]
    if not which:
        return hosts
    chosen = [h for h in hosts if h["name"] == which]
    if not chosen:
        raise DefectError(f"no host named {which!r}")
    return chosen


def _split(value: str) -> tuple[str, str | None]:
    """``8@20`` -> ("8", "20"); ``8`` -> ("8", None)."""
    number, _, where = value.partition("@")
    return number, where or None


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise DefectError(f"{what} must be a number, not {text!r}") from None


def _slow_switch(data, value):
    factor = _number(value, "slow_switch's factor")
    emulation = _emulation(_switch(data))
    emulation["switching_time_s"] = emulation.get("switching_time_s", 0.05) * factor


def _lossy_connector(data, value):
    db, port = _split(value)
    if port is None:  # the first baseline circuit's receiving side
        baseline = data.get("safety", {}).get("baseline") or []
        if not baseline:
            raise DefectError("lossy_connector needs a port (DB@PORT): the bench has no baseline circuit")
        port = baseline[0][1]
    _emulation(_switch(data)).setdefault("port_loss_db", {})[int(port)] = _number(db, "lossy_connector's dB")


def _crosstalk(data, value):
    _emulation(_switch(data))["crosstalk_db"] = _number(value, "crosstalk's dB")


def _wrong_switch_size(data, value):
    n_in, n_out = _switch(data)["ports"]
    extra = int(_number(value, "wrong_switch_size's extra ports"))
    _emulation(_switch(data))["reported_ports"] = [n_in + extra, n_out + extra]


def _host_setting(setting: str, what: str, convert=float):
    """A defect that sets one emulation setting on every host, or on one (VALUE@HOST)."""
    def apply(data, value):
        number, host = _split(value)
        for h in _hosts(data, host):
            _emulation(h)[setting] = convert(_number(number, what))

    return apply


def _silent_data_corruption(data, value):
    host = value or (data.get("job") or {}).get("ranks", [data["topology"]["hosts"][0]["name"]])[0]
    for h in _hosts(data, host):
        _emulation(h)["silent_data_corruption"] = True


def _nic(data: dict, where: str) -> tuple[dict, dict]:
    """``HOST.NIC`` -> (the host's data, the NIC's data)."""
    host_name, dot, nic_name = where.partition(".")
    if not dot:
        raise DefectError(f"{where!r} is not HOST.NIC (e.g. host1.p0)")
    (host,) = _hosts(data, host_name)
    nic = next((n for n in host["nics"] if n["name"] == nic_name), None)
    if nic is None:
        raise DefectError(f"host {host_name!r} has no NIC port {nic_name!r}")
    return host, nic


def _swapped_fibres(data, value):
    """Two NICs' duplex cords swapped at the patch panel: each one's transmit fibre lands where
    the other's should, and so does each one's receive fibre."""
    if value is None:  # the first NIC of the second host and of the last: a rank's and the spare's
        hosts = data["topology"]["hosts"]
        value = f"{hosts[1]['name']}.{hosts[1]['nics'][0]['name']},{hosts[-1]['name']}.{hosts[-1]['nics'][0]['name']}"
    ends = [w.strip() for w in value.split(",")]
    if len(ends) != 2 or ends[0] == ends[1]:
        raise DefectError(f"swapped_fibres takes two NICs, HOST.NIC,HOST.NIC (got {value!r})")
    (_, a), (_, b) = (_nic(data, end) for end in ends)
    swaps = _emulation(_switch(data)).setdefault("swapped_ports", [])
    for pair in ([a["tx_port"], b["tx_port"]], [a["rx_port"], b["rx_port"]]):
        if not any(set(pair) == set(done) for done in swaps):  # a bench served with it already has it
            swaps.append(pair)


def _weak_transmitter(data, value):
    db, where = _split(value)
    if where is None:
        first = data["topology"]["hosts"][0]
        where = f"{first['name']}.{first['nics'][0]['name']}"
    host, nic = _nic(data, where)
    _emulation(host).setdefault("tx_shortfall_db", {})[nic["name"]] = _number(db, "weak_transmitter's dB")


def _controller(factory: str, **fixed):
    def apply(data, value):
        recovery = data.setdefault("recovery", {})
        recovery["controller"] = f"lumion_hil.harness.testing:{factory}"
        options = dict(fixed)
        if value is not None:
            ms, phase = _split(value)
            options["delay_ms"] = _number(ms, "the delay in ms")
            if phase:
                options["phase"] = phase
        recovery["controller_options"] = options

    return apply


CATALOGUE: dict[str, Defect] = {d.name: d for d in (
    Defect("slow_switch", "the switch takes N times longer per connection", "10", _slow_switch),
    Defect("lossy_connector", "+N dB at one port (DB@PORT; default: the first baseline circuit's egress)", "8",
           _lossy_connector),
    Defect("swapped_fibres", "two NICs' fibres swapped at the patch panel, both directions (HOST.NIC,HOST.NIC; "
           "default: the first NIC of the second host and of the last): the bench file says where they should be",
           None, _swapped_fibres),
    Defect("weak_transmitter", "a NIC's transmitter launches N dB below the bench file's launch_dbm (DB@HOST.NIC; "
           "default: the first host's first NIC)", "3", _weak_transmitter),
    Defect("crosstalk", "every dark egress port sees the lit ingress ports' light, N dB down", "-10", _crosstalk),
    Defect("wrong_switch_size", "the switch reports N more ports each side than the bench file says", "8",
           _wrong_switch_size),
    Defect("slow_nic_lock", "the NICs take S seconds to lock after light arrives (S@HOST: one host)", "0.5",
           _host_setting("lock_time_s", "slow_nic_lock's seconds")),
    Defect("insensitive_receiver", "the NICs' receivers need N dBm to lock, more than reaches them (N@HOST: one "
           "host's)", "-3", _host_setting("receiver_sensitivity_dbm", "insensitive_receiver's dBm")),
    Defect("flapping_nic", "links come up and drop N times before they stay up (N@HOST: one host)", "3",
           _host_setting("link_flaps", "flapping_nic's flaps", int)),
    Defect("slow_link", "optical links carry a fraction F of their rate (F@HOST: one host's)", "0.5",
           _host_setting("link_rate_factor", "slow_link's fraction")),
    Defect("slow_agent", "hosts tell their agents of link changes and job output S seconds late", "0.02",
           _host_setting("agent_latency_s", "slow_agent's seconds")),
    Defect("silent_data_corruption", "a GPU computes wrong results without an error (HOST; default: rank 0's)",
           None, _silent_data_corruption),
    Defect("slow_controller", "the controller spends N ms more in one phase (MS@PHASE; default plan)", "600",
           _controller("SlowController"), device=False),
    Defect("spare_in_use", "the controller takes a spare that is already in the job", None,
           _controller("SpareInUseController"), device=False),
    Defect("leaves_failed_circuits", "the controller leaves the failed GPU's circuits that no new one needs", None,
           _controller("LeavesFailedCircuitsController"), device=False),
    Defect("never_degraded", "the controller never says degraded (it calls it a failure)", None,
           _controller("NeverDegradedController"), device=False),
    Defect("lead_only_restart", "the controller restarts only the lead rank of the new rank map", None,
           _controller("LeadOnlyRestartController"), device=False),
    Defect("no_phases", "the controller recovers and reports none of its phases", None,
           _controller("NoPhasesController"), device=False),
    Defect("wrong_failed_host", "the controller recovers and names another rank as the failed host", None,
           _controller("WrongFailedHostController"), device=False),
    Defect("wrong_rank_map", "the controller recovers and reports its new rank map in another order", None,
           _controller("WrongRankMapController"), device=False),
    Defect("ignores_fading_light", "the controller never reads the light at its receivers (no margin watcher)", None,
           _controller("IgnoresFadingLightController"), device=False),
    Defect("early_first_step", "the controller reports the first step N ms before its hosts saw it", "200",
           _controller("EarlyFirstStepController"), device=False),
    Defect("restart_first_dawdle", "the controller restarts the job first and rewires only N ms after the job is "
           "ready (the job waits in its first collective for its links)", "400", _controller("RestartFirstController"),
           device=False),
    Defect("wrong_spare_first", "the controller wires another spare in first, waits for its links, then takes it out "
           "for the one it chose (a bench with two spares)", None, _controller("WrongSpareFirstController"),
           device=False),
    Defect("touches_protected_port", "the controller parks a beam on a protected port through its own switch session "
           "and takes it away again before the switch is read back", None,
           _controller("TouchesProtectedPortController"), device=False),
    Defect("unguarded_protected_port", "the controller switches through the raw driver, so the protected-port "
           "guard does not see it, and takes a spare behind a protected port", None,
           _controller("UnguardedController"), device=False),
)}


def parse(spec: str) -> tuple[Defect, str | None]:
    name, eq, value = spec.partition("=")
    defect = CATALOGUE.get(name.strip())
    if defect is None:
        import difflib

        close = difflib.get_close_matches(name.strip(), CATALOGUE, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DefectError(f"unknown defect {name.strip()!r}{hint}; known: {', '.join(CATALOGUE)}")
    return defect, (value.strip() if eq else defect.default)


def apply_defects(data: dict, specs: list[str], *, emulated: bool, bench_name: str) -> dict:
    """The bench's data (``Bench.model_dump(mode="json")``) with these defects applied;
    ``emulated``: whether any part of the bench is emulated (device defects need one)."""
    for spec in specs:
        defect, value = parse(spec)
        if defect.device and not emulated:
            raise DefectError(f"{defect.name}: a device defect needs an emulated bench; bench {bench_name!r} is real")
        try:
            defect.apply(data, value)
        except (KeyError, IndexError, TypeError) as exc:
            raise DefectError(f"{spec}: cannot apply it to bench {bench_name!r}: {exc}") from None
    data["emulator"]["defects"] = list(specs)
    return data
