"""Small protocols per instrument kind. Suites and the controller ask for these, never a vendor."""

from __future__ import annotations

import abc
import enum
import math
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, runtime_checkable

from lumion_hil.instruments.gpu_host.replies import (EventWait, GpuDevice, GpuHealth, JobStarted, JobStatus, LinkState,
                                                     LinkWait, NcclRun, StepWait, TransmitterSet, XidEvent)


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


class InstrumentIOError(InstrumentError):
    """The exchange itself failed (no reply in time, the connection lost, a reply that is not
    one): unlike a refusal, the instrument may or may not have done what was asked."""


class AgentGone(InstrumentIOError):
    """A GPU host's agent is not running: its process (or its ssh session) ended, and, for a call
    that may start it again, starting it again failed. What a controller reads as a lost host."""


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


@runtime_checkable
class PortShutters(Protocol):
    """A capability a switch has or not: it can turn a port's light off and on again without
    touching its cross-connects (a Polatis's port enable/disable). Checked with ``isinstance``;
    a fault that needs it (a switch port failure) is refused with the reason where it is missing."""

    def enable_ports(self, ports: Iterable[int]) -> None: ...

    def disable_ports(self, ports: Iterable[int]) -> None: ...


# --- power meters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OutOfRange:
    """A reading the meter could not make: over its range or under it. Deliberately not a float,
    so it cannot sail through a comparison; ``direction`` is "over" or "under"."""

    direction: str
    raw: str = ""

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"{self.direction} range ({self.raw})" if self.raw else f"{self.direction} range"


Reading = float | OutOfRange


@dataclass
class PowerTrace:
    """Timestamped readings of one meter channel, on the harness clock (perf_counter_ns).

    ``method`` says how it was taken: "hardware-logging" (the meter timed the samples) or
    "polled" (each sample is one query, timed by the harness). ``start_uncertainty_ns`` bounds
    how well the first sample's time is known; each sample also spans ``interval_s``."""

    channel: int
    times_ns: list[int]
    values_dbm: list[Reading]
    method: str
    interval_s: float
    start_uncertainty_ns: int = 0

    def first_at_or_above(self, threshold_dbm: float, after_ns: int | None = None) -> int | None:
        for t, v in zip(self.times_ns, self.values_dbm):
            if (after_ns is None or t >= after_ns) and isinstance(v, float) and v >= threshold_dbm:
                return t
        return None

    def resolution_ns(self) -> int:
        """How finely a change can be placed in time: one sample interval plus the start's
        uncertainty (hardware logging), or the largest gap between samples (polling)."""
        if self.method == "hardware-logging":
            return int(self.interval_s * 1e9) + self.start_uncertainty_ns
        gaps = [b - a for a, b in zip(self.times_ns, self.times_ns[1:])]
        return max(gaps) if gaps else 0


class PowerMeter(abc.ABC):
    """An optical power meter with one or more channels (numbered from 1)."""

    name: str
    channels: int = 1

    @abc.abstractmethod
    def identify(self) -> Identity: ...

    @abc.abstractmethod
    def set_wavelength_nm(self, wavelength_nm: float, channel: int = 1) -> None: ...

    @abc.abstractmethod
    def wavelength_nm(self, channel: int = 1) -> float: ...

    @abc.abstractmethod
    def read_dbm(self, channel: int = 1) -> Reading:
        """One reading in dBm, or OutOfRange."""

    @property
    def hardware_logging(self) -> bool:
        return False

    def start_trace(self, channel: int, duration_s: float, interval_s: float):
        """Begin a trace; :meth:`finish_trace` returns it. Meters without hardware logging poll
        as fast as they answer, in a background thread, and say so in the trace."""
        return _PolledTrace(self, channel, duration_s).start()

    def finish_trace(self, handle, timeout_s: float | None = None) -> PowerTrace:
        return handle.finish(timeout_s)

    def trace(self, channel: int, duration_s: float, interval_s: float) -> PowerTrace:
        return self.finish_trace(self.start_trace(channel, duration_s, interval_s))

    def close(self) -> None:
        """Release the connection to the instrument."""


