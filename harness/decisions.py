"""Decisions about noisy figures, each with a stated false-alarm rate.

A verdict that compares noisy figures (a replay against its recording, a twin against its lab,
tonight against the nights before) is a statistical decision here, never a fixed tolerance on a
median of a few samples. Every decision:

- is about a difference, ``after`` minus ``before`` (replay minus recording, tonight minus the
  nights before), in the figures' own unit and time base (a bench at time scale 0.2 has its
  timings at 0.2, and so has the margin);
- has a ``margin``: the smallest difference that matters. The answer has three values:
  ``differs`` (the difference is shown to be beyond the margin), ``same`` (shown to be within
  it: two one-sided tests, TOST) and ``undecided`` (the samples cannot tell: too few, or too
  noisy for the margin);
- has a false-alarm rate ``alpha``: a difference no larger than the margin is called
  ``differs`` with probability at most alpha (the worst case, a true difference right at the
  margin; a true difference of nothing is called so far less often). ``same`` is wrong with at
  most the same probability;
- says its effect, its interval and its answer: the effect is the difference of the two sides'
  20%-trimmed means (Yuen): a sample that a loaded machine delayed moves it little; the
  interval is Welch-Yuen's at level 1 - 2 alpha (``scipy.stats.ttest_ind(trim=0.2,
  equal_var=False)``), so that ``differs`` is the interval lying wholly beyond the margin and
  ``same`` the interval lying wholly within it. Paired samples (the same exchange recorded and
  replayed) are judged on the trimmed mean of their differences, so that what a pair shares
  cancels. One figure against the nights before it (one sample on one side) is judged by the
  Student interval of a new observation (a prediction interval: the nights' own spread is the
  noise);
- needs at least ``MIN_SAMPLES`` samples a side (or pairs; or one against that many): with
  fewer it is undecided, and says so.

A verdict that makes many decisions holds one false-alarm rate for all of them together
(``Family``: Bonferroni, each decision at its share of alpha among those that can be decided,
shares weighted where some decisions' effects dwarf their noise).
``CI_LEDGER`` lists every family a CI run makes and its rate; their sum is the run's
(``CI_RUN_ALPHA``, 1.1 %). The rates actually seen are measured by ``perf/flakes.py`` and
``perf/fidelity_rates.py``.
"""

from __future__ import annotations

import enum
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Hashable, Sequence, TypedDict

import numpy as np

# scipy.stats is imported by the functions that use it, at the first decision, not with this
# module: it costs most of a second of CPU, and every process that imports the recovery suite's
# code (each pytest worker, each suite run, the failure sequences that make no decision) paid it.

TRIM = 0.2  # each side's 20% most extreme samples weigh least (Yuen's trimmed means)
MIN_SAMPLES = 3  # a side (or pairs) of fewer cannot show a difference at the rates used here: undecided

# --- the false-alarm budget of a CI run ------------------------------------------------------

CI_RUN_ALPHA = 0.011  # at most 1.1% of CI runs go red on a comparison of noisy figures without a real difference

FIDELITY_ALPHA = 0.005  # one fidelity report, over all its kinds and detectors
TWIN_ALPHA = FIDELITY_ALPHA  # the mystery lab's twin, judged by a fidelity report on a recording it was not fitted to
# The agents' stamps of a restarted job's steps against the emulated world's instants
# (harness/overhead.py stamp_error): once per recovery judged against the world (the recovery
# suite's recovery_measurement_error). Nominal: the decision takes its pairs as independent.
RECOVERY_ERROR_ALPHA = 1e-5
SUMMARY_ALPHA = 0.01  # one morning summary's regressions, over all its rows (a nightly's, not CI's: no history there)

# Every family of decisions a CI run makes: (how many a run makes, the rate of each).
CI_LEDGER: dict[str, tuple[int, float]] = {
    "fidelity of the default bench against the mystery lab's recording (tests/test_fidelity.py)": (1, FIDELITY_ALPHA),
    "fidelity of the twin against the lab's second recording (tests/test_fidelity.py)": (1, TWIN_ALPHA),
    # at most: the recovery suite on the three emulated benches (15), its defect proofs and the
    # tests that run it (under 60 by count of their -k selections), the real-time recovery test
    # (tests/test_recovery.py: 3 at most)
    "the agents' stamps of a recovery against the world's instants (recovery_measurement_error)":
        (100, RECOVERY_ERROR_ALPHA),
}


def ci_run_alpha() -> float:
    """The CI run's false-alarm rate over every family it decides (at most the sum of theirs)."""
    return sum(count * alpha for count, alpha in CI_LEDGER.values())


# --- one decision ------------------------------------------------------------------------------


