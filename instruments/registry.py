"""The instrument models lumion-hil drives, found by entry point (group ``lumion_hil.instruments``).

Each model is one :class:`InstrumentModel`: its name (what a bench file's ``model`` says), its
kind, its driver and its emulator (named as ``module:Name`` and imported only when used, so the
harness never imports an emulator and a driver never does), its transport, how its identity
query names it, and what the rest of the project needs to know of it: the switching time
``lumion-hil bench discover`` drafts, its programming reference as data (the conformance table),
how a transcript shows its power readings or its connections (``lumion-hil fidelity``).

The project's own models are registered in its pyproject.toml; a lab adds its own meter or
switch the same way, from its own package, without editing the project: one driver module, one
emulator module and one entry point naming an :class:`InstrumentModel`.
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.metadata
import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

GROUP = "lumion_hil.instruments"


class Kind(enum.StrEnum):
    """What a model is, as a bench file's ``kind`` says it."""

    OPTICAL_SWITCH = "optical_switch"
    POWER_METER = "power_meter"


class Transport(enum.StrEnum):
    """How the real instrument is reached, and so how its emulator is served and its driver
    opened: ``visa`` a VISA message session (the emulator on a raw SCPI socket); ``vxi11`` the
    same, and the emulator answers VXI-11 too (the LAN protocol its maker's tools address it
    by); ``serial`` a serial line (the emulator on a pseudo-terminal, the driver given the
    device)."""

    VISA = "visa"
    VXI11 = "vxi11"
    SERIAL = "serial"


@dataclass(frozen=True)
class PowerReplies:
    """How a meter's power readings read in a transcript: the commands that set its unit and
    the queries that read a power, as regular expressions over one command of a line (SCPI's
    ``;`` splits them). ``unit`` has a group ``unit`` (the unit set) and may have a group
    ``channel`` (1 where it is absent or empty); ``read`` may have a group ``channel``.
    ``default_unit`` is the unit of a reading no command set (the instrument's power-on one)."""

    read: str
    unit: str
    default_unit: str = "DBM"
    #: what a unit-setting command's argument says for watts (any other: dBm)
    watts: tuple[str, ...] = ("W", "WATT", "1")

    @functools.cached_property
    def _read(self) -> re.Pattern[str]:
        return re.compile(self.read, re.IGNORECASE)

    @functools.cached_property
    def _unit(self) -> re.Pattern[str]:
        return re.compile(self.unit, re.IGNORECASE)

    def unit_set(self, command: str) -> tuple[int, str] | None:
        """(channel, "W" or "DBM") a unit-setting command sets; None for any other command."""
        m = self._unit.match(command)
        if not m:
            return None
        return _channel(m), "W" if m.group("unit").upper() in self.watts else "DBM"

    def reads(self, query: str) -> int | None:
        """The channel a power query reads; None for any other query."""
        m = self._read.match(query)
        return _channel(m) if m else None


def _channel(m: re.Match[str]) -> int:
    return int(m.groupdict().get("channel") or 1)


@dataclass(frozen=True)
class SwitchMoves:
    """How a switch whose commands are not SCPI's cross-connect set (``:OXC:SWIT:CONN...``, read
    by fidelity for every other switch) shows its connections in a transcript: ``move`` makes
    one (groups ``ingress`` and ``egress``; egress 0 parks the ingress, counted from the first
    egress port), ``park_all`` parks every one, and ``settled`` is the query the driver asks
    after its moves, whose reply ends them."""

    move: str
    park_all: str
    settled: str

    def match_move(self, command: str) -> tuple[int, int] | None:
        m = re.match(self.move, command, re.IGNORECASE)
        return (int(m.group("ingress")), int(m.group("egress"))) if m else None

    def parks_all(self, command: str) -> bool:
        return re.match(self.park_all, command, re.IGNORECASE) is not None

    def settles(self, command: str) -> bool:
        return re.match(self.settled, command, re.IGNORECASE) is not None


