"""Bench files: YAML validated into typed models.

A bench file names every instrument, the fabric topology, the detectors, the limits to judge
against and the safety rules. ``load_bench`` turns it into a :class:`Bench` or raises a
:class:`~harness.errors.BenchFileError` naming the file, each field path, its line and the reason.
``bench_json_schema`` exports the JSON schema from the same models.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterable, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from lumion_hil.harness import timescale
from lumion_hil.harness.errors import BenchFileError, BenchProblem
from lumion_hil.harness.plugins import BACKENDS, CONTROLLERS, plugin_names
from lumion_hil.instruments import registry
from lumion_hil.instruments.backend import AGENT_FAULTS, INSTRUMENT_FAULTS

EMULATED = "emulated"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sourced(_Model):
    """A number with the place it came from, so a report can say why a limit is what it is."""

    value: float
    source: str = "bench file"

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, data: Any) -> Any:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"value": data}
        return data


# --- instruments -----------------------------------------------------------------------------


def _check_faults(faults: list[str], known: dict[str, str]) -> list[str]:
    """``name`` or ``name=seconds``, each a fault the emulator knows."""
    for fault in faults:
        name, _, value = fault.partition("=")
        if name not in known:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(known)}")
        if value:
            try:
                float(value)
            except ValueError:
                raise ValueError(f"fault {fault!r}: {value!r} is not a number of seconds") from None
    return faults


def _instrument_faults(faults: list[str]) -> list[str]:
    return _check_faults(faults, INSTRUMENT_FAULTS)


def _agent_faults(faults: list[str]) -> list[str]:
    return _check_faults(faults, AGENT_FAULTS)


class SwitchEmulation(_Model):
    """How the emulated switch behaves. Used only when the instrument's resource is ``emulated``."""

    switching_time_s: NonNegativeFloat = 0.05
    switching_jitter_s: NonNegativeFloat = Field(default=0.0, description="spread (standard deviation) of one "
                                                 "connection's switching time: each connection draws its own, never "
                                                 "below zero (0: every one takes switching_time_s)")
    insertion_loss_db: NonNegativeFloat = 1.5
    monitor_floor_dbm: float = -50.0
    monitor_noise_db: NonNegativeFloat = 0.02
    command_latency_s: NonNegativeFloat = 0.0002
    multi_connection_extra_s: NonNegativeFloat = Field(default=0.0, description="extra switching time of each "
                                                       "connection in a command that makes two or more (a controller "
                                                       "that moves a batch of beams more slowly; 0: none). "
                                                       "lumion-hil calibrate does not fit it: fidelity names it "
                                                       "unexplained")
    port_loss_db: dict[int, NonNegativeFloat] = Field(default={}, description="extra loss at some ports (a dirty "
                                                      "or damaged connector), port -> dB")
    connection_loss_db: dict[str, float] = Field(default={}, description="loss of some connections beyond "
                                                 "insertion_loss_db, 'INGRESS-EGRESS' -> dB (a beam-steering "
                                                 "switch's loss differs from port pair to port pair; lumion-hil "
                                                 "calibrate fits it)")
    crosstalk_db: float | None = Field(default=None, description="light of every lit ingress leaking into each dark "
                                       "egress, this many dB down (None: none)")
    reported_ports: tuple[PositiveInt, PositiveInt] | None = Field(default=None, description="the size the switch "
                                                                   "reports, if not its real one")
    faults: list[str] = Field(default=[], description="faults switched on from the start: stall, delay=S, drop, "
                              "partial, garbage, errors, busy, power_loss=S (lumion-hil emulate --help)")
    product_code: str | None = Field(default=None, description="the product code *IDN? reports (default "
                                     "N-VST-<in>x<out>-HU1-EMU), for scripts that check for their model")
    swapped_ports: list[tuple[PositiveInt, PositiveInt]] = Field(
        default=[], description="pairs of ports whose fibres are each other's (a patch-panel mistake): the fibre "
        "the bench file lands on one is really on the other. Found by lumion-hil bench wiring")

    _faults = field_validator("faults")(_instrument_faults)

    @field_validator("swapped_ports")
    @classmethod
    def _swaps(cls, value: list[tuple[int, int]]) -> list[tuple[int, int]]:
        seen: set[int] = set()
        for a, b in value:
            if a == b:
                raise ValueError(f"[{a}, {b}] swaps a port with itself")
            if {a, b} & seen:
                raise ValueError(f"[{a}, {b}]: a port may be in one swap only")
            seen |= {a, b}
        return value

    @field_validator("connection_loss_db")
    @classmethod
    def _pairs(cls, value: dict[str, float]) -> dict[str, float]:
        for key, loss in value.items():
            if not re.fullmatch(r"\d+-\d+", key):
                raise ValueError(f"key {key!r} is not a connection 'INGRESS-EGRESS' (e.g. '3-19')")
        return value

    def loss_of(self, ingress: int, egress: int) -> float:
        """The extra loss of one connection (connection_loss_db), 0 where none is given."""
        return self.connection_loss_db.get(f"{ingress}-{egress}", 0.0)


