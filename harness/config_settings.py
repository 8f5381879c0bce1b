"""A bench file's other sections: the limits judged against, the deadlines, the safety rules, the
labgrid place, the migration baseline, the electrical rack, the collectives' cost model,
nccl-tests, the namespaced bench, recovery and emulator settings."""

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from lumion_hil.harness import timescale
from lumion_hil.harness.config_base import Model, Sourced


class Limits(Model):
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


class Deadlines(Model):
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


class Safety(Model):
    protected_ports: list[PositiveInt] = []
    baseline: list[tuple[PositiveInt, PositiveInt]] = Field(
        default=[], description="cross-connects (ingress, egress) restored at set-up and teardown"
    )
    owned_ports: list[PositiveInt] | None = Field(
        default=None, description="the switch ports this bench may switch, when it shares the switch with other "
        "benches (every other port is left alone, as a protected one); a labgrid place's `ports` tag sets it "
        "(harness/places.py). Default: the whole switch")


class PlaceSettings(Model):
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


class MigrationBaseline(Model):
    """Recovery without an optical fabric: the job moves to an idle reserved rack and restores
    its checkpoint (LUMION's baseline). Emulated on the same world, to compare; the reserved
    rack's servers are on the electrical network (``electrical``), in a rack of their own."""

    checkpoint_bytes: PositiveFloat = Field(default=1.73e10, description="weights, optimizer state, master copy")
    network_gbps: PositiveFloat = Field(default=25.0, description="checkpoint storage to the new rack")
    scheduling_s: NonNegativeFloat = Field(default=5.0, description="finding and claiming the reserved rack")


class ElectricalRack(Model):
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


class CollectiveSettings(Model):
    """How NCCL's collectives cost on either fabric (instruments/collectives.py): the emulated
    job and nccl-tests take their figures from here, the pod-scale planner too."""

    step_latency_us: Sourced = Sourced(value=15.0, source="assumption: one NCCL ring step over TCP sockets "
                                       "(the prototype ran NCCL_IB_DISABLE=1)")
    optical_hop_latency_us: Sourced = Sourced(value=1.0, source="assumption: NIC to NIC over a circuit, "
                                              "a few metres of fibre")
    rings: Literal[1, 2] = Field(default=2, description="NCCL rings: 2 runs one each way round")


class NcclTests(Model):
    """How the suites run nccl-tests on the hosts."""

    path: str = Field(default="", description="folder of the *_perf binaries on the hosts; emulated hosts run "
                      "emulated ones")
    launcher: list[str] = Field(default=[], description="argv before the binary, e.g. [mpirun, -np, '{world_size}', "
                                "-H, '{hosts}']; {world_size} and {hosts} are filled in. Empty: the binary alone")
    min_bytes: PositiveInt = Field(default=8, description="-b: the smallest message, bytes")
    max_bytes: PositiveInt = Field(default=134217728, description="-e: the largest message, bytes")
    step_factor: PositiveInt = Field(default=2, description="-f: each message this many times the last")
    iters: PositiveInt = Field(default=5, description="-n: timed iterations a size")
    warmup_iters: NonNegativeInt = Field(default=1, description="-w: untimed iterations a size before them")
    check: NonNegativeInt = Field(default=1, description="-c: iterations whose results are checked (0: none, #wrong "
                                  "is N/A)")
    timeout_s: PositiveFloat = Field(default=300.0, description="how long one run of a binary may take, all its "
                                     "sizes, in seconds")


class NetnsSettings(Model):
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


class RecoverySettings(Model):
    controller: str = Field(default="lumion_hil.harness.controller:ReferenceController",
                            description="the recovery controller under test: module:factory, or a name registered "
                            "under the lumion_hil.controllers entry points (reference)")
    controller_options: dict[str, Any] = Field(default={}, description="keyword arguments for the factory")
    migration: MigrationBaseline = MigrationBaseline()
    fault_seed: int = 1


class EmulatorSettings(Model):
    time_scale: PositiveFloat = Field(default=1.0, description="multiplies every emulated latency")
    seed: int = 1
    defects: list[str] = Field(default=[], description="defects of the emulated bench, NAME[=VALUE] "
                               "(lumion-hil defects lists them): to show which verdict each turns red")
    explore: dict[Literal["ci", "nightly", "bench"], PositiveInt] = Field(
        default={}, description="sequences an exploration profile tells on this bench, where not the profile's own "
        "(a bench whose stories cost more, real processes over ssh, tells fewer): {ci: 200}")


