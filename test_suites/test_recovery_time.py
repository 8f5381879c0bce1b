"""Recovery time: for each fault the bench can make, inject it into the running job, let the
controller under test recover, and measure the total and every phase on one clock, judged
against the published figures. On the emulated bench the world's ground truth also gives the
measurement's own error and the controller's overhead per phase. Then the baseline without an
optical fabric: migrating the job to a reserved rack."""

from __future__ import annotations

from dataclasses import dataclass, replace

import allure
import pytest

from lumion_hil.reports import allure_glue
from lumion_hil.harness.controller import PHASES, load_controller
from lumion_hil.harness import limits
from lumion_hil.harness.faults import CATALOGUE, Fault, Injector
from lumion_hil.harness.measurements import Spec
from lumion_hil.harness.published import about_at_most, upper_limit
from lumion_hil.harness.recovery import (LightProbe, LinkWatch, NotRestarted, checkpoint_saved_before,
                                        controller_overhead, floor_from_before, ground_truth, job_last_words,
                                        job_phases, migrate_to_reserved_rack, observe_restart, recover_from,
                                        stamp_error, switch_commands)
from lumion_hil.reports.plots import recovery_figure

pytestmark = allure.feature("recovery")


@pytest.fixture
def running_job(session, bench_file, gpu_hosts, record_note):
    """The bench's job running healthy on its ranks, from the baseline (and, for a job that
    checkpoints, past its first checkpoint); put back afterwards."""
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    ranks = list(bench_file.job.ranks)
    record_note("job", kind=session.job_kind())
    started = session.fresh_job(ranks)
    # On an emulated world, two steps: the job's step interval before a fault is then known, and
    # the bare reader that recovery_measurement_error is judged against (harness/overhead.py)
    # runs at it while the restarted job's steps are stamped, not after them.
    status = gpu_hosts[ranks[0]].wait_step(2 if session.world is not None else 1, bench_file.waits.recovery_s)
    assert status.reached, f"the job did not start healthy on {ranks}: {status.last_lines}"
    events = gpu_hosts[ranks[0]].job_events()
    ready = next((e for e in events if e["event"] in ("nccl_init", "communicator_ready")), None)
    if ready is not None and started:  # the job's own start-up, as its rank 0 said it (fidelity reads it too)
        record_note("job start-up", seconds=(ready["t_ns"] - max(s.started_ns for s in started.values())) / 1e9,
                    ready=ready["event"], measured="the last rank's launch to rank 0's communicator-ready line")
    if any(e["event"] == "checkpoint_loaded" for e in events):  # a job that checkpoints: let it save one first
        saved = gpu_hosts[ranks[0]].wait_job_event("checkpoint_saved", bench_file.waits.recovery_s)
        assert saved.event, f"the job on {ranks} saved no checkpoint: {saved.last_lines}"
    yield ranks
    session.put_back()


def _spare_detectors(bench_file):
    spares = [h for h in bench_file.topology.hosts if any(g.role == "spare" for g in h.gpus)]
    return [d for h in spares for n in h.nics for d in bench_file.detectors_for_port(n.rx_port)[:1]]


def _recover(session, bench_file, ranks, fault_kind):
    """Make the fault and let the controller recover, watching from outside: the light at the
    spares' detectors, the switch as read before the fault, and (on a bench without an emulated
    world to keep the record) the NICs' carrier as their agents see it."""
    injector = Injector(session, seed=bench_file.recovery.fault_seed)
    supported, why = injector.supported(fault_kind)
    if not supported:
        pytest.skip(f"{fault_kind}: {why}")
    controller = load_controller(session, ranks)
    fault = injector.choose(fault_kind, ranks)
    before = session.switch.connections()
    nics = [] if session.world is not None else [(h.name, n.interface or n.name) for h in bench_file.topology.hosts
                                                 for n in h.nics]
    with LightProbe(session, _spare_detectors(bench_file)) as probe, LinkWatch(session, nics) as links:
        fault_ns, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault))
    return Recovery(fault, fault_ns, result, probe, before, links)