class MeterEmulation(_Model):
    noise_db: NonNegativeFloat = 0.02
    offset_db: float = Field(default=0.0, description="what every lit reading adds to the light at the port (a meter "
                             "out of calibration; 0: none). lumion-hil calibrate does not fit it: fidelity names it "
                             "unexplained where another detector sees the same port")
    dark_floor_dbm: float = -70.0
    min_sample_interval_s: PositiveFloat = 0.0001
    command_latency_s: NonNegativeFloat = 0.0002
    faults: list[str] = Field(default=[], description="faults switched on from the start (see the switch's)")

    _faults = field_validator("faults")(_instrument_faults)


class _InstrumentBase(_Model):
    #: which registered models (instruments/registry.py) an entry of this kind may name
    _kind: ClassVar[registry.Kind | None] = None
    _kind_words: ClassVar[str] = "instrument"

    model: str
    resource: str = Field(description="VISA resource string, serial device path, or 'emulated'")
    timeout_s: PositiveFloat = 5.0
    read_termination: str = "\n"
    write_termination: str = "\n"
    pace_s: NonNegativeFloat = Field(default=0.0, description="pause between commands; some firmware needs it")
    baud_rate: PositiveInt = 115200

    @property
    def emulated(self) -> bool:
        return self.resource == EMULATED

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        known = registry.names(cls._kind)
        if value not in known:
            raise ValueError(f"unknown {cls._kind_words} model {value!r}; known: {', '.join(known)}")
        return value

    @field_validator("resource")
    @classmethod
    def _resource_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a VISA resource string, a serial device or 'emulated'")
        return value


class SwitchInstrument(_InstrumentBase):
    kind: Literal["optical_switch"]
    ports: tuple[PositiveInt, PositiveInt] = Field(description="(ingress count, egress count)")
    power_monitors: bool = False
    emulation: SwitchEmulation = SwitchEmulation()

    _kind: ClassVar[registry.Kind | None] = registry.Kind.OPTICAL_SWITCH
    _kind_words: ClassVar[str] = "optical switch"

    @property
    def ingress_ports(self) -> range:
        return range(1, self.ports[0] + 1)

    @property
    def egress_ports(self) -> range:
        return range(self.ports[0] + 1, self.ports[0] + self.ports[1] + 1)


class MeterInstrument(_InstrumentBase):
    kind: Literal["power_meter"]
    channels: PositiveInt = 1
    wavelength_nm: PositiveFloat = 1550.0
    emulation: MeterEmulation = MeterEmulation()

    _kind: ClassVar[registry.Kind | None] = registry.Kind.POWER_METER
    _kind_words: ClassVar[str] = "power meter"


Instrument = Annotated[Union[SwitchInstrument, MeterInstrument], Field(discriminator="kind")]


# --- topology ---------------------------------------------------------------------------------


class Gpu(_Model):
    index: Annotated[int, Field(ge=0)]
    model: str
    role: Literal["active", "spare"] = "active"


class NicPort(_Model):
    """One optical port of a NIC: its transmit fibre lands on a switch ingress port and its
    receive fibre comes from a switch egress port."""

    name: str
    rate_gbps: PositiveFloat
    launch_dbm: float
    tx_port: PositiveInt
    rx_port: PositiveInt
    tx_fibre_loss_db: NonNegativeFloat = 0.0
    rx_fibre_loss_db: NonNegativeFloat = 0.0
    interface: str | None = Field(default=None, description="Linux interface name on the host, e.g. ens1f0")
    wavelength_nm: PositiveFloat = Field(default=1310.0, description="transmitter wavelength (10GBASE-LR: 1310 nm)")