class Verdict(str, enum.Enum):
    DIFFERS = "differs"  # shown to differ by more than the margin
    SAME = "same"  # shown to be within the margin
    UNDECIDED = "undecided"  # the samples cannot tell


@dataclass(frozen=True)
class Decision:
    """One comparison's answer, with everything needed to read it: the effect (``after`` minus
    ``before``), its interval at level 1 - 2 ``alpha``, the margin, the samples and the method."""

    what: str
    unit: str
    n_before: int
    n_after: int
    effect: float | None
    low: float | None
    high: float | None
    margin: float
    alpha: float
    verdict: Verdict
    method: str
    why: str = ""  # why undecided, when it is

    @property
    def above(self) -> bool:
        """Shown larger than ``before`` by more than the margin (one-sided, at ``alpha``)."""
        return self.low is not None and self.low > self.margin

    @property
    def below(self) -> bool:
        """Shown smaller than ``before`` by more than the margin (one-sided, at ``alpha``)."""
        return self.high is not None and self.high < -self.margin

    def text(self, factor: float = 1.0, unit: str | None = None) -> str:
        """``+1.02 ms (-0.11 .. +2.15; margin 0.50; n 27/27, alpha 0.01%): differs``;
        figures multiplied by ``factor`` and shown in ``unit`` (e.g. 1000, "ms")."""
        unit = self.unit if unit is None else unit

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x * factor:+.3g}"

        interval = "" if self.low is None else f"{f(self.low)} .. {f(self.high)}; "
        return (f"{f(self.effect)} {unit} ({interval}margin {self.margin * factor:.3g}; n {self.n_before}/"
                f"{self.n_after}; alpha {self.alpha:.2g}): {self.verdict.value}" + (f", {self.why}" if self.why else ""))

    def as_dict(self) -> dict:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        out["level"] = 1 - 2 * self.alpha
        return out


class _Shared(TypedDict):
    """The fields of a :class:`Decision` that every answer of one comparison shares."""

    what: str
    unit: str
    n_before: int
    n_after: int
    margin: float
    alpha: float


