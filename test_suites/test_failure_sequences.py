"""Failure sequences: faults are rules, the harness's promises are invariants, and Hypothesis
explores the orders in which things break. Failed hardware stays failed within a sequence, so
spares run out; a failing sequence shrinks to the shortest story that breaks a promise.

Promises: a protected port is never switched; after each fault the controller either recovers
(the job steps again, on healthy ranks) or says it is degraded, and it is degraded exactly when
a GPU is lost and no spare is left; every recovery ends within the bench's deadline."""

from __future__ import annotations

import time

import allure
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.controller import load_controller
from harness.faults import Injector

pytestmark = allure.feature("failure sequences")

SEQUENCES = settings(max_examples=3, stateful_step_count=3, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))


@allure.title("sequences of faults keep the harness's promises")
def test_failure_sequences(bench, bench_file, gpu_hosts):
    if bench_file.job is None:
        pytest.skip("the bench file has no job section")
    injector = Injector(bench, seed=bench_file.recovery.fault_seed)
    kinds = [k for k in ("gpu_failure", "process_kill", "fibre_cut", "transceiver_degradation", "switch_port_failure")
             if injector.supported(k)[0]]
    spares = [h.name for h in bench_file.topology.hosts if any(g.role == "spare" for g in h.gpus)]
    protected = set(bench_file.safety.protected_ports)
    deadline_s = bench_file.deadlines.recovery_s

    class Sequences(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.faults = []
            self.ranks = list(bench_file.job.ranks)
            self.spares_left = len(spares)
            self.last = None
            bench.stop_job()
            bench.restore_baseline()
            bench.start_job(self.ranks)
            assert gpu_hosts[self.ranks[0]].wait_step(1, deadline_s)["reached"], "the job did not start healthy"

        @precondition(lambda self: self.last is None or self.last.status == "recovered")
        @rule(kind=st.sampled_from(kinds), rank=st.integers(0, 99), nic=st.integers(0, 99))
        def a_fault(self, kind, rank, nic):
            host = bench_file.host(self.ranks[rank % len(self.ranks)])
            fault = injector.choose(kind, [host.name])
            if fault.nic is not None:
                fault = type(fault)(kind, host.name, host.nics[nic % len(host.nics)].name)
            controller = load_controller(bench, self.ranks)
            controller.arm()
            started = time.monotonic()
            try:
                self.faults.append(fault)
                fault_ns = injector.inject(fault)
                self.last = controller.recover(fault_ns)
            finally:
                controller.disarm()
            with allure.step(f"{fault.describe()}: {self.last.status} ({self.last.reason})"):
                print(f"  {fault.describe()}: {self.last.status} ({self.last.reason})")
            assert time.monotonic() - started < deadline_s + 30, "a recovery outlived its deadline"
            needs_spare = kind != "process_kill"
            expect = "degraded" if needs_spare and self.spares_left == 0 else "recovered"
            assert self.last.status == expect, f"{fault.describe()}: {self.last.status}: {self.last.reason}"
            if self.last.status == "recovered":
                if self.last.plan.spare:
                    self.spares_left -= 1
                self.ranks = self.last.plan.ranks_after

        @rule()
        def nothing_breaks(self):
            """A quiet moment: a recovered job keeps stepping; a degraded one stays reported."""
            if self.last is not None and self.last.status == "recovered":
                lead = gpu_hosts[self.ranks[0]]
                step = lead.job_status()["progress"].get("step", 0)
                assert lead.wait_step(step + 1, deadline_s)["reached"], f"the job stopped stepping on {self.ranks}"

        @invariant()
        def protected_ports_are_never_switched(self):
            touched = {p for pair in bench.switch.connections().items() for p in pair} & protected
            baseline_touch = {p for pair in bench_file.safety.baseline for p in pair} & protected
            assert touched <= baseline_touch
            if bench.world is not None:
                assert bench.world.events_of("safety.violation") == []

        @invariant()
        def a_recovered_job_runs_on_its_ranks(self):
            if self.last is not None and self.last.status == "recovered":
                status = gpu_hosts[self.ranks[0]].job_status()
                assert status["running"], f"the job is not running on {self.ranks}: {status['last_lines']}"

        def teardown(self):
            bench.stop_job()
            for fault in self.faults:
                injector.repair(fault)
            bench.restore_baseline()

    Sequences.TestCase.settings = SEQUENCES
    Sequences.TestCase().runTest()