class HostEmulation(_Model):
    """How an emulated host's links and GPUs behave. Used only when its address is ``emulated``."""

    receiver_sensitivity_dbm: float = Field(default=-14.4, description="the light its receivers need to lock "
                                            "(assumption: receivers exactly at IEEE 802.3 clause 52's 10GBASE-LR "
                                            "-14.4 dBm); a device setting, which may be worse than the lab's limit")
    lock_time_s: NonNegativeFloat = Field(default=0.005, description="light at the receiver to CDR lock")
    link_up_time_s: NonNegativeFloat = Field(default=0.1, description="lock to carrier up as the OS reports it")
    management_latency_s: NonNegativeFloat = Field(default=0.0, description="round trip of the network between the "
                                                   "harness and this host's agent, half each way (a remote or busy "
                                                   "management network; 0: none; software time, never scaled). "
                                                   "lumion-hil calibrate does not fit it: fidelity names it "
                                                   "unexplained")
    agent_latency_s: NonNegativeFloat = Field(default=0.0, description="how late the host tells its agent of a link "
                                              "change or a line of the job's output (0: at once)")
    link_rate_factor: float = Field(default=1.0, gt=0, le=1, description="the fraction of its rate each optical link "
                                    "of this host really carries (1: all of it)")
    silent_data_corruption: bool = Field(default=False, description="its GPU returns wrong results without an error")
    link_flaps: NonNegativeInt = Field(default=0, description="times a link comes up and drops again before it "
                                       "stays up")
    tx_shortfall_db: dict[str, NonNegativeFloat] = Field(default={}, description="NIC port -> dB its transmitter "
                                                         "launches below the bench file's launch_dbm (a weak or "
                                                         "ageing transmitter). Found by lumion-hil bench budget")
    faults: list[str] = Field(default=[], description="faults of its agent from the start: drop, stall, delay=S, "
                              "partial, garbage, errors, power_loss (python -m lumion_hil.instruments.emulators.agent --help)")

    _faults = field_validator("faults")(_agent_faults)


class Host(_Model):
    name: str
    address: str = Field(default=EMULATED, description="'emulated', 'local', or an ssh destination")
    python: str = Field(default="python3", description="interpreter that runs the agent on the host")
    gpus: list[Gpu] = Field(min_length=1)
    nics: list[NicPort] = Field(min_length=1)
    emulation: HostEmulation = HostEmulation()

    @model_validator(mode="after")
    def _shortfall_of_own_nics(self) -> "Host":
        unknown = sorted(set(self.emulation.tx_shortfall_db) - {n.name for n in self.nics})
        if unknown:
            raise ValueError(f"emulation.tx_shortfall_db names {', '.join(unknown)}: not a NIC port of {self.name}")
        return self

    @property
    def emulated(self) -> bool:
        return self.address == EMULATED

    @property
    def world_address(self) -> str | None:
        """For a host emulated by a world served elsewhere (``world:HOST:PORT``)."""
        return self.address.removeprefix("world:") if self.address.startswith("world:") else None


class Job(_Model):
    """The training job the suites run and recover: its ranks in order, and its command."""

    ranks: list[str] = Field(min_length=1, description="host names, rank 0 first")
    command: list[str] = Field(
        default=[], description="argv template; {rank} {world_size} {gpu} {master_addr} {master_port} "
        "{heartbeat} are filled in. Empty: the emulated training job")
    master_port: PositiveInt = 29500
    heartbeat_dir: str = Field(default="/tmp/lumion-hil", description="where each rank writes its heartbeat file")
    # The emulated job's model of one data-parallel step (bench files say where they come from).
    gradient_bytes: PositiveFloat = 2.47e9
    compute_time_s: NonNegativeFloat = 0.3
    startup_time_s: NonNegativeFloat = 1.0
    batch_per_rank: PositiveInt = Field(default=8, description="samples each rank takes per step (samples/s = this x "
                                        "ranks / step time)")
    nccl_timeout_s: PositiveFloat = Field(default=30.0, description="the emulated job's NCCL timeout: how long a "
                                          "rank waits for its peers, at init and in each collective, before it fails "
                                          "(scaled with the emulation; PyTorch's own default is 10 min)")


class Topology(_Model):
    switch: str = Field(description="name of the optical switch instrument the fibres land on")
    connector_loss_db: NonNegativeFloat = 0.0
    hosts: list[Host] = Field(min_length=1)


class Detector(_Model):
    """Something that sees the light at a switch port: a switch's own monitor or a meter channel."""

    name: str
    instrument: str
    port: PositiveInt
    channel: PositiveInt | None = None
    tap_loss_db: NonNegativeFloat = 0.0


class Limits(_Model):
    receiver_sensitivity_dbm: Sourced
    link_margin_db: Sourced
    switch_time_per_connection_s: Sourced
    switch_command_overhead_s: Sourced = Sourced(value=0.05, source="allowance for SCPI round trips")
    marginal_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="a pass within this fraction of the limit is reported marginal"
    )
    link_up_after_light_s: Sourced = Sourced(value=0.5, source="lab requirement (assumption): a NIC has carrier "
                                             "within 0.5 s of light at its receiver")
    controller_overhead_s: Sourced = Sourced(value=0.25, source="harness requirement: the controller adds at most "
                                             "0.25 s to a recovery beyond the physics it waits on")
    prediction_tolerance: Sourced = Sourced(value=0.1, source="assumption: a figure the bench file predicts (its "
                                            "cost model) is observed within +-10%")
    about_tolerance: Sourced = Sourced(value=0.25, source="assumption: a published 'about' figure (rounded, some "
                                       "from secondary summaries) is met within +-25%")

    @property
    def light_floor_dbm(self) -> float:
        """The light a receiver needs: its sensitivity plus the link margin."""
        return self.receiver_sensitivity_dbm.value + self.link_margin_db.value


