"""The emulated world's values: the error it refuses a request with, a cross-connect's life
(:class:`Circuit`), a physical event and its true instant (:class:`WorldEvent`), a transmitter and
a receiver on the switch's ports, a value's history over time, a GPU's state, and the states a
NIC link goes through."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


class WorldError(Exception):
    """A request the physical world refuses; emulators turn it into their instrument's error."""

    def __init__(self, kind: str, message: str):
        self.kind = kind  # "range", "conflict", "argument"
        super().__init__(message)


@dataclass
class Circuit:
    """One cross-connect, from command to removal."""

    ingress: int
    egress: int
    commanded_ns: int
    lit_ns: int  # when the beam settles and light passes
    removed_ns: int | None = None
    moving_ns: int | None = None  # when its own beam began to move (after the beams queued before it)

    def live_at(self, t_ns: int) -> bool:
        """Configured at t (switching or lit)."""
        return self.commanded_ns <= t_ns and (self.removed_ns is None or t_ns < self.removed_ns)

    def lit_at(self, t_ns: int) -> bool:
        return self.lit_ns <= t_ns and (self.removed_ns is None or t_ns < self.removed_ns)


@dataclass(frozen=True)
class WorldEvent:
    """A physical event and the instant it truly happened."""

    t_ns: int
    kind: str  # "switch.command", "circuit.lit", "circuit.dark", "port.state", "loss", ...
    subject: str
    detail: dict = field(default_factory=dict, hash=False)


@dataclass
class Source:
    launch_dbm: float
    tx_fibre_loss_db: float
    owner: str
    wavelength_nm: float = 1310.0


@dataclass
class Sink:
    rx_fibre_loss_db: float
    owner: str
    sensitivity_dbm: float  # the receiver's own (its host's emulation setting), not the lab's limit


class History:
    """A value that changes at instants; ``at(t)`` gives the value in force at t."""

    def __init__(self, initial):
        self._times: list[int] = [-(2**62)]
        self._values: list = [initial]

    def set(self, t_ns: int, value) -> None:
        i = bisect.bisect_right(self._times, t_ns)
        # A change supersedes anything planned after it.
        del self._times[i:], self._values[i:]
        self._times.append(t_ns)
        self._values.append(value)

    def at(self, t_ns: int):
        return self._values[bisect.bisect_right(self._times, t_ns) - 1]


@dataclass
class GpuState:
    host: str
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    role: str = "active"
    failed_ns: int | None = None
    xid: int | None = None
    ecc_dbe: int = 0
    retired_pages: int = 0
    temperature_c: float = 45.0
    power_w: float = 80.0


LINK_STATES = ("dark", "light", "locked", "up")
