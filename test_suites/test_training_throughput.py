"""Training throughput, observed: the step rate of the running job before a GPU fails, after
the optical fabric swaps a spare in, and on the electrical rack with the same ranks, each from
the instants at which the agent sees successive steps (never the rate the job prints about
itself). Judged: the optical-over-electrical ratio against the published speed-up, and the rate
the swap gives back; recorded: the steps the recovery cost."""

from __future__ import annotations

import allure
import pytest

from lumion_hil.harness.bandwidth import observe_step_rate
from lumion_hil.harness import limits, predictions
from lumion_hil.harness.measurements import Spec
from lumion_hil.harness.published import about
from lumion_hil.harness.recovery import observe_restart, recover_once

pytestmark = allure.feature("training throughput")

INTERVALS = 3  # step intervals timed per rate


@pytest.fixture(scope="module")
def rates(session, bench_file):
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    ranks = list(bench_file.job.ranks)
    session.fresh_job(ranks)
    out = {"before": observe_step_rate(session, ranks, INTERVALS)}
    injector, fault, fault_ns, result = recover_once(session, ranks)
    try:
        assert result.status == "recovered", f"{fault.describe()}: {result.status}: {result.reason}"
        restart = observe_restart(session, fault_ns)  # the rank map from the agents, not the plan
        after = restart.ranks
        out["after"] = observe_step_rate(session, after, INTERVALS)
        out["downtime_s"] = (restart.first_step_ns - fault_ns) / 1e9
        if bench_file.electrical is not None:
            session.stop_job()
            session.start_job(after, "electrical")
            out["electrical"] = observe_step_rate(session, after, INTERVALS)
    finally:
        session.put_back(lambda: injector.repair(fault))
    out["fault"] = fault
    return out


@allure.title("step rate before, after the optical swap, and on the electrical rack")
def test_step_rates(rates, session, measure, record_note):
    record_note("job", kind=session.job_kind())
    for name in ("before", "after", "electrical"):
        if name in rates:
            rate = rates[name]
            measure(Spec(f"step_time_{name}", "s", description="median interval between steps the agent saw"),
                    rate.step_time_s, ranks=rate.ranks, intervals_s=rate.intervals_s)
            measure(Spec(f"samples_per_s_{name}", "samples/s", description="batch x ranks / step time"),
                    rate.samples_per_s)
    # The steps the job could have taken while it was down: what the recovery cost in progress.
    measure(Spec("steps_lost_to_recovery", "steps", description="fault to first step after the swap, in steps "
                 "at the rate before the failure"), rates["downtime_s"] / rates["before"].step_time_s,
            fault=rates["fault"].describe())


@allure.title("the optical swap gives the step rate back")
def test_step_rate_after_recovery_matches_before(rates, bench_file, measure):
    measure(Spec("throughput_after_over_before", "ratio", description="samples/s after the swap / before").at_least(
        0.9, "LUMION: training continues at full speed on the spare (lab requirement: within 10%)").with_marginal(
        bench_file.limits.marginal_fraction), rates["after"].samples_per_s / rates["before"].samples_per_s)


@allure.title("training throughput, optical over electrical, after the swap")
def test_throughput_ratio_optical_over_electrical(rates, session, bench_file, measure):
    if "electrical" not in rates:
        pytest.skip("the bench file describes no electrical rack to compare with")
    ratio = rates["after"].samples_per_s / rates["electrical"].samples_per_s
    rings = session.backend.collective_rings()  # the job's library's (None: NCCL's, the bench file's)
    predicted = predictions.throughput_ratio(bench_file, rings or None)
    if predicted is None:
        pytest.fail("no throughput ratio predicted: the bench file needs a job of two ranks or more and an "
                    "electrical rack")
    tolerance, fraction = bench_file.limits.about_tolerance.value, bench_file.limits.marginal_fraction
    job = session.job_kind()
    for name, key in (("throughput_optical_over_electrical", "morphlux.epoch_speedup"),
                      ("throughput_optical_over_electrical_lumion", "lumion.throughput_vs_electrical")):
        measure(about(name, key, bench_file.published, tolerance, fraction)
                .not_comparable_because(session.backend.not_comparable("job")), ratio, predicted=predicted.value,
                prediction=predicted.why, job=job)
    measure(limits.against_prediction("throughput_ratio_over_bench_prediction", bench_file)
            .not_comparable_because(session.backend.not_comparable("job:model")), ratio / predicted.value,
            observed=ratio, predicted=predicted.value, prediction=predicted.why, job=job)
