"""The namespaced bench (rack in a box, instruments/emulators/netns.py): the code a real bench
runs (ssh, netlink, real jobs and real bytes) run against the emulated world's physics."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from lumion_hil.harness.bandwidth import run_sweep
from lumion_hil.harness.config import load_bench
from lumion_hil.harness.controller import load_controller
from lumion_hil.harness.faults import Fault, Injector
from lumion_hil.harness.recovery import job_last_words
from lumion_hil.harness.session import BenchSession
from lumion_hil.instruments.collectives import collective_cost
from lumion_hil.instruments.emulators.netns import available
from lumion_hil.instruments.emulators.rack import Rack
from lumion_hil.instruments.emulators.rack_state import STATE_DIR, rack_states
from lumion_hil.instruments.protocols import InstrumentIOError
from conftest import BENCHES, ROOT, fastest_of, needs

OK, WHY = available()
pytestmark = [*needs("netns", OK, f"the namespaced bench cannot be built here: {WHY}"),
              pytest.mark.alone]  # real traffic and netlink timing (scripts/tests)
BENCH = BENCHES / "netns.yaml"


@pytest.fixture(scope="module")
def session():
    with BenchSession.open(load_bench(BENCH)) as session:
        yield session


def _rx_port(session, host: str, nic: str) -> int:
    return next(n.rx_port for n in session.bench.host(host).nics if n.name == nic)


def _carrier_change(world, nic: str, up: bool, after_ns: int, within_s: float = 2.0):
    """The data plane's record of the carrier change (it may note it just after the agent saw it)."""
    deadline = time.monotonic() + within_s
    while True:
        found = [e for e in world.events_of("netns.carrier", nic) if e.t_ns >= after_ns and e.detail["up"] == up]
        if found or time.monotonic() > deadline:
            assert found, f"{nic}: the data plane never set the carrier {'up' if up else 'down'}"
            return found[0]
        time.sleep(0.01)


def test_agent_sees_the_carrier_through_netlink_within_5_ms_of_the_change(session):
    """The world's light goes and comes back at host1.p0; the veth's carrier follows (set by the
    data plane), and the agent, woken by netlink in the host's own namespace, stamps each change
    within 5 ms of the carrier change, never before it.

    The kernel changes the carrier somewhere between the data plane's netlink request and its
    acknowledgement: the truth is that window. A stamp within 5 ms of the request is within 5 ms
    of the change, wherever in the window it fell (on time); one 5 ms or more after the
    acknowledgement is late wherever it fell (late); between the two, the window is too wide to
    say (undecided: once, beside the other tests, the data plane took 62 ms between the two and
    the agent stamped the change 1 ms before its end). An undecided change is made again, up to
    12 changes in all; every decided one is on time, and at least two of each kind are decided."""
    agent, world = session.hosts["host1"], session.world
    agent.sync_clock(16)
    port = _rx_port(session, "host1", "p0")
    assert agent.wait_link("p0", True, 5).timed_out is False
    interfaces = agent.call("hello")["interfaces"]
    assert {"p0", "p1", "mgmt0"} <= set(interfaces) and "bond0" in interfaces  # its own namespace's, not ours
    decided: dict[bool, list[float]] = {False: [], True: []}  # ms after the request, by the carrier's new state
    undecided: list[tuple[bool, float, float]] = []  # (up, ms after the request, the window's ms)
    up = True
    try:
        for _ in range(12):
            if min(len(v) for v in decided.values()) >= 2:
                break
            up = not up
            got: dict = {}
            waiter = threading.Thread(target=lambda: got.setdefault("s", agent.wait_link("p0", up, 5)))
            waiter.start()
            time.sleep(0.02)
            before = world.now_ns()
            world.set_extra_loss(port, 0.0 if up else float("inf"), before)
            waiter.join()
            state = got["s"]
            assert state.timed_out is False and state.method == "netlink", state
            change = _carrier_change(world, "host1.p0", up, before)
            assert state.t_ns >= change.t_ns - state.uncertainty_ns, (up, state, change)  # never before the request
            after_request_ms = (state.t_ns - change.t_ns) / 1e6
            after_ack_ms = (state.t_ns - change.detail["acked_ns"]) / 1e6
            assert after_ack_ms < 5.0, f"carrier {'up' if up else 'down'}: stamped {after_ack_ms:.1f} ms after the " \
                f"kernel acknowledged the change (late wherever in its window it fell)"
            if after_request_ms < 5.0:
                decided[up].append(after_request_ms)
            else:
                undecided.append((up, after_request_ms, (change.detail["acked_ns"] - change.t_ns) / 1e6))
            if up:  # carrier comes up only after the receiver's lock and bring-up (105 ms on this bench)
                assert (change.t_ns - before) / 1e9 >= 0.105
    finally:
        if up is False:  # the light back on at host1.p0, as the bench had it, whatever happened
            world.set_extra_loss(port, 0.0, world.now_ns())
            agent.wait_link("p0", True, 5)  # judged below, where no failure is already on its way
    assert min(len(v) for v in decided.values()) >= 2, \
        f"too few changes decided (on time: {decided}; undecided, as (up, ms after the request, window ms): {undecided})"
    assert agent.call("link", interface="p0")["carrier"] == 1