class Deadlines(_Model):
    """Every wait has one: nothing the harness does waits for ever. These are for real time; on
    an emulated bench run at another time scale the harness waits ``at_scale`` of them."""

    opc_s: PositiveFloat = 10.0
    light_s: PositiveFloat = 5.0
    link_up_s: PositiveFloat = 30.0
    recovery_s: PositiveFloat = 120.0
    io_allowance_s: NonNegativeFloat = Field(default=0.5, description="real time added to each deadline when emulated "
                                             "latencies are scaled: the commands' round trips do not shrink with them")

    WAITS: ClassVar[tuple[str, ...]] = ("opc_s", "light_s", "link_up_s", "recovery_s")

    def at_scale(self, scale: float) -> "Deadlines":
        """Each deadline times ``scale``, plus the I/O allowance (unchanged at scale 1)."""
        if scale == 1.0:
            return self
        return self.model_copy(update={k: timescale.scaled(getattr(self, k), scale, self.io_allowance_s)[0]
                                       for k in self.WAITS})

    def describe(self, scale: float) -> dict:
        """For the run record: the deadlines waited on, and how they were derived."""
        waits = self.at_scale(scale)
        how = "as in the bench file" if scale == 1.0 else \
            f"bench file x time scale {scale:g} + {self.io_allowance_s:g} s I/O allowance"
        return {**{k: getattr(waits, k) for k in self.WAITS}, "derived": how}


class Safety(_Model):
    protected_ports: list[PositiveInt] = []
    baseline: list[tuple[PositiveInt, PositiveInt]] = Field(
        default=[], description="cross-connects (ingress, egress) restored at set-up and teardown"
    )
    owned_ports: list[PositiveInt] | None = Field(
        default=None, description="the switch ports this bench may switch, when it shares the switch with other "
        "benches (every other port is left alone, as a protected one); a labgrid place's `ports` tag sets it "
        "(harness/places.py). Default: the whole switch")


class PlaceSettings(_Model):
    """The bench as a labgrid place (harness/places.py): runs reserve and acquire it on the
    lab's coordinator instead of taking a file lock on this machine."""

    coordinator: str | None = Field(default=None, description="the labgrid coordinator, HOST:PORT (LG_COORDINATOR "
                                    "wins; default 127.0.0.1:20408)")
    name: str | None = Field(default=None, description="the place's name (LG_PLACE wins)")
    tags: dict[str, str] = Field(default={}, description="or the tags a place must have: the reservation takes any "
                                 "free place that has them")

    @model_validator(mode="after")
    def _name_or_tags(self) -> "PlaceSettings":
        if not self.name and not self.tags:
            raise ValueError("a place needs a name or tags to match one")
        return self


class MigrationBaseline(_Model):
    """Recovery without an optical fabric: the job moves to an idle reserved rack and restores
    its checkpoint (LUMION's baseline). Emulated on the same world, to compare; the reserved
    rack's servers are on the electrical network (``electrical``), in a rack of their own."""

    checkpoint_bytes: PositiveFloat = Field(default=1.73e10, description="weights, optimizer state, master copy")
    network_gbps: PositiveFloat = Field(default=25.0, description="checkpoint storage to the new rack")
    scheduling_s: NonNegativeFloat = Field(default=5.0, description="finding and claiming the reserved rack")


class ElectricalRack(_Model):
    """The electrical alternative the papers compare against: each server's NIC to a top-of-rack
    packet switch, and servers in other racks through each rack's shared uplink. On an emulated
    bench the world models it; on a real one it is the network the hosts' ``interface`` is on."""

    interface: str = Field(default="eth0", description="the hosts' NIC on it; a job uses it when NCCL_SOCKET_IFNAME "
                           "names it")
    nic_gbps: Sourced = Field(description="each server's NIC rate")
    hop_latency_us: Sourced = Field(description="one packet-switch hop")
    oversubscription: Sourced = Field(description="a rack's server bandwidth over its uplink's (2: 2:1); under "
                                      "load a server gets 1/oversubscription of its NIC to other racks")
    racks: dict[str, str] = Field(default={}, description="host -> rack; hosts not named are in rack0")

    def rack_of(self, host: str) -> str:
        if host.startswith("reserved-"):
            return "reserved"
        return self.racks.get(host, "rack0")

    @field_validator("oversubscription")
    @classmethod
    def _at_least_one(cls, value: Sourced) -> Sourced:
        if value.value < 1:
            raise ValueError("an oversubscription ratio is 1 or more (1: non-blocking)")
        return value


