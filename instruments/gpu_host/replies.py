"""The agent's replies of a fixed shape, as the harness reads them: an XID event, a link's state
after a wait, a transmitter turned off or on. The wire stays JSON objects (wire.py); the client
(client.py) makes these from them once the instants are on the harness clock, so a caller reads
fields a type checker knows instead of keys it has to remember. ``as_dict`` gives the reply
back as the agent sent it, with the client's clock fields, for records and transcripts.

Replies whose shape depends on the job or on the host (a job's status, its events, a GPU's
health) stay dicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Reply = TypeVar("_Reply", bound="DataclassInstance")


def _from_json(cls: type[_Reply], reply: dict[str, Any]) -> _Reply:
    """The fields ``cls`` knows, from a reply; keys it does not know (an agent newer than the
    harness) are left out rather than refused."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in reply.items() if k in known})


@dataclass(frozen=True)
class XidEvent:
    """A GPU's XID error, as the agent's NVML event wait saw it."""

    xid: int
    index: int | None  # the GPU's NVML index (None: the event's device was not one the agent registered)
    uuid: str | None
    t_ns: int  # harness clock
    host_t_ns: int | None = None  # the host's own clock, as the agent read it
    uncertainty_ns: int = 0  # of t_ns: half the best round trip of the clock mapping

    @classmethod
    def from_json(cls, reply: dict[str, Any]) -> XidEvent:
        return _from_json(cls, reply)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LinkWait:
    """A NIC's link as the host's kernel showed it when a wait for it to come up (or go down)
    ended: ``timed_out`` if it never did, and then the state is the last one read."""

    interface: str
    carrier: int | None  # 1 with carrier, 0 without, None unreadable (the interface down)
    operstate: str | None
    t_ns: int  # harness clock: when the change was seen (netlink's wake-up), else when it was read
    timed_out: bool
    method: str  # how the agent waited: "netlink" (told of changes) or "polling"
    already: bool = False  # it was so at the first look: t_ns is that look, not the change
    carrier_changes: int | None = None
    carrier_up_count: int | None = None
    carrier_down_count: int | None = None
    speed_mbps: int | None = None  # None while the link is down or where the kernel does not say
    host_t_ns: int | None = None
    uncertainty_ns: int = 0

    @classmethod
    def from_json(cls, reply: dict[str, Any]) -> LinkWait:
        return _from_json(cls, reply)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TransmitterSet:
    """An interface's transmitter turned off or on (the fibre walk), and when."""

    interface: str
    on: bool
    t_ns: int  # harness clock
    host_t_ns: int | None = None
    uncertainty_ns: int = 0

    @classmethod
    def from_json(cls, reply: dict[str, Any]) -> TransmitterSet:
        return _from_json(cls, reply)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
