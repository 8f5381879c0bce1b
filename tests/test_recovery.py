"""Recovery: the controller's promises, measured against the emulated world's ground truth."""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

from lumion_hil.harness.config import load_bench, parse_bench
from lumion_hil.harness.controller import RecoveryController, RecoveryError, RecoveryResult, load_controller
from lumion_hil.harness.decisions import Verdict
from lumion_hil.harness.faults import CATALOGUE, Fault, FaultNotPossible, Injector
from lumion_hil.harness.job_restart import observe_restart
from lumion_hil.harness.overhead import STAMPED_STEPS, stamp_decision, stamp_pairs, step_interval_s
from lumion_hil.harness.published import published
from lumion_hil.harness.recovery import ground_truth, recover_from
from lumion_hil.harness.session import BenchSession
from lumion_hil.reports.plots import recovery_figure, render
from conftest import BENCHES, ROOT, stop_served

pytestmark = pytest.mark.alone  # timing judged against ground truth (scripts/tests)

TEXT = (BENCHES / "emulated.yaml").read_text()


def _session(text: str = TEXT, time_scale: float = 0.1):
    return BenchSession.open(parse_bench(text, "test-bench.yaml", time_scale=time_scale))


def _running(session):
    ranks = list(session.bench.job.ranks)
    session.start_job(ranks)
    assert session.hosts[ranks[0]].wait_step(1, 60).reached
    return ranks


REAL_TIME_RECOVERIES = 3  # at most: another only while the stamps' decision is undecided


def test_recovery_at_real_time_agrees_with_ground_truth():
    """A GPU failure recovered at real time, judged against the world's truth.

    The agents' stamps that fault-to-first-step is measured from (every rank's first four steps
    after the restart, 12 stamps) are no more than 5 ms later after the world's instants than a
    bare reader on this machine reads such a line: the recovery suite's decision
    (recovery_measurement_error, the trimmed means of the two samples; harness/overhead.py
    reader_floor). A busy core delays an agent's read of a line by several ms now and then (4.4 ms
    seen with two busy loops on two cores): the decision weighs that line little; an idle core's
    wake-up (9 ms once after 1.6 s asleep, on a 2-core VM) is the floor's too. An agent that
    reads every line late is ``differs``, red: 8 ms late (slow_agent=0.008) is +10.2 ms beyond the
    floor, where the first step's error alone, one sample against a fixed 10 ms, passed it.
    While it is ``undecided``, the same failure is recovered again from a fresh job and its pairs
    added, at most 3 recoveries; then it is a warning that names it (the samples cannot tell, and
    a red night must mean a regression).

    On every recovery, limits on the sample itself: no stamp before the world's instant by more
    than its clock's stated uncertainty (a busy core only makes them late); at least 4
    connections of 50 ms of switching in the switch phase, and no more than 100 ms besides; no
    controller time hidden between the phases it reports (20 ms, against 1-2 ms seen)."""
    pairs: list[tuple[int, int]] = []  # (the world's instant, the agent's stamp) of each step, ns
    decision = None
    with _session(time_scale=1.0) as session:
        ranks = list(session.bench.job.ranks)
        injector = Injector(session)
        for count in range(1, REAL_TIME_RECOVERIES + 1):
            session.fresh_job(ranks)  # the first time too: the baseline is restored and read back
            assert session.hosts[ranks[0]].wait_step(1, 60).reached
            controller = load_controller(session, ranks)
            fault = Fault("gpu_failure", "host1", xid=79)
            fault_ns, result = recover_from(controller, lambda: injector.inject(fault), lambda: injector.repair(fault),
                                            keep_fault=True)
            try:
                assert result.status == "recovered", result.reason
                assert result.plan.ranks_after == ["host0", "host3", "host2"]
                restart = observe_restart(session, fault_ns)
                truth = ground_truth(session.world, fault_ns, result, restart)
                taken = stamp_pairs(session, session.world, restart.ranks, restart.restarted_ns, 10.0)
            finally:
                injector.repair(fault)
            assert len(taken) == len(restart.ranks) * STAMPED_STEPS, f"stamps missing: {taken}"
            early_allowed = max(session.hosts[h].clock.uncertainty_ns for h in restart.ranks) + 500_000
            assert min(stamp - world for world, stamp in taken) >= -early_allowed, (taken, early_allowed)
            # The physics on the critical path is at least 4 connections of 50 ms each (more on a
            # loaded machine, where the commands reach the switch later: that is the emulator's
            # time, not the harness's error, so it has no upper bound here).
            assert truth.physical_s["switch"] >= 0.2 - 1e-4
            assert 0 <= result.phase_s("switch") - truth.physical_s["switch"] < 0.1
            spans = {getattr(name, "value", name): (round((a - fault_ns) / 1e6, 1), round((b - fault_ns) / 1e6, 1))
                     for name, (a, b) in sorted(result.phases.items(), key=lambda item: item[1])}
            assert truth.between_phases_s < 0.02, f"no controller time hides between phases (ms after the fault: {spans})"
            assert session.world.events_of("safety.violation") == []
            pairs += taken
            decision = stamp_decision(pairs, len(restart.ranks), step_interval_s(taken))
            assert decision.verdict is not Verdict.DIFFERS, f"after {count} recoveries: {decision.text(1000, 'ms')}"
            if decision.verdict is Verdict.SAME:
                break
    assert decision is not None
    if decision.verdict is Verdict.UNDECIDED:
        warnings.warn(f"the real-time recovery's stamps, undecided after {REAL_TIME_RECOVERIES} recoveries: "
                      f"{decision.text(1000, 'ms')}", stacklevel=1)


