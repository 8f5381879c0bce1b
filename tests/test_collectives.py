"""The collective cost model against cases worked by hand, the emulated nccl-tests against the
model, and the bandwidth and throughput verdicts against the physics that should move them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from lumion_hil.harness.bandwidth import run_sweep
from lumion_hil.harness.config import parse_bench
from lumion_hil.harness.session import BenchSession
from lumion_hil.instruments.collectives import Fabric, Link, NoPath, bus_factor, collective_cost, max_min_share
from lumion_hil.instruments.gpu_host.nccl import parse

from conftest import BENCHES, ROOT

GB = 1e9


def ring_fabric(hosts: list[str], gbps: float = 10.0, latency_us: float = 0.0, slow: dict | None = None) -> Fabric:
    """A link each way between ring neighbours (what the optical circuits make)."""
    links = {}
    for a, b in zip(hosts, hosts[1:] + hosts[:1]):
        for x, y in ((a, b), (b, a)):
            links[(x, y)] = Link((slow or {}).get((x, y), gbps), latency_us)
    return Fabric(links, lambda x, y: ((x, y),) if (x, y) in links else None)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_by_hand(n):
    hosts = [f"h{i}" for i in range(n)]
    size = 10**9
    cost = collective_cost("all_reduce", hosts, size, ring_fabric(hosts), step_latency_us=0.0, rings=2)
    # Two rings, one each way, each carrying S/2: 2(n-1) steps of S/(2n) bytes at 10 Gb/s. With
    # n = 2 both rings use the same two links and share them (5 Gb/s each).
    per_flow = 5e9 if n == 2 else 10e9
    expected = 2 * (n - 1) * (size / 2 / n) * 8 / per_flow
    assert cost.time_s == pytest.approx(expected, rel=1e-9)
    # busbw is the link rate for n = 2 (one link each way), twice it for a ring of both directions
    assert cost.busbw_gbps * 8 == pytest.approx(10 if n == 2 else 20, rel=1e-9)


def test_small_messages_pay_the_step_latency_and_tree_wins_at_scale():
    hosts = [f"h{i}" for i in range(8)]
    fabric = ring_fabric(hosts, latency_us=1.0)
    ring = collective_cost("all_reduce", hosts, 8, fabric, step_latency_us=15.0, algorithm="ring")
    tree = collective_cost("all_reduce", hosts, 8, fabric, step_latency_us=15.0)
    assert ring.time_s == pytest.approx(14 * 16e-6, rel=1e-3)  # 2(n-1) steps of (15 + 1) us
    assert tree.algorithm == "tree" and tree.time_s == pytest.approx(6 * 16e-6, rel=1e-3)  # 2 log2(8) steps


def test_one_slow_link_slows_its_ring():
    hosts = ["a", "b", "c", "d"]
    size = 10**9
    slow = ring_fabric(hosts, slow={("b", "c"): 5.0})
    cost = collective_cost("all_reduce", hosts, size, slow, step_latency_us=0.0, rings=2)
    # The forward ring runs at 5 Gb/s (its b->c hop), the backward one at 10: the slower decides.
    assert cost.time_s == pytest.approx(6 * (size / 2 / 4) * 8 / 5e9, rel=1e-9)


def test_two_flows_sharing_an_uplink_divide_it():
    links = {"nic-a": Link(20), "nic-b": Link(20), "uplink": Link(10), "nic-c": Link(20)}
    rates = max_min_share([("nic-a", "uplink"), ("nic-b", "uplink"), ("nic-c",)], links)
    assert rates == pytest.approx([5.0, 5.0, 20.0])
    # One flow held back elsewhere leaves the rest of the shared link to the other.
    links["nic-a"] = Link(2)
    assert max_min_share([("nic-a", "uplink"), ("nic-b", "uplink")], links) == pytest.approx([2.0, 8.0])


def test_bus_factors_of_each_collective():
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == bus_factor("alltoall", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == 1.0
    hosts = ["a", "b", "c", "d"]
    mesh = {(x, y): Link(10.0) for x in hosts for y in hosts if x != y}  # alltoall needs every pair
    full = Fabric(mesh, lambda x, y: ((x, y),))
    for collective in ("all_gather", "reduce_scatter", "broadcast", "alltoall"):
        cost = collective_cost(collective, hosts, 10**8, full, step_latency_us=0.0)
        assert cost.busbw_gbps == pytest.approx(cost.algbw_gbps * bus_factor(collective, 4))
    # all-gather by hand: 3 steps of S/(2n) per ring at 10 Gb/s; alltoall: S/n to each peer at once
    assert collective_cost("all_gather", hosts, 10**8, full, step_latency_us=0.0).time_s == pytest.approx(
        3 * (10**8 / 2 / 4) * 8 / 10e9)
    assert collective_cost("alltoall", hosts, 10**8, full, step_latency_us=0.0).time_s == pytest.approx(
        (10**8 / 4) * 8 / 10e9)


def test_a_missing_link_is_no_path_not_a_number():
    hosts = ["a", "b", "c"]
    fabric = ring_fabric(hosts)
    del fabric.links[("b", "c")]
    with pytest.raises(NoPath, match="no path from b to c"):
        collective_cost("all_reduce", hosts, 1024, fabric, step_latency_us=1.0)


TEXT = (BENCHES / "emulated.yaml").read_text()


def _bench(**changes):
    data = yaml.safe_load(TEXT)
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[leaf] = value
    return parse_bench(yaml.safe_dump(data), "test-bench.yaml", time_scale=0.05)


def test_emulated_nccl_tests_print_the_models_numbers():
    bench = _bench()
    with BenchSession.open(bench) as session:
        ranks = list(bench.job.ranks)
        sweep = run_sweep(session, "all_reduce", ranks, "optical", sizes=(8, 1 << 24))
        world = session.world
        assert sweep.result.collective == "all_reduce" and sweep.result.ranks == 3 and sweep.result.total_wrong == 0
        for row in sweep.result.rows:
            model = world.collective_cost("all_reduce", ranks, row.size_bytes).time_s  # physical, not scaled
            for perf in (row.out_of_place, row.in_place):
                assert perf.time_us == pytest.approx(model * 1e6, rel=0.05, abs=0.02)  # 1 % noise, printed rounding
                if row.size_bytes >= 1 << 20:
                    assert perf.busbw_gbps == pytest.approx(perf.algbw_gbps * 4 / 3, rel=0.02)
        # -J writes the same results as JSON
        argv, env = session.nccl_tests_command("all_gather", ranks, "optical", (1024, 4096))
        out_file = session.bench.job.heartbeat_dir + "/allgather.json"
        os.makedirs(session.bench.job.heartbeat_dir, exist_ok=True)
        if os.path.exists(out_file):
            os.remove(out_file)
        run = session.hosts[ranks[0]].run_nccl_tests(argv + ["-J", out_file], env=env)
        text_result = parse(run.stdout)
        json_result = parse(open(out_file).read())
        assert json_result.collective == "all_gather" and len(json_result.rows) == len(text_result.rows) == 3
        # all-gather sizes are whole elements per rank, as nccl-tests rounds them (3 ranks x 4 bytes)
        assert [r.size_bytes for r in json_result.rows] == [1020, 2040, 4092]
        assert json_result.rows[2].out_of_place.busbw_gbps == pytest.approx(text_result.rows[2].out_of_place.busbw_gbps,
                                                                            abs=0.006)


def test_emulated_nccl_tests_report_the_same_bandwidth_at_every_time_scale():
    """A bench run ten times faster waits a tenth as long, but prints the fabric's own figures."""
    largest = {}
    for scale in (1.0, 0.1):
        bench = parse_bench(TEXT, "test-bench.yaml", time_scale=scale)
        with BenchSession.open(bench) as session:
            sweep = run_sweep(session, "all_reduce", list(bench.job.ranks), "optical", sizes=(1 << 20, 1 << 24))
            largest[scale] = sweep.largest.out_of_place.busbw_gbps
    assert largest[0.1] == pytest.approx(largest[1.0], rel=0.05), largest  # 1 % noise per row
    # two 10 Gb/s NICs a host: a ring all-reduce's bus bandwidth is at most their 2.5 GB/s
    line_gbytes = sum(n.rate_gbps for n in bench.host(bench.job.ranks[0]).nics) / 8
    assert largest[1.0] <= line_gbytes and largest[0.1] <= line_gbytes * 1.05


