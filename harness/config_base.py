"""What every model of a bench file is built on: frozen, no unknown keys; a number with its
source; the emulators' fault names a section may list."""

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from lumion_hil.instruments.backend import AGENT_FAULTS, INSTRUMENT_FAULTS


EMULATED = "emulated"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sourced(Model):
    """A number with the place it came from, so a report can say why a limit is what it is."""

    value: float
    source: str = "bench file"

    @model_validator(mode="before")
    @classmethod
    def _bare_number(cls, data: Any) -> Any:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"value": data}
        return data


def check_faults(faults: list[str], known: dict[str, str]) -> list[str]:
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


def instrument_faults(faults: list[str]) -> list[str]:
    return check_faults(faults, INSTRUMENT_FAULTS)


def agent_faults(faults: list[str]) -> list[str]:
    return check_faults(faults, AGENT_FAULTS)
