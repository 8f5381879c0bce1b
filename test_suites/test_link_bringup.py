"""Link bring-up: after a circuit is made, light reaches the receiver, then the NIC reports
carrier up. The two times, and the time between them (transceiver lock plus the NIC's own
bring-up, which no standard specifies and nobody has published: so it is measured here)."""

from __future__ import annotations

import time

import allure
import pytest

from harness import limits
from harness.measurements import Spec
from test_suites.light import light_threshold_reading_dbm

pytestmark = allure.feature("link bring-up")


@allure.title("circuit {baseline_circuit}: light, then carrier up at the receiving NIC")
def test_link_comes_up_after_light(bench, bench_file, optical_switch, gpu_hosts, baseline_circuit, measure, timeline):
    ingress, egress = baseline_circuit
    receiver = bench_file.nic_on_rx_port(egress)
    if receiver is None:
        pytest.skip(f"no NIC receives from egress port {egress}")
    host, nic = receiver
    interface = nic.interface or nic.name
    agent = gpu_hosts[host.name]
    deadline = bench_file.deadlines.link_up_s

    optical_switch.disconnect([baseline_circuit])
    down = agent.wait_link(interface, up=False, timeout_s=deadline)
    assert not down["timed_out"], f"{host.name}.{interface} kept carrier with its circuit removed"

    det = bench_file.meter_detector_for_port(egress)
    meter = bench.meters.get(det.instrument) if det else None
    budget = limits.switch_completion(bench_file, 1).high
    handle = meter.start_trace(det.channel, duration_s=3 * budget, interval_s=max(0.0005, budget / 200)) if meter else None
    commanded_ns = time.perf_counter_ns()
    with timeline.span("suite.connect", ingress=ingress, egress=egress):
        optical_switch.connect([baseline_circuit])
    up = agent.wait_link(interface, up=True, timeout_s=deadline)
    carrier_ns = up.get("since_ns") or up["t_ns"]  # the instant the host says it changed, else when seen
    timeline.event("link.carrier_up", carrier_ns, uncertainty_ns=up["uncertainty_ns"], source=host.name,
                   interface=interface)

    carrier_s = None if up["timed_out"] else (carrier_ns - commanded_ns) / 1e9
    measure(Spec("carrier_up_time", "s", description="switch command to carrier up at the NIC").at_most(
        deadline, "bench deadline deadlines.link_up_s"), carrier_s, host=host.name, interface=interface)
    if handle is not None:
        trace = meter.finish_trace(handle)
        light_ns = trace.first_at_or_above(light_threshold_reading_dbm(bench_file, det), after_ns=commanded_ns)
        measure(limits.light_arrival(bench_file), None if light_ns is None else (light_ns - commanded_ns) / 1e9,
                detector=det.name, method=trace.method)
        if light_ns is not None and carrier_s is not None:
            measure(Spec("light_to_carrier_time", "s",
                         description="light at the receiver to carrier up: transceiver lock and NIC bring-up"),
                    (carrier_ns - light_ns) / 1e9, host=host.name, interface=interface,
                    uncertainty_s=(trace.resolution_ns() + up["uncertainty_ns"]) / 1e9)
