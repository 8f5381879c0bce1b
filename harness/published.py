"""The registry of published numbers (harness/published.yaml), with a bench's corrections."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from lumion_hil.harness import timescale
from lumion_hil.harness.measurements import Spec

REGISTRY = Path(__file__).with_name("published.yaml")


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    quantity: str
    value: float
    unit: str
    bound: Literal["about", "at_most", "at_least"]
    conditions: str
    source: str
    confidence: Literal["primary", "secondary", "cost-model", "lab-doc", "bench"]

    def cite(self) -> str:
        return f"{self.source} ({self.confidence}; {self.conditions})"


@lru_cache(maxsize=1)
def _registry() -> dict[str, Published]:
    data = yaml.safe_load(REGISTRY.read_text(encoding="utf-8"))
    return {key: Published.model_validate(entry) for key, entry in data.items()}


def published(key: str, overrides: dict | None = None) -> Published:
    """A published figure, corrected by the bench's ``published:`` section where it has one."""
    base = _registry().get(key)
    if base is None:
        raise KeyError(f"no published number {key!r}; known: {', '.join(sorted(_registry()))}")
    change = (overrides or {}).get(key)
    if change:
        base = base.model_copy(update={**change, "confidence": change.get("confidence", "bench")})
    return base


def all_published() -> dict[str, Published]:
    return dict(_registry())


def _scaled(p: Published, time_scale: float, software_s: float = 0.0) -> tuple[float, str]:
    """A published time on an emulated bench run at ``time_scale``: scaled the same way as every
    emulated latency, plus ``software_s`` of software time that does not scale, and saying so.
    Other units are left as they are."""
    if p.unit != "s":
        return p.value, ""
    value, how = timescale.scaled(p.value, time_scale, software_s, "software budget (not scaled)")
    return value, f"; {how}" if how else ""


def upper_limit(name: str, key: str, overrides: dict | None = None, marginal_fraction: float = 0.1,
                time_scale: float = 1.0, software_s: float = 0.0) -> Spec:
    """A measurement judged as "no more than the published figure"; ``software_s``: the software
    budget added, unscaled, when the time is scaled (the figure includes a controller's time)."""
    p = published(key, overrides)
    high, note = _scaled(p, time_scale, software_s)
    return Spec(name, p.unit, high=high, source=f"{p.quantity}: {p.value:g} {p.unit}, {p.cite()}{note}",
                marginal_fraction=marginal_fraction, published_key=key, published_value=high)


def about(name: str, key: str, overrides: dict | None, tolerance: float, marginal_fraction: float = 0.1) -> Spec:
    """A measurement judged against a published "about X" figure: within X (1 +- tolerance)."""
    p = published(key, overrides)
    return Spec(name, p.unit, low=p.value * (1 - tolerance), high=p.value * (1 + tolerance),
                source=f"{p.quantity}: about {p.value:g} {p.unit} (+-{tolerance:.0%}), {p.cite()}",
                marginal_fraction=marginal_fraction, published_key=key, published_value=p.value,
                category="bandwidth regression" if p.unit == "ratio" else "")


def about_at_most(name: str, key: str, overrides: dict | None, tolerance: float, marginal_fraction: float = 0.1,
                  time_scale: float = 1.0, software_s: float = 0.0) -> Spec:
    """A measurement judged against a published "within about X": no more than X (1 + tolerance)."""
    p = published(key, overrides)
    high, note = _scaled(p.model_copy(update={"value": p.value * (1 + tolerance)}), time_scale, software_s)
    return Spec(name, p.unit, high=high, source=f"{p.quantity}: within about {p.value:g} {p.unit} "
                f"(+{tolerance:.0%}), {p.cite()}{note}", marginal_fraction=marginal_fraction, published_key=key,
                published_value=p.value)
