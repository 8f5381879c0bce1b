"""The bench backend: the one interface the harness talks to a bench through, beside the
instruments' own I/O. It sits at the bottom of the layers, so the harness never imports what
implements it:

- the in-process emulated world (``lumion_hil.instruments.emulators.bench:EmulatedBench``);
- a world served by ``lumion-hil emulate`` (``lumion_hil.instruments.emulators.bench:ServedWorld``);
- a real bench (``lumion_hil.instruments.backend:BenchBackend`` itself: the drivers alone, nothing to start);
- a lab's own (a namespaced rack, a vendor's twin), named in the bench file as ``backend: module:factory``.

A backend starts and stops what the bench needs beyond its drivers, says how a host's agent,
the job and nccl-tests are started there, makes and repairs faults, and holds the ground truth
where there is one (``world``: the emulated physical world; ``None`` on a real bench).

Also here, as the layers' shared constants: the fault kinds, and the names of the faults an
emulated instrument or agent can be made to show.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


class FaultKind(str, enum.Enum):
    """What can go wrong on a bench: the one list of fault kinds."""

    GPU_FAILURE = "gpu_failure"
    PROCESS_KILL = "process_kill"
    FIBRE_CUT = "fibre_cut"
    TRANSCEIVER_DEGRADATION = "transceiver_degradation"
    SWITCH_PORT_FAILURE = "switch_port_failure"

    def __str__(self) -> str:
        return self.value

    @property
    def at_nic(self) -> bool:
        """The fault hits one NIC of a host (its light or its port), not the host as a whole."""
        return self in NIC_FAULTS


NIC_FAULTS = frozenset({FaultKind.FIBRE_CUT, FaultKind.TRANSCEIVER_DEGRADATION, FaultKind.SWITCH_PORT_FAILURE})


@dataclass(frozen=True)
class Fault:
    """One fault, as the harness made it: which kind, on which host (and NIC), how strong."""

    kind: FaultKind
    host: str
    nic: str | None = None
    xid: int = 79
    loss_db: float = 15.0
    detail: dict = field(default_factory=dict, hash=False)

    if TYPE_CHECKING:
        # A fault is also named by its kind's string (a bench file, a transcript, a test):
        # the constructor takes either, and the field holds the enum.
        def __init__(self, kind: FaultKind | str, host: str, nic: str | None = None, xid: int = 79,
                     loss_db: float = 15.0, detail: dict = ...) -> None: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FaultKind(self.kind))  # frozen: set once, here

    def describe(self) -> str:
        where = f"{self.host}.{self.nic}" if self.nic else self.host
        extra = {"gpu_failure": f" (XID {self.xid})", "transceiver_degradation": f" (-{self.loss_db:g} dB)"}
        return f"{self.kind} at {where}{extra.get(self.kind, '')}"


# What an emulated instrument can be made to do wrong (``emulation.faults``, ``emulate --fault``).
INSTRUMENT_FAULTS = {
    "drop": "the connection is closed when the next command arrives",
    "stall": "queries are never answered",
    "delay": "every reply comes DELAY seconds late (default 30: past any timeout)",
    "partial": "replies stop half-way, without their line end",
    "garbage": "replies are noise",
    "errors": "every command (but the error queue's and the * common ones) also puts an error on the queue",
    "out_of_range": "readings are the instrument's over-range sentinel",
    "busy": "set commands are refused: the instrument is busy",
    "power_loss": "the instrument loses power: connections drop, nothing answers for DOWN seconds "
                  "(default 1), then it comes back with its power-on state",
}

# What an emulated host's agent can be made to do wrong: its link to the harness, as an ssh
# session or a host can fail it.
AGENT_FAULTS = {
    "drop": "the session ends when the next request arrives (the agent exits, its job stopped)",
    "stall": "requests are never answered",
    "delay": "every reply comes DELAY seconds late (default 30)",
    "partial": "replies stop half-way, without their line end",
    "garbage": "replies are noise",
    "errors": "every request fails with an error reply",
    "power_loss": "the host loses power: the agent and its job are killed at once",
}


def models_physics(backend) -> bool:
    """Whether an emulated world decides a backend's physics (light, switching, lock, the cost
    model): every bench but a real one, a served world's included. ``backend``: the class or an
    instance."""
    return getattr(backend, "kind", "real") != "real"


class BenchBackend(abc.ABC):
    """What a bench offers the harness beyond its drivers. ``bench`` is the validated bench
    (read for its topology and emulation settings only)."""

    #: "emulated" (an in-process world), "served" (a world served elsewhere), "real"
    kind: str = "real"
    #: real bytes cross its fabric (a real bench; the namespaced bench's sockets and shaped links):
    #: what nccl-tests reports there is measured, even where the rest is emulated
    real_traffic: bool = True
    #: what the harness itself set that its traffic figures follow from (the namespaced bench's
    #: tbf rates and uplinks, from the bench file); empty where the fabric is the lab's own
    shaped_by: str = ""

    def __init__(self, bench: Any):
        self.bench = bench
        #: instrument name -> the address its driver opens (emulated instruments only)
        self.resources: dict[str, str] = {}

    @property
    def world(self) -> Any:
        """The ground truth (the emulated physical world), or None where there is none."""
        return None

    def start(self) -> "BenchBackend":
        return self

    def stop(self) -> None:
        """Stop whatever :meth:`start` started; safe to call twice."""

    def agent_argv(self, host: Any) -> list[str] | None:
        """How to start this host's agent here; None: the bench file's address says (local, ssh)."""
        return None

    def job_argv(self, job: Any, ranks: list[str]) -> list[str] | None:
        """The job's command template on this backend; None: the bench file's ``job.command``."""
        return None

    # Whether job_argv should give the light job where this backend has more than one: the
    # failure sequences restart the job hundreds of times (BenchSession.use_light_job).
    light_job = False

    def job_kind(self, job: Any) -> str:
        """What :meth:`job_argv` runs here, in words (for the run record)."""
        return "the emulated training job (instruments/emulators/job.py)"

    def collective_libraries(self) -> list[str]:
        """The collective libraries whose bandwidth tests this backend runs, by short name (the
        bench's own nccl-tests: ``nccl-tests``)."""
        return ["nccl-tests"]

    def describe_library(self, library: str) -> str:
        """Which library and launcher produce ``library``'s figures, in words (for the record)."""
        return "nccl-tests (the bench's nccl_tests.path and launcher)"

    def collective_rings(self, library: str | None = None) -> int | None:
        """The rings the all-reduce of ``library`` (None: the job's) runs, for the cost model's
        prediction; None: the bench file's ``collectives.rings`` (NCCL's); 0: no ring the model describes."""
        return None

    def not_comparable(self, what: str) -> str | None:
        """Why this bench's figures of ``what`` cannot be judged against a published prototype's:
        ``"job"`` (times that contain the job's start-up and steps), a library of
        :meth:`collective_libraries` (its bandwidth), ``"LIBRARY:model"`` (its figures
        against the cost model's prediction), or ``"job:model"`` (the job's step rates against
        the cost model's, through the library the job all-reduces with); None: they can."""
        return None

    def scale_uplinks(self, factor: float) -> bool:
        """Reshape the electrical rack's uplinks to ``factor`` times what the bench file gives
        them (1: back); False where this bench cannot (a real rack's switches are the lab's)."""
        return False

    def fabric_env(self, host: Any, fabric: str) -> dict[str, str]:
        """What a job or bandwidth test on ``host`` needs beside NCCL_SOCKET_IFNAME to use
        ``fabric`` on this backend (another library's interface variable, say)."""
        return {}

    def reserved_rack_job_argv(self, job: Any, ranks: list[str]) -> list[str] | None:
        """The job on the migration baseline's reserved rack (a rack outside the fabric, one
        process for all its ranks); None: this bench has no such rack (a real one)."""
        return None

    def nccl_tests_folder(self, host: Any, library: str = "nccl-tests") -> str | None:
        """Where the bandwidth test programs of ``library`` (one of :meth:`collective_libraries`;
        nccl-tests' names, flags and output) are for ``host``; None: the bench file's
        ``nccl_tests.path``."""
        return None

    def local_address(self, host: Any) -> bool:
        """Whether ``host`` runs on this machine (its job's master address is the loopback)."""
        return host.address == "local"

    def master_address(self, host: Any) -> str:
        """The address the job's other ranks reach rank 0's host at (its rendezvous)."""
        return "127.0.0.1" if self.local_address(host) else host.address.split("@")[-1]

    def can_inject(self, kind: str) -> tuple[bool, str]:
        """Whether this backend makes faults of ``kind``, and how (or why not)."""
        return False, f"{kind} cannot be made on this bench"

    def inject(self, fault: Fault) -> int:
        """Make ``fault``; returns its instant on this machine's monotonic clock (ns)."""
        raise NotImplementedError(self.can_inject(fault.kind)[1])

    def repair(self, fault: Fault) -> None:
        """Undo ``fault`` where this backend can (a failed GPU on a real bench it cannot)."""

    def set_fault(self, part: str, fault: str) -> None:
        """Make an emulated instrument or agent misbehave (see INSTRUMENT_FAULTS)."""
        raise ValueError(f"{part}: faults of emulated parts need an emulated bench")

    def __enter__(self) -> "BenchBackend":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
