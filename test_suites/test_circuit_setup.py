"""Circuit set-up: the bench's circuits carry enough light, and the switch completes in budget.

Runs unchanged on a real bench and on the emulated one; it names no vendor."""

from __future__ import annotations

import allure
import pytest

from lumion_hil.harness import limits
from lumion_hil.test_suites.light import received_dbm

pytestmark = allure.feature("circuit set-up")


def _detectors(bench_file, egress):
    dets = bench_file.detectors_for_port(egress)
    if not dets:
        pytest.skip(f"no detector watches egress port {egress}")
    return dets


@allure.title("the switch is the one the bench file describes")
def test_switch_matches_bench(optical_switch, bench_file):
    identity = optical_switch.identify()
    allure.dynamic.description(f"switch: {identity}")
    assert optical_switch.size() == tuple(bench_file.switch.ports), (
        f"{optical_switch.name} reports {optical_switch.size()} ports; the bench file says {bench_file.switch.ports}")


@allure.title("baseline circuit {baseline_circuit} carries light")
def test_baseline_circuit_carries_light(session, bench_file, optical_switch, baseline_circuit, measure):
    ingress, egress = baseline_circuit
    assert optical_switch.connections().get(ingress) == egress, f"baseline {ingress}->{egress} is not connected"
    sensitivity = bench_file.limits.receiver_sensitivity_dbm.value
    for det in _detectors(bench_file, egress):
        received = received_dbm(session, det)
        measure(limits.received_power(bench_file), received, port=egress, detector=det.name)
        margin = received - sensitivity if isinstance(received, float) else received
        measure(limits.link_margin(bench_file), margin, port=egress, detector=det.name)


@allure.title("circuit {baseline_circuit}: dark when removed, light within budget when made")
def test_circuit_make_and_break(session, bench_file, optical_switch, baseline_circuit, measure, timeline):
    ingress, egress = baseline_circuit
    det = _detectors(bench_file, egress)[0]
    optical_switch.disconnect([baseline_circuit])
    measure(limits.dark_after_disconnect(bench_file), received_dbm(session, det), port=egress, detector=det.name)
    with timeline.span("suite.connect", ingress=ingress, egress=egress) as span:
        optical_switch.connect([baseline_circuit])
    measure(limits.switch_completion(bench_file, 1), span.duration_s, ingress=ingress, egress=egress)
    measure(limits.received_power(bench_file), received_dbm(session, det), port=egress, detector=det.name)


@allure.title("all baseline circuits made in one command")
def test_all_baseline_circuits_in_one_command(session, bench_file, optical_switch, measure, timeline):
    baseline = list(bench_file.safety.baseline)
    if not baseline:
        pytest.skip("the bench has no baseline circuits")
    optical_switch.disconnect(baseline)
    with timeline.span("suite.connect_all", connections=len(baseline)) as span:
        optical_switch.connect(baseline)
    measure(limits.switch_completion(bench_file, len(baseline)), span.duration_s, connections=len(baseline))
    for ingress, egress in baseline:
        for det in bench_file.detectors_for_port(egress)[:1]:
            measure(limits.received_power(bench_file), received_dbm(session, det), port=egress, detector=det.name)
