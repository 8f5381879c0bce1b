"""The agent's replies of a fixed shape, as the harness reads them: an XID event, a link's state
after a wait, a transmitter turned off or on, the job's status (and after a wait for a step or
an event), a job started, an nccl-tests run. The wire stays JSON objects (wire.py); the client
(client.py) makes these from them once the instants are on the harness clock, so a caller reads
fields a type checker knows instead of keys it has to remember. ``as_dict`` gives the reply
back as the agent sent it, with the client's clock fields, for records and transcripts.

What the job itself decides stays a dict inside them: its progress line's fields (``step``,
``step_time_s``, ``samples_per_s``...) and its events (``nccl_init``, ``collective``, with what
the job printed beside them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self


# A reply type's field names, read once (dataclasses.fields costs more than making the reply).
_FIELD_NAMES: dict[type, frozenset[str]] = {}


class Reply:
    """What every reply here can do: be made from the agent's JSON object (keys it does not
    know, from an agent newer than the harness, are left out rather than refused) and be given
    back as one."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # each reply is a dataclass

    @classmethod
    def from_json(cls, reply: dict[str, Any]) -> Self:
        known = _FIELD_NAMES.get(cls)
        if known is None:
            known = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        return cls(**{k: v for k, v in reply.items() if k in known})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class XidEvent(Reply):
    """A GPU's XID error, as the agent's NVML event wait saw it."""

    xid: int
    index: int | None  # the GPU's NVML index (None: the event's device was not one the agent registered)
    uuid: str | None
    t_ns: int  # harness clock
    host_t_ns: int | None = None  # the host's own clock, as the agent read it
    uncertainty_ns: int = 0  # of t_ns: half the best round trip of the clock mapping


@dataclass(frozen=True)
class GpuDevice(Reply):
    """One GPU as NVML lists it; a lost one (fallen off the bus) says only that."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False


@dataclass(frozen=True)
class GpuHealth(Reply):
    """One GPU's health as NVML reads it. A field the device does not support is None; a lost
    GPU gives its index, ``lost`` and the ``reason``."""

    index: int
    lost: bool
    uuid: str | None = None
    reason: str | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_dbe: int | None = None
    remapped_rows: dict[str, int] | None = None  # correctable, uncorrectable, pending, failure
    clock_event_reasons: int | None = None  # NVML's bit mask


@dataclass(frozen=True)
class LinkState(Reply):
    """A NIC's link as the host's kernel shows it now (sysfs: carrier, operstate, its counters)."""

    interface: str
    carrier: int | None  # 1 with carrier, 0 without, None unreadable (the interface down)
    operstate: str | None
    t_ns: int  # harness clock: when it was read
    carrier_changes: int | None = None
    carrier_up_count: int | None = None
    carrier_down_count: int | None = None
    speed_mbps: int | None = None  # None while the link is down or where the kernel does not say
    host_t_ns: int | None = None
    uncertainty_ns: int = 0

    @property
    def up(self) -> bool:
        """Carrier, and the kernel calls the interface up (or cannot tell: ``unknown``)."""
        return self.carrier == 1 and self.operstate in ("up", "unknown")


@dataclass(frozen=True)
class LinkWait(LinkState):
    """A NIC's link as the host's kernel showed it when a wait for it to come up (or go down)
    ended: ``timed_out`` if it never did, and then the state is the last one read. ``t_ns`` is
    when the change was seen (netlink's wake-up), else when it was read."""

    timed_out: bool = field(kw_only=True)
    method: str = field(kw_only=True)  # how the agent waited: "netlink" (told of changes) or "polling"
    already: bool = False  # it was so at the first look: t_ns is that look, not the change


@dataclass(frozen=True)
class TransmitterSet(Reply):
    """An interface's transmitter turned off or on (the fibre walk), and when."""

    interface: str
    on: bool
    t_ns: int  # harness clock
    host_t_ns: int | None = None
    uncertainty_ns: int = 0


@dataclass(frozen=True)
class JobStatus(Reply):
    """The job's rank on one host as its agent sees it: running or ended (and how), its last
    progress and lines. Instants on the harness clock; ``started_ns`` None before any start."""

    running: bool
    pid: int | None  # None: no job started in this agent's session
    returncode: int | None  # None while it runs
    started_ns: int | None
    exit_ns: int | None
    argv: list[str] | None
    fields: dict[str, Any]  # the template's fields it was started with (rank, world_size...)
    progress: dict[str, Any]  # the job's last progress line (``step``, ``t_ns`` on the harness clock...)
    last_lines: list[str]
    error_lines: list[str]  # the lines that read as an error (a traceback, a launcher's report)

    @property
    def step(self) -> int:
        """The last step the job reported (0 before its first)."""
        return int(self.progress.get("step", 0))

    @property
    def ended(self) -> bool:
        """A job was started in this session and its process has ended."""
        return not self.running and self.pid is not None

    def last_words(self, lines: int = 2) -> list[str]:
        """What the job said as it failed: its error lines where the agent kept some (a
        launcher's report may follow them), else its last lines."""
        return self.error_lines[-lines:] or self.last_lines[-lines:]


@dataclass(frozen=True)
class StepWait(JobStatus):
    """The job's status when a wait for a step ended: ``reached`` it, the process ended, or
    ``timed_out``."""

    reached: bool = False
    timed_out: bool = False


@dataclass(frozen=True)
class EventWait(Reply):
    """A wait for the job's first ``event`` of this run: the event (its ``t_ns`` on the harness
    clock, with what the job printed beside it), or None when the job ended first or the wait
    ``timed_out``."""

    event: dict[str, Any] | None
    timed_out: bool
    running: bool
    last_lines: list[str]


@dataclass(frozen=True)
class JobStarted(Reply):
    """A rank started: its process, the command as filled in, when (harness clock) and where its
    output is kept on the host."""

    pid: int
    argv: list[str]
    started_ns: int
    log: str


@dataclass(frozen=True)
class NcclRun(Reply):
    """nccl-tests (or the bench's bandwidth test) run on a host: its exit status and output,
    and when it started and ended (harness clock)."""

    returncode: int
    stdout: str
    stderr: str
    started_ns: int
    ended_ns: int
