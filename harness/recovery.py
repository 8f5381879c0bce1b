"""What the recovery suite needs beside the controller: the one path of every recovery the
harness drives (:func:`recover_from`, :func:`recover_once`), a light probe (the light at the
ports a recovery lights, sampled for the plot), and the migration baseline (recovery without a
fabric). The restart as the agents report it is in harness/job_restart.py, the controller's
overhead against the ground truth in harness/overhead.py; their names are importable from here
too, where the suites have always imported them."""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any, Callable

from lumion_hil.harness.collector import no_collection
from lumion_hil.harness.job_restart import (
    JOB_EXTRAS, JOB_PHASES, JobPhase, NotRestarted, Restart, checkpoint_saved_before, job_last_words, job_phases,
    observe_restart, rank_map,
)
from lumion_hil.harness.overhead import (
    LinkWatch, Overhead, RecoveryTruth, between_phases_s, controller_overhead, floor_from_before, ground_truth,
    stamp_error, switch_commands,
)
from lumion_hil.harness.recovery_model import RecoveryResult
from lumion_hil.instruments.backend import FaultKind

__all__ = ["JOB_EXTRAS", "JOB_PHASES", "SWAP_FAULTS", "JobPhase", "LightProbe", "LinkWatch", "NotRestarted",
           "Overhead", "RecoveryTruth", "Restart", "between_phases_s", "checkpoint_saved_before",
           "controller_overhead", "floor_from_before", "ground_truth", "job_last_words", "job_phases",
           "migrate_to_reserved_rack", "observe_restart", "rank_map", "recover_from", "recover_once", "stamp_error",
           "switch_commands"]


class LightProbe:
    """Samples the power at some detectors in the background while a recovery runs, through
    instrument sessions of its own: it never queues behind the controller's commands (on a paced
    real switch that would delay what is being timed). An instrument that will not open a
    second session is left out, and said so in ``skipped``."""

    def __init__(self, session, detectors, interval_s: float = 0.002):
        from lumion_hil.harness.binding import open_driver

        self.session, self.interval_s = session, interval_s
        self.drivers: dict[str, Any] = {}  # switches and meters, as open_driver opens them
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


def migrate_to_reserved_rack(session, ranks: list[str]) -> dict:
    """Recovery without an optical fabric, on the emulated world: stop the job, claim an idle
    reserved rack, copy the checkpoint to it, and restart there on its electrical network.
    Returns the instants (harness clock) and the job's step time there."""
    from lumion_hil.instruments.gpu_host.jobs import JobControl

    world = session.world
    reserved = [f"reserved-{i}" for i in range(len(ranks))]
    argv = session.backend.reserved_rack_job_argv(session.bench.job, reserved) if world is not None else None
    if argv is None:
        raise ValueError("the migration baseline runs on an emulated bench (a reserved rack is not on a real one)")
    settings = session.bench.recovery.migration
    session.stop_job()
    restored_ns = world.transfer_checkpoint(settings.checkpoint_bytes, settings.network_gbps, settings.scheduling_s)
    with tempfile.TemporaryDirectory(prefix="lumion-hil-migration-") as logs:  # this run's alone, then gone
        control = JobControl(logs, clock_ns=time.perf_counter_ns)
        # The reserved rack has no optical fabric: its servers talk over the electrical network.
        control.start(argv, {"rank": 0}, session.fabric_env(ranks[0], "electrical"))
        try:
            status = control.wait_step(2, session.bench.waits.recovery_s)
            if not status["reached"]:  # the job runner's own reply (jobs.py), not an agent's
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
        with no_collection():  # a collection of the harness's heap is no controller's time (harness/collector.py)
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