def test_no_collection_of_the_harness_heap_starts_inside_a_measured_recovery():
    """A collection of the process's heap stops every thread (25-165 ms for a pytest process's
    on a 2-core machine beside a busy core): inside a measured recovery it is counted as the
    controller's time (harness/collector.py). A thread that makes cyclic garbage all through the
    recovery would set off a collection every few hundred objects; none starts between the
    fault and the first step, and they run again after it."""
    with _session() as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        starts: list[int] = []
        stop, collected = threading.Event(), threading.Event()

        def seen(phase: str, info: dict) -> None:
            if phase == "start":
                starts.append(session.timeline.clock())
                collected.set()

        def churn() -> None:
            while not stop.is_set():
                for _ in range(1000):
                    loop: list = []
                    loop.append(loop)
                time.sleep(0.001)

        gc.callbacks.append(seen)
        churner = threading.Thread(target=churn, daemon=True)
        churner.start()
        try:
            fault_ns, result = recover_from(controller, lambda: Injector(session).inject(Fault("gpu_failure", "host1")))
            collected.clear()
            collected.wait(5)  # the churn's next collection, now that the window is over
        finally:
            stop.set()
            churner.join()
            gc.callbacks.remove(seen)
        assert result.status == "recovered", result.reason
        inside = [round((t - fault_ns) / 1e6, 1) for t in starts if fault_ns <= t <= result.first_step_ns]
        assert inside == [], f"collections started {inside} ms after the fault, before the first step"
        assert [t for t in starts if t > result.first_step_ns], "the collections run again after the recovery"
        assert gc.isenabled()


def test_spares_exhausted_is_a_clear_degraded_state_not_a_hang():
    text = TEXT.replace("role: spare}", "role: active}")
    with _session(text) as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        controller.arm()
        started = time.monotonic()
        fault_ns = Injector(session).inject(Fault("gpu_failure", "host2"))
        result = controller.recover(fault_ns)
        assert result.status == "degraded" and "no spare GPU is left" in result.reason
        assert time.monotonic() - started < 10


def test_protected_port_is_refused_even_when_it_is_the_only_path():
    text = TEXT.replace("protected_ports: [16, 32]", "protected_ports: [7, 16, 32]")  # the spare's host3.p0 tx
    with _session(text) as session:
        ranks = _running(session)
        before = session.switch.connections()
        controller = load_controller(session, ranks)
        controller.arm()
        result = controller.recover(Injector(session).inject(Fault("gpu_failure", "host0")))
        assert result.status == "degraded"
        assert "host3 behind protected port(s) [7], never switched" in result.reason
        assert session.world.events_of("safety.violation") == []
        assert session.switch.connections() == before


def test_without_a_failure_recovery_ends_at_its_deadline():
    text = TEXT.replace("  recovery_s: 120", "  recovery_s: 1")
    with _session(text) as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        controller.arm()
        started = time.monotonic()
        result = controller.recover()
        assert result.status == "failed" and "no failure detected within" in result.reason
        assert "(deadlines.recovery_s 1 s" in result.reason
        assert time.monotonic() - started < 5


class _LabController(RecoveryController):
    def arm(self) -> None:
        pass

    def recover(self, fault_ns=None) -> RecoveryResult:
        return RecoveryResult("failed", "the lab's controller is a stub in this test")


def make_lab_controller(session, ranks):
    return _LabController(session, ranks)


def test_a_bench_names_its_own_controller():
    text = TEXT.replace("deadlines:", "recovery:\n  controller: test_recovery:make_lab_controller\n\ndeadlines:", 1)
    with _session(text) as session:
        controller = load_controller(session, ["host0"])
        assert isinstance(controller, _LabController)
    broken = TEXT.replace("deadlines:", "recovery:\n  controller: no_such_module:factory\n\ndeadlines:", 1)
    with _session(broken) as session:
        with pytest.raises(RecoveryError, match="recovery.controller 'no_such_module:factory': cannot load it"):
            load_controller(session, ["host0"])