def _busbw(session, ranks: list[str], fabric: str, size: tuple[int, int], library: str = "ring") -> float:
    """The all-reduce's busbw (GB/s) at the largest size of one run of nccl-tests' output."""
    return run_sweep(session, "all_reduce", ranks, fabric, size, library=library).largest.out_of_place.busbw_best_gbps


def _fastest_reaches(run, predicted: float, what: str, first: float | None = None) -> list[float]:
    """The busbw of ``run()`` (GB/s) against the cost model's ``predicted`` for the rates shaped:
    the fastest of up to three runs, stopping at the first within 15% of it (fastest_of). A run
    can only fall short of the shaping: on a core another process takes (the tests beside this
    one), as one did once at 0.79 of the model in a clean-clone CI run; so a run above the
    shaping's 15% is red, and a rate shaped wrong misses it in every run. One short run never
    decides (a single sample against a fixed band would: a loaded core would turn it red).
    ``first``: a run already made."""
    made = [first] if first is not None else []
    measured = fastest_of(lambda: made.pop() if made else run(), lambda busbw: busbw >= predicted * 0.85)
    assert max(measured) <= predicted * 1.15, (what, measured, predicted)
    assert max(measured) == pytest.approx(predicted, rel=0.15), (what, measured, predicted)
    return measured


def test_traffic_follows_the_circuits_and_busbw_matches_the_cost_model(session):
    """nccl-tests' all-reduce, run for real on the three ranks, on the optical ring and on the
    electrical rack: its large-message busbw within 15% of what the cost model predicts for the
    rates shaped here; with the racks' uplinks halved, the electrical figure across racks follows
    the model to the halved rates (each the fastest of up to three runs: _fastest_reaches)."""
    backend = session.backend
    ranks = list(session.bench.job.ranks)
    session.stop_job()
    session.restore_baseline()

    for fabric in ("optical", "electrical"):
        size = (8 << 20, 8 << 20)  # one size: the largest the bench file sweeps
        first = _busbw(session, ranks, fabric, size)  # the optical fabric the model sees: the circuits it lit
        predicted = backend.predicted_busbw_gbps("all_reduce", ranks, size[0], fabric)
        _fastest_reaches(lambda: _busbw(session, ranks, fabric, size), predicted, fabric, first=first)
    ranks_e = ["host0", "host1", "host3"]  # the spare's rack is reached through the uplinks
    size = (4 << 20, 4 << 20)
    full = backend.predicted_busbw_gbps("all_reduce", ranks_e, size[0], "electrical")
    _fastest_reaches(lambda: _busbw(session, ranks_e, "electrical", size), full, "across racks")
    try:
        assert backend.scale_uplinks(0.5)
        halved = backend.predicted_busbw_gbps("all_reduce", ranks_e, size[0], "electrical")
        _fastest_reaches(lambda: _busbw(session, ranks_e, "electrical", size), halved, "across racks, uplinks halved")
    finally:
        backend.scale_uplinks(1.0)
    assert halved == pytest.approx(full / 2, rel=0.05), (full, halved)  # the model itself: the uplinks bound it


def _recover_with(defect: str) -> tuple:
    """A GPU failure on host1 recovered by a controller with ``defect``, the PyTorch job under
    torchrun at half of real time: the result, and every rank's last words once the job has given
    up. The job's NCCL timeout is 10 s, not the bench file's 30: its rendezvous and gloo's then
    give up after 5 s, not 15 (what these tests judge is the framework's words, not how long it
    waits), and a healthy step takes well under a second."""
    bench = load_bench(BENCH, defects=[defect], time_scale=0.5)
    bench = bench.model_copy(update={"job": bench.job.model_copy(update={"nccl_timeout_s": 10.0})})
    assert bench.netns.job == "torch"
    with BenchSession.open(bench) as session:
        ranks = list(bench.job.ranks)
        session.start_job(ranks)
        assert session.hosts[ranks[0]].wait_step(1, 90).reached
        controller = load_controller(session, ranks)
        controller.arm()
        fault_ns = Injector(session).inject(Fault("gpu_failure", "host1"))
        result = controller.recover(fault_ns)
        controller.disarm()
        words = job_last_words(session, list(result.plan.ranks_after), 30)
        session.stop_job()
    return result, words


