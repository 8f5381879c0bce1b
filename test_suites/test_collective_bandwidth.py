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
from lumion_hil.reports.plots import busbw_figure

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
    """Sweeps with each collective library the bench has (nccl-tests on a lab's bench) before
    the failure, after the optical recovery, and on the electrical rack (and there again with
    its uplinks halved, where the bench can reshape them), and the instants the recovery
    gives; the bench is put back afterwards."""
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    ranks = list(bench_file.job.ranks)
    libraries = session.backend.collective_libraries()
    session.stop_job()
    session.restore_baseline()
    out = {"libraries": libraries, "sweeps": {lib: {} for lib in libraries}}
    for lib in libraries:
        out["sweeps"][lib]["before"] = run_sweep(session, "all_reduce", ranks, "optical", library=lib)
    session.start_job(ranks)
    assert session.hosts[ranks[0]].wait_step(1, bench_file.waits.recovery_s).reached, "the job did not start"
    injector, fault, fault_ns, result = recover_once(session, ranks)
    try:
        assert result.status == "recovered", f"{fault.describe()}: {result.status}: {result.reason}"
        after, _ = rank_map(session, fault_ns)  # from the agents, not the controller's plan
        lead = session.hosts[after[0]]
        out["collective"] = lead.wait_job_event("collective", bench_file.waits.recovery_s)
        out["init"] = lead.wait_job_event("nccl_init", 0)
        out.update(fault=fault, fault_ns=fault_ns, ranks_after=after)
        session.stop_job()
        for lib in libraries:
            out["sweeps"][lib]["after"] = run_sweep(session, "all_reduce", after, "optical", library=lib)
            if bench_file.electrical is not None:
                out["sweeps"][lib]["electrical"] = run_sweep(session, "all_reduce", after, "electrical", library=lib)
        if bench_file.electrical is not None and session.backend.scale_uplinks(0.5):
            try:
                for lib in libraries:
                    out["sweeps"][lib]["electrical_uplinks_halved"] = run_sweep(
                        session, "all_reduce", after, "electrical", library=lib)
            finally:
                session.backend.scale_uplinks(1.0)
    finally:
        session.put_back(lambda: injector.repair(fault))
    return out


def _tag(story, library: str) -> str:
    """What a library's measurements are named with: nothing where the bench has one."""
    return "" if len(story["libraries"]) == 1 else f"_{library.replace('-', '_')}"


@allure.title("bus bandwidth by message size: before, after the optical swap, electrical")
def test_busbw_by_size(story, session, measure, record_note):
    record_note("job", kind=session.job_kind(),
                libraries={lib: session.backend.describe_library(lib) for lib in story["libraries"]})
    series = {f"{name} ({sweep.fabric}, {len(sweep.ranks)} ranks{'' if len(story['libraries']) == 1 else ', ' + lib})":
              sweep.result.busbw_by_size() for lib, sweeps in story["sweeps"].items() for name, sweep in sweeps.items()}
    table = io.StringIO()
    writer = csv.writer(table)
    sizes = sorted({size for by_size in series.values() for size in by_size})
    writer.writerow(["size_bytes", *series])
    for size in sizes:
        writer.writerow([size, *(by_size.get(size, "") for by_size in series.values())])
    allure.attach(table.getvalue(), name="busbw-by-size", attachment_type=allure.attachment_type.CSV)
    allure_glue.attach_figure("busbw-by-size",
                              lambda: busbw_figure(series, "all-reduce bus bandwidth (nccl-tests' output)"))
    for lib, sweeps in story["sweeps"].items():
        tag, made_by = _tag(story, lib), session.backend.describe_library(lib)
        for name, sweep in sweeps.items():
            allure.attach(sweep.output, name=f"{lib} {name}", attachment_type=allure.attachment_type.TEXT)
            measure(Spec(f"busbw_largest_{name}{tag}", "GB/s", description=f"all-reduce of {sweep.largest.size_bytes} "
                         f"B, {sweep.fabric}, {made_by}"), sweep.largest.out_of_place.busbw_best_gbps, ranks=sweep.ranks,
                    library=made_by)
            measure(Spec(f"nccl_tests_sweep_{name}{tag}", "s", description="wall time of the sweep"), sweep.wall_s,
                    library=made_by)
            # Every size in the record, so that a regression at any size reaches the summary.
            for size, busbw in sorted(sweep.result.busbw_by_size().items()):
                measure(Spec(f"busbw_{name}{tag}_{size}B", "GB/s", better="higher", description=f"all-reduce busbw "
                             f"at {size} B, {sweep.fabric} (out of place), {made_by}"), busbw, size_bytes=size,
                        ranks=sweep.ranks, library=made_by)


@allure.title("the optical swap gives the bandwidth back")
def test_busbw_after_recovery_matches_before(story, bench_file, measure):
    for lib, sweeps in story["sweeps"].items():
        before, after = sweeps["before"].largest.out_of_place.busbw_best_gbps, sweeps["after"].largest.out_of_place.busbw_best_gbps
        measure(Spec(f"busbw_after_over_before{_tag(story, lib)}", "ratio", description="largest all-reduce, after "
                     "the swap / before").at_least(0.9, "LUMION: the spare is switched in at full bandwidth (lab "
                                                  "requirement: within 10%)").with_marginal(
            bench_file.limits.marginal_fraction), after / before)


def _shaping(session, bench_file) -> str:
    """What the ratio follows from on a bench whose rates are shaped (the namespaced one); nothing
    on a bench that models its links (its basis, `model`, already says so)."""
    scale = getattr(getattr(bench_file, "netns", None), "rate_scale", None)
    if session.backend.kind != "netns" or scale is None:
        return ""
    rack = bench_file.electrical
    return (f"the shaping: optical NICs at the bench file's rates x {scale:g}, electrical NICs at "
            f"{rack.nic_gbps.value * scale * 1000:g} Mb/s, each rack's uplink its servers' over "
            f"{rack.oversubscription.value:g}:1")


