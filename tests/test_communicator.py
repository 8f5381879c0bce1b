"""The emulated job's NCCL communicator: ranks that need each other."""

from __future__ import annotations

import os
import threading
import time

import pytest

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


def test_ranks_behind_are_only_late_while_alive_and_not_held_by_the_world():
    """The answer to a rank waiting in a collective says whether those behind are only late:
    alive, and their last step not stalled by the world. A stalled one, a dead one and one that
    has ended but is not yet reaped are not: the watchdog is theirs."""
    import subprocess
    import sys

    comms = Communicators()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])  # ends, and stays unreaped until wait()
    while open(f"/proc/{ended.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    try:
        comm = _join_all(comms, "k", [os.getpid(), os.getpid(), ended.pid])[0]["comm"]
        waiting = comms.enter(comm, 0, 1, wait_s=0.0)
        assert waiting["behind"] == [1, 2] and not waiting["late_only"]  # rank 2's process has ended
        comms.enter(comm, 2, 1, wait_s=0.0)  # (as if it had entered before it ended)
        assert comms.enter(comm, 0, 1, wait_s=0.0)["late_only"]  # rank 1: alive, nothing holds it
        comms.stall(comm, 1)  # its step stalled by the world (a link down)
        assert not comms.enter(comm, 0, 1, wait_s=0.0)["late_only"]
        assert comms.enter(comm, 1, 1, wait_s=0.0)["done"]  # in at last: no longer stalled
        assert comms.enter(comm, 1, 2, wait_s=0.0)["late_only"] is False  # 0 and 2 behind; 2 has ended
    finally:
        ended.wait()


class _World:
    """The world service's communicator, called in-process as a rank calls it."""

    def __init__(self, comms):
        self.comms = comms

    def call(self, method, **kw):
        assert method == "comm_enter"
        return self.comms.enter(kw["comm"], kw["rank"], kw["seq"], kw["wait_s"])


def test_a_rank_waits_the_allowance_for_peers_only_late_and_not_for_held_ones(capsys):
    """At a scaled time NCCL's timeout (0.6 s at a fiftieth) is shorter than a starved process
    can be late. A peer that is only late gets the allowance beyond it (said in a line of its
    own); a peer held by the world gets the watchdog at the timeout, as before."""
    from lumion_hil.instruments.emulators.job import _Peers

    comms = Communicators()
    comm = _join_all(comms, "k", [os.getpid(), os.getpid()])[0]["comm"]
    peers = _Peers(_World(comms), "k", ["a", "b"], 0, timeout_s=0.2, allowance_s=0.5)
    peers.comm = comm
    late = threading.Timer(0.4, lambda: comms.enter(comm, 1, 1, wait_s=0.0))  # 0.2 s past the timeout
    late.start()
    started = time.monotonic()
    assert peers.collective(1)
    assert 0.35 <= time.monotonic() - started < 0.7
    said = capsys.readouterr().out
    assert '"event": "late_peers"' in said and "Watchdog" not in said

    comms.stall(comm, 1)  # rank 1's next step held by the world: the watchdog at the timeout
    started = time.monotonic()
    assert not peers.collective(2)
    assert 0.2 <= time.monotonic() - started < 0.45
    assert "Watchdog caught collective operation timeout" in capsys.readouterr().out

    comms.enter(comm, 1, 2, wait_s=0.0)  # rank 1 steps on: only late again, for collective 3
    peers.allowance_s = 0.0  # at real time, or with no allowance: the timeout alone
    started = time.monotonic()
    assert not peers.collective(3)
    assert 0.2 <= time.monotonic() - started < 0.45


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


@pytest.mark.scaled  # a fiftieth of real time: never beside another worker on a core
def test_a_rank_stopped_past_the_scaled_timeout_is_waited_for_and_one_stopped_longer_is_not():
    """At a fiftieth of real time NCCL's 30 s are 0.6 s, less than a starved core can delay a
    process (609 ms once, in a clean-clone CI run with the tests held to one core). A rank
    stopped (SIGSTOP: a starved core made certain) for 0.8 s is only late: the others wait the
    bench's I/O allowance (0.5 s) beyond the timeout, the job steps on and says so. Stopped for
    2 s, the watchdog fails the others at the timeout and the allowance. Without the allowance,
    the first stop fails the job."""
    import signal

    from lumion_hil.harness.config import parse_bench
    from lumion_hil.harness.session import BenchSession
    from conftest import BENCHES

    bench = parse_bench((BENCHES / "emulated.yaml").read_text(), "emulated.yaml", time_scale=0.02)
    timeout_s, allowance_s = bench.job.nccl_timeout_s * 0.02, bench.deadlines.io_allowance_s
    assert (timeout_s, allowance_s) == (0.6, 0.5)
    with BenchSession.open(bench) as session:
        ranks = list(bench.job.ranks)
        lead = session.hosts[ranks[0]]
        started = session.fresh_job(ranks)
        assert lead.wait_step(3, 30).reached
        follower = started[ranks[1]].pid
        for stopped_s in (0.8, 2.0):
            step = lead.job_status().step
            os.kill(follower, signal.SIGSTOP)
            try:
                time.sleep(stopped_s)  # the stimulus: how long the process cannot run
            finally:
                os.kill(follower, signal.SIGCONT)
            if stopped_s < timeout_s + allowance_s:
                assert lead.wait_step(step + 3, 10).reached, lead.job_status()
                assert lead.job_events("late_peers"), lead.job_events()
            else:
                status = lead.wait_step(10**9, 10)  # until the lead's process ends
                assert not status.running
                assert any("Watchdog caught collective operation timeout" in line for line in status.last_lines), \
                    status.last_lines
