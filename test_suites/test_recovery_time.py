"""Recovery time: for each fault the bench can make, inject it into the running job, let the
controller under test recover, and measure the total and every phase on one clock, judged
against the published figures. On the emulated bench the world's ground truth also gives the
measurement's own error and the controller's overhead per phase. Then the baseline without an
optical fabric: migrating the job to a reserved rack."""

from __future__ import annotations

import allure
import pytest

from fixtures import allure_glue
from harness.controller import PHASES, load_controller
from harness.faults import CATALOGUE, Injector
from harness.measurements import Spec
from harness.published import upper_limit
from harness.recovery import LightProbe, ground_truth, migrate_to_reserved_rack
from reports.plots import close, recovery_figure

pytestmark = allure.feature("recovery")


@pytest.fixture
def running_job(bench, bench_file, gpu_hosts):
    """The bench's job running healthy on its ranks, from the baseline; put back afterwards."""
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    ranks = list(bench_file.job.ranks)
    bench.stop_job()
    bench.restore_baseline()
    bench.start_job(ranks)
    status = gpu_hosts[ranks[0]].wait_step(1, bench_file.deadlines.recovery_s)
    assert status["reached"], f"the job did not start healthy on {ranks}: {status.get('last_lines')}"
    yield ranks
    bench.stop_job()
    bench.restore_baseline()


def _spare_detectors(bench_file):
    spares = [h for h in bench_file.topology.hosts if any(g.role == "spare" for g in h.gpus)]
    return [d for h in spares for n in h.nics for d in bench_file.detectors_for_port(n.rx_port)[:1]]


def _recover(bench, bench_file, ranks, fault_kind):
    injector = Injector(bench, seed=bench_file.recovery.fault_seed)
    supported, why = injector.supported(fault_kind)
    if not supported:
        pytest.skip(f"{fault_kind}: {why}")
    controller = load_controller(bench, ranks)
    fault = injector.choose(fault_kind, ranks)
    controller.arm()
    with LightProbe(bench, _spare_detectors(bench_file)) as probe:
        try:
            fault_ns = injector.inject(fault)
            result = controller.recover(fault_ns)
        finally:
            controller.disarm()
            injector.repair(fault)
    return fault, fault_ns, result, probe


def _attach(bench_file, fault, fault_ns, result, probe):
    fig = recovery_figure(result.phases, fault_ns, probe.samples, title=f"{fault.describe()}: {result.status}",
                          sensitivity_dbm=bench_file.limits.receiver_sensitivity_dbm.value)
    allure_glue.attach_figure("recovery-timeline", fig)
    close(fig)
    allure_glue.attach_json("recovery", {"fault": fault.describe(), "status": result.status, "reason": result.reason,
                                         "plan": vars(result.plan) if result.plan else None,
                                         "phases_s": {p: result.phase_s(p) for p in result.phases}})


@allure.title("recovery from {fault_kind}")
@pytest.mark.parametrize("fault_kind", list(CATALOGUE))
def test_recovery_time(bench, bench_file, running_job, fault_kind, measure, timeline):
    fault, fault_ns, result, probe = _recover(bench, bench_file, running_job, fault_kind)
    _attach(bench_file, fault, fault_ns, result, probe)
    allure.dynamic.description(f"{fault.describe()}: {result.status}. {result.reason}")
    assert result.status == "recovered", f"{fault.describe()}: {result.status}: {result.reason}"

    overrides = bench_file.published
    fraction = bench_file.limits.marginal_fraction
    restart_s = (result.restarted_ns - fault_ns) / 1e9
    total_s = (result.first_step_ns - fault_ns) / 1e9
    measure(upper_limit("recovery_to_restart", "morphlux.rewire_and_restart_s", overrides, fraction), restart_s,
            fault=fault.describe())
    measure(upper_limit("recovery_to_first_step", "morphlux.first_step_s", overrides, fraction), total_s,
            fault=fault.describe(), uncertainty_s=result.first_step_uncertainty_ns / 1e9)
    for phase in PHASES:
        if phase in result.phases:
            measure(Spec(f"phase_{phase}", "s", description=f"recovery phase {phase}"), result.phase_s(phase))

    if bench.world is not None:  # the emulated world knows what truly happened
        truth = ground_truth(bench.world, fault_ns, result)
        measure(Spec("recovery_measurement_error", "s", description="measured total - the world's fault-to-first-step")
                .in_range(-0.002, 0.002, "harness requirement: within 2 ms of ground truth"), total_s - truth.total_s)
        for phase, physical in truth.physical_s.items():
            measure(Spec(f"controller_overhead_{phase}", "s", description=f"{phase}: measured - physical latency"),
                    result.phase_s(phase) - physical)
        measure(Spec("controller_overhead_between_phases", "s", description="critical-path time outside every phase"),
                truth.between_phases_s)


@allure.title("baseline without an optical fabric: migrate to a reserved rack")
def test_migration_baseline_against_optical_recovery(bench, bench_file, running_job, gpu_hosts, measure):
    if bench.world is None:
        pytest.skip("the migration baseline needs the emulated world (a reserved rack is not on this bench)")
    fault, fault_ns, optical, _ = _recover(bench, bench_file, running_job, "gpu_failure")
    assert optical.status == "recovered", optical.reason
    optical_s = (optical.first_step_ns - fault_ns) / 1e9

    bench.stop_job()
    bench.restore_baseline()
    bench.start_job(running_job)
    assert gpu_hosts[running_job[0]].wait_step(1, bench_file.deadlines.recovery_s)["reached"]
    injector = Injector(bench, seed=bench_file.recovery.fault_seed)
    controller = load_controller(bench, running_job)
    controller.arm()
    fault = injector.choose("gpu_failure", running_job)
    try:
        fault_ns = injector.inject(fault)
        assert controller.wait_detection(bench_file.deadlines.recovery_s) is not None
    finally:
        controller.disarm()
    migrated = migrate_to_reserved_rack(bench, running_job)
    injector.repair(fault)
    migration_s = (migrated["first_step_ns"] - fault_ns) / 1e9
    measure(Spec("migration_to_first_step", "s", description="fault to first step after migrating the job"), migration_s)
    measure(Spec("optical_to_first_step", "s", description="fault to first step with the optical swap"), optical_s)
    measure(Spec("migration_over_optical_recovery", "ratio").at_least(1.0, "LUMION: the fabric avoids migration"),
            migration_s / optical_s)