class CollectiveSettings(_Model):
    """How NCCL's collectives cost on either fabric (instruments/collectives.py): the emulated
    job and nccl-tests take their figures from here, the pod-scale planner too."""

    step_latency_us: Sourced = Sourced(value=15.0, source="assumption: one NCCL ring step over TCP sockets "
                                       "(the prototype ran NCCL_IB_DISABLE=1)")
    optical_hop_latency_us: Sourced = Sourced(value=1.0, source="assumption: NIC to NIC over a circuit, "
                                              "a few metres of fibre")
    rings: Literal[1, 2] = Field(default=2, description="NCCL rings: 2 runs one each way round")


class NcclTests(_Model):
    """How the suites run nccl-tests on the hosts."""

    path: str = Field(default="", description="folder of the *_perf binaries on the hosts; emulated hosts run "
                      "emulated ones")
    launcher: list[str] = Field(default=[], description="argv before the binary, e.g. [mpirun, -np, '{world_size}', "
                                "-H, '{hosts}']; {world_size} and {hosts} are filled in. Empty: the binary alone")
    min_bytes: PositiveInt = 8
    max_bytes: PositiveInt = 134217728
    step_factor: PositiveInt = 2
    iters: PositiveInt = 5
    warmup_iters: NonNegativeInt = 1
    check: NonNegativeInt = Field(default=1, description="-c: iterations whose results are checked (0: none, #wrong "
                                  "is N/A)")
    timeout_s: PositiveFloat = 300.0


class NetnsSettings(_Model):
    """The namespaced bench (``backend: netns``, the rack in a box): each host a network
    namespace on this machine reached through its own sshd, each optical NIC a veth whose
    carrier the world's light drives, circuits as bridges, the electrical rack a bridge per rack
    joined through shaped uplinks, and the job a real program exchanging real bytes."""

    rate_scale: float = Field(default=0.01, gt=0, le=1, description="every line rate is shaped to this fraction of "
                              "the bench file's (0.01: 10 Gb/s -> 100 Mb/s), so that real bytes through sockets on "
                              "one machine keep up; the job's gradients are scaled the same, so a step lasts what the "
                              "bench file's rates say")
    user: str = Field(default="root", description="the user the harness logs in as on each host's sshd")
    job: Literal["torch", "ring"] = Field(default="ring", description="the job the suites run here (without "
                                          "job.command): torch, a PyTorch DDP job on gloo started by torchrun on "
                                          "every host, with checkpoints on shared storage; ring, the light ring job "
                                          "(ring_job.py), which the failure sequences keep for their restarts")
    checkpoint_every: NonNegativeInt = Field(default=2, description="the PyTorch job's steps between checkpoints "
                                             "(0: none)")
    collectives: list[Literal["ring", "gloo", "mpi"]] = Field(
        default=["ring"], min_length=1, description="the libraries the collective-bandwidth suite measures with, "
        "each printing nccl-tests' output: ring (lumion-hil's ring, ring_perf.py, launched over ssh), gloo "
        "(torch.distributed, launched over ssh on every host), mpi (mpi4py's Allreduce on Open MPI, launched "
        "by mpirun with a host file)")


class RecoverySettings(_Model):
    controller: str = Field(default="lumion_hil.harness.controller:ReferenceController",
                            description="the recovery controller under test: module:factory, or a name registered "
                            "under the lumion_hil.controllers entry points (reference)")
    controller_options: dict[str, Any] = Field(default={}, description="keyword arguments for the factory")
    migration: MigrationBaseline = MigrationBaseline()
    fault_seed: int = 1


class EmulatorSettings(_Model):
    time_scale: PositiveFloat = Field(default=1.0, description="multiplies every emulated latency")
    seed: int = 1
    defects: list[str] = Field(default=[], description="defects of the emulated bench, NAME[=VALUE] "
                               "(lumion-hil defects lists them): to show which verdict each turns red")
    explore: dict[Literal["ci", "nightly", "bench"], PositiveInt] = Field(
        default={}, description="sequences an exploration profile tells on this bench, where not the profile's own "
        "(a bench whose stories cost more, real processes over ssh, tells fewer): {ci: 200}")