def test_lead_only_restart_fails_at_torchruns_rendezvous_timeout():
    """A controller that restarts only the lead rank: the lead's torchrun waits in its static
    rendezvous for nodes that never come and fails at its timeout with the framework's words,
    which the controller's reason quotes (it no longer takes the old followers' exits for the
    new job's)."""
    result, words = _recover_with("lead_only_restart")
    assert result.status == "failed", result
    assert re.search(r"DistStoreError: Timed out after \d+ seconds waiting for clients. 1/3 clients joined", result.reason), \
        result
    assert any("DistStoreError" in line for line in words[result.plan.ranks_after[0]]), words


def test_a_follower_killed_after_the_restart_fails_the_others_through_the_framework():
    """Every rank restarted, then a follower's process killed: the controller sees it exit, and
    the other ranks give up in torchrun (its rendezvous times out) or gloo (the peer is gone),
    each in the framework's words."""
    result, words = _recover_with("follower_killed_after_restart")
    assert result.status == "failed" and "before its first step" in result.reason, result
    lead, killed = result.plan.ranks_after[0], result.plan.ranks_after[-1]
    others = [h for h in result.plan.ranks_after if h != killed]
    # The framework's words for a peer gone: torchrun's rendezvous timeout, or gloo's (which says
    # "Connection closed", "Connection reset", or "Failed to recv, got 0 bytes. Connection was
    # likely closed"). A rank that has said them may still be in torchrun's own teardown when the
    # words are read (a clean-clone CI run saw one 30 s after): what is judged is that it gave up.
    for host in others:
        said = " ".join(words[host])
        assert any(w in said for w in ("DistStoreError", "Connection closed", "Connection reset", "Failed to recv",
                                       "Timed out")), words
    assert lead in others


def test_gloo_and_mpi_bandwidth_tests_print_nccl_tests_output_over_the_circuits(session):
    """torch.distributed's all-reduce under torchrun and mpi4py's under mpirun, each printing
    nccl-tests' output: exact results, and gloo's one ring through the circuits carries about
    a link's shaped rate (within 15% of the cost model's one ring: _fastest_reaches)."""
    ranks = list(session.bench.job.ranks)
    session.stop_job()
    session.restore_baseline()
    size = (4 << 20, 4 << 20)
    for library in ("gloo", "mpi"):
        sweep = run_sweep(session, "all_reduce", ranks, "optical", size, library=library)
        assert sweep.result.total_wrong == 0, sweep.output
        assert sweep.library == library and ("gloo" if library == "gloo" else "Open MPI") in sweep.output
        if library == "gloo":
            settings = session.bench.collectives
            predicted = collective_cost("all_reduce", ranks, size[0], session.backend.fabric("optical", ranks),
                                        step_latency_us=settings.step_latency_us.value, rings=1).busbw_gbps
            _fastest_reaches(lambda: _busbw(session, ranks, "optical", size, "gloo"), predicted, "gloo",
                             first=sweep.largest.out_of_place.busbw_best_gbps)


def test_ssh_faults_end_in_a_recovery_or_a_clear_error_within_the_deadline(session):
    host = session.hosts["host2"]
    backend = session.backend
    assert host.call("clock") is not None
    backend.set_fault("host2", "drop")  # its ssh session is killed: the client starts a new one
    started = time.monotonic()
    assert host.call("hello")["backend"] == "emulated"
    assert time.monotonic() - started < session.bench.waits.opc_s
    backend.sshd["host2"].stop()  # sshd gone: a clear error naming the host, within the deadline
    backend.set_fault("host2", "drop")
    started = time.monotonic()
    with pytest.raises(InstrumentIOError, match="host2"):
        host.call("hello")
    assert time.monotonic() - started < 2 * session.bench.waits.opc_s + 5
    backend.sshd["host2"].start()  # and back: the next call gets through
    assert host.call("hello")["backend"] == "emulated"


