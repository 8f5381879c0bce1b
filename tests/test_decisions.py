"""Decisions about noisy figures (harness/decisions.py): their stated false-alarm rate holds, they
see what they should, and the CI run's rates add up to its budget."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from lumion_hil.harness import decisions
from lumion_hil.harness.decisions import Verdict, compare

RNG_SEED = 20261203


def _late(rng, n: int, scale: float = 1.0) -> np.ndarray:
    """Timings as a loaded machine gives them: mostly near 10, a few much later (heavy tail)."""
    return 10 + scale * (rng.normal(0, 0.3, n) + rng.exponential(0.3, n) * (rng.random(n) < 0.2) * 10)


def test_a_difference_at_the_margin_is_called_different_at_most_alpha_of_the_time():
    """The worst case the rate is stated for: a true difference right at the margin, samples
    with a heavy tail (a loaded machine's late samples). 2000 trials at alpha 5%."""
    rng = np.random.default_rng(RNG_SEED)
    margin, alpha, trials = 0.5, 0.05, 2000
    alarms = 0
    for _ in range(trials):
        before, after = _late(rng, 15), _late(rng, 15) + margin
        alarms += compare(before, after, margin=margin, alpha=alpha).verdict == Verdict.DIFFERS
    # within 3 standard errors of alpha: the test could fail only if the stated rate did not hold
    assert alarms / trials <= alpha + 3 * (alpha * (1 - alpha) / trials) ** 0.5, alarms / trials


def test_no_difference_is_rarely_called_different_and_often_shown_the_same():
    rng = np.random.default_rng(RNG_SEED + 1)
    verdicts = [compare(_late(rng, 25), _late(rng, 25), margin=1.0, alpha=0.001).verdict for _ in range(300)]
    assert verdicts.count(Verdict.DIFFERS) == 0
    assert verdicts.count(Verdict.SAME) >= 0.75 * len(verdicts)  # the rest undecided: a fifth of the samples are late


def test_twice_the_margin_is_seen_and_its_interval_holds_the_truth():
    rng = np.random.default_rng(RNG_SEED + 2)
    seen = 0
    for _ in range(200):
        d = compare(_late(rng, 20), _late(rng, 20) + 2.0, margin=1.0, alpha=0.005, what="switch", unit="ms")
        seen += d.verdict == Verdict.DIFFERS and d.above
        assert d.low <= d.effect <= d.high
    assert seen >= 0.8 * 200  # power with a fifth of the samples late by up to 10 standard deviations
    assert "switch" not in d.text() and d.text().endswith("differs") and "margin 1" in d.text()


def test_pairs_cancel_what_they_share():
    """Each pair shares a large draw (the same command, the same seed): paired, a small shift
    shows; the same samples unpaired cannot tell."""
    rng = np.random.default_rng(RNG_SEED + 3)
    shared = rng.normal(50, 8, 30)
    before, after = shared + rng.normal(0, 0.1, 30), shared + 1.0 + rng.normal(0, 0.1, 30)
    assert compare(before, after, margin=0.5, alpha=0.001, paired=True).verdict == Verdict.DIFFERS
    assert compare(before, after, margin=0.5, alpha=0.001).verdict == Verdict.UNDECIDED
    with pytest.raises(ValueError, match="paired samples come in pairs .3 against 2."):
        compare([1, 2, 3], [1, 2], margin=0.1, alpha=0.01, paired=True, what="link_up host0")


def test_too_few_samples_are_undecided_and_say_so():
    one = compare([1.0], [5.0], margin=0.1, alpha=0.01)
    assert one.verdict == Verdict.UNDECIDED and "too few samples" in one.why
    assert compare([], [5.0, 5.1], margin=0.1, alpha=0.01).why == "no samples on one side"
    exact = compare([2.0, 2.0, 2.0], [2.5, 2.5, 2.5], margin=0.1, alpha=0.01)  # no noise: the difference is exact
    assert exact.verdict == Verdict.DIFFERS and exact.low == exact.high == pytest.approx(0.5)


def test_one_night_against_the_nights_before_is_a_prediction_interval():
    nights = [1.00, 1.02, 0.99, 1.01, 1.00]
    assert compare(nights, [1.5], margin=0.1, alpha=0.001).above
    assert compare(nights, [1.04], margin=0.1, alpha=0.001).verdict != Verdict.DIFFERS
    assert compare(nights[:2], [1.5], margin=0.1, alpha=0.001).verdict == Verdict.UNDECIDED


def test_a_family_shares_one_rate_among_the_decisions_it_can_make():
    family = decisions.Family(0.01, "fidelity")
    family.add("a", [1, 2, 3], [1, 2, 3], margin=1)
    family.add("b", [1, 2, 3], [4, 5, 6], margin=1)
    family.add("c", [1, 2], [2, 3], margin=1)  # too few: takes no share
    family.add("d", [1, 2, 3], [1, 2, 3], margin=1, weight=0.5)
    assert family.size == 3
    decided = family.decide()
    assert decided["a"].alpha == decided["b"].alpha == pytest.approx(0.004)
    assert decided["d"].alpha == pytest.approx(0.002) and "at least 3 a side" in decided["c"].why
    with pytest.raises(ValueError, match="fidelity: 'a' is compared twice"):
        family.add("a", [1], [1], margin=1)


def test_bad_rates_and_margins_say_which_decision():
    with pytest.raises(ValueError, match="job_start: a false-alarm rate is between 0 and 0.5, not 1.5"):
        compare([1, 2], [1, 2], margin=0.1, alpha=1.5, what="job_start")
    with pytest.raises(ValueError, match="light: the margin is a difference of at least 0"):
        compare([1, 2], [1, 2], margin=-1, alpha=0.01, what="light")


def test_the_ci_runs_decisions_add_up_to_its_budget():
    assert 0 < decisions.ci_run_alpha() <= decisions.CI_RUN_ALPHA


def test_a_decision_judges_a_measurement_one_late_line_is_noise_every_late_line_a_defect():
    """recovery_measurement_error's shape: the agents' stamps of nine steps against the world's
    instants, at its rate and its 5 ms margin. A busy core delays one read by 7 ms (the old
    one-sample bound's false alarm): same, pass. An agent that reads every line 20 ms late:
    differs, fail. Nothing paired: no pass."""
    from lumion_hil.harness.measurements import Spec
    from lumion_hil.harness.measurements import Verdict as Judged

    rng = np.random.default_rng(RNG_SEED)
    world = np.cumsum(rng.uniform(0.3, 0.4, 9))
    read = rng.uniform(0.0001, 0.0006, 9)

    def judged(late: np.ndarray):
        decision = compare(world, world + late, paired=True, margin=0.005, alpha=decisions.RECOVERY_ERROR_ALPHA)
        spec = Spec("recovery_measurement_error", "s").decided_by(decision, "within 5 ms")
        return spec.judge(decision.effect), decision

    one_late = read.copy()
    one_late[0] += 0.007
    verdict, decision = judged(one_late)
    assert verdict is Judged.PASS and decision.verdict is Verdict.SAME, decision.text(1000, "ms")
    verdict, decision = judged(read + 0.020)
    assert verdict is Judged.FAIL and decision.low > 0.005, decision.text(1000, "ms")
    nothing = compare([], [], paired=True, margin=0.005, alpha=decisions.RECOVERY_ERROR_ALPHA)
    assert Spec("e", "s").decided_by(nothing, "x").judge(nothing.effect) is Judged.FAIL
    assert Spec("e", "s").decided_by(nothing, "x").source == "x; decided at a false-alarm rate of 1e-05"


def test_scipy_is_imported_at_the_first_decision_not_with_the_harness():
    """scipy.stats costs most of a second at import: a process that imports the recovery suite's
    code and decides nothing (a failure-sequence run, a pytest worker) does not pay it."""
    probe = ("import sys, lumion_hil.harness.recovery, lumion_hil.harness.fidelity, lumion_hil.harness.decisions as d; "
             "print('scipy.stats' in sys.modules); d.compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], margin=1.0, alpha=0.01); "
             "print('scipy.stats' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"], proc.stdout


def test_the_bare_readers_floor_has_one_lateness_a_line_and_is_measured_once():
    """The machine's floor under the agents' stamps (harness/overhead.py reader_floor): every
    writer's every line read, none before it was written (one clock), and a second ask for the
    same writers and interval is the first measurement, not another."""
    from lumion_hil.harness.overhead import reader_floor, start_reader_floor

    floor = reader_floor(2, 0.05, lines=3)
    assert len(floor) == 2 * 3
    assert all(0 <= late < 1.0 for late in floor), floor
    assert start_reader_floor(2, 0.05, lines=3) is start_reader_floor(2, 0.051, lines=3)
    assert reader_floor(2, 0.05, lines=3) == floor