def test_emulated_nccl_tests_flags_and_errors_are_the_real_ones():
    env = {**os.environ, "LUMION_HIL_RANKS": ""}
    proc = subprocess.run([sys.executable, "-m", "lumion_hil.instruments.emulators.nccl_tests", "--world", "127.0.0.1:1",
                           "--program", "all_reduce_perf", "-d", "float7"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 1 and "Invalid datatype 'float7'" in proc.stderr


def _suite(tmp_path, bench_text: str, tests: str, time_scale: float = 0.1) -> dict[str, dict]:
    bench_file = tmp_path / "bench.yaml"
    bench_file.write_text(bench_text)
    record = tmp_path / "record.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "test_suites" / tests), "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT / "test_suites"), "--bench", str(bench_file), "--time-scale",
                           str(time_scale), "--run-record", str(record), "-q"], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return {m["name"]: m for m in lines if m["type"] == "measurement"}, proc


def test_a_halved_optical_link_rate_turns_the_bandwidth_ratio_red(tmp_path):
    data = yaml.safe_load(TEXT)
    for host in data["topology"]["hosts"]:
        host.setdefault("emulation", {})["link_rate_factor"] = 0.5
    measured, proc = _suite(tmp_path, yaml.safe_dump(data), "test_collective_bandwidth.py")
    ratio = measured["allreduce_busbw_optical_over_electrical"]
    assert ratio["verdict"] == "fail" and ratio["value"] == pytest.approx(1.0, rel=0.05), ratio
    assert measured["busbw_after_over_before"]["verdict"] == "pass"
    assert proc.returncode == 1


@pytest.mark.alone  # throughput from the emulated job's step times: a loaded core moves it (a clean-clone CI
# run beside another test saw throughput_after_over_before marginal)
def test_an_electrical_uplink_as_fast_as_the_optical_links_brings_throughput_to_par(tmp_path):
    data = yaml.safe_load(TEXT)
    data["electrical"]["oversubscription"] = {"value": 1, "source": "test: a non-blocking uplink"}
    measured, proc = _suite(tmp_path, yaml.safe_dump(data), "test_training_throughput.py")
    ratio = measured["throughput_optical_over_electrical"]
    assert ratio["value"] == pytest.approx(1.0, abs=0.1) and ratio["verdict"] == "fail", ratio
    # the swap gives the rate back within the lab's 10% (the verdict's own limit): "marginal" is
    # within it, and is where a healthy ratio of about 1 lands whenever the two medians of three
    # step intervals differ by more than 1% (0.9 x 1.1 = 0.99), as beside a busy core
    assert measured["throughput_after_over_before"]["verdict"] != "fail", measured["throughput_after_over_before"]