@dataclass(frozen=True)
class InstrumentModel:
    """One instrument model. ``driver`` is constructed, by transport: ``visa``/``vxi11``:
    ``Driver(session, opc_timeout_s=..., **options)``, with one keyword per name in
    ``driver_options`` taken from the bench entry of the same name (a Polatis's
    ``power_monitors``, an N77xx's ``channels``); ``serial`` (a switch): ``Driver(name, device,
    ingress=, egress=, baud_rate=, timeout_s=, pace_s=)``. ``emulator`` is constructed as
    ``Emulator(name, spec, world, seed=)`` for a switch and ``Emulator(name, spec, world, bench,
    seed=)`` for a meter (a meter's detectors are the bench's). ``identity`` is (vendor pattern,
    model pattern) over its ``*IDN?`` reply; ``probe`` (``module:name``) is called as
    ``probe(found, session_or_driver)`` by instruments/identify.py to read what the model says
    of itself (size, monitors, channels). ``manual`` is its programming reference as data
    (``package:file.yaml``, see emulators/conformance.py)."""

    name: str
    kind: Kind
    driver: str
    emulator: str
    transport: Transport = Transport.VISA
    identity: tuple[str, str] = (".", ".")
    driver_options: tuple[str, ...] = ()
    probe: str | None = None
    #: the switching time per connection a drafted bench requires, and where it comes from
    switch_time_s: tuple[float, str] | None = None
    manual: str | None = None
    power_replies: PowerReplies | None = None
    switch_moves: SwitchMoves | None = None

    def driver_class(self) -> Any:
        return load(self.driver)

    def emulator_class(self) -> Any:
        return load(self.emulator)

    def probe_function(self) -> Callable[..., None] | None:
        return load(self.probe) if self.probe else None

    def manual_path(self) -> Path | None:
        """Where its manual file is (None: it has none)."""
        if not self.manual:
            return None
        package, _, name = self.manual.partition(":")
        return Path(str(importlib.resources.files(package).joinpath(name)))

    def identifies(self, vendor: str, model: str) -> bool:
        """Whether an ``*IDN?`` reply's vendor and model fields name this model."""
        return bool(re.search(self.identity[0], vendor, re.I) and re.search(self.identity[1], model, re.I))


class UnknownModel(ValueError):
    """A model no installed package registers."""


def load(reference: str) -> Any:
    """The object a ``module:Name`` reference names (``Name`` may be dotted)."""
    module, _, name = reference.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split(".") if name else ():
        obj = getattr(obj, part)
    return obj


def models(kind: Kind | None = None) -> tuple[InstrumentModel, ...]:
    """Every registered model (of ``kind``), the project's own first, in registration order."""
    return tuple(m for m in _registered().values() if kind is None or m.kind == kind)


def names(kind: Kind | None = None) -> tuple[str, ...]:
    return tuple(m.name for m in models(kind))


def model(name: str, *, instrument: str | None = None) -> InstrumentModel:
    """The model registered as ``name``; :class:`UnknownModel` names the known ones (and the
    bench's ``instrument`` that asked, where one did)."""
    found = _registered().get(name)
    if found is None:
        asker = f"{instrument}: " if instrument else ""
        raise UnknownModel(f"{asker}unknown instrument model {name!r}; known: {', '.join(_registered())}")
    return found


def find(name: str | None) -> InstrumentModel | None:
    """The model registered as ``name``, or None (no name, or none registered by it)."""
    return _registered().get(name) if name else None


def refresh() -> None:
    """Read the entry points again (a package installed, or a path added, since)."""
    _registered.cache_clear()


@functools.cache
def _registered() -> dict[str, InstrumentModel]:
    out: dict[str, InstrumentModel] = {}
    for point in sorted(importlib.metadata.entry_points(group=GROUP), key=_order):
        entry = point.load()
        if not isinstance(entry, InstrumentModel):
            raise TypeError(f"entry point {point.name} = {point.value} (group {GROUP}): not an InstrumentModel")
        if entry.name != point.name:
            raise ValueError(f"entry point {point.name} = {point.value} (group {GROUP}): its model is named "
                             f"{entry.name!r}")
        out.setdefault(entry.name, entry)
    if not out:
        # The project registers its own models: none means its installed metadata is missing
        # or older than its code (an egg-info left from before the registry, a copied tree).
        raise RuntimeError(f"no instrument models are registered (entry-point group {GROUP}): lumion-hil's "
                           "installed metadata is missing or stale; install it again (scripts/setup, or "
                           "pip install -e . in the project's folder)")
    return out


def _order(point: importlib.metadata.EntryPoint) -> tuple[int, str, int, str]:
    """The project's own models first, in the order their module defines them (its switches,
    then its meters: the order of its tables and messages); then each plug-in's, by name.
    (Installed metadata lists a group's entry points sorted by name, not as written.)"""
    distribution = point.dist.name if point.dist is not None else ""
    own = distribution.replace("_", "-").lower() == "lumion-hil"
    place = 0
    if own:
        names = list(vars(importlib.import_module(point.module)))
        place = names.index(point.attr) if point.attr in names else len(names)
    return (0 if own else 1, "" if own else distribution, place, point.name)