def test_a_host_losing_power_loses_every_process_and_comes_back(session):
    """power_loss: every process in the host's namespace dies at once (its sshd, its agent's
    session, its job); the agent's next call is a clear error while the host is off, and a new
    session once its sshd is back."""
    backend, host = session.backend, session.hosts["host3"]
    assert backend.rack.pids("host3"), "nothing runs on host3: the test proves nothing"
    backend.set_fault("host3", "power_loss=3")
    assert backend.rack.pids("host3") == []
    with pytest.raises(InstrumentIOError, match="host3"):
        host.call("hello")
    assert backend.sshd["host3"].wait_up(20), "host3's sshd did not come back within 20 s"
    assert host.call("hello")["interfaces"], "the host came back, its agent did not"


def test_a_slow_management_link_slows_the_agents_replies(session):
    """mgmt_kbit: the host's management link shaped (tbf: once its small bucket is spent, replies
    queue), a slow agent link. Ten replies of the links' state cost seconds at 16 kbit/s."""
    agent = session.hosts["host0"]

    def ten_calls_s() -> float:
        started = time.monotonic()
        for _ in range(10):
            agent.call("links")
        return time.monotonic() - started

    fast = ten_calls_s()
    session.backend.set_fault("host0", "mgmt_kbit=16")
    try:
        slow = ten_calls_s()
    finally:
        session.backend.clear_faults("host0")
    assert slow > 1.0 and slow > 10 * fast, (fast, slow)
    assert ten_calls_s() < 1.0  # cleared


def _kill_9(proc: subprocess.Popen, mark: str) -> None:
    """Kill a run outright, as a power cut would: ``lumion-hil run`` and its pytest (in a
    session of its own), every process whose command line names the run's results folder."""
    os.killpg(proc.pid, signal.SIGKILL)
    killed = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if mark.encode() in f.read():
                        os.kill(int(entry), signal.SIGKILL)
                        killed.append(int(entry))
            except OSError:
                pass
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is delivered, not yet acted on


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _rack_of_run(run_pid: int) -> str | None:
    """The prefix of the rack a `lumion-hil run` (its pid) built, as the rack's state file says."""
    return next((state["prefix"] for state in rack_states(STATE_DIR, "lh-") if state.get("run_pid") == run_pid), None)


@pytest.mark.parametrize("killed", ["its process group", "every process of the run"])
def test_restore_after_kill_9_leaves_nothing_behind(tmp_path, killed):
    """A run killed outright mid-recovery: `lumion-hil run`'s own process group (its pytest, in a
    session of its own, is then sent SIGTERM and still stopping), or every process of the run
    (nothing left to stop: its namespaces, links and processes stay). When `lumion-hil bench
    restore` returns, nothing of the run is on the machine: its namespaces, its root links, any
    process in them (sshd, agents, jobs), and its scratch folder (the ssh keys among its files),
    listed here as the test looked for them. The run's rack is the one whose state file names the
    run: other racks on the machine (another run's) are not this test's to judge."""
    env = {k: v for k, v in os.environ.items() if k != "LUMION_HIL_RUN"}  # its own run, not one around this test
    proc = subprocess.Popen([sys.executable, "-m", "lumion_hil", "run", "--bench", str(BENCH), "--results",
                             str(tmp_path / "results"), "--no-report", "-q", "-k", "recovery_time and gpu_failure"],
                            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    prefix = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until its recovery restarted the job through ssh on the spare
            prefix = prefix or _rack_of_run(proc.pid)
            running = Rack.leftovers(prefix)["processes"] if prefix else []
            if any("python" in p for p in running if p.split()[1] == f"{prefix}-host3"):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the run restarted no job on its spare within 90 s (its rack: {prefix})")
    finally:
        if killed == "its process group":
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            _kill_9(proc, str(tmp_path / "results"))
    assert prefix is not None
    left = Rack.leftovers(prefix)
    assert left["netns"], "kill -9 left nothing: the test proves nothing"
    if killed == "every process of the run":  # nothing was left to remove its files
        assert left["folders"], "no scratch folder was left"
    out = subprocess.run([sys.executable, "-m", "lumion_hil", "bench", "restore", "--bench", str(BENCH)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    left = Rack.leftovers(prefix)  # at once: restore returns only once the bench is restored
    looked_for = {"namespaces": left["netns"], "root links": left["links"],
                  "processes in them (sshd, agents, jobs)": left["processes"],
                  "scratch folders (ssh keys, job logs, checkpoints)": left["folders"]}
    assert not any(looked_for.values()), f"rack {prefix}: still there after restore returned: {looked_for}"