class Bench(_Model):
    name: str
    description: str = ""
    emulator: EmulatorSettings = EmulatorSettings()
    backend: str | None = Field(default=None, description="the bench backend: module:factory, or a name registered "
                                "under the lumion_hil.backends entry points (emulated, served, netns, real); default: "
                                "from the bench (emulated instruments: emulated; hosts at world:HOST:PORT: served; "
                                "else real)")
    instruments: dict[str, Instrument] = Field(min_length=1)
    topology: Topology
    detectors: list[Detector] = []
    limits: Limits
    job: Job | None = None
    published: dict[str, dict] = Field(
        default={}, description="corrections to published numbers: {id: {value: ..., source: ...}}")
    recovery: RecoverySettings = RecoverySettings()
    deadlines: Deadlines = Deadlines()
    safety: Safety = Safety()
    electrical: ElectricalRack | None = None
    collectives: CollectiveSettings = CollectiveSettings()
    nccl_tests: NcclTests = NcclTests()
    netns: NetnsSettings = NetnsSettings()
    place: PlaceSettings | None = None

    # -- derived views -----------------------------------------------------------------------

    @property
    def switch(self) -> SwitchInstrument:
        return self.instruments[self.topology.switch]  # type: ignore[return-value]

    @property
    def time_scale(self) -> float:
        """The scale emulated latencies run at on this bench: a served emulated bench keeps the
        one it was served with; a real bench runs at 1."""
        served = any(h.world_address for h in self.topology.hosts)
        return self.emulator.time_scale if (self.any_emulated or served) else 1.0

    @property
    def waits(self) -> Deadlines:
        """The deadlines the harness waits on at this bench's time scale (see Deadlines)."""
        return self.deadlines.at_scale(self.time_scale)

    @property
    def any_emulated(self) -> bool:
        return any(i.emulated for i in self.instruments.values()) or self.any_emulated_host

    @property
    def all_emulated(self) -> bool:
        return all(i.emulated for i in self.instruments.values()) and all(h.emulated for h in self.topology.hosts)

    def nic_ports(self) -> list[tuple[Host, NicPort]]:
        return [(h, n) for h in self.topology.hosts for n in h.nics]

    def host(self, name: str) -> Host:
        for h in self.topology.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host named {name!r} in bench {self.name!r}")

    @property
    def any_emulated_host(self) -> bool:
        return any(h.emulated for h in self.topology.hosts)

    def nic_on_rx_port(self, egress: int) -> tuple[Host, NicPort] | None:
        return next(((h, n) for h, n in self.nic_ports() if n.rx_port == egress), None)

    def nic_on_tx_port(self, ingress: int) -> tuple[Host, NicPort] | None:
        return next(((h, n) for h, n in self.nic_ports() if n.tx_port == ingress), None)

    def detectors_for_port(self, port: int) -> list[Detector]:
        return [d for d in self.detectors if d.port == port]

    def at_receiver_dbm(self, egress: int, port_dbm):
        """The light at the receiver fed by switch egress ``egress``, from the power read at that
        port: less the receive fibre of the NIC there (none: the port's own). A reading that is
        not a number (out of range) is passed on as it is. The one place this is computed."""
        if not isinstance(port_dbm, float):
            return port_dbm
        owner = self.nic_on_rx_port(egress)
        return port_dbm - (owner[1].rx_fibre_loss_db if owner else 0.0)

    def meter_detector_for_port(self, port: int) -> Detector | None:
        """A detector on a power meter (not a switch monitor) watching this port."""
        return next((d for d in self.detectors if d.port == port and d.instrument != self.topology.switch), None)

    def problems(self) -> list[BenchProblem]:
        """Checks across fields that a field validator cannot see."""
        out: list[BenchProblem] = []

        def bad(path: str, reason: str) -> None:
            out.append(BenchProblem(path, reason))

        switch = self.instruments.get(self.topology.switch)
        if switch is None:
            bad("topology.switch", f"no instrument named {self.topology.switch!r}")
        elif not isinstance(switch, SwitchInstrument):
            bad("topology.switch", f"instrument {self.topology.switch!r} is a {switch.kind}, not an optical_switch")
            switch = None

        _unique(bad, "topology.hosts", [h.name for h in self.topology.hosts], "host name")
        used_ports: dict[int, str] = {}
        for hi, host in enumerate(self.topology.hosts):
            _unique(bad, f"topology.hosts[{hi}].nics", [n.name for n in host.nics], "NIC port name")
            _unique(bad, f"topology.hosts[{hi}].gpus", [g.index for g in host.gpus], "GPU index")
            for ni, nic in enumerate(host.nics):
                where = f"topology.hosts[{hi}].nics[{ni}]"
                for field, port, side in (("tx_port", nic.tx_port, "ingress"), ("rx_port", nic.rx_port, "egress")):
                    if switch is not None:
                        valid = switch.ingress_ports if side == "ingress" else switch.egress_ports
                        if port not in valid:
                            bad(f"{where}.{field}", f"port {port} is not an {side} port of "
                                f"{self.topology.switch!r} ({valid.start}..{valid.stop - 1})")
                    owner = f"{host.name}.{nic.name}"
                    if port in used_ports:
                        bad(f"{where}.{field}", f"port {port} is already used by {used_ports[port]}")
                    used_ports[port] = owner

        for key in self.published:
            from lumion_hil.harness.published import all_published

            if key not in all_published():
                bad(f"published.{key}", f"no published number {key!r}; see harness/published.yaml")
        for path, spec, group in (("recovery.controller", self.recovery.controller, CONTROLLERS),
                                  ("backend", self.backend, BACKENDS)):
            if spec is not None and ":" not in spec and spec not in plugin_names(group):
                bad(path, f"expected module:factory, or one of the names registered in {group} "
                          f"({', '.join(plugin_names(group)) or 'none'})")
        if self.electrical is not None:
            hosts = {h.name for h in self.topology.hosts}
            for racked in self.electrical.racks:
                if racked not in hosts:
                    bad(f"electrical.racks.{racked}", f"no host named {racked!r}")
            optical = {n.interface or n.name for h in self.topology.hosts for n in h.nics}
            if self.electrical.interface in optical:
                bad("electrical.interface", f"{self.electrical.interface!r} is an optical NIC's interface")
        if self.job is not None:
            hosts = {h.name for h in self.topology.hosts}
            for ri, rank_host in enumerate(self.job.ranks):
                if rank_host not in hosts:
                    bad(f"job.ranks[{ri}]", f"no host named {rank_host!r}")
            _unique(bad, "job.ranks", self.job.ranks, "rank host")

        for di, det in enumerate(self.detectors):
            inst = self.instruments.get(det.instrument)
            where = f"detectors[{di}]"
            if inst is None:
                bad(f"{where}.instrument", f"no instrument named {det.instrument!r}")
                continue
            if isinstance(inst, SwitchInstrument):
                if not inst.power_monitors:
                    bad(f"{where}.instrument", f"switch {det.instrument!r} has no power monitors "
                        "(set power_monitors: true if it does)")
                if det.channel is not None:
                    bad(f"{where}.channel", "a switch monitor has no channel; leave it out")
            else:
                if det.channel is None:
                    bad(f"{where}.channel", f"meter {det.instrument!r} needs the channel that taps the port")
                elif det.channel > inst.channels:
                    bad(f"{where}.channel", f"meter {det.instrument!r} has {inst.channels} channel(s)")
            if switch is not None and det.port not in switch.ingress_ports and det.port not in switch.egress_ports:
                bad(f"{where}.port", f"port {det.port} is not a port of {self.topology.switch!r}")
        _unique(bad, "detectors", [d.name for d in self.detectors], "detector name")

        if self.safety.owned_ports is not None:
            owned = set(self.safety.owned_ports)
            for port, owner in sorted(used_ports.items()):
                if port not in owned:
                    bad("safety.owned_ports", f"port {port} ({owner}) is not one of the bench's own ports "
                        f"{port_ranges(owned)} (it shares the switch: the place's ports tag says which are its own)")
            for ingress, egress in self.safety.baseline:
                if not {ingress, egress} <= owned:
                    bad("safety.owned_ports",
                        f"baseline [{ingress}, {egress}] uses a port outside {port_ranges(owned)}")
        protected = set(self.safety.protected_ports)
        seen_in: set[int] = set()
        seen_out: set[int] = set()
        for bi, (ingress, egress) in enumerate(self.safety.baseline):
            where = f"safety.baseline[{bi}]"
            if switch is not None:
                if ingress not in switch.ingress_ports:
                    bad(where, f"{ingress} is not an ingress port of {self.topology.switch!r}")
                if egress not in switch.egress_ports:
                    bad(where, f"{egress} is not an egress port of {self.topology.switch!r}")
            if ingress in seen_in or egress in seen_out:
                bad(where, f"[{ingress}, {egress}] reuses a port of an earlier baseline cross-connect")
            if {ingress, egress} & protected:
                bad(where, f"[{ingress}, {egress}] touches a protected port; protected ports are never switched")
            seen_in.add(ingress)
            seen_out.add(egress)
        if switch is not None:
            for si, (a, b) in enumerate(switch.emulation.swapped_ports):
                if not ({a, b} <= set(switch.ingress_ports) or {a, b} <= set(switch.egress_ports)):
                    bad(f"instruments.{self.topology.switch}.emulation.swapped_ports[{si}]",
                        f"[{a}, {b}]: a fibre swap is between two ingress ports or two egress ports of "
                        f"{self.topology.switch!r}")
            for pi, port in enumerate(self.safety.protected_ports):
                if port not in switch.ingress_ports and port not in switch.egress_ports:
                    bad(f"safety.protected_ports[{pi}]", f"port {port} is not a port of {self.topology.switch!r}")
        return out


