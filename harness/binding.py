"""Which driver serves which instrument model, and how it is opened from a bench entry."""

from __future__ import annotations

from harness.config import MeterInstrument, SwitchInstrument
from instruments.visa import VisaSession


def open_driver(name: str, spec: SwitchInstrument | MeterInstrument, resource: str, *, opc_timeout_s: float = 10.0):
    """Open the driver for a bench instrument at ``resource`` (the real address, or where its
    emulator listens). The driver does not know, and does not care, which one it is."""
    if spec.model == "polatis":
        from instruments.polatis import PolatisSwitch

        return PolatisSwitch(_visa(name, spec, resource), power_monitors=spec.power_monitors,
                             opc_timeout_s=opc_timeout_s)
    raise ValueError(f"{name}: no driver for model {spec.model!r} yet")


def _visa(name: str, spec, resource: str) -> VisaSession:
    return VisaSession(
        name,
        resource,
        timeout_s=spec.timeout_s,
        read_termination=spec.read_termination,
        write_termination=spec.write_termination,
        pace_s=spec.pace_s,
    )
