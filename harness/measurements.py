"""Measurements declared with a unit and limits, each limit with its source; the verdict comes
from the declaration (after OpenHTF), never from a float compared inline in a test."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any

from lumion_hil.instruments.protocols import OutOfRange


class Basis(str, enum.Enum):
    """Where a figure comes from. ``measured``: a device or a program observed it (on an emulated
    bench, the harness's own software and the controller's run at real time and are measured).
    ``model``: an emulated bench computed it from its own physics and settings, so it can agree
    with a published number but never confirm one."""

    MEASURED = "measured"
    MODEL = "model"


# Units of figures that an emulated bench's physics decides (times, light, bandwidth, rates, the
# wrong elements a collective computes, the carrier drops a link makes).
_PHYSICS_UNITS = frozenset({"s", "dBm", "dB", "GB/s", "ratio", "samples/s", "steps", "elements", "drops"})


class Verdict(str, enum.Enum):
    PASS = "pass"
    MARGINAL = "marginal"  # inside the limits, but closer to one than the bench's marginal band
    FAIL = "fail"
    NOT_COMPARABLE = "not comparable"  # recorded beside a limit that does not apply to this bench (and why)


@dataclass(frozen=True)
class Spec:
    """What is measured, in which unit, and what counts as good: ``Spec("x", "s").at_most(1.1, src)``."""

    name: str
    unit: str
    low: float | None = None
    high: float | None = None
    source: str = ""
    marginal_fraction: float = 0.1
    description: str = ""
    published_key: str = ""  # the published number this is judged against (harness/published.yaml)
    published_value: float | None = None
    category: str = ""  # what a failure means; see ``cause``
    software: bool = False  # the figure is software time or the harness's own error: measured on any bench
    better: str | None = None  # "higher" or "lower": a recorded figure's good direction, for night-to-night regressions
    traffic: bool = False  # bytes moved over a fabric (nccl-tests): measured on a bench that moves real bytes
    not_comparable: str = ""  # why this bench's figure cannot be judged against the limit (it is recorded beside it)
    decided: str = ""  # a decision's answer (harness/decisions.py) that judges the figure, its effect: see decided_by

    def basis(self, emulated: bool, real_traffic: bool = False) -> Basis:
        """Measured on a real bench; on an emulated one, a figure its physics decides is a model,
        but for the bytes moved over its fabric where it moves real ones (``real_traffic``: the
        namespaced bench's real sockets, queues and shaped links)."""
        if not emulated or self.software or self.category == "controller error" or (self.traffic and real_traffic):
            return Basis.MEASURED
        return Basis.MODEL if self.unit in _PHYSICS_UNITS else Basis.MEASURED

    def cause(self) -> str:
        """What a failure of this measurement means, for reports: a timing regression, a
        bandwidth regression, ... (its declared category, else from its unit and name)."""
        if self.category:
            return self.category
        if self.unit == "s":
            return "timing regression"
        if self.unit == "GB/s" or any(w in self.name for w in ("busbw", "throughput", "bandwidth")):
            return "bandwidth regression"
        if self.unit in ("dBm", "dB"):
            return "optical power"
        return "out of limits"

    def at_most(self, high: float, source: str) -> "Spec":
        return replace(self, high=high, source=source)

    def at_least(self, low: float, source: str) -> "Spec":
        return replace(self, low=low, source=source)

    def in_range(self, low: float, high: float, source: str) -> "Spec":
        return replace(self, low=low, high=high, source=source)

    def with_marginal(self, fraction: float) -> "Spec":
        return replace(self, marginal_fraction=fraction)

    def not_comparable_because(self, why: str | None) -> "Spec":
        """The limit stays in the record beside the figure, and the verdict is "not comparable"
        with ``why`` (None or empty: judged as usual)."""
        return replace(self, not_comparable=why or "")

    def decided_by(self, decision, source: str) -> "Spec":
        """Judged by a statistical decision (harness/decisions.py) whose margin is the limit:
        ``differs`` (shown beyond the margin) fails, ``same`` (shown within it) passes, and
        ``undecided`` (the samples cannot tell) is marginal. The figure measured is the decision's
        effect (None, nothing to decide on: fails); the limit shown is the margin, with the
        decision's false-alarm rate."""
        return replace(self, low=-decision.margin, high=decision.margin, decided=decision.verdict.value,
                       source=f"{source}; decided at a false-alarm rate of {decision.alpha:.2g}")

    def judge(self, value) -> Verdict:
        if self.not_comparable:
            return Verdict.NOT_COMPARABLE
        if self.decided:  # (no effect at all: nothing to decide on, which is no pass)
            if value is None:
                return Verdict.FAIL
            return {"differs": Verdict.FAIL, "same": Verdict.PASS}.get(self.decided, Verdict.MARGINAL)
        if isinstance(value, OutOfRange):
            # Below the meter's range satisfies an upper limit and nothing else; above, nothing.
            only_high = self.low is None and self.high is not None
            return Verdict.PASS if value.direction == "under" and only_high else Verdict.FAIL
        if value is None or not math.isfinite(value):
            return Verdict.FAIL
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            return Verdict.FAIL
        if self.low is not None and self.high is not None:
            band = (self.high - self.low) * self.marginal_fraction / 2
        else:
            band = abs(self.low if self.low is not None else self.high or 0.0) * self.marginal_fraction
        near_low = self.low is not None and value - self.low < band
        near_high = self.high is not None and self.high - value < band
        return Verdict.MARGINAL if (near_low or near_high) else Verdict.PASS

    def measure(self, value: float | None, basis: Basis = Basis.MEASURED, **attrs: Any) -> "Measurement":
        return Measurement(self, value, self.judge(value), attrs, Basis(basis))

    def limit_text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:g} .. {self.high:g} {self.unit}"
        if self.low is not None:
            return f">= {self.low:g} {self.unit}"
        if self.high is not None:
            return f"<= {self.high:g} {self.unit}"
        return "(recorded, not judged)"