@dataclass
class Recovery:
    """One recovery as the harness watched it."""

    fault: Fault
    fault_ns: int
    result: object  # the controller's RecoveryResult: its own account, judged as a claim
    probe: LightProbe
    before: dict[int, int]  # the switch's connections, read just before the fault
    links: LinkWatch


def _attach(bench_file, fault, fault_ns, result, probe):
    allure_glue.attach_figure("recovery-timeline", lambda: recovery_figure(
        result.phases, fault_ns, probe.samples, title=f"{fault.describe()}: {result.status}",
        sensitivity_dbm=bench_file.limits.receiver_sensitivity_dbm.value))
    allure_glue.attach_json("recovery", {"fault": fault.describe(), "status": result.status, "reason": result.reason,
                                         "plan": vars(result.plan) if result.plan else None,
                                         "phases_s": {p: result.phase_s(p) for p in result.phases}})


def verify_from_outside(session, bench_file, recovery, restart, measure) -> dict[int, int]:
    """What the controller did to the switch, as the harness saw it: no circuit still touches
    the host the harness failed (when the job no longer runs there), read back from the switch;
    and no protected port switched at any moment of the recovery (the commands the harness saw
    through the bench's switch, the emulated world's record of every beam moved, and what the
    switch carries now). Returns the connections read back."""
    fault = recovery.fault
    connections = sorted(session.switch.connections().items())
    if fault.host not in restart.ranks:
        ports = {p for nic in bench_file.host(fault.host).nics for p in (nic.tx_port, nic.rx_port)}
        left = [pair for pair in connections if set(pair) & ports]
        measure(Spec("failed_host_circuits_removed", "ok", category="controller error", description="1: no circuit touches the replaced host")
                .at_least(1, "the controller's promise: the failed GPU is taken out of the fabric").with_marginal(0.0),
                0.0 if left else 1.0, host=fault.host, circuits_left=left)
    protected = set(bench_file.safety.protected_ports)
    now_on = [pair for pair in connections if set(pair) & protected and pair not in set(bench_file.safety.baseline)]
    commanded = [(method, pairs) for method, _, _, pairs in switch_commands(session, recovery.fault_ns, session.timeline.clock())
                 if any(set(pair) & protected for pair in pairs)]
    world = session.world
    violations = [] if world is None else [e.detail.get("ports") for e in world.violations if e.t_ns >= recovery.fault_ns]
    measure(Spec("protected_ports_untouched", "ok", category="controller error", description="1: no protected port switched "
                 "during the recovery, nor carrying a new circuit after it").at_least(
        1, "safety rule: protected ports are never switched").with_marginal(0.0),
        0.0 if (now_on or commanded or violations) else 1.0, circuits=now_on, commands=commanded,
        world_violations=violations)
    return dict(connections)


def judge_the_report(fault, restart, result, measure):
    """The controller's own account, beside what the harness measured: its first step, the host
    it says failed, the rank map it says it started, and whether it reported its phases."""
    report = Spec("controller_report_error", "s", category="controller error", description="the controller's first step minus the one its hosts "
                  "saw").in_range(-0.005, 0.005, "harness requirement: a controller reports what happened, within 5 ms")
    measure(report, (result.first_step_ns - restart.first_step_ns) / 1e9 if result.first_step_ns else None)
    true_to = Spec("controller_report_matches", "ok", category="controller error").at_least(
        1, "harness requirement: a controller reports what it did").with_marginal(0.0)
    if fault.host not in restart.ranks:
        named = result.plan.failed_host if result.plan else None
        measure(replace(true_to, name="controller_report_failed_host", description="1: the host it names as failed "
                        "is the one the harness failed"), 1.0 if named == fault.host else 0.0, named=named,
                injected=fault.host)
    claimed = list(result.plan.ranks_after) if result.plan else None
    measure(replace(true_to, name="controller_report_rank_map", description="1: the rank map it reports is the one "
                    "the agents run"), 1.0 if claimed == restart.ranks else 0.0, claimed=claimed, agents=restart.ranks)
    measure(replace(true_to, name="controller_report_phases", description="1: it reports the phases of its recovery"),
            1.0 if result.phases else 0.0, phases=sorted(result.phases))


