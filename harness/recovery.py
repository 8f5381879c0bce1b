"""What the recovery suite needs beside the controller: a light probe (the light at the ports a
recovery lights, sampled for the plot), the comparison with the emulated world's ground truth
(the controller's overhead per phase), and the migration baseline (recovery without a fabric)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from lumion_hil.harness.recovery_model import PHASES, RecoveryResult
from lumion_hil.instruments.backend import FaultKind


class LightProbe:
    """Samples the power at some detectors in the background while a recovery runs, through
    instrument sessions of its own: it never queues behind the controller's commands (on a paced
    real switch that would delay what is being timed). An instrument that will not open a
    second session is left out, and said so in ``skipped``."""

    def __init__(self, session, detectors, interval_s: float = 0.002):
        from lumion_hil.harness.binding import open_driver

        self.session, self.interval_s = session, interval_s
        self.drivers: dict[str, object] = {}
        self.skipped: dict[str, str] = {}
        for det in detectors:
            if det.instrument in self.drivers or det.instrument in self.skipped:
                continue
            spec = session.bench.instruments[det.instrument]
            try:
                self.drivers[det.instrument] = open_driver(f"{det.instrument}-probe", spec,
                                                           session.resources[det.instrument])
            except Exception as exc:  # the probe never stops a recovery
                self.skipped[det.instrument] = f"cannot open a second session: {exc}"
        self.detectors = [d for d in detectors if d.instrument in self.drivers]
        self.samples: dict[str, list[tuple[int, float | None]]] = {d.name: [] for d in self.detectors}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="light-probe")

    def __enter__(self) -> "LightProbe":
        if self.detectors:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for driver in self.drivers.values():
            try:
                driver.close()
            except Exception:
                pass

    def _read(self, det) -> float | None:
        driver = self.drivers[det.instrument]
        if det.channel is None:  # a switch's own monitor
            value = driver.port_power_dbm([det.port])[det.port]
        else:
            value = driver.read_dbm(det.channel)
        return value + det.tap_loss_db if isinstance(value, float) else None

    def _run(self) -> None:
        while not self._stop.is_set():
            for det in self.detectors:
                try:
                    value = self._read(det)
                except Exception:  # the probe never disturbs a recovery
                    value = None
                self.samples[det.name].append((time.perf_counter_ns(), value))
            self._stop.wait(self.interval_s)


@dataclass
class RecoveryTruth:
    fault_ns: int
    first_step_ns: int | None
    physical_s: dict[str, float] = field(default_factory=dict)  # per phase: time spent waiting on physics
    between_phases_s: float = 0.0  # critical-path time outside every phase (all of it overhead)

    @property
    def total_s(self) -> float | None:
        return None if self.first_step_ns is None else (self.first_step_ns - self.fault_ns) / 1e9


def ground_truth(world, fault_ns: int, result: RecoveryResult) -> RecoveryTruth:
    """The emulated world's record of the same recovery: when the fault truly happened, when the
    first step truly completed, and how much of each phase was physics (beams settling, links
    locking, the job starting and stepping) rather than the controller."""
    lead = result.plan.ranks_after[0] if result.plan else None

    def first_steps():
        return [e for e in world.events_of("job.step", lead) if e.t_ns > (result.restarted_ns or fault_ns)
                and e.detail.get("step") == 1]

    # The emulated job tells the world of a step just after it prints it (so the world's
    # bookkeeping never delays what the host sees): a step the harness saw may reach the world
    # a moment later. Wait for it, woken by each world event, at most a second.
    steps, until = first_steps(), time.monotonic() + 1.0
    while not steps and result.first_step_ns is not None and time.monotonic() < until:
        world.wait_for_change(until - time.monotonic())
        steps = first_steps()
    truth = RecoveryTruth(fault_ns, steps[0].t_ns if steps else None)
    lit = [e.t_ns for e in world.events_of("circuit.lit") if e.t_ns > fault_ns]
    ups = []
    if result.plan:
        for _, egress in result.plan.add:
            owner = world.bench.nic_on_rx_port(egress)
            if owner:
                state, since = world.link_state(owner[0].name, owner[1].name)
                if state == "up":
                    ups.append(since)
    physics_end = {"switch": max(lit) if lit else None, "link": max(ups) if ups else None,
                   "first_step": truth.first_step_ns}
    for phase in PHASES:
        if phase not in result.phases:
            continue
        start, end = result.phases[phase]
        until = physics_end.get(phase)
        truth.physical_s[phase] = 0.0 if until is None else max(0.0, min(until, end) - start) / 1e9
    truth.between_phases_s = between_phases_s(result)
    return truth


def between_phases_s(result: RecoveryResult) -> float:
    """Time on the path from the first phase's start to the last one's end that no phase covers."""
    spans = sorted(result.phases.values())
    if not spans:
        return 0.0
    gap, reach = 0, spans[0][1]
    for start, end in spans[1:]:
        gap += max(0, start - reach)
        reach = max(reach, end)
    return gap / 1e9


def migrate_to_reserved_rack(session, ranks: list[str]) -> dict:
    """Recovery without an optical fabric, on the emulated world: stop the job, claim an idle
    reserved rack, copy the checkpoint to it, and restart there on its electrical network.
    Returns the instants (harness clock) and the job's step time there."""
    from lumion_hil.instruments.gpu_host.jobs import JobControl

    world = session.world
    reserved = [f"reserved-{i}" for i in range(len(ranks))]
    argv = session.backend.job_argv(session.bench.job, reserved) if world is not None else None
    if argv is not None:
        argv.append("--all-ranks-here")  # one process for the reserved rack, which has no agents
    if argv is None:
        raise ValueError("the migration baseline runs on an emulated bench (a reserved rack is not on a real one)")
    settings = session.bench.recovery.migration
    session.stop_job()
    restored_ns = world.transfer_checkpoint(settings.checkpoint_bytes, settings.network_gbps, settings.scheduling_s)
    control = JobControl("/tmp/lumion-hil-migration", clock_ns=time.perf_counter_ns)
    # The reserved rack has no optical fabric: its servers talk over the electrical network.
    control.start(argv, {"rank": 0}, session.fabric_env(ranks[0], "electrical"))
    try:
        status = control.wait_step(2, session.bench.waits.recovery_s)
        if not status["reached"]:
            raise RuntimeError(f"the job did not step on the reserved rack: {status['last_lines']}")
        steps = control.steps()
        return {"restored_ns": restored_ns, "first_step_ns": steps[0][1], "steps": steps}
    finally:
        control.stop(timeout_s=5)