@dataclass(frozen=True)
class Measurement:
    spec: Spec
    value: float | None
    verdict: Verdict
    attrs: dict[str, Any] = field(default_factory=dict)
    basis: Basis = Basis.MEASURED

    @property
    def passed(self) -> bool:
        return self.verdict is not Verdict.FAIL

    def describe(self) -> str:
        if isinstance(self.value, OutOfRange):
            shown = f"{self.value} of the meter"
        elif self.value is None or not math.isfinite(self.value):
            shown = "invalid"
        else:
            shown = f"{self.value:.6g} {self.spec.unit}"
        why = f": {self.spec.not_comparable}" if self.verdict is Verdict.NOT_COMPARABLE else ""
        return (f"{self.spec.name} = {shown} ({self.basis.value}): {self.verdict.value}{why} (limit "
                f"{self.spec.limit_text()}{'; ' + self.spec.source if self.spec.source else ''})")

    def to_dict(self) -> dict[str, Any]:
        out_of_range = self.value.direction if isinstance(self.value, OutOfRange) else None
        value = None if out_of_range or self.value is None or not math.isfinite(self.value) else self.value
        return {
            **({"out_of_range": out_of_range} if out_of_range else {}),
            "name": self.spec.name,
            "value": value,
            "unit": self.spec.unit,
            "low": self.spec.low,
            "high": self.spec.high,
            "source": self.spec.source,
            "verdict": self.verdict.value,
            "basis": self.basis.value,
            "cause": self.spec.cause(),
            **({"decided": self.spec.decided} if self.spec.decided else {}),
            **({"better": self.spec.better} if self.spec.better else {}),
            **({"not_comparable": self.spec.not_comparable} if self.verdict is Verdict.NOT_COMPARABLE else {}),
            **({"published": self.spec.published_key, "published_value": self.spec.published_value}
               if self.spec.published_key else {}),
            **({"attrs": self.attrs} if self.attrs else {}),
        }