def judge_the_job_phases(session, fault_ns, restart, saved, measure):
    """The restarted job's start as it printed it (harness/recovery.py job_phases): each phase
    from the fault to its last rank; for a job that checkpoints (``saved``: the newest step it
    said it saved before the fault), that they came in the order a start goes, and that the
    checkpoint it loaded is no older."""
    phases = job_phases(session, restart)
    for phase in phases:
        measure(Spec(f"job_{phase.name}", "s", description=f"fault to the job's {phase.name.replace('_', ' ')} on its "
                     "last rank, as the job printed it and its agent saw it"), (phase.t_ns - fault_ns) / 1e9,
                by_rank_s={h: (t - fault_ns) / 1e9 for h, t in phase.by_rank_ns.items()}, **phase.detail,
                job=session.job_kind())
    ordered = [p for p in phases if p.ordered]
    instants = [p.t_ns for p in ordered]
    if saved is None:
        return  # a job that says nothing of checkpoints (the emulated ones): its phases are recorded
    measure(Spec("job_phases_in_order", "ok", category="job", description="1: processes started, rendezvous, "
                 "communicator ready, checkpoint loaded and first step came in that order").at_least(
        1, "the job interface: a start goes through its phases in order").with_marginal(0.0),
        1.0 if instants == sorted(instants) else 0.0, phases=[p.name for p in ordered])
    loaded = next((p.detail.get("step") for p in phases if p.name == "checkpoint_loaded"), None)
    measure(Spec("checkpoint_step_loaded", "step", category="job", description="the step of the checkpoint the "
                 "restarted job loaded").at_least(saved, "the job resumes from the newest checkpoint saved before "
                                                  "the fault").with_marginal(0.0), loaded, saved_before=saved)