def _unique(bad, path: str, values: list, what: str) -> None:
    seen = set()
    for i, v in enumerate(values):
        if v in seen:
            bad(f"{path}[{i}]", f"duplicate {what} {v!r}")
        seen.add(v)


# --- loading ----------------------------------------------------------------------------------


def port_ranges(ports: Iterable[int]) -> str:
    """Ports as ``1-8,33-40``."""
    out: list[str] = []
    run: list[int] = []
    for p in sorted(ports):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [p]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def load_bench(path: str | Path, *, time_scale: float | None = None, defects: list[str] | tuple = ()) -> Bench:
    """Read and validate a bench file, with its defects (the file's ``emulator.defects`` and
    ``defects``) applied. Raises BenchFileError with every problem found."""
    path = Path(path)
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchFileError(shown, [BenchProblem("", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchFileError(shown, [BenchProblem("", f"cannot read: {exc}")]) from None
    return parse_bench(text, shown, time_scale=time_scale, defects=defects)


def parse_bench(text: str, file: str = "<bench>", *, time_scale: float | None = None,
                defects: list[str] | tuple = ()) -> Bench:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        reason = getattr(exc, "problem", None) or str(exc)
        raise BenchFileError(file, [BenchProblem("", f"not valid YAML: {reason}", line)]) from None
    if root is None:
        raise BenchFileError(file, [BenchProblem("", "the file is empty")])
    duplicates = list(_duplicate_keys(root, ""))
    if duplicates:
        raise BenchFileError(file, duplicates)
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise BenchFileError(file, [BenchProblem("", "a bench file is a mapping of sections (name, instruments, ...)", 1)])
    held = os.environ.get("LUMION_HIL_PLACE")
    if held:  # `lumion-hil run` holds the bench's labgrid place: addresses and ports from it
        from lumion_hil.harness.places import apply_place

        data = apply_place(data, json.loads(held))
    if time_scale is not None:
        data.setdefault("emulator", {})
        if isinstance(data["emulator"], dict):
            data["emulator"]["time_scale"] = time_scale
    try:
        bench = Bench.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = err["loc"] + (("kind",) if err["type"].startswith("union_tag") else ())
            path, line = _locate(root, loc)
            problems.append(BenchProblem(path, _reason(err), line))
        raise BenchFileError(file, problems) from None
    cross = bench.problems()
    if cross:
        raise BenchFileError(file, [BenchProblem(p.path, p.reason, _line_of(root, p.path)) for p in cross])
    wanted = list(bench.emulator.defects) + [d for d in defects if d not in bench.emulator.defects]
    if wanted:
        from lumion_hil.harness.defects import DefectError, apply_defects

        emulated = bench.any_emulated or any(h.world_address for h in bench.topology.hosts)
        try:
            data = apply_defects(bench.model_dump(mode="json"), wanted, emulated=emulated, bench_name=bench.name)
            bench = Bench.model_validate(data)
        except DefectError as exc:
            raise BenchFileError(file, [BenchProblem("emulator.defects", str(exc), _line_of(root, "emulator"))]) from None
        except ValidationError as exc:
            raise BenchFileError(file, [BenchProblem("emulator.defects", f"{', '.join(wanted)}: makes an invalid "
                                                     f"bench: {exc}", _line_of(root, "emulator"))]) from None
    return bench


def bench_json_schema() -> str:
    return json.dumps(Bench.model_json_schema(), indent=2)


def _reason(err: ErrorDetails) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return "required field is missing"
    if err["type"] == "extra_forbidden":
        return "unknown field (check its spelling against `lumion-hil bench schema`)"
    if err["type"] == "union_tag_invalid":
        return f"unknown kind {err.get('input', {}).get('kind')!r}; expected optical_switch or power_meter"
    if err["type"] == "union_tag_not_found":
        return "required field is missing; expected optical_switch or power_meter"
    if "input" in err and not isinstance(err["input"], (dict, list)) and repr(err["input"]) not in msg:
        return f"{msg} (got {err['input']!r})"
    return msg


def _locate(root: yaml.Node, loc: tuple) -> tuple[str, int | None]:
    """Turn a pydantic error location into a readable path and the YAML line it points at.

    Location parts that are not in the document (a union's tag, say) are dropped."""
    node = root
    parts: list[str] = []
    line = root.start_mark.line + 1
    for depth, key in enumerate(loc):
        child = _child(node, key)
        if child is None:
            last = depth == len(loc) - 1
            if last and isinstance(key, str) and isinstance(node, yaml.MappingNode):
                parts.append(f".{key}" if parts else key)  # a missing field: point at its parent
            continue  # otherwise a union's tag, which the document does not spell out
        parts.append(f"[{key}]" if isinstance(key, int) else (f".{key}" if parts else str(key)))
        node = child
        line = node.start_mark.line + 1
    return "".join(parts), line


def _line_of(root: yaml.Node, dotted: str) -> int | None:
    keys: list[str | int] = []
    for part in dotted.replace("]", "").replace("[", ".").split("."):
        if part:
            keys.append(int(part) if part.isdigit() else part)
    return _locate(root, tuple(keys))[1]


def _child(node: yaml.Node, key) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(key, str):
        for k, v in node.value:
            if k.value == key:
                return v
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
        return node.value[key]
    return None


def _duplicate_keys(node: yaml.Node, path: str):
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            sub = f"{path}.{k.value}" if path else str(k.value)
            if k.value in seen:
                yield BenchProblem(sub, "key appears twice (YAML would silently keep the last)", k.start_mark.line + 1)
            seen.add(k.value)
            yield from _duplicate_keys(v, sub)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            yield from _duplicate_keys(v, f"{path}[{i}]")