class _PolledTrace:
    def __init__(self, meter: PowerMeter, channel: int, duration_s: float):
        self.meter, self.channel, self.duration_s = meter, channel, duration_s
        self.times: list[int] = []
        self.values: list[Reading] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"trace-{meter.name}")

    def start(self) -> "_PolledTrace":
        self._thread.start()
        return self

    def _run(self) -> None:
        end = time.perf_counter_ns() + int(self.duration_s * 1e9)
        try:
            while True:
                sent = time.perf_counter_ns()
                if sent >= end:
                    return
                value = self.meter.read_dbm(self.channel)
                got = time.perf_counter_ns()
                self.times.append((sent + got) // 2)  # the reading was made between the two
                self.values.append(value)
        except BaseException as exc:  # surfaced by finish()
            self.error = exc

    def finish(self, timeout_s: float | None = None) -> PowerTrace:
        self._thread.join(timeout_s if timeout_s is not None else self.duration_s + 30)
        if self._thread.is_alive():
            raise InstrumentError(self.meter.name, "polled trace", "polling did not finish in time")
        if self.error is not None:
            raise self.error
        gaps = [b - a for a, b in zip(self.times, self.times[1:])]
        interval = (sum(gaps) / len(gaps) / 1e9) if gaps else 0.0
        return PowerTrace(self.channel, self.times, self.values, "polled", interval)


def watts_to_dbm(watts: float) -> float:
    return 10 * math.log10(watts * 1000) if watts > 0 else -math.inf


# --- GPU hosts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockMapping:
    """host clock - harness clock, and how well it is known (half the best round trip)."""

    offset_ns: int
    uncertainty_ns: int

    def to_harness(self, host_ns: int) -> int:
        return host_ns - self.offset_ns


class GpuHost(abc.ABC):
    """A GPU host: its GPUs' health and XID events, its NICs' links, and its rank of the job.
    Times it returns are on the harness clock, with the mapping's uncertainty."""

    name: str
    clock: ClockMapping

    @abc.abstractmethod
    def devices(self) -> list[GpuDevice]: ...

    @abc.abstractmethod
    def health(self) -> list[GpuHealth]: ...

    @abc.abstractmethod
    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        """The next XID critical error (None: none within ``timeout_s``)."""

    @abc.abstractmethod
    def links(self) -> list[LinkState]: ...

    @abc.abstractmethod
    def wait_link(self, interface: str, up: bool, timeout_s: float) -> LinkWait: ...

    @abc.abstractmethod
    def start_job(self, command: list[str], fields: dict, env: dict | None = None) -> JobStarted: ...

    @abc.abstractmethod
    def stop_job(self, timeout_s: float = 10.0) -> JobStatus: ...

    @abc.abstractmethod
    def job_status(self) -> JobStatus: ...

    @abc.abstractmethod
    def wait_step(self, step: int, timeout_s: float) -> StepWait: ...

    @abc.abstractmethod
    def job_steps(self, after_step: int = 0) -> list[tuple[int, int]]:
        """(step, harness time the agent saw it) for each step after ``after_step``."""

    @abc.abstractmethod
    def job_events(self, event: str | None = None) -> list[dict]:
        """The job's events of this run (or those named ``event``), in order, on the harness clock."""

    @abc.abstractmethod
    def wait_job_event(self, event: str, timeout_s: float) -> EventWait: ...

    @abc.abstractmethod
    def run_nccl_tests(self, argv: list[str], timeout_s: float = 600.0, env: dict | None = None) -> NcclRun: ...

    def close(self) -> None:
        """Release the agent."""


class TransmitterControl(abc.ABC):
    """A capability of some hosts: turning one NIC's transmitter (its laser) off and on, so
    that the light it feeds a switch port can be found by watching for it to go out."""

    @abc.abstractmethod
    def set_transmitter(self, interface: str, on: bool) -> TransmitterSet:
        """A host that cannot refuses with the reason."""
