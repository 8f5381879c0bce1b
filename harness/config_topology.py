"""A bench file's topology: the GPU hosts, their NICs' ports and fibres, the job, and the
detectors that watch the switch's ports."""

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from lumion_hil.harness.config_base import EMULATED, Model, agent_faults


# --- topology ---------------------------------------------------------------------------------


class Gpu(Model):
    index: Annotated[int, Field(ge=0)]
    model: str
    role: Literal["active", "spare"] = "active"


class NicPort(Model):
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


class HostEmulation(Model):
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

    _faults = field_validator("faults")(agent_faults)


class Host(Model):
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


class Job(Model):
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


class Topology(Model):
    switch: str = Field(description="name of the optical switch instrument the fibres land on")
    connector_loss_db: NonNegativeFloat = 0.0
    hosts: list[Host] = Field(min_length=1)


class Detector(Model):
    """Something that sees the light at a switch port: a switch's own monitor or a meter channel."""

    name: str
    instrument: str
    port: PositiveInt
    channel: PositiveInt | None = None
    tap_loss_db: NonNegativeFloat = 0.0