def test_faults_a_real_bench_cannot_make_say_why(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMION_HIL_LOCK_DIR", str(tmp_path))
    with _session() as session:
        session.backend.world, world = None, session.backend.world  # seen as a real bench
        injector = Injector(session)
        injector.world = None
        ok, why = injector.supported("gpu_failure")
        assert not ok and "cannot be made to fail on demand" in why
        with pytest.raises(FaultNotPossible, match="transceiver_degradation at host0.p0 .* variable optical attenuator"):
            injector.inject(Fault("transceiver_degradation", "host0", "p0"))
        assert injector.supported("fibre_cut")[0] and injector.supported("process_kill")[0]
        assert injector.supported("switch_port_failure")[0]  # a Polatis has port shutters (PortShutters)
        session.backend.world = world
    assert set(CATALOGUE) == {"gpu_failure", "process_kill", "fibre_cut", "transceiver_degradation",
                              "switch_port_failure"}


def test_published_numbers_carry_their_source_and_a_bench_can_correct_them():
    base = published("morphlux.first_step_s")
    assert base.value == 25.6 and base.confidence == "secondary" and "2508.03674" in base.source
    fixed = published("morphlux.first_step_s", {"morphlux.first_step_s": {"value": 24.0, "source": "our reading of Fig. 8c"}})
    assert fixed.value == 24.0 and fixed.confidence == "bench"
    with pytest.raises(Exception, match="no published number 'morphlux.typo'"):
        parse_bench(TEXT.replace("deadlines:", "published:\n  morphlux.typo: {value: 1}\n\ndeadlines:", 1))


def test_timeline_exports_json_and_a_plot():
    with _session() as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        controller.arm()
        fault_ns = Injector(session).inject(Fault("process_kill", "host0"))
        result = controller.recover(fault_ns)
        assert result.status == "recovered"
        exported = json.loads(session.timeline.to_json())
        names = {s["name"] for s in exported["spans"]}
        assert {"recovery.detect", "recovery.restart", "recovery.first_step"} <= names
        assert any(e["name"] == "fault.injected" for e in exported["events"])
        fig = recovery_figure(result.phases, fault_ns, {"probe": [(fault_ns, -50.0), (fault_ns + 10**8, -3.6)]})
        png, svg = render(fig, "png"), render(fig, "svg")
        assert png.startswith(b"\x89PNG") and b"<svg" in svg[:400]


def _connections(resource: str) -> str:
    port = int(resource.split("::")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b":OXC:SWIT:CONN:STAT?\n")
        data = b""
        while not data.endswith(b"\n"):
            data += sock.recv(4096)
    return data.decode().strip()


def test_killing_a_run_mid_recovery_keeps_its_record_and_the_next_run_restores_the_baseline(tmp_path):
    served = tmp_path / "served.yaml"
    emulator = subprocess.Popen([sys.executable, "-m", "lumion_hil", "emulate", "--time-scale", "0.2", "--bench-out", str(served)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        switch = next(line for line in emulator.stdout if line.startswith("ocs\t")).split("\t")[2].strip()
        while not served.exists():
            time.sleep(0.05)
        pairs = sorted(load_bench(served).safety.baseline)
        baseline = f"(@{','.join(str(i) for i, _ in pairs)}),(@{','.join(str(e) for _, e in pairs)})"
        record = tmp_path / "run1.jsonl"
        env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}
        run1 = subprocess.Popen([sys.executable, "-m", "pytest", str(ROOT / "test_suites" / "test_recovery_time.py"),
                                 "-p", "no:cacheprovider", "-k", "process_kill or fibre_cut", "--bench", str(served),
                                 "--run-record", str(record), "-q"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the first recovery is recorded, the second is rewiring
            done = record.exists() and any('"recovery_to_first_step"' in line for line in record.read_text().splitlines())
            if done and _connections(switch) != baseline:
                break
            time.sleep(0.002)
        else:
            run1.kill()
            pytest.fail(f"the run never reached its second recovery: {run1.stdout.read().decode()[-2000:]}")
        run1.send_signal(signal.SIGKILL)
        run1.wait()
        assert _connections(switch) != baseline, "killed with the switch away from its baseline"

        lines = record.read_text().splitlines()
        assert all(json.loads(line) for line in lines), "every line of the record is whole"
        names = [json.loads(line).get("name") for line in lines]
        assert "recovery_to_restart" in names and "recovery_to_first_step" in names

        probe = tmp_path / "test_probe.py"
        probe.write_text(textwrap.dedent("""
            def test_setup_restored_the_baseline(optical_switch, bench_file):
                assert optical_switch.connections() == dict(bench_file.safety.baseline)
        """))
        run2 = subprocess.run([sys.executable, "-m", "pytest", str(probe), "-p", "no:cacheprovider", "--bench", str(served), "-q"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert run2.returncode == 0, run2.stdout[-2000:]
        assert _connections(switch) == baseline
    finally:
        stop_served(emulator)


def test_a_wrong_guess_about_which_end_failed_is_retried_with_the_other_end():
    """A serial switch has no monitors; with no meter on the receiving port either, nothing shows
    whether the sender faded or the receiver failed: the controller guesses, checks, and tries
    the other end."""
    text = (BENCHES / "emulated-serial.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if "channel: 4, port: 20" not in line)
    with _session(text, time_scale=0.2) as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        controller.arm()
        result = controller.recover(Injector(session).inject(Fault("transceiver_degradation", "host0", "p0")))
        assert result.status == "recovered", result.reason
        assert result.plan.ranks_after == ["host3", "host1", "host2"] and "retry" in result.phases
        assert "the first guess failed" in result.reason


def test_dim_light_at_a_meter_points_at_the_transmitter():
    with _session((BENCHES / "emulated-serial.yaml").read_text(), time_scale=0.2) as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        controller.arm()
        result = controller.recover(Injector(session).inject(Fault("transceiver_degradation", "host0", "p0")))
        assert result.status == "recovered" and "retry" not in result.phases
        assert result.plan.failed_host == "host0"


@pytest.mark.parametrize("fade_db", [2.0, 4.0])
def test_a_small_fade_on_a_thin_loss_budget_is_blamed_on_the_transmitter(fade_db):
    """The mesh's 10 dB insertion loss leaves under 1 dB of margin: a 2 dB fade takes the
    receiver below the floor while the light at the switch is only 2 dB short, less than the
    link margin; 4 dB takes it below sensitivity, so the link may drop before the margin watcher
    sees it. Either way the shortfall at the switch explains the receiver's: the sender is
    replaced, not the healthy receiver (which would leave the faded light on the spare)."""
    with _session((BENCHES / "emulated-mesh.yaml").read_text(), time_scale=0.2) as session:
        ranks = _running(session)
        controller = load_controller(session, ranks)
        controller.arm()
        result = controller.recover(Injector(session).inject(Fault("transceiver_degradation", "host0", "p0", loss_db=fade_db)))
        assert result.status == "recovered", result.reason
        assert result.plan.failed_host == "host0" and "retry" not in result.phases


@pytest.mark.parametrize("bench_name", ["emulated.yaml", "example-lab.yaml"])
def test_recovery_suite_passes_for_every_fault_on_a_served_bench(tmp_path, bench_name):
    """A served bench is driven like a real one: a fibre cut is a circuit removed at the switch,
    a killed rank a stopped process, a failed port a closed shutter (the lab's ways); its world
    makes the faults a lab cannot (a GPU failing, a fading transmitter). The example lab's bench
    runs through its own topology and real-bench path, served as its emulated twin."""
    from conftest import emulated_twin, serve_bench

    path = BENCHES / bench_name
    if bench_name == "example-lab.yaml":
        path = emulated_twin(path, tmp_path)
    with serve_bench(path, tmp_path) as (served, _, _):
        env = {**os.environ, "LUMION_HIL_LOCK_DIR": str(tmp_path)}
        record = tmp_path / "record.jsonl"
        run = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "test_suites" / "test_recovery_time.py"),
                              "-p", "no:cacheprovider", "-k", "test_recovery_time", "--bench", str(served),
                              "--run-record", str(record), "-q"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    tests = [t for t in lines if t["type"] == "test"]
    outcomes = {t["test"].split("[")[-1].rstrip("]"): t["outcome"] for t in tests if "test_recovery_time[" in t["test"]}
    assert outcomes == {kind: "passed" for kind in CATALOGUE}
    # A served world decides the bench's physics as an in-process one does: every figure of it is
    # a model (confirming nothing published); the harness's and the controller's own are measured.
    figures = [m for m in lines if m["type"] == "measurement"]
    basis = {m["name"]: m["basis"] for m in figures}
    assert basis["recovery_to_restart_lumion"] == basis["recovery_to_first_step"] == "model", basis
    assert basis["controller_overhead_total"] == basis["protected_ports_untouched"] == "measured", basis
    overhead = next(m for m in figures if m["name"] == "controller_overhead_total")
    assert "switch commands the harness saw" in overhead["attrs"]["physics_from"], overhead  # no world in process
    assert overhead["attrs"]["physics"]["light and lock"] > 0, overhead  # the agents' carrier stamps
