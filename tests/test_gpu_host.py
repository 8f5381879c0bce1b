"""GPU host agents: NVML (real library where it exists, the clear unavailable state where it
does not, the emulated one through the real backend), links, jobs, clock mapping."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types

import pynvml
import pytest

from lumion_hil.harness.config import load_bench
from lumion_hil.harness.session import BenchSession
from lumion_hil.harness.spares import host_lost
from lumion_hil.instruments.emulators.bench import EmulatedBench
from lumion_hil.instruments.emulators.nvml import FakeNvml
from lumion_hil.instruments.emulators.world_client import WorldClient
from lumion_hil.instruments.gpu_host.client import AgentClient, local_agent_argv, ssh_agent_argv
from lumion_hil.instruments.gpu_host.jobs import JobControl, JobError, fill_template
from lumion_hil.instruments.gpu_host.links import SysfsLinks
from lumion_hil.instruments.gpu_host.nvml_backend import NvmlGpus
from lumion_hil.instruments.protocols import AgentGone, InstrumentError, InstrumentIOError
from conftest import BENCHES, fastest_of


@pytest.fixture
def session():
    with BenchSession.open(load_bench(BENCHES / "emulated.yaml", time_scale=0.1)) as s:
        yield s


@pytest.mark.alone  # timing judged against the world's instant
def test_failed_gpu_shows_as_xid_within_milliseconds(session):
    agent = session.hosts["host1"]
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("event", agent.wait_xid(10)))
    waiter.start()
    time.sleep(0.1)  # let the wait reach NVML's event wait before the failure
    truth = session.world.fail_gpu("host1", 0, xid=79)
    waiter.join()
    event = got["event"]
    assert event.xid == 79 and event.uuid == session.world.gpus[("host1", 0)].uuid
    latency_ms = (event.t_ns - truth.t_ns) / 1e6
    assert -event.uncertainty_ns / 1e6 <= latency_ms < 50, latency_ms  # a few ms; generous for a loaded CI
    health = agent.health()
    assert health[0].lost is True and health[0].reason is not None and "fell off the bus" in health[0].reason


def test_no_xid_is_a_timeout_not_an_error(session):
    assert session.hosts["host0"].wait_xid(0.2) is None


@pytest.mark.alone  # timing judged against the world's instant
def test_cut_circuit_takes_carrier_down_at_the_worlds_instant(session):
    agent = session.hosts["host1"]
    assert agent.wait_link("p1", up=True, timeout_s=5).carrier == 1
    session.world.set_extra_loss(20, float("inf"))  # cut the fibre feeding host1.p1
    state = agent.wait_link("p1", up=False, timeout_s=5)
    assert state.carrier == 0 and state.operstate == "lowerlayerdown" and not state.timed_out
    cut = session.world.events_of("loss", "20")[-1].t_ns
    # The agent saw it when the host told it, as netlink would: within milliseconds of the cut.
    assert -state.uncertainty_ns <= state.t_ns - cut < 20_000_000 + state.uncertainty_ns
    counters = agent.links()[1]
    assert counters.carrier_down_count is not None and counters.carrier_down_count >= 1


@pytest.mark.alone  # timing judged against the world's instant
def test_clock_mapping_places_offset_host_events_within_the_uncertainty():
    bench = load_bench(BENCHES / "emulated.yaml", time_scale=0.1)
    offset = 7_300_000_000  # the host's clock runs 7.3 s ahead of the harness's
    with EmulatedBench(bench) as emulated:
        agent = AgentClient("host1", emulated.agent_argv("host1", "--clock-offset-ns", str(offset)))
        try:
            assert abs(agent.clock.offset_ns - offset) <= agent.clock.uncertainty_ns
            assert agent.clock.uncertainty_ns < 20_000_000
            emulated.world.connect(bench.safety.baseline)
            up = agent.wait_link("p1", up=True, timeout_s=5)
            truth = emulated.world.link_state("host1", "p1")[1]  # the world's instant, harness clock
            assert up.host_t_ns is not None  # the client keeps the host's own stamp
            seen_on_host = up.host_t_ns - offset  # the host stamped it on its own clock...
            assert 0 <= seen_on_host - truth < 20_000_000
            assert -up.uncertainty_ns <= up.t_ns - truth < 20_000_000 + up.uncertainty_ns  # ...mapped onto ours
        finally:
            agent.close()


def test_agent_without_nvml_says_so_clearly():
    agent = AgentClient("local", local_agent_argv())
    try:
        nvml = agent.hello["nvml"]
        try:
            pynvml.nvmlInit()
            real = True
        except pynvml.NVMLError:
            real = False
        if real:  # a machine with a driver: the real library answers
            assert nvml["available"] and agent.devices()
        else:
            assert nvml == {"available": False, "reason": nvml["reason"]}
            assert nvml["reason"].startswith("NVML not available: NVMLError_")
            with pytest.raises(InstrumentError, match="NVML not available"):
                agent.devices()
        assert agent.links(), "links are read even without NVML"
    finally:
        agent.close()


def test_fake_nvml_raises_the_real_error_classes(session):
    world = WorldClient(session.backend.world_service.address)
    fake = FakeNvml(world, "host2")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    gpus = NvmlGpus(fake)
    session.world.fail_gpu("host2", 0, xid=79)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(0))
    assert gpus.health()[0]["lost"] is True


def test_backend_reports_a_missing_library_as_unavailable():
    class NoLibrary:
        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    gpus = NvmlGpus(NoLibrary())
    assert gpus.status() == {"available": False, "reason": "NVML not available: NVMLError_LibraryNotFound: "
                                                            "NVML Shared Library Not Found"}


def test_ecc_double_bit_error_is_counted(session):
    session.world.fail_gpu("host0", 0, xid=48)
    health = session.hosts["host0"].health()[0]
    assert health.ecc_uncorrected_volatile == 1 and health.remapped_rows is not None
    assert health.remapped_rows["uncorrectable"] == 1


def test_agent_that_dies_is_a_clear_error_or_is_started_again_for_a_read(session):
    agent = AgentClient("host3", session.backend.agent_argv("host3"))
    agent._proc.kill()
    agent._proc.wait()
    with pytest.raises(AgentGone, match="host3: 'job_stop': the agent is not running"):
        agent.stop_job()  # it changes the host: never sent again blindly
    agent._proc.kill()
    agent._proc.wait()
    assert agent.health()[0].index == 0 and agent.restarts == 1  # a read: started again, asked again
    agent.argv = ["no-such-python", "-m", "lumion_hil.agent"]  # the host is gone for good
    agent._proc.kill()
    agent._proc.wait()
    with pytest.raises(AgentGone, match="host3: 'health': the agent is not running .*starting it again failed"):
        agent.health()
    agent.close()


def test_a_host_is_lost_when_its_agent_is_gone_not_when_it_is_slow():
    """What the controller reads as a lost host: a GPU that says so, or an agent whose process
    ended (by its kind of error, not its words). An agent that did not answer in time, or said
    no, may still be a spare."""

    class Host:
        def __init__(self, error):
            self.error = error

        def health(self):
            raise self.error

    def lost(error) -> bool:
        return host_lost(types.SimpleNamespace(hosts={"host3": Host(error)}), "host3")

    assert lost(AgentGone("host3", "health", "the agent is not running (exit 255): no output"))
    assert not lost(InstrumentIOError("host3", "health", "no reply from the agent within 5 s"))
    assert not lost(InstrumentError("host3", "health", "agent error NVMLError: the agent is not running"))


def test_the_reader_of_an_ended_agent_wakes_only_the_calls_made_to_it(session):
    """A restarted agent's first request was once woken by the old process's reader, which came to
    the end of its output late (on a busy core, after the restart), and read as the new agent gone
    too: "starting it again failed: the agent is not running (exit None)". The reader of an ended
    process wakes the calls made to that process only."""
    from lumion_hil.instruments.gpu_host.client import _Slot

    agent = AgentClient("host3", session.backend.agent_argv("host3"))
    try:
        ended = subprocess.Popen([sys.executable, "-c", ""], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        ended.wait()
        to_ended, to_live = _Slot(ended), _Slot(agent._proc)
        with agent._lock:
            agent._pending[-1], agent._pending[-2] = to_ended, to_live
        agent._read(ended)  # its reader, at the end of its output
        assert to_ended.done.is_set() and to_ended.reply is None
        assert not to_live.done.is_set()
        assert agent.health()[0].index == 0 and agent.restarts == 0  # the live agent answers, as it is
    finally:
        with agent._lock:
            agent._pending.pop(-1, None)
            agent._pending.pop(-2, None)
        ended.stdout.close()
        agent.close()


def test_agent_whose_new_session_dies_at_once_is_a_clear_error_not_a_hang(session):
    """What ssh does when the host's sshd is down: the session starts, then ends at once (exit
    255). Starting it again must not start it again from inside its own start (a lock held)."""
    agent = AgentClient("host3", session.backend.agent_argv("host3"))
    agent.argv = [sys.executable, "-c", "import sys; sys.exit(255)"]
    agent._proc.kill()
    agent._proc.wait()
    done: dict = {}

    def read() -> None:
        try:
            agent.health()
        except InstrumentError as exc:
            done["error"] = str(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive(), "the call hung"
    assert "host3: 'health': the agent is not running" in done["error"] and "starting it again failed" in done["error"]
    agent.close()


def test_agent_that_cannot_start_is_a_clear_error():
    with pytest.raises(InstrumentError, match="host9: 'no-such-python -m lumion_hil.agent': cannot start"):
        AgentClient("host9", local_agent_argv("no-such-python"))


def test_template_arguments_are_lists_never_a_shell():
    argv = fill_template(["run", "--rank={rank}", "{master_addr}", '{"lr": 1}'], {"rank": 1, "master_addr": "a; rm -rf /"})
    assert argv == ["run", "--rank=1", "a; rm -rf /", '{"lr": 1}']
    with pytest.raises(JobError, match=r"uses \{heartbeat\} but no value"):
        fill_template(["--hb={heartbeat}"], {})
    with pytest.raises(JobError, match="unknown template fields"):
        fill_template(["x"], {"shell": "yes"})
    with pytest.raises(JobError, match="non-empty list"):
        fill_template("python train.py", {})


def test_job_progress_from_output_and_stop(tmp_path):
    jobs = JobControl(str(tmp_path))
    script = ("import json,sys,time\n"
              "for i in range(1, 4):\n"
              "    print(json.dumps({'step': i, 'step_time_s': 0.01, 'samples_per_s': 800, 't_monotonic_ns': 1234}), flush=True)\n"
              "time.sleep(0.2)\n"
              "print('step 4', flush=True)\n"
              "time.sleep(60)\n")
    jobs.start([sys.executable, "-c", script, "{rank}"], {"rank": 0})
    before = time.monotonic_ns()
    stamped = jobs.wait_step(3, timeout_s=20)["progress"]
    # Stamped when the agent read the line, from outside the job; the job's own claim kept beside it.
    assert stamped["stamped_by"] == "agent" and stamped["claimed_ns"] == 1234
    assert before - 10**9 <= stamped["t_ns"] <= time.monotonic_ns()
    assert [step for step, _ in jobs.steps()] == [1, 2, 3]
    status = jobs.wait_step(4, timeout_s=20)
    assert status["reached"] and status["running"] and status["progress"]["step"] == 4
    assert status["progress"]["stamped_by"] == "agent"
    stopped = jobs.stop(timeout_s=5)
    assert not stopped["running"] and stopped["returncode"] is not None
    log = (tmp_path / "rank0.log").read_text().splitlines()
    assert json.loads(log[0])["step"] == 1


@pytest.mark.alone  # timing judged against the job's own 70 ms
def test_stopping_a_job_returns_as_it_ends_not_at_the_next_look(tmp_path):
    """A job that takes 70 ms to end after SIGTERM (a launcher taking its workers down): stop
    returns as it ends. Popen's own wait with a timeout looks at 0.5, 1.5, 3.5 ... 63.5 ms, then
    at 113.5 ms: it would see this end 43 ms late, and a recovery that restarts the job would pay
    that as the controller's own time.

    A busy machine only makes a stop return later, never sooner: so the fastest of up to three
    stops (each of a job of its own) is judged, stopping at the first under 100 ms. A stop that
    looks at 113.5 ms is never under it, however quiet the machine; a stop woken by the end is
    judged red only if three stops in a row each come back 30 ms late. No stop returns before
    the job has ended (70 ms), on any machine."""
    jobs = JobControl(str(tmp_path))
    script = ("import json,os,signal,time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.07), os._exit(0)))\n"
              "print(json.dumps({'step': 1, 'step_time_s': 0.01, 'samples_per_s': 1}), flush=True)\n"
              "time.sleep(60)\n")

    def one_stop() -> float:
        jobs.start([sys.executable, "-c", script, "{rank}"], {"rank": 0})
        assert jobs.wait_step(1, timeout_s=20)["reached"]
        started = time.monotonic()
        stopped = jobs.stop(timeout_s=5)
        took = time.monotonic() - started
        assert not stopped["running"] and stopped["returncode"] == 0
        assert took >= 0.07, f"stop returned {took * 1e3:.1f} ms after SIGTERM, before the job's 70 ms end"
        return took

    took = fastest_of(one_stop, lambda s: s < 0.1)
    assert min(took) < 0.1, \
        f"stops returned {[round(t * 1e3, 1) for t in took]} ms after SIGTERM; the job took 70 ms to end"


def test_a_jobs_start_events_and_last_words_as_the_job_interface_says(tmp_path):
    """What a PyTorch job under torchrun prints, read as the job interface says: torchrun's
    rendezvous line and the job's own events in order (an event that names a checkpoint's step
    is not a step done), and the lines that say why it failed kept apart from a launcher's
    report after them."""
    jobs = JobControl(str(tmp_path))
    lines = ['{"event": "process_started", "rank": 0}',
             "I1203 10:28:36.073000 22123 torch/distributed/elastic/agent/server/api.py:553] [default] Rendezvous "
             "complete for workers. Result:",
             '{"event": "communicator_ready", "rank": 0, "backend": "gloo"}',
             '{"event": "checkpoint_loaded", "rank": 0, "step": 40, "path": "/ckpt/step-40.pt"}',
             '{"step": 1, "global_step": 41}',
             '{"event": "checkpoint_saved", "rank": 0, "step": 42, "path": "/ckpt/step-42.pt"}',
             "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [198.19.3.12]:4",
             *[f"torchrun's report, line {i}" for i in range(8)]]
    script = "import sys\nfor line in sys.argv[1:]:\n    print(line, flush=True)\nsys.exit(1)\n"
    jobs.start([sys.executable, "-c", script, *lines], {})
    status = jobs.wait_step(10**6, timeout_s=20)
    assert not status["running"] and status["returncode"] == 1
    assert [e["event"] for e in jobs.events()] == ["process_started", "rendezvous", "communicator_ready",
                                                  "checkpoint_loaded", "checkpoint_saved"]
    assert [e["step"] for e in jobs.events("checkpoint_loaded")] == [40]
    assert [step for step, _ in jobs.steps()] == [1]  # not 40, nor 42
    assert status["error_lines"] == [lines[6]] and lines[6] not in status["last_lines"]


def test_an_earlier_jobs_last_output_is_not_the_next_jobs(tmp_path):
    """A stopped job's output can still be in its pipe (here a child outside its process group
    holds it open and writes a step) when the next job starts: that step and that end belong to
    the earlier job. Seen on the namespaced bench under load: a restarted job read as exited at
    once, with no output ("it exited: "), or as having stepped before it had."""
    jobs = JobControl(str(tmp_path))
    marker = tmp_path / "late-step-written"
    late = "import sys,time; time.sleep(0.3); print('step 9', flush=True); open(sys.argv[1], 'w').close()"
    script = ("import subprocess,sys,time\n"
              f"subprocess.Popen([sys.executable, '-c', {late!r}, {str(marker)!r}], start_new_session=True)\n"
              "print('step 1', flush=True)\n"
              "time.sleep(60)\n")
    jobs.start([sys.executable, "-c", script], {"rank": 0})
    assert jobs.wait_step(1, timeout_s=20)["reached"]
    jobs.stop(timeout_s=5)
    jobs.start([sys.executable, "-c", "import time; time.sleep(60)"], {"rank": 0})
    try:
        deadline = time.monotonic() + 20
        # until the earlier job's reader has read its pipe to the end (the child's step, then EOF)
        while len([t for t in threading.enumerate() if t.name == "job-output"]) > 1 or not marker.exists():
            assert time.monotonic() < deadline, "the earlier job's pipe never closed"
            time.sleep(0.01)
        status = jobs.status()
        assert status["running"] and status["exit_ns"] is None, status
        assert status["progress"] == {} and status["last_lines"] == [], status
        assert jobs.wait_step(1, timeout_s=0.05)["timed_out"]
        assert "step 9" in (tmp_path / "rank0.log").read_text()  # kept in the log, where it was written
    finally:
        jobs.stop(timeout_s=5)


def test_job_restart_on_a_new_rank_map(session):
    ranks = ["host0", "host1", "host2"]
    session.start_job(ranks)
    assert session.hosts["host2"].wait_step(1, 30).reached
    session.stop_job()
    new_ranks = ["host0", "host3", "host2"]
    session.switch.replace_all(_ring_circuits(session.bench, new_ranks))
    session.start_job(new_ranks)
    status = session.hosts["host3"].wait_step(1, 30)
    assert status.reached, status
    assert status.argv is not None and "--ranks" in status.argv and "host0,host3,host2" in status.argv


def _ring_circuits(bench, ranks):
    pairs = []
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        na, nb = bench.host(a).nics[0], bench.host(b).nics[1]
        pairs += [(na.tx_port, nb.rx_port), (nb.tx_port, na.rx_port)]
    return pairs


def test_sysfs_links_read_a_tree_and_wait_for_a_change(tmp_path):
    nic = tmp_path / "ens1f0"
    nic.mkdir()
    for name, value in (("carrier", "0"), ("operstate", "down"), ("carrier_changes", "3"),
                        ("carrier_up_count", "1"), ("carrier_down_count", "2")):
        (nic / name).write_text(value + "\n")
    links = SysfsLinks(str(tmp_path))
    assert links.interfaces() == ["ens1f0"]
    assert links.state("ens1f0")["carrier"] == 0 and links.state("ens1f0")["carrier_changes"] == 3

    def link_comes_up():  # stands in for the kernel
        time.sleep(0.05)
        (nic / "operstate").write_text("up\n")
        (nic / "carrier").write_text("1\n")

    threading.Thread(target=link_comes_up).start()
    state = links.wait("ens1f0", up=True, timeout_s=5)
    assert state["carrier"] == 1 and not state["timed_out"] and state["method"] == "polling"
    with pytest.raises(KeyError, match="no interface 'eth9'"):
        links.state("eth9")


def test_real_sysfs_loopback_is_readable_and_waits_by_netlink():
    links = SysfsLinks()
    if "lo" not in links.interfaces():
        pytest.skip("no /sys/class/net/lo here")
    state = links.wait("lo", up=True, timeout_s=1)
    assert state["operstate"] in ("unknown", "up") and state["method"] in ("netlink", "polling")


def test_ssh_agent_command_is_a_list():
    assert ssh_agent_argv("lab@gpu-a", "/opt/venv/bin/python") == [
        "ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "lab@gpu-a",
        "/opt/venv/bin/python", "-m", "lumion_hil.agent"]


# An agent's session that ends as ssh's does when the far end kills it: its output ends at once,
# and its process lingers a moment, stdin still open. Its first run serves through a real agent;
# a later one (the session started again) is the agent itself.
LINGERING_SESSION = r"""
import os, subprocess, sys, threading, time
first, drop = sys.argv[1], sys.argv[2]
if os.path.exists(first):
    os.execv(sys.executable, [sys.executable, "-m", "lumion_hil.agent"])
