"""The instrument models the project ships, each one registry entry (instruments/registry.py),
registered by entry point in pyproject.toml as a lab's package registers its own; with them what
reads each model's own answers when ``lumion-hil bench discover`` asks what it has.

Drivers and emulators are named, not imported: loading the registry imports neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lumion_hil.instruments.registry import InstrumentModel, Kind, PowerReplies, SwitchMoves, Transport

if TYPE_CHECKING:
    from lumion_hil.instruments.identify import Found

_MANUALS = "lumion_hil.instruments.emulators.manuals"


def _probe_polatis(found: Found, session: Any) -> None:
    from lumion_hil.instruments.polatis import PolatisSwitch

    switch = PolatisSwitch(session)
    switch.clear_status()
    found.ports = switch.size()
    found.how["ports"] = ":OXC:SWIT:SIZE?"
    found.power_monitors = switch.probe_power_monitors()
    found.how["power_monitors"] = ":PMON:POW? (@1);*OPC? " + ("answered" if found.power_monitors else "refused")


def _probe_dicon(found: Found, matrix: Any) -> None:
    found.ports = matrix.read_size()
    found.how["ports"] = "X1 DIM?"
    found.power_monitors = False
    found.how["power_monitors"] = "a DiCon matrix has none"


def _probe_n77xx(found: Found, session: Any) -> None:
    from lumion_hil.instruments.keysight_n77xx import KeysightN77xx

    meter = KeysightN77xx(session)
    meter.clear_status()
    found.channels = meter.installed_channels()
    found.how["channels"] = ":SLOT<n>:EMPT? (fitted ports)"


def _probe_pm100(found: Found, session: Any) -> None:
    found.channels = 1
    found.how["channels"] = f"one sensor input ({found.identity.model if found.identity else 'PM100'})"


POLATIS = InstrumentModel(
    name="polatis",
    kind=Kind.OPTICAL_SWITCH,
    driver="lumion_hil.instruments.polatis:PolatisSwitch",
    emulator="lumion_hil.instruments.emulators.polatis:PolatisEmulator",
    transport=Transport.VISA,  # raw SCPI on its port only
    identity=(r"polatis|huber\+suhner", r"."),
    driver_options=("power_monitors",),
    probe=f"{__name__}:_probe_polatis",
    switch_time_s=(0.0625, "the documented 'about 50 ms' per connection (published "
                           "polatis.switch_per_connection_s) +25%"),
    manual=f"{_MANUALS}:polatis.yaml",
)

DICON_MATRIX = InstrumentModel(
    name="dicon-matrix",
    kind=Kind.OPTICAL_SWITCH,
    driver="lumion_hil.instruments.dicon:DiconMatrix",
    emulator="lumion_hil.instruments.emulators.dicon:DiconEmulator",
    transport=Transport.SERIAL,
    identity=(r"dicon", r"."),
    probe=f"{__name__}:_probe_dicon",
    switch_time_s=(0.02, "typical MEMS matrix datasheets, 5-20 ms per connection (the slow end)"),
    manual=f"{_MANUALS}:dicon-matrix.yaml",
    # its moves are literal commands; the driver reads the error queue after them
    switch_moves=SwitchMoves(move=r"^X\d+\s+CH\s+(?P<ingress>\d+)\s+(?P<egress>\d+)\s*$",
                             park_all=r"^X\d+\s+CH\s+\*\s+0\s*$", settled=r"SYST:ERR\?"),
)

THORLABS_PM100 = InstrumentModel(
    name="thorlabs-pm100",
    kind=Kind.POWER_METER,
    driver="lumion_hil.instruments.thorlabs_pm100:ThorlabsPM100",
    emulator="lumion_hil.instruments.emulators.thorlabs_pm100:ThorlabsPM100Emulator",
    transport=Transport.VISA,  # USBTMC on a bench; its emulator on a raw SCPI socket
    identity=(r"thorlabs", r"^PM100"),
    probe=f"{__name__}:_probe_pm100",
    manual=f"{_MANUALS}:thorlabs-pm100.yaml",
    power_replies=PowerReplies(
        read=r"^:?(MEAS(URE)?(:SCAL(AR)?)?(:POW(ER)?)?\?|READ\?|FETC(H)?\?)$",
        unit=r"^:?(SENS(E)?:)?POW(ER)?(:DC)?:UNIT\s+(?P<unit>\S+)",
        default_unit="W",  # its power-on unit
        watts=("W", "WATT", "WATTS"),
    ),
)

KEYSIGHT_N77XX = InstrumentModel(
    name="keysight-n77xx",
    kind=Kind.POWER_METER,
    driver="lumion_hil.instruments.keysight_n77xx:KeysightN77xx",
    emulator="lumion_hil.instruments.emulators.keysight_n77xx:KeysightN77xxEmulator",
    # Keysight's programming guide addresses them as TCPIP0::<host>::inst0::INSTR, too
    transport=Transport.VXI11,
    identity=(r"keysight|agilent", r"^N77\d\d"),
    driver_options=("channels",),
    probe=f"{__name__}:_probe_n77xx",
    manual=f"{_MANUALS}:keysight-n77xx.yaml",
    power_replies=PowerReplies(
        read=r"^:?(READ|FETC(H)?)(?P<channel>\d*)(:CHAN(NEL)?(\d+))?(:SCAL(AR)?)?:POW(ER)?(:DC)?\?",
        unit=r"^:?SENS(E)?(?P<channel>\d*)(:CHAN(NEL)?(\d+))?:POW(ER)?:UNIT\s+(?P<unit>\S+)",
        default_unit="DBM",
        watts=("1", "W", "WATT"),
    ),
)
