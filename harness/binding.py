"""Which driver serves which instrument model, and how it is opened from a bench entry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumion_hil.harness.config import MeterInstrument, SwitchInstrument
from lumion_hil.instruments.visa import VisaSession

if TYPE_CHECKING:
    from lumion_hil.instruments.keysight_n77xx import KeysightN77xx
    from lumion_hil.instruments.thorlabs_pm100 import ThorlabsPM100


def open_driver(name: str, spec: SwitchInstrument | MeterInstrument, resource: str, *, opc_timeout_s: float = 10.0):
    """Open the driver for a bench instrument at ``resource`` (the real address, or where its
    emulator listens). The driver does not know, and does not care, which one it is. SCPI
    instruments start with their error queue cleared (``*CLS``); meters are set to the bench's
    wavelength on every channel."""
    meter: ThorlabsPM100 | KeysightN77xx
    if spec.model == "polatis":
        from lumion_hil.instruments.polatis import PolatisSwitch

        assert isinstance(spec, SwitchInstrument)  # the bench file's validation: a switch model is a switch's
        switch = PolatisSwitch(_visa(name, spec, resource), power_monitors=spec.power_monitors,
                               opc_timeout_s=opc_timeout_s)
        try:
            switch.clear_status()
        except BaseException:
            switch.close()
            raise
        return switch
    if spec.model == "dicon-matrix":
        from lumion_hil.instruments.dicon import DiconMatrix

        assert isinstance(spec, SwitchInstrument)
        return DiconMatrix(name, resource, ingress=spec.ports[0], egress=spec.ports[1], baud_rate=spec.baud_rate,
                           timeout_s=max(spec.timeout_s, opc_timeout_s), pace_s=spec.pace_s)
    if spec.model == "thorlabs-pm100":
        from lumion_hil.instruments.thorlabs_pm100 import ThorlabsPM100

        assert isinstance(spec, MeterInstrument)  # the bench file's validation: a meter model is a meter's
        meter = ThorlabsPM100(_visa(name, spec, resource), opc_timeout_s=opc_timeout_s)
    elif spec.model == "keysight-n77xx":
        from lumion_hil.instruments.keysight_n77xx import KeysightN77xx

        assert isinstance(spec, MeterInstrument)
        meter = KeysightN77xx(_visa(name, spec, resource), channels=spec.channels, opc_timeout_s=opc_timeout_s)
    else:
        raise ValueError(f"{name}: no driver for model {spec.model!r}")
    try:
        meter.clear_status()
        for channel in range(1, meter.channels + 1):
            meter.set_wavelength_nm(spec.wavelength_nm, channel)
    except BaseException:
        meter.close()
        raise
    return meter


def _visa(name: str, spec, resource: str) -> VisaSession:
    return VisaSession(
        name,
        resource,
        timeout_s=spec.timeout_s,
        read_termination=spec.read_termination,
        write_termination=spec.write_termination,
        pace_s=spec.pace_s,
    )