open(first, "w").close()
agent = subprocess.Popen([sys.executable, "-m", "lumion_hil.agent"], stdout=subprocess.PIPE)

def copy():
    for line in agent.stdout:
        try:
            os.write(1, line)
        except OSError:
            return

threading.Thread(target=copy, daemon=True).start()
while not os.path.exists(drop):
    time.sleep(0.01)
agent.kill()
os.close(1)
time.sleep(5)
"""


def test_a_call_after_the_agents_output_ended_starts_its_session_again_at_once(tmp_path):
    """The namespaced bench's ssh drop, beside a busy core (perf/flakes.py, 1 run in 5): the
    client's reader saw the session's output end and woke the calls waiting then; a call made
    after that was written into the dying session's stdin and waited its whole timeout for a
    reply that could not come. It now finds the session gone and, read-only, starts it again."""
    script = tmp_path / "lingering_session.py"
    script.write_text(LINGERING_SESSION)
    drop = tmp_path / "drop"
    agent = AgentClient("host5", [sys.executable, str(script), str(tmp_path / "first"), str(drop)], timeout_s=5)
    try:
        drop.touch()
        deadline = time.monotonic() + 10
        while agent._proc not in agent._silent and time.monotonic() < deadline:  # its reader met the end
            time.sleep(0.01)
        assert agent._proc in agent._silent and agent.alive, "the session must linger, output ended: the case here"
        assert "nvml" in agent.call("hello")  # not "no reply from the agent within 5 s"
        assert agent.restarts == 1
        assert not agent._silent  # the ended session is forgotten once replaced
    finally:
        agent.close()