@allure.title("recovery from {fault_kind}")
@pytest.mark.parametrize("fault_kind", list(CATALOGUE))
def test_recovery_time(session, bench_file, running_job, fault_kind, measure, timeline, record_note):
    saved = checkpoint_saved_before(session, running_job[0])
    recovery = _recover(session, bench_file, running_job, fault_kind)
    fault, fault_ns, result = recovery.fault, recovery.fault_ns, recovery.result
    # this machine's bare reader, measured while the job restarts (stamp_error, below)
    interval = floor_from_before(session.world, running_job, fault_ns) if session.world is not None else None
    _attach(bench_file, fault, fault_ns, result, recovery.probe)
    allure.dynamic.description(f"{fault.describe()}: {result.status}. {result.reason}")
    if result.status != "recovered":
        allure_glue.label_cause("controller error")
        # The job's own words on every rank of the new map, once the framework has given up
        # (its timeouts: the job's NCCL timeout, scaled, and a little more).
        hosts = list(result.plan.ranks_after) if result.plan else running_job
        words = job_last_words(session, hosts, bench_file.job.nccl_timeout_s * bench_file.time_scale + 10.0)
        record_note("job's last words", fault=fault.describe(), status=result.status, words=words)
        said = "; ".join(f"{h}: {' | '.join(w[-2:])}" for h, w in words.items())
        raise AssertionError(f"{fault.describe()}: {result.status}: {result.reason}. The job said: {said}")

    try:
        restart = observe_restart(session, fault_ns)
    except NotRestarted as exc:
        allure_glue.label_cause("controller error")
        raise AssertionError(f"{fault.describe()}: the controller said recovered, but {exc}") from None
    after = verify_from_outside(session, bench_file, recovery, restart, measure)
    judge_the_report(fault, restart, result, measure)
    overrides, fraction, scale = bench_file.published, bench_file.limits.marginal_fraction, bench_file.time_scale
    software = bench_file.limits.controller_overhead_s.value  # added unscaled to a scaled limit
    restart_s = (restart.restarted_ns - fault_ns) / 1e9
    total_s = (restart.first_step_ns - fault_ns) / 1e9
    uncertainty_ns = session.hosts[restart.lead].clock.uncertainty_ns
    # Morphlux's "optical path reprogrammed and job restarted" is the relaunch: every rank's
    # process started. LUMION's "restarts the ML job" is the job running again: every rank's
    # communicator ready and its first collective done.
    measure(upper_limit("recovery_to_restart", "morphlux.rewire_and_restart_s", overrides, fraction, scale, software),
            restart_s, fault=fault.describe(), until="every rank's process started")
    measure(about_at_most("recovery_to_restart_lumion", "lumion.swap_and_restart_s", overrides,
                          bench_file.limits.about_tolerance.value, fraction, scale, software)
            .not_comparable_because(session.backend.not_comparable("job")),
            (restart.running_ns - fault_ns) / 1e9, fault=fault.describe(), until=restart.running_from,
            processes_started_s=restart_s, job=session.job_kind())
    measure(upper_limit("recovery_to_first_step", "morphlux.first_step_s", overrides, fraction, scale, software)
            .not_comparable_because(session.backend.not_comparable("job")), total_s,
            fault=fault.describe(), uncertainty_s=uncertainty_ns / 1e9, job=session.job_kind())
    judge_the_job_phases(session, fault_ns, restart, saved, measure)
    for phase in PHASES:
        if phase in result.phases:
            measure(Spec(f"phase_{phase}", "s", description=f"recovery phase {phase}, as the controller reports it"),
                    result.phase_s(phase))
    if restart.ready_ns is not None:
        measure(Spec("recovery_to_communicator_ready", "s", description="fault to every rank's communicator ready, "
                     "from the ranks' own lines as their agents saw them"), (restart.ready_ns - fault_ns) / 1e9)

    # The controller's overhead, from outside: wall time minus the physics its final plan needed.
    overhead = controller_overhead(session, fault_ns, restart, recovery.before, after, recovery.links)
    measure(limits.controller_overhead(bench_file), overhead.overhead_s, physics_s=overhead.physics_s,
            physics=overhead.physics, physics_from=overhead.basis, not_needed_by_the_final_plan=overhead.wasted,
            final_plan_added=overhead.added, final_plan_removed=overhead.removed)
    if session.world is not None:  # the emulated world knows what truly happened
        truth = ground_truth(session.world, fault_ns, result, restart)
        # The stamps recovery_to_first_step is measured from, against the world's instants: a
        # decision over the first steps of every rank, not one sample (a busy core delays an
        # agent's read of one line by several ms now and then; a slow agent delays every line),
        # beyond the machine's own wake-up (a bare reader's lateness, measured once a run).
        # A sample with pairs missing (a rank that never printed them) decides nothing: no pass.
        error = stamp_error(session, session.world, restart, bench_file.waits.recovery_s, interval)
        decision = error.decision
        measure(Spec("recovery_measurement_error", "s", software=True, description="how late the agents stamp the "
                     "restarted job's steps (the first steps of every rank) after the world's instants, beyond how "
                     "late a bare reader on this machine reads such a line: the difference of the trimmed "
                     "means").decided_by(
            decision, "harness requirement: the stamps within 5 ms of ground truth, beyond the machine's own wake-up"),
            decision.effect if error.complete else None, decision=decision.text(1000, "ms"),
            interval_s=[decision.low, decision.high], pairs=decision.n_after, pairs_expected=error.expected,
            first_step_error_s=None if truth.total_s is None else total_s - truth.total_s)
        # The old way, recorded beside it: the controller's phases minus the physics inside each.
        reported = sum(result.phase_s(p) - physical for p, physical in truth.physical_s.items()) + truth.between_phases_s
        measure(Spec("controller_overhead_from_its_phases", "s", software=True, description="the same overhead summed over the "
                     "phases the controller reports (0 for one that reports none): recorded, never judged"), reported)