@allure.title("all-reduce bus bandwidth, optical over electrical, after the swap")
def test_busbw_ratio_optical_over_electrical(story, session, bench_file, measure):
    if bench_file.electrical is None:
        pytest.skip("the bench file describes no electrical rack to compare with")
    follows = _shaping(session, bench_file)
    for lib, sweeps in story["sweeps"].items():
        tag, made_by = _tag(story, lib), session.backend.describe_library(lib)
        optical, electrical = sweeps["after"].largest, sweeps["electrical"].largest
        assert optical.size_bytes == electrical.size_bytes
        ratio = optical.out_of_place.busbw_best_gbps / electrical.out_of_place.busbw_best_gbps
        rings = session.backend.collective_rings(lib)
        no_model = (f"{made_by}: its algorithm is not a ring the cost model describes" if rings == 0 else
                    session.backend.not_comparable(f"{lib}:model"))
        predicted = predictions.busbw_ratio(bench_file, optical.size_bytes, rings or None)
        if predicted is None:
            pytest.fail("no bus bandwidth ratio predicted: the bench file needs a job of two ranks or more and an "
                        "electrical rack")
        measure(about(f"allreduce_busbw_optical_over_electrical{tag}", "morphlux.allreduce_busbw_ratio",
                      bench_file.published, bench_file.limits.about_tolerance.value,
                      bench_file.limits.marginal_fraction).not_comparable_because(session.backend.not_comparable(lib)),
                ratio, size_bytes=optical.size_bytes, predicted=predicted.value, prediction=predicted.why,
                library=made_by, follows_from=follows)
        measure(limits.against_prediction(f"allreduce_busbw_ratio_over_bench_prediction{tag}", bench_file)
                .not_comparable_because(no_model), ratio / predicted.value, observed=ratio, predicted=predicted.value,
                prediction=predicted.why, library=made_by, follows_from=follows)
        if "electrical_uplinks_halved" in sweeps:  # the ratio moves with the uplinks, as the shaping says
            halved = sweeps["electrical_uplinks_halved"].largest
            halved_ratio = optical.out_of_place.busbw_best_gbps / halved.out_of_place.busbw_best_gbps
            rack = bench_file.electrical
            oversubscribed = bench_file.model_copy(update={"electrical": rack.model_copy(update={
                "oversubscription": rack.oversubscription.model_copy(update={"value": 2 * rack.oversubscription.value})})})
            expected = predictions.busbw_ratio(oversubscribed, optical.size_bytes, rings or None)
            if expected is None:
                pytest.fail("no bus bandwidth ratio predicted with the uplinks halved")
            move = expected.value / predicted.value
            # Recorded beside its prediction; judged: that it moves the way the shaping says, by at
            # least half as much (TCP fills a slower shared uplink less well: gloo's electrical
            # busbw with the uplinks halved was 0.83 of the model's here, its ratio 2.45 for 1.99)
            measure(Spec(f"allreduce_busbw_ratio_uplinks_halved{tag}", "ratio", description="optical over electrical "
                         "with the racks' uplinks halved"), halved_ratio, predicted=None if rings == 0 else expected.value,
                    prediction=f"uplinks halved: {expected.why}", library=made_by,
                    follows_from=follows and follows + ", the uplinks halved")
            measure(Spec(f"allreduce_busbw_ratio_moved_by_halved_uplinks{tag}", "ratio", description="optical over "
                         "electrical with the uplinks halved / with them as the bench file gives them").at_least(
                1 + (move - 1) / 2, f"the shaping: halving the uplinks moves the ratio {move:.2f}x (bench file's "
                "prediction), at least half of that").with_marginal(bench_file.limits.marginal_fraction)
                    .not_comparable_because(no_model if rings == 0 else None), halved_ratio / ratio,
                    predicted_move=move, library=made_by, follows_from=follows)


@allure.title("no wrong results in any all-reduce")
def test_no_wrong_results(story, measure):
    for lib, sweeps in story["sweeps"].items():
        for name, sweep in sweeps.items():
            wrong = sweep.result.total_wrong
            if wrong is None:
                pytest.skip(f"nccl-tests ran without checking (-c 0): #wrong is N/A ({name})")
            measure(Spec(f"nccl_wrong_elements_{name}{_tag(story, lib)}", "elements", category="wrong results",
                         description="nccl-tests #wrong over the sweep")
                    .at_most(0, "nccl-tests: any wrong element is a failure").with_marginal(0.0), wrong)


@allure.title("fault to the first collective completed again")
def test_time_until_a_collective_completes_again(story, session, bench_file, measure):
    event = story["collective"].event
    assert event is not None, f"no collective completed on {story['ranks_after']}: {story['collective'].last_lines}"
    measure(upper_limit("nccl_resync", "morphlux.nccl_resync_s", bench_file.published,
                        bench_file.limits.marginal_fraction, bench_file.time_scale,
                        bench_file.limits.controller_overhead_s.value)
            .not_comparable_because(session.backend.not_comparable("job")),
            (event["t_ns"] - story["fault_ns"]) / 1e9, fault=story["fault"].describe(),
            uncertainty_s=event["uncertainty_ns"] / 1e9, job=session.job_kind())
    init = story["init"].event
    if init is not None:
        measure(Spec("nccl_communicator_ready", "s", description="fault to NCCL's Init COMPLETE on the new ranks"),
                (init["t_ns"] - story["fault_ns"]) / 1e9)
