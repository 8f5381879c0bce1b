"""The recovery model: what a recovery controller is asked to do and what it answers. The
phases, what was detected, the plan, the result, and the interface a lab's controller
implements (whole, or by replacing a part of the reference controller: see
harness/controller.py).

A bench names the controller under test with ``recovery.controller``: ``module:factory`` or the
name of an entry point in ``lumion_hil.controllers``; the factory is called as
``factory(session, ranks, **recovery.controller_options)`` and returns a
:class:`RecoveryController`.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Protocol

from lumion_hil.harness.errors import HarnessError
from lumion_hil.harness.plugins import CONTROLLERS, PluginError, load_object


class Phase(enum.StrEnum):
    """The phases of a recovery, in the order they happen (``retry`` and ``replan`` only where
    a first guess was wrong or a host was lost on the way)."""

    DETECT = "detect"
    PLAN = "plan"
    SWITCH = "switch"
    LIGHT = "light"
    LINK = "link"
    RETRY = "retry"
    RESTART = "restart"
    FIRST_STEP = "first_step"
    REPLAN = "replan"


PHASES = tuple(p.value for p in Phase)


class Status(enum.StrEnum):
    RECOVERED = "recovered"  # the job runs again at full size
    DEGRADED = "degraded"  # it cannot, for a reason the fabric explains (no spare, a protected port)
    FAILED = "failed"  # the recovery itself failed


class DetectionKind(enum.StrEnum):
    XID = "xid"  # the GPU reported a fatal XID (NVML event)
    LINK_DOWN = "link_down"  # a NIC lost carrier (netlink)
    MARGIN_LOW = "margin_low"  # the light at a receiver fell below sensitivity + margin (meters)
    AGENT_LOST = "agent_lost"  # the host's agent is gone
    JOB_EXIT = "job_exit"  # the job's process exited


@dataclass
class Detection:
    kind: DetectionKind
    host: str
    t_ns: int  # harness clock
    uncertainty_ns: int = 0
    detail: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a lab's watcher may still name the kind by its string; the field holds the enum either way
        self.kind = DetectionKind(self.kind)


@dataclass
class Plan:
    failed_host: str | None
    spare: str | None
    ranks_before: list[str]
    ranks_after: list[str]
    remove: list[tuple[int, int]] = field(default_factory=list)
    add: list[tuple[int, int]] = field(default_factory=list)
    diagnosis: str = ""
    fallback: "Plan | None" = None  # where the diagnosis was a guess: the other end to try


@dataclass
class RecoveryResult:
    status: Status
    reason: str = ""
    detection: Detection | None = None
    plan: Plan | None = None
    phases: dict[str, tuple[int, int]] = field(default_factory=dict)
    restarted_ns: int | None = None
    first_step_ns: int | None = None
    first_step_uncertainty_ns: int = 0

    def __post_init__(self) -> None:
        # a lab's controller may still give the status as its string; the field holds the enum
        self.status = Status(self.status)

    def phase_s(self, name: str) -> float | None:
        if name not in self.phases:
            return None
        start, end = self.phases[name]
        return (end - start) / 1e9


class RecoveryError(HarnessError):
    pass


class PhaseListener(Protocol):
    """Told as a recovery enters each phase (its name, a :class:`Phase`, and the plan so far,
    None before there is one), on the recovery's own thread: what it does there is part of the
    recovery's time, which is how a harness makes a second fault mid-recovery."""

    def __call__(self, phase: str, plan: Plan | None, /) -> None: ...


class RecoveryController(abc.ABC):
    """What the recovery suite drives: ``arm`` before the fault, ``recover`` after it."""

    def __init__(self, session, ranks: list[str]):
        self.session = session
        self.ranks = list(ranks)
        # Called with a phase's name and the plan so far as the controller enters the phase: a
        # harness can act mid-recovery (make a second fault, say). A controller that never calls
        # them is still a controller.
        self.phase_listeners: list[PhaseListener] = []

    @abc.abstractmethod
    def arm(self) -> None:
        """Start watching for failures of the running job."""

    @abc.abstractmethod
    def recover(self, fault_ns: int | None = None) -> RecoveryResult:
        """Wait for a failure, recover from it, and report. ``fault_ns`` (when the harness made
        the fault) starts the detect phase; without it, detection time is all that is known."""

    def disarm(self) -> None:
        """Stop watching."""

    def return_to_service(self, host: str) -> None:
        """The lab repaired ``host``: it may serve as a spare again."""

    def resume(self) -> RecoveryResult:
        """After a repair, bring a degraded job back to full size (default: cannot)."""
        return RecoveryResult(Status.DEGRADED, f"{type(self).__name__} cannot resume a degraded job")


def load_controller(session, ranks: list[str]) -> RecoveryController:
    spec = session.bench.recovery.controller
    try:
        factory = load_object(spec, CONTROLLERS, "recovery.controller")
    except PluginError as exc:
        raise RecoveryError(str(exc)) from None
    controller = factory(session, ranks, **session.bench.recovery.controller_options)
    if not isinstance(controller, RecoveryController):
        raise RecoveryError(f"recovery.controller {spec!r} did not return a RecoveryController")
    return controller
