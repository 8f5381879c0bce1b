"""Link bring-up: after a circuit is made, light reaches the receiver, then the NIC reports
carrier up. The two times, and the time between them (transceiver lock plus the NIC's own
bring-up, which no standard specifies and nobody has published: so it is measured here, from
the meter's trace and the agent's view of carrier, and judged against the lab's requirement)."""

from __future__ import annotations

import time

import allure
import pytest

from lumion_hil.harness import limits
from lumion_hil.harness.measurements import Spec
from lumion_hil.test_suites.light import light_threshold_reading_dbm, trace_interval_s

pytestmark = allure.feature("link bring-up")


@allure.title("circuit {baseline_circuit}: light, then carrier up at the receiving NIC")
def test_link_comes_up_after_light(session, bench_file, optical_switch, gpu_hosts, baseline_circuit, measure, timeline):
    ingress, egress = baseline_circuit
    receiver = bench_file.nic_on_rx_port(egress)
    if receiver is None:
        pytest.skip(f"no NIC receives from egress port {egress}")
    host, nic = receiver
    interface = nic.interface or nic.name
    agent = gpu_hosts[host.name]
    deadline = bench_file.waits.link_up_s

    optical_switch.disconnect([baseline_circuit])
    down = agent.wait_link(interface, up=False, timeout_s=deadline)
    assert not down.timed_out, f"{host.name}.{interface} kept carrier with its circuit removed"

    det = bench_file.meter_detector_for_port(egress)
    meter = session.meters.get(det.instrument) if det else None
    budget = limits.switch_completion(bench_file, 1).high
    if budget is None:
        pytest.fail("the switch completion limit has no upper bound (limits.switch_completion)")
    handle = meter.start_trace(det.channel, duration_s=3 * budget, interval_s=trace_interval_s(budget)) if meter else None
    commanded_ns = time.perf_counter_ns()
    with timeline.span("suite.connect", ingress=ingress, egress=egress):
        optical_switch.connect([baseline_circuit])
    up = agent.wait_link(interface, up=True, timeout_s=deadline)
    carrier_ns = up.t_ns  # when the agent saw carrier come up (netlink on a host, stamped by its clock)
    timeline.event("link.carrier_up", carrier_ns, uncertainty_ns=up.uncertainty_ns, source=host.name,
                   interface=interface)

    carrier_s = None if up.timed_out else (carrier_ns - commanded_ns) / 1e9
    measure(Spec("carrier_up_time", "s", description="switch command to carrier up at the NIC").at_most(
        *limits.scaled(bench_file, bench_file.deadlines.link_up_s, "bench deadline deadlines.link_up_s")), carrier_s, host=host.name,
        interface=interface)
    if meter is not None and handle is not None:
        trace = meter.finish_trace(handle)
        light_ns = trace.first_at_or_above(light_threshold_reading_dbm(bench_file, det), after_ns=commanded_ns)
        measure(limits.light_arrival(bench_file), None if light_ns is None else (light_ns - commanded_ns) / 1e9,
                detector=det.name, method=trace.method)
        if light_ns is not None and carrier_s is not None:
            measure(limits.link_bringup(bench_file), (carrier_ns - light_ns) / 1e9, host=host.name,
                    interface=interface, uncertainty_s=(trace.resolution_ns() + up.uncertainty_ns) / 1e9)
    if carrier_s is not None:  # once up, the link stays up: count the drops the host's counters show
        settle_s = limits.scaled(bench_file, bench_file.limits.link_up_after_light_s.value, "")[0]
        before = next(s for s in agent.links() if s.interface == interface)
        drop = agent.wait_link(interface, up=False, timeout_s=settle_s)
        if not drop.timed_out:
            agent.wait_link(interface, up=True, timeout_s=deadline)
            agent.wait_link(interface, up=False, timeout_s=settle_s * 4)  # let a flapping link finish
        after = next(s for s in agent.links() if s.interface == interface)
        drops = None if before.carrier_down_count is None or after.carrier_down_count is None else \
            after.carrier_down_count - before.carrier_down_count
        measure(Spec("carrier_drops_after_up", "drops", description="carrier lost again after it came up "
                     f"(within {settle_s:g} s and after)").at_most(0, "a link that comes up stays up").with_marginal(0.0),
                drops, host=host.name, interface=interface)