@allure.title("with no spare left, the controller says degraded")
def test_degraded_when_no_spare_is_left(session, bench_file, running_job, measure):
    injector = Injector(session, seed=bench_file.recovery.fault_seed)
    if not injector.supported("gpu_failure")[0]:
        pytest.skip("needs GPUs failed on demand (an emulated bench): " + injector.supported("gpu_failure")[1])
    spares = [h.name for h in bench_file.topology.hosts if h.name not in running_job
              and any(g.role == "spare" for g in h.gpus)]
    if not spares:
        pytest.skip("the bench has no spare to use up")
    used_up = [Fault("gpu_failure", h) for h in spares]
    for fault in used_up:
        injector.inject(fault)
    controller = load_controller(session, running_job)
    fault = injector.choose("gpu_failure", running_job)

    def repair_all() -> None:
        for f in used_up + [fault]:
            injector.repair(f)

    _, result = recover_from(controller, lambda: injector.inject(fault), repair_all)
    allure.dynamic.description(f"{fault.describe()} with spares {spares} failed: {result.status}. {result.reason}")
    measure(Spec("degraded_reported_without_spare", "ok", category="controller error", description="1: the controller says degraded").at_least(
        1, "the controller's promise: with no spare left it reports degraded and why").with_marginal(0.0),
        1.0 if result.status == "degraded" else 0.0, status=result.status, reason=result.reason)


@allure.title("baseline without an optical fabric: migrate to a reserved rack")
def test_migration_baseline_against_optical_recovery(session, bench_file, running_job, gpu_hosts, measure):
    if session.world is None:
        pytest.skip("the migration baseline needs the emulated world (a reserved rack is not on this bench)")
    if bench_file.electrical is None:
        pytest.skip("the migration baseline's reserved rack runs on the electrical network; the bench describes none")
    recovery = _recover(session, bench_file, running_job, "gpu_failure")
    fault_ns, optical = recovery.fault_ns, recovery.result
    assert optical.status == "recovered", optical.reason
    optical_s = (observe_restart(session, fault_ns).first_step_ns - fault_ns) / 1e9  # as the agents saw it

    session.fresh_job(running_job)
    assert gpu_hosts[running_job[0]].wait_step(1, bench_file.waits.recovery_s).reached
    injector = Injector(session, seed=bench_file.recovery.fault_seed)
    controller = load_controller(session, running_job)
    if not hasattr(controller, "wait_detection"):  # the reference controller's; RecoveryController has none
        pytest.fail(f"the migration baseline waits for the controller's detection: {type(controller).__name__} "
                    "has no wait_detection")
    controller.arm()
    fault = injector.choose("gpu_failure", running_job)
    try:
        fault_ns = injector.inject(fault)
        assert controller.wait_detection(bench_file.waits.recovery_s) is not None
    finally:
        controller.disarm()
    migrated = migrate_to_reserved_rack(session, running_job)
    injector.repair(fault)
    migration_s = (migrated["first_step_ns"] - fault_ns) / 1e9
    measure(Spec("migration_to_first_step", "s", description="fault to first step after migrating the job"), migration_s)
    measure(Spec("optical_to_first_step", "s", description="fault to first step with the optical swap"), optical_s)
    # The reserved rack runs the emulated job (its start-up a model): against a bench's real job
    # restarted for real (the namespaced bench's PyTorch job) the two are not alike.
    unlike = session.backend.not_comparable("job")
    measure(Spec("migration_over_optical_recovery", "ratio").at_least(1.0, "LUMION: the fabric avoids migration")
            .not_comparable_because(unlike and f"the migrated job is the emulated one (its start-up the bench file's "
                                              f"startup_time_s), the optical recovery's {session.job_kind()}"),
            migration_s / optical_s)