# The hard faults that need a spare swapped in, in the order a suite tries them.
SWAP_FAULTS = (FaultKind.GPU_FAILURE.value, FaultKind.FIBRE_CUT.value, FaultKind.SWITCH_PORT_FAILURE.value)


def recover_from(controller, make_fault: Callable[[], int], undo: Callable[[], None] | None = None, *,
                 keep_fault: bool = False) -> tuple[int, RecoveryResult]:
    """The one path of every recovery the harness drives: arm the controller, make the fault,
    let it recover, disarm; then ``undo`` (repair the fault) unless ``keep_fault`` (the caller
    measures the bench with the fault in place and repairs it itself). Whatever goes wrong,
    the controller is disarmed and the fault undone. Returns (fault instant, result)."""
    controller.arm()
    try:
        fault_ns = make_fault()
        result = controller.recover(fault_ns)
    except BaseException:
        controller.disarm()
        if undo is not None:
            undo()
        raise
    controller.disarm()
    if undo is not None and not keep_fault:
        undo()
    return fault_ns, result


def recover_once(session, ranks: list[str], kinds: tuple[str, ...] = SWAP_FAULTS):
    """Make the first fault of ``kinds`` this bench can make (each needs a spare swapped in),
    and let the controller under test recover from it. Returns (injector, fault, fault_ns,
    result); the caller repairs the fault (``injector.repair(fault)``) when done with it."""
    from lumion_hil.harness.controller import load_controller
    from lumion_hil.harness.faults import Injector

    injector = Injector(session, seed=session.bench.recovery.fault_seed)
    kind = next((k for k in kinds if injector.supported(k)[0]), None)
    if kind is None:
        raise ValueError(f"bench {session.bench.name!r} can make none of the faults {', '.join(kinds)}")
    controller = load_controller(session, ranks)
    fault = injector.choose(kind, ranks)
    fault_ns, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault),
                                    keep_fault=True)
    return injector, fault, fault_ns, result
