"""Failure sequences as stories: what happens to the bench step by step (faults, a fault during a
recovery, a spare that fails as it is switched in, slow degradation, repairs, quiet moments),
each naming hosts and NICs, never indices. A story saved on one bench (as YAML) replays on any
bench that has the hosts and NICs it names (harness/explorer.py tells it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lumion_hil.harness.errors import HarnessError
from lumion_hil.instruments.backend import NIC_FAULTS, FaultKind

# Faults that take a host out of the job (a process killed restarts it in place).
REPLACING = tuple(k.value for k in FaultKind if k != FaultKind.PROCESS_KILL)
KINDS = (FaultKind.PROCESS_KILL.value,) + REPLACING
NIC_KINDS = tuple(k.value for k in FaultKind if k in NIC_FAULTS)
DURING = ("switch", "restart")  # the recovery phases a second fault may hit


class StoryError(HarnessError):
    """A story that cannot be read, or cannot be told on this bench."""


@dataclass(frozen=True)
class Step:
    """One thing that happens. ``action``: fault, degrade, repair or quiet."""

    action: str
    host: str | None = None
    kind: str | None = None  # the fault's kind
    nic: str | None = None
    by_db: float | None = None  # degrade: dB more loss at the NIC's transmitter
    during: "Step | None" = None  # fault: a second fault, made as the recovery enters ``at``
    at: str | None = None  # the phase the second fault comes in
    spare_fails: bool = False  # fault: the spare the controller takes fails as it is switched in

    def describe(self) -> str:
        where = f"{self.host}.{self.nic}" if self.nic else (self.host or "")
        if self.action == "fault":
            text = f"{self.kind} at {where}"
            if self.spare_fails:
                text += ", and the spare taken fails as it is switched in"
            if self.during is not None:
                text += f", and {self.during.describe()} as the recovery enters its {self.at} phase"
            return text
        if self.action == "degrade":
            return f"{where}'s transmitter fades {self.by_db:g} dB more"
        if self.action == "repair":
            return f"{self.host} is repaired"
        return "a quiet moment"

    def to_dict(self) -> dict:
        if self.action == "quiet":
            return {"quiet": True}
        if self.action == "repair":
            return {"repair": self.host}
        if self.action == "degrade":
            return {"degrade": {"host": self.host, "nic": self.nic, "by_db": self.by_db}}
        out: dict = {"fault": self.kind, "host": self.host}
        if self.nic:
            out["nic"] = self.nic
        if self.spare_fails:
            out["spare_fails"] = True
        if self.during is not None:
            out["during_recovery"] = {**self.during.to_dict(), "at": self.at}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Step":
        if not isinstance(data, dict):
            raise StoryError(f"a step is a mapping (fault:, degrade:, repair: or quiet:), not {data!r}")
        if data.get("quiet"):
            return cls("quiet")
        if "repair" in data:
            return cls("repair", host=str(data["repair"]))
        if "degrade" in data:
            d = data["degrade"]
            return cls("degrade", host=d["host"], nic=d["nic"], by_db=float(d["by_db"]))
        if "fault" in data:
            if data["fault"] not in KINDS:
                raise StoryError(f"unknown fault {data['fault']!r}; known: {', '.join(KINDS)}")
            during = data.get("during_recovery")
            second = cls.from_dict({k: v for k, v in during.items() if k != "at"}) if during else None
            return cls("fault", host=data["host"], kind=data["fault"], nic=data.get("nic"), during=second,
                       at=during.get("at") if during else None, spare_fails=bool(data.get("spare_fails")))
        raise StoryError(f"a step is fault:, degrade:, repair: or quiet:, not {sorted(data)}")


@dataclass
class Story:
    bench: str
    steps: list[Step]
    seed: int | None = None
    profile: str | None = None
    controller: str | None = None
    broke: str | None = None  # the promise broken, and how
    # What each step came to as the story was first told, up to the one that broke a promise
    # (``broke``): told again (a replay), a story that broke under load may take another path.
    told: list[str] = field(default_factory=list)

    def dump(self) -> str:
        data: dict = {"story": "a failure sequence (lumion-hil replay STORY --bench FILE)", "bench": self.bench,
                "seed": self.seed, "profile": self.profile, "controller": self.controller,
                "steps": [s.to_dict() for s in self.steps]}
        if self.told:
            data["told"] = list(self.told)
        if self.broke:
            data["broke"] = self.broke
        text = yaml.safe_dump(data, sort_keys=False, width=100)
        told = "\n".join(f"#   {n}. {s.describe()}" for n, s in enumerate(self.steps, 1))
        return f"# {len(self.steps)} step(s):\n{told}\n{text}"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.dump(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Story":
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise StoryError(f"{path}: cannot read the story: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise StoryError(f"{path}: a story is a mapping with a list of steps")
        try:
            steps = [Step.from_dict(s) for s in data["steps"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise StoryError(f"{path}: a step is malformed: {exc}") from None
        told = data.get("told") or []
        if not isinstance(told, list) or not all(isinstance(t, str) for t in told):
            raise StoryError(f"{path}: 'told' is a list of what each step came to, in words")
        return cls(str(data.get("bench")), steps, data.get("seed"), data.get("profile"), data.get("controller"),
                   data.get("broke"), told)
