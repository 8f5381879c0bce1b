"""Small protocols per instrument kind. Suites and the controller ask for these, never a vendor."""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import Iterable, Mapping


class InstrumentError(Exception):
    """An instrument did not do what was asked: names the instrument, the command, what came back."""

    def __init__(self, instrument: str, command: str, reason: str, reply: str | None = None):
        self.instrument = instrument
        self.command = command
        self.reason = reason
        self.reply = reply
        text = f"{instrument}: {command!r}: {reason}"
        if reply is not None:
            text += f" (reply: {reply!r})"
        super().__init__(text)


class NotSupported(InstrumentError):
    """The instrument model cannot do this (a switch without power monitors, say)."""


@dataclass(frozen=True)
class Identity:
    vendor: str
    model: str
    serial: str
    firmware: str

    def __str__(self) -> str:
        return f"{self.vendor} {self.model} (serial {self.serial}, firmware {self.firmware})"


class PortState(enum.Enum):
    ENABLED = "E"
    DISABLED = "D"
    FAILED = "F"


Pairs = Iterable[tuple[int, int]] | Mapping[int, int]


def as_pairs(pairs: Pairs) -> list[tuple[int, int]]:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return [(int(i), int(e)) for i, e in items]


class OpticalSwitch(abc.ABC):
    """An optical circuit switch or photonic mesh: ingress ports cross-connected to egress ports.

    Every method that changes connections returns only once the switch reports completion."""

    name: str

    @abc.abstractmethod
    def identify(self) -> Identity: ...

    @abc.abstractmethod
    def size(self) -> tuple[int, int]:
        """(ingress port count, egress port count)."""

    @abc.abstractmethod
    def connections(self) -> dict[int, int]:
        """Current cross-connects, ingress -> egress."""

    @abc.abstractmethod
    def connect(self, pairs: Pairs) -> None:
        """Add cross-connects, keeping the others; return when they have settled."""

    @abc.abstractmethod
    def disconnect(self, pairs: Pairs) -> None:
        """Remove the given cross-connects."""

    @abc.abstractmethod
    def disconnect_all(self) -> None: ...

    def replace_all(self, pairs: Pairs) -> None:
        """Make these the only cross-connects, touching none that already match."""
        wanted = set(as_pairs(pairs))
        current = set(self.connections().items())
        if current - wanted:
            self.disconnect(sorted(current - wanted))
        if wanted - current:
            self.connect(sorted(wanted - current))

    @abc.abstractmethod
    def port_states(self, ports: Iterable[int]) -> dict[int, PortState]: ...

    @property
    def has_power_monitors(self) -> bool:
        return False

    def port_power_dbm(self, ports: Iterable[int]) -> dict[int, float]:
        """Optical power per port from the switch's own monitors."""
        raise NotSupported(self.name, "port power", "this switch has no power monitors")

    def close(self) -> None:
        """Release the connection to the instrument."""
