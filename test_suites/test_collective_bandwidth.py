"""Collective bandwidth: nccl-tests' all-reduce, run on the hosts as a lab runs it, before a
GPU fails, after the optical fabric swaps a spare in, and on the electrical rack the papers
compare against (the same ranks, the spare reached through the packet network). Judged: the
large-message bus-bandwidth ratio against the published one, the bandwidth the swap gives back,
no wrong results, and the time from the fault until a collective completes again."""

from __future__ import annotations

import csv
import dataclasses
import io

import allure
import pytest

from lumion_hil.reports import allure_glue
from lumion_hil.harness.bandwidth import run_sweep
from lumion_hil.harness import limits, predictions
from lumion_hil.harness.measurements import Spec
from lumion_hil.harness.published import about, upper_limit
from lumion_hil.harness.recovery import rank_map, recover_once
from lumion_hil.reports.plots import busbw_figure, close

pytestmark = allure.feature("collective bandwidth")


# The recovery's instants, judged here too, are times on the bench, not bytes over its fabric.
RECOVERY_TIMES = ("nccl_resync", "nccl_communicator_ready")


@pytest.fixture
def measure(measure):
    """The plugin's ``measure``, each figure marked as bytes moved over a fabric by nccl-tests:
    measured where the bench moves real bytes (a real bench, the namespaced one), a model on a
    bench whose nccl-tests compute their figures."""
    def traffic(spec, value, **attrs):
        return measure(spec if spec.name in RECOVERY_TIMES else dataclasses.replace(spec, traffic=True), value, **attrs)

    return traffic


@pytest.fixture(scope="module")
def story(session, bench_file):
    """Sweeps before the failure, after the optical recovery, and on the electrical rack, and
    the instants the recovery gives; the bench is put back afterwards."""
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    ranks = list(bench_file.job.ranks)
    session.stop_job()
    session.restore_baseline()
    out = {"before": run_sweep(session, "all_reduce", ranks, "optical")}
    session.start_job(ranks)
    assert session.hosts[ranks[0]].wait_step(1, bench_file.waits.recovery_s)["reached"], "the job did not start"
    injector, fault, fault_ns, result = recover_once(session, ranks)
    try:
        assert result.status == "recovered", f"{fault.describe()}: {result.status}: {result.reason}"
        after, _ = rank_map(session, fault_ns)  # from the agents, not the controller's plan
        lead = session.hosts[after[0]]
        out["collective"] = lead.wait_job_event("collective", bench_file.waits.recovery_s)
        out["init"] = lead.wait_job_event("nccl_init", 0)
        out.update(fault=fault, fault_ns=fault_ns, ranks_after=after)
        session.stop_job()
        out["after"] = run_sweep(session, "all_reduce", after, "optical")
        if bench_file.electrical is not None:
            out["electrical"] = run_sweep(session, "all_reduce", after, "electrical")
    finally:
        session.stop_job()
        injector.repair(fault)
        session.restore_baseline()
    return out


@allure.title("bus bandwidth by message size: before, after the optical swap, electrical")
def test_busbw_by_size(story, measure):
    series = {f"{name} ({story[name].fabric}, {len(story[name].ranks)} ranks)": story[name].result.busbw_by_size()
              for name in ("before", "after", "electrical") if name in story}
    table = io.StringIO()
    writer = csv.writer(table)
    sizes = sorted({size for by_size in series.values() for size in by_size})
    writer.writerow(["size_bytes", *series])
    for size in sizes:
        writer.writerow([size, *(by_size.get(size, "") for by_size in series.values())])
    allure.attach(table.getvalue(), name="busbw-by-size", attachment_type=allure.attachment_type.CSV)
    fig = busbw_figure(series, "all-reduce bus bandwidth (nccl-tests)")
    allure_glue.attach_figure("busbw-by-size", fig)
    close(fig)
    for name in ("before", "after", "electrical"):
        if name in story:
            sweep = story[name]
            allure.attach(sweep.output, name=f"nccl-tests {name}", attachment_type=allure.attachment_type.TEXT)
            measure(Spec(f"busbw_largest_{name}", "GB/s", description=f"all-reduce of {sweep.largest.size_bytes} B, "
                         f"{sweep.fabric}"), sweep.largest.out_of_place.busbw_best_gbps, ranks=sweep.ranks)
            measure(Spec(f"nccl_tests_sweep_{name}", "s", description="wall time of the sweep"), sweep.wall_s)
            # Every size in the record, so that a regression at any size reaches the summary.
            for size, busbw in sorted(sweep.result.busbw_by_size().items()):
                measure(Spec(f"busbw_{name}_{size}B", "GB/s", better="higher", description=f"all-reduce busbw at "
                             f"{size} B, {sweep.fabric} (out of place)"), busbw, size_bytes=size, ranks=sweep.ranks)


