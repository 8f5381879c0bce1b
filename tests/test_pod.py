"""Spare swaps at rack and pod scale, against cases worked by hand."""

from __future__ import annotations

import pytest

from lumion_hil.harness.pod import Pod, PodSpec


def test_a_rack_swaps_in_its_own_spare_and_keeps_the_ring_bandwidth():
    pod = Pod(PodSpec(racks=1))
    assert len(pod.slices) == 15 and pod.free_spares[0] == [(0, 60), (0, 61), (0, 62), (0, 63)]
    before = pod.ring_busbw_gbps(0)
    plan = pod.fail((0, 1))  # slice 0 is (0,0) -> (0,1) -> (0,2) -> (0,3) -> back
    assert plan.spare == (0, 60) and not plan.cross_rack and not plan.degraded
    assert sorted(plan.remove) == sorted([((0, 0), (0, 1)), ((0, 1), (0, 0)), ((0, 1), (0, 2)), ((0, 2), (0, 1))])
    assert sorted(plan.add) == sorted([((0, 0), (0, 60)), ((0, 60), (0, 0)), ((0, 60), (0, 2)), ((0, 2), (0, 60))])
    assert pod.slices[0] == [(0, 0), (0, 60), (0, 2), (0, 3)]
    assert plan.busbw_gbps == pytest.approx(before)
    # Two rings of 4 at 10 Gb/s each way: a busbw near 20 Gb/s (2.5 GB/s) at 128 MiB.
    assert plan.busbw_gbps == pytest.approx(2.5, rel=0.01)
    assert ((0, 1), (0, 2)) not in pod.circuits and ((0, 60), (0, 2)) in pod.circuits


def test_a_rack_out_of_spares_borrows_from_the_nearest_rack_through_the_pod_switch():
    pod = Pod(PodSpec(racks=3))
    for slot in (0, 4, 8, 12):  # four failures use rack 0's four spares
        assert not pod.fail((0, slot)).cross_rack
    plan = pod.fail((0, 16))
    assert plan.spare == (1, 60) and plan.cross_rack
    assert pod.uplinks_free[0] == 8 - 4 and pod.uplinks_free[1] == 8 - 4
    assert pod.slice_fabric(plan.slice_id).links[((0, 17), (1, 60))].latency_us == pod.spec.pod_hop_latency_us
    assert plan.busbw_gbps < pod.ring_busbw_gbps(1) and plan.busbw_gbps == pytest.approx(2.5, rel=0.01)


def test_no_spare_and_no_uplink_left_is_a_degraded_slice_not_a_guess():
    pod = Pod(PodSpec(racks=1, uplink_ports=0))
    for slot in (0, 4, 8, 12):
        pod.fail((0, slot))
    plan = pod.fail((0, 16))
    assert plan.degraded and "slice 4 degraded" in plan.reason and plan.add == []


def test_a_failed_spare_leaves_the_pool():
    pod = Pod(PodSpec(racks=1))
    assert pod.fail((0, 60)).spare is None
    assert pod.fail((0, 0)).spare == (0, 61)


def test_a_pod_of_4096():
    pod = Pod(PodSpec())
    assert pod.spec.gpus == 4096 and len(pod.slices) == 64 * 15
    plan = pod.fail((37, 9))
    assert plan.spare == (37, 60) and plan.busbw_gbps == pytest.approx(2.5, rel=0.01)
