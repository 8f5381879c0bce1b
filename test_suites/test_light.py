"""Light at the detectors: when a circuit is made, how long until the receiver behind it has
enough light, taken from the meter's own trace (hardware-timed where the meter can)."""

from __future__ import annotations

import time

import allure
import pytest

from lumion_hil.harness import limits
from lumion_hil.harness.measurements import Spec
from lumion_hil.test_suites.light import light_threshold_reading_dbm, trace_interval_s

pytestmark = allure.feature("light")


@allure.title("circuit {baseline_circuit}: time from switch command to light at the detector")
def test_light_arrival_time(session, bench_file, optical_switch, baseline_circuit, measure, timeline):
    ingress, egress = baseline_circuit
    det = bench_file.meter_detector_for_port(egress)
    if det is None:
        pytest.skip(f"no power meter watches egress port {egress}")
    meter = session.meters[det.instrument]
    budget = limits.switch_completion(bench_file, 1)
    if budget.high is None:
        pytest.fail("the switch completion limit has no upper bound (limits.switch_completion)")
    optical_switch.disconnect([baseline_circuit])
    interval_s = trace_interval_s(budget.high)
    trace_handle = meter.start_trace(det.channel, duration_s=3 * budget.high, interval_s=interval_s)
    commanded_ns = time.perf_counter_ns()
    with timeline.span("suite.connect", ingress=ingress, egress=egress):
        optical_switch.connect([baseline_circuit])
    trace = meter.finish_trace(trace_handle)
    threshold = light_threshold_reading_dbm(bench_file, det)
    lit_ns = trace.first_at_or_above(threshold, after_ns=commanded_ns)
    allure.dynamic.description(f"{det.name} on {det.instrument} channel {det.channel}: {trace.method} trace, "
                               f"{len(trace.times_ns)} samples, resolution {trace.resolution_ns() / 1e6:.2f} ms")
    arrival_s = None if lit_ns is None else (lit_ns - commanded_ns) / 1e9
    measure(limits.light_arrival(bench_file), arrival_s, detector=det.name, method=trace.method)
    measure(Spec("light_arrival_resolution", "s", description="how finely the trace places the arrival"),
            trace.resolution_ns() / 1e9, detector=det.name, method=trace.method)
