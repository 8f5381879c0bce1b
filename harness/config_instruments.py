"""A bench file's instruments: the switch and the meters, how each is reached, and how an
emulated one behaves (its ``emulation`` section)."""

import re
from typing import Annotated, ClassVar, Literal, Union

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

from lumion_hil.harness.config_base import EMULATED, Model, instrument_faults
from lumion_hil.instruments import registry


# --- instruments -----------------------------------------------------------------------------


class SwitchEmulation(Model):
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

    _faults = field_validator("faults")(instrument_faults)

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


class MeterEmulation(Model):
    noise_db: NonNegativeFloat = 0.02
    offset_db: float = Field(default=0.0, description="what every lit reading adds to the light at the port (a meter "
                             "out of calibration; 0: none). lumion-hil calibrate does not fit it: fidelity names it "
                             "unexplained where another detector sees the same port")
    dark_floor_dbm: float = -70.0
    min_sample_interval_s: PositiveFloat = 0.0001
    command_latency_s: NonNegativeFloat = 0.0002
    faults: list[str] = Field(default=[], description="faults switched on from the start (see the switch's)")

    _faults = field_validator("faults")(instrument_faults)


class _InstrumentBase(Model):
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


