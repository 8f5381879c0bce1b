"""Which driver serves which instrument model, and how it is opened from a bench entry."""

from __future__ import annotations

from lumion_hil.harness.config_instruments import MeterInstrument, SwitchInstrument
from lumion_hil.instruments import registry
from lumion_hil.instruments.visa import VisaSession


def open_driver(name: str, spec: SwitchInstrument | MeterInstrument, resource: str, *, opc_timeout_s: float = 10.0):
    """Open the driver for a bench instrument at ``resource`` (the real address, or where its
    emulator listens). The driver does not know, and does not care, which one it is. Its model's
    registry entry (instruments/registry.py) names the driver, how it is reached and which of
    the bench entry's settings it takes. SCPI instruments start with their error queue cleared
    (``*CLS``); meters are set to the bench's wavelength on every channel."""
    entry = registry.model(spec.model, instrument=name)
    driver = entry.driver_class()
    if entry.transport is registry.Transport.SERIAL:
        assert isinstance(spec, SwitchInstrument)  # the bench file's validation: a serial model is a switch
        return driver(name, resource, ingress=spec.ports[0], egress=spec.ports[1], baud_rate=spec.baud_rate,
                      timeout_s=max(spec.timeout_s, opc_timeout_s), pace_s=spec.pace_s)
    options = {option: getattr(spec, option) for option in entry.driver_options}
    instrument = driver(_visa(name, spec, resource), opc_timeout_s=opc_timeout_s, **options)
    try:
        instrument.clear_status()
        if isinstance(spec, MeterInstrument):  # the bench file's validation: a meter model is a meter's
            for channel in range(1, instrument.channels + 1):
                instrument.set_wavelength_nm(spec.wavelength_nm, channel)
    except BaseException:
        instrument.close()
        raise
    return instrument


def _visa(name: str, spec, resource: str) -> VisaSession:
    return VisaSession(
        name,
        resource,
        timeout_s=spec.timeout_s,
        read_termination=spec.read_termination,
        write_termination=spec.write_termination,
        pace_s=spec.pace_s,
    )
