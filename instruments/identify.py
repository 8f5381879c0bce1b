"""Which instrument answers at an address, told by the instrument itself: its identity query
(``*IDN?``, which the DiCon matrix answers too, on its serial line), then what its model says of
itself (a switch's size, whether it has power monitors, a meter's channels). What
``lumion-hil bench discover`` drafts a bench file from.

Each reading keeps the query it came from, so a draft can say how every value was obtained.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from lumion_hil.instruments.protocols import Identity, InstrumentError
from lumion_hil.instruments.visa import VisaSession, resource_manager

# identity -> the model name a bench file gives it: (vendor pattern, model pattern, model)
MODELS = (
    (r"polatis|huber\+suhner", r".", "polatis"),
    (r"dicon", r".", "dicon-matrix"),
    (r"keysight|agilent", r"^N77\d\d", "keysight-n77xx"),
    (r"thorlabs", r"^PM100", "thorlabs-pm100"),
)
KINDS = {"polatis": "optical_switch", "dicon-matrix": "optical_switch", "keysight-n77xx": "power_meter",
         "thorlabs-pm100": "power_meter"}


@dataclass
class Found:
    """What answered at ``resource``; ``how`` says which query read each value; ``problem``
    why nothing usable did."""

    resource: str
    identity: Identity | None = None
    model: str | None = None
    ports: tuple[int, int] | None = None
    power_monitors: bool | None = None
    channels: int | None = None
    how: dict[str, str] = field(default_factory=dict)
    problem: str | None = None

    @property
    def kind(self) -> str | None:
        return KINDS.get(self.model or "")


def model_of(identity: Identity) -> str | None:
    for vendor, model, name in MODELS:
        if re.search(vendor, identity.vendor, re.I) and re.search(model, identity.model, re.I):
            return name
    return None


def serial_device(resource: str) -> str | None:
    """The device of a serial resource (``ASRL/dev/ttyUSB0::INSTR``, ``/dev/ttyUSB0``,
    ``socket://host:port`` for a matrix behind ser2net), or None for a VISA LAN/USB one."""
    if resource.startswith("ASRL"):
        return resource.removeprefix("ASRL").removesuffix("::INSTR")
    if resource.startswith(("/dev/", "socket://", "rfc2217://")):
        return resource
    return None


def list_resources() -> list[str]:
    """What pyvisa-py finds on this machine: serial ports, USB instruments (with pyusb), VXI-11
    instruments answering a broadcast on the default interface."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notes about optional packages for other discoveries
        try:
            return [r for r in resource_manager().list_resources("?*::INSTR")]
        except Exception:  # a discovery backend that fails on this machine finds nothing
            return []


def identify(resource: str, *, timeout_s: float = 2.0, baud_rate: int = 115200) -> Found:
    """Ask what is at ``resource`` and what it has. Never raises for an instrument that is not
    there or not ours: ``problem`` says so."""
    found = Found(resource)
    device = serial_device(resource)
    try:
        if device is not None:
            _serial(found, device, timeout_s, baud_rate)
        else:
            _visa(found, timeout_s)
    except InstrumentError as exc:
        found.problem = found.problem or exc.reason
    except (OSError, ValueError) as exc:
        found.problem = found.problem or str(exc)
    return found


def _visa(found: Found, timeout_s: float) -> None:
    session = VisaSession(found.resource, found.resource, timeout_s=timeout_s)
    try:
        from lumion_hil.instruments.scpi import parse_identity

        reply = session.query("*IDN?")
        try:
            found.identity = parse_identity(reply)
        except ValueError:
            found.problem = f"*IDN? answered {reply!r}, not vendor,model,serial,firmware"
            return
        found.model = model_of(found.identity)
        found.how["model"] = f"*IDN? -> {reply.strip()}"
        if found.model == "polatis":
            from lumion_hil.instruments.polatis import PolatisSwitch

            switch = PolatisSwitch(session)
            switch.clear_status()
            found.ports = switch.size()
            found.how["ports"] = ":OXC:SWIT:SIZE?"
            found.power_monitors = switch.probe_power_monitors()
            found.how["power_monitors"] = ":PMON:POW? (@1);*OPC? " + ("answered" if found.power_monitors else
                                                                     "refused")
        elif found.model == "keysight-n77xx":
            from lumion_hil.instruments.keysight_n77xx import KeysightN77xx

            meter = KeysightN77xx(session)
            meter.clear_status()
            found.channels = meter.installed_channels()
            found.how["channels"] = ":SLOT<n>:EMPT? (fitted ports)"
        elif found.model == "thorlabs-pm100":
            found.channels = 1
            found.how["channels"] = f"one sensor input ({found.identity.model})"
        elif found.model is None:
            found.problem = f"{found.identity}: not a model lumion-hil drives"
    finally:
        session.close()


def _serial(found: Found, device: str, timeout_s: float, baud_rate: int) -> None:
    from lumion_hil.instruments.dicon import DiconMatrix

    # Opened as a DiCon (the serial model lumion-hil drives): its identity query is *IDN? too.
    matrix = DiconMatrix(found.resource, device, ingress=1, egress=1, baud_rate=baud_rate, timeout_s=timeout_s)
    try:
        found.identity = matrix.identify()
        found.model = model_of(found.identity)
        found.how["model"] = f"*IDN? -> {found.identity.vendor}, {found.identity.model}"
        if found.model == "dicon-matrix":
            found.ports = matrix.read_size()
            found.how["ports"] = "X1 DIM?"
            found.power_monitors = False
            found.how["power_monitors"] = "a DiCon matrix has none"
        else:
            found.problem = f"{found.identity}: not a serial model lumion-hil drives"
    finally:
        matrix.close()
