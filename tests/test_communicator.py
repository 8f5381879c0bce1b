"""The emulated job's NCCL communicator: ranks that need each other."""

from __future__ import annotations

import os
import threading

from lumion_hil.instruments.emulators.communicator import Communicators


def _join_all(comms, key, pids):
    results = {}

    def join(rank, pid):
        for _ in range(20):
            state = comms.join(key, len(pids), rank, pid, wait_s=0.25)
            if state["complete"]:
                break
        results[rank] = state

    threads = [threading.Thread(target=join, args=(r, p)) for r, p in enumerate(pids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_init_completes_only_when_every_rank_has_joined():
    comms = Communicators()
    alone = comms.join("29500/a,b,c", 3, 0, os.getpid(), wait_s=0.05)
    assert not alone["complete"] and alone["missing"] == [1, 2]
    results = _join_all(comms, "29500/a,b,c", [os.getpid(), 101, 102])
    assert all(r["complete"] for r in results.values())
    assert len({r["comm"] for r in results.values()}) == 1


def test_a_follower_before_its_root_waits_and_a_restarted_root_makes_a_new_communicator():
    comms = Communicators()
    early = comms.join("k", 2, 1, 201, wait_s=0.05)
    assert early["comm"] is None and early["missing"] == [0]
    first = _join_all(comms, "k", [os.getpid(), 201])
    # rank 0 alone starts again (a launcher that forgot the other rank): a new communicator
    # that the old rank 1 is not in, and never completes without a new rank 1
    again = comms.join("k", 2, 0, os.getpid() + 10**6, wait_s=0.05)
    assert again["comm"] != first[0]["comm"] and not again["complete"] and again["missing"] == [1]


def test_a_collective_completes_only_when_every_rank_has_entered_it():
    comms = Communicators()
    comm = _join_all(comms, "k", [os.getpid(), 2, 3])[0]["comm"]
    first = comms.enter(comm, 0, 1, wait_s=0.05)
    assert not first["done"] and first["behind"] == [1, 2]
    comms.enter(comm, 1, 1, wait_s=0.0)
    last = comms.enter(comm, 2, 1, wait_s=0.05)
    assert last["done"] and comms.enter(comm, 0, 1, wait_s=0.0)["done"]
    assert comms.enter(9999, 0, 1, wait_s=0.0)["gone"]


def test_emulated_ranks_need_their_peers_and_fail_after_the_nccl_timeout():
    import time

    from lumion_hil.harness.config import parse_bench
    from lumion_hil.harness.session import BenchSession
    from conftest import BENCHES

    bench = parse_bench((BENCHES / "emulated.yaml").read_text(), "emulated.yaml", time_scale=0.1)
    timeout_s = bench.job.nccl_timeout_s * 0.1
    with BenchSession.open(bench) as session:
        ranks = list(bench.job.ranks)
        lead = session.hosts[ranks[0]]
        # the lead alone: NCCL init never completes, and fails at the timeout
        session.start_job(ranks, only=ranks[:1])
        started = time.monotonic()
        status = lead.wait_step(1, timeout_s + 10)
        assert not status.reached and time.monotonic() - started >= timeout_s * 0.9
        assert any("DistStoreError: Timed out" in line and "1/3 clients joined" in line
                   for line in status.last_lines), status.last_lines
        # every rank: it steps; then a follower is killed, and the others stall until the watchdog
        session.fresh_job(ranks)
        assert lead.wait_step(2, 30).reached
        session.hosts[ranks[1]].stop_job()
        killed = time.monotonic()
        status = lead.wait_step(10**9, timeout_s + 10)  # until the lead's process ends
        assert not status.running and time.monotonic() - killed >= timeout_s * 0.9
        assert any("Watchdog caught collective operation timeout" in line and "waiting for ranks [1]" in line
                   for line in status.last_lines), status.last_lines


def test_emulated_ranks_stall_while_a_link_is_down_and_fail_after_the_nccl_timeout():
    """A circuit of the ring dark: the ranks stall in their all-reduce, go on if the light comes
    back within the NCCL timeout, and otherwise fail with the watchdog's line, as the namespaced
    bench's ring job (and NCCL's) do; they never hang for ever."""
    import time

    from lumion_hil.harness.config import parse_bench
    from lumion_hil.harness.session import BenchSession
    from conftest import BENCHES

    bench = parse_bench((BENCHES / "emulated.yaml").read_text(), "emulated.yaml", time_scale=0.1)
    timeout_s = bench.job.nccl_timeout_s * 0.1
    circuit = list(bench.safety.baseline)[0]
    with BenchSession.open(bench) as session:
        ranks = list(bench.job.ranks)
        lead = session.hosts[ranks[0]]
        session.fresh_job(ranks)
        assert lead.wait_step(2, 30).reached
        # an outage shorter than the timeout: the job steps on once the light is back
        session.switch.disconnect([circuit])
        step = lead.job_status().step
        time.sleep(timeout_s / 3)  # the outage's length: the stimulus, not a wait for a result
        session.switch.connect([circuit])
        assert lead.wait_step(step + 2, timeout_s).reached
        # one that lasts: every rank fails at the timeout, saying what it waited on (the link, or
        # a peer stalled by it: a rank that entered the step's all-reduce before the light went)
        session.switch.disconnect([circuit])
        dark = time.monotonic()
        status = lead.wait_step(10**9, timeout_s + 10)
        assert not status.running and timeout_s * 0.9 <= time.monotonic() - dark <= timeout_s + 5
        assert any("Watchdog caught collective operation timeout" in line and ("stalled:" in line or "waiting for "
                   "ranks" in line) for line in status.last_lines), status.last_lines
        session.switch.connect([circuit])