def _finite(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def _trimmed_sd(x: np.ndarray) -> float:
    """The winsorized standard deviation Yuen's test uses (0: no spread at all)."""
    from scipy import stats

    if len(x) < 2:
        return 0.0
    return float(np.std(np.asarray(stats.mstats.winsorize(x, limits=(TRIM, TRIM))), ddof=1))


def compare(before: Sequence[float], after: Sequence[float], *, margin: float, alpha: float, what: str = "",
            unit: str = "", paired: bool = False) -> Decision:
    """Whether ``after`` differs from ``before`` by more than ``margin`` (same unit), with a
    false-alarm rate of ``alpha``. See the module's docstring for the method.

    ``paired``: the i-th samples of the two sides belong together (the same exchange recorded
    and replayed, the same draw of two benches of one seed): the effect is then the trimmed
    mean of the differences, and what the pairs share (the command, the draw) cancels."""
    if not (0 < alpha < 0.5):
        raise ValueError(f"{what or 'decision'}: a false-alarm rate is between 0 and 0.5, not {alpha!r}")
    if margin < 0 or not math.isfinite(margin):
        raise ValueError(f"{what or 'decision'}: the margin is a difference of at least 0, not {margin!r}")
    if paired:
        if len(before) != len(after):
            raise ValueError(f"{what or 'decision'}: paired samples come in pairs ({len(before)} against {len(after)})")
        pairs = [(b, a) for b, a in zip(before, after) if b is not None and a is not None
                 and math.isfinite(b) and math.isfinite(a)]
        before, after = [b for b, _ in pairs], [a for _, a in pairs]
    x, y = _finite(before), _finite(after)
    level = 1 - 2 * alpha
    base = _Shared(what=what, unit=unit, n_before=len(x), n_after=len(y), margin=float(margin), alpha=alpha)
    if paired and len(x) >= MIN_SAMPLES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return _paired(y - x, base, level, margin)
    if min(len(x), len(y)) == 0:
        return Decision(**base, effect=None, low=None, high=None, verdict=Verdict.UNDECIDED, method="-",
                        why="no samples on one side")
    with warnings.catch_warnings():  # scipy warns of nearly identical samples: they are answered below
        warnings.simplefilter("ignore", RuntimeWarning)
        return _compare(x, y, base, level, margin)


def _paired(differences: np.ndarray, base: _Shared, level: float, margin: float) -> Decision:
    from scipy import stats

    # Yuen's test of the differences against none (a one-sample trimmed t; scipy's two-sample
    # form with a side of zeros, whose spread is nothing, is exactly that)
    result = stats.ttest_ind(differences, np.zeros_like(differences), equal_var=False, trim=TRIM)
    effect = float(stats.trim_mean(differences, TRIM))
    return _answer(base, result, effect, _trimmed_sd(differences), level, margin,
                   "paired, Yuen (20% trimmed mean of the differences)")


def _compare(x: np.ndarray, y: np.ndarray, base: _Shared, level: float, margin: float) -> Decision:
    from scipy import stats

    if min(len(x), len(y)) < MIN_SAMPLES and not (min(len(x), len(y)) == 1 and max(len(x), len(y)) >= MIN_SAMPLES):
        effect = float(np.mean(y) - np.mean(x))
        return Decision(**base, effect=effect, low=None, high=None, verdict=Verdict.UNDECIDED, method="-",
                        why=f"too few samples: at least {MIN_SAMPLES} a side (or one against {MIN_SAMPLES})")
    if min(len(x), len(y)) == 1:
        # One new figure against several: the Student interval of a new observation.
        result = stats.ttest_ind(y, x, equal_var=True)
        method = "prediction interval (Student)"
        effect = float(np.mean(y) - np.mean(x))
        spread = float(np.std(x if len(x) > 1 else y, ddof=1))
    else:
        result = stats.ttest_ind(y, x, equal_var=False, trim=TRIM)
        method = "Yuen-Welch, 20% trimmed means"
        effect = float(stats.trim_mean(y, TRIM) - stats.trim_mean(x, TRIM))
        spread = max(_trimmed_sd(x), _trimmed_sd(y))
    return _answer(base, result, effect, spread, level, margin, method)


def _answer(base: _Shared, result, effect: float, spread: float, level: float, margin: float, method: str) -> Decision:
    if spread == 0.0:  # no noise on either side: the difference is exact
        low = high = effect
    else:
        interval = result.confidence_interval(level)
        low, high = float(interval.low), float(interval.high)
        if not (math.isfinite(low) and math.isfinite(high)):
            return Decision(**base, effect=effect, low=None, high=None, verdict=Verdict.UNDECIDED, method=method,
                            why="no interval: too few samples")
    if low > margin or high < -margin:
        verdict = Verdict.DIFFERS
    elif -margin <= low and high <= margin:
        verdict = Verdict.SAME
    else:
        verdict = Verdict.UNDECIDED
    why = "" if verdict != Verdict.UNDECIDED else "the interval reaches past the margin: more samples would tell"
    return Decision(**base, effect=effect, low=low, high=high, verdict=verdict, method=method, why=why)


def decidable(before: Sequence[float], after: Sequence[float], paired: bool = False) -> bool:
    """Whether a comparison of these samples can come out other than undecided for want of
    samples (so that it takes a share of its family's false-alarm rate)."""
    a, b = len(_finite(before)), len(_finite(after))
    if paired:
        return min(a, b) >= MIN_SAMPLES
    return min(a, b) >= MIN_SAMPLES or (min(a, b) == 1 and max(a, b) >= MIN_SAMPLES)


# --- many decisions, one rate --------------------------------------------------------------------


def bonferroni(alpha: float, count: int) -> float:
    """Each of ``count`` decisions' rate, so that all of them together cry wolf at most ``alpha``."""
    return alpha / max(1, count)


class Family:
    """Decisions that share one false-alarm rate: collect the comparisons, then ``decide()``
    them all, each at its share of ``alpha`` among those that can be decided (Bonferroni,
    weighted: a decision of ``weight`` 0.1 gets a tenth of the share of one of weight 1, for
    decisions whose effects dwarf their noise, so that the others keep the rate they need)."""

    def __init__(self, alpha: float, name: str = ""):
        self.alpha = alpha
        self.name = name
        self._pending: dict[Hashable, tuple] = {}

    def add(self, key: Hashable, before: Sequence[float], after: Sequence[float], *, margin: float,
            what: str = "", unit: str = "", paired: bool = False, weight: float = 1.0) -> None:
        if key in self._pending:
            raise ValueError(f"{self.name or 'family'}: {key!r} is compared twice")
        if not weight > 0:
            raise ValueError(f"{self.name or 'family'}: {key!r}'s weight is above 0, not {weight!r}")
        self._pending[key] = (list(before), list(after), margin, what or str(key), unit, paired, weight)

    @property
    def size(self) -> int:
        """How many of the comparisons can be decided (each takes a share of the rate)."""
        return sum(decidable(b, a, paired) for b, a, _, _, _, paired, _ in self._pending.values())

    def decide(self) -> dict[Hashable, Decision]:
        weights = sum(w for b, a, _, _, _, paired, w in self._pending.values() if decidable(b, a, paired)) or 1.0
        return {key: compare(before, after, margin=margin, alpha=self.alpha * weight / weights, what=what, unit=unit,
                             paired=paired)
                for key, (before, after, margin, what, unit, paired, weight) in self._pending.items()}
