"""Which instrument answers at an address, told by the instrument itself: its identity query
(``*IDN?``, which a serial switch answers too, on its line), then what its model says of itself
(a switch's size, whether it has power monitors, a meter's channels), as its registry entry
(instruments/registry.py) reads it. What
``lumion-hil bench discover`` drafts a bench file from.

Each reading keeps the query it came from, so a draft can say how every value was obtained.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from lumion_hil.instruments import registry
from lumion_hil.instruments.protocols import Identity, InstrumentError
from lumion_hil.instruments.visa import VisaSession, resource_manager


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
    def kind(self) -> registry.Kind | None:
        entry = registry.find(self.model)
        return entry.kind if entry else None


def model_of(identity: Identity) -> str | None:
    """The registered model (the name a bench file gives it) whose identity patterns match."""
    return next((m.name for m in registry.models() if m.identifies(identity.vendor, identity.model)), None)


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
        if found.model is None:
            found.problem = f"{found.identity}: not a model lumion-hil drives"
            return
        entry = registry.model(found.model)
        probe = entry.probe_function()
        if probe is not None and entry.transport is not registry.Transport.SERIAL:
            probe(found, session)  # what the model says of itself: size, monitors, channels
    finally:
        session.close()


def _serial(found: Found, device: str, timeout_s: float, baud_rate: int) -> None:
    serial = [m for m in registry.models() if m.transport is registry.Transport.SERIAL]
    if not serial:
        found.problem = "a serial line, and no registered model is reached by one"
        return
    # Opened with the driver of the (first) serial model lumion-hil drives: a switch's, whose
    # identity query is *IDN? too.
    matrix = serial[0].driver_class()(found.resource, device, ingress=1, egress=1, baud_rate=baud_rate,
                                      timeout_s=timeout_s)
    try:
        found.identity = matrix.identify()
        found.model = model_of(found.identity)
        found.how["model"] = f"*IDN? -> {found.identity.vendor}, {found.identity.model}"
        entry = registry.model(found.model) if found.model else None
        if entry is not None and entry.transport is registry.Transport.SERIAL:
            probe = entry.probe_function()
            if probe is not None:
                probe(found, matrix)
        else:
            found.problem = f"{found.identity}: not a serial model lumion-hil drives"
    finally:
        matrix.close()