@allure.title("the optical swap gives the bandwidth back")
def test_busbw_after_recovery_matches_before(story, bench_file, measure):
    before, after = story["before"].largest.out_of_place.busbw_best_gbps, story["after"].largest.out_of_place.busbw_best_gbps
    measure(Spec("busbw_after_over_before", "ratio", description="largest all-reduce, after the swap / before").at_least(
        0.9, "LUMION: the spare is switched in at full bandwidth (lab requirement: within 10%)").with_marginal(
        bench_file.limits.marginal_fraction), after / before)


@allure.title("all-reduce bus bandwidth, optical over electrical, after the swap")
def test_busbw_ratio_optical_over_electrical(story, bench_file, measure):
    if "electrical" not in story:
        pytest.skip("the bench file describes no electrical rack to compare with")
    optical, electrical = story["after"].largest, story["electrical"].largest
    assert optical.size_bytes == electrical.size_bytes
    ratio = optical.out_of_place.busbw_best_gbps / electrical.out_of_place.busbw_best_gbps
    predicted = predictions.busbw_ratio(bench_file, optical.size_bytes)
    measure(about("allreduce_busbw_optical_over_electrical", "morphlux.allreduce_busbw_ratio", bench_file.published,
                  bench_file.limits.about_tolerance.value, bench_file.limits.marginal_fraction), ratio,
            size_bytes=optical.size_bytes, predicted=predicted.value, prediction=predicted.why)
    measure(limits.against_prediction("allreduce_busbw_ratio_over_bench_prediction", bench_file), ratio / predicted.value,
            observed=ratio, predicted=predicted.value, prediction=predicted.why)


@allure.title("no wrong results in any all-reduce")
def test_no_wrong_results(story, measure):
    for name in ("before", "after", "electrical"):
        if name not in story:
            continue
        wrong = story[name].result.total_wrong
        if wrong is None:
            pytest.skip(f"nccl-tests ran without checking (-c 0): #wrong is N/A ({name})")
        measure(Spec(f"nccl_wrong_elements_{name}", "elements", category="wrong results", description="nccl-tests #wrong over the sweep")
                .at_most(0, "nccl-tests: any wrong element is a failure").with_marginal(0.0), wrong)


@allure.title("fault to the first collective completed again")
def test_time_until_a_collective_completes_again(story, session, bench_file, measure):
    event = story["collective"]["event"]
    assert event is not None, f"no collective completed on {story['ranks_after']}: {story['collective']['last_lines']}"
    measure(upper_limit("nccl_resync", "morphlux.nccl_resync_s", bench_file.published,
                        bench_file.limits.marginal_fraction, bench_file.time_scale,
                        bench_file.limits.controller_overhead_s.value),
            (event["t_ns"] - story["fault_ns"]) / 1e9, fault=story["fault"].describe(),
            uncertainty_s=event["uncertainty_ns"] / 1e9)
    init = story["init"]["event"]
    if init is not None:
        measure(Spec("nccl_communicator_ready", "s", description="fault to NCCL's Init COMPLETE on the new ranks"),
                (init["t_ns"] - story["fault_ns"]) / 1e9)
