"""The fork server an emulated host's agent starts its ranks from (instruments/emulators/forkserver.py):
a forked rank behaves as the fresh process it stands for (``python -m MODULE ARGS``: its argv,
environment, folder, session, output and exit status), it does not import again what the server
has imported, and what the server does not fork is started as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lumion_hil.instruments.emulators.forkserver import ForkedProcess, ForkServer
from lumion_hil.instruments.gpu_host.jobs import JobControl

PROGRAM = textwrap.dedent("""\
    import json, os, sys, time
    import fs_heavy  # noqa: F401  (what the server imports once)
    if __name__ == "__main__":
        print(json.dumps({"argv": sys.argv[1:], "env": os.environ.get("FS_TEST"), "cwd": os.getcwd(),
                          "pid": os.getpid(), "sid": os.getsid(0), "name": __name__}), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        mode = sys.argv[1] if len(sys.argv) > 1 else "exit"
        if mode == "raise":
            raise RuntimeError("the job broke")
        if mode == "resolve":  # what resolving an address imports on first use, in this process
            before = set(sys.modules)
            import socket
            socket.getaddrinfo("127.0.0.1", 80)
            print(json.dumps(sorted(set(sys.modules) - before)), flush=True)
        if mode == "wait":
            time.sleep(60)
        if mode == "steps":
            for step in range(1, 4):
                print(json.dumps({"step": step}), flush=True)
            time.sleep(60)
        sys.exit(int(mode) if mode.isdigit() else 0)
""")


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A program and a module it imports, which writes a line to a file each time it is imported."""
    (tmp_path / "fs_prog.py").write_text(PROGRAM)
    imports = tmp_path / "imports.txt"
    (tmp_path / "fs_heavy.py").write_text(f"open({str(imports)!r}, 'a').write('imported\\n')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the server and the fresh processes find them
    return imports


@pytest.fixture
def server(modules):
    forks = ForkServer(("fs_prog",)).start(preload=("fs_prog",))
    assert forks.ready(10)
    yield forks
    forks.close()


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fs_prog", *args]


def _run(proc) -> tuple[list[str], int]:
    out = proc.stdout.read().decode().splitlines()
    return out, proc.wait(10)


def test_a_forked_rank_is_the_process_it_stands_for(server, modules, tmp_path):
    proc = server.popen(_argv("7", "--flag"), {**os.environ, "FS_TEST": "given"}, cwd=str(tmp_path))
    assert isinstance(proc, ForkedProcess), "a module the server has: forked"
    lines, status = _run(proc)
    seen = json.loads(lines[0])
    assert seen["argv"] == ["7", "--flag"] and seen["name"] == "__main__"
    assert seen["env"] == "given" and seen["cwd"] == str(tmp_path)
    assert seen["pid"] == proc.pid != os.getpid() and seen["sid"] == proc.pid, "a session of its own, as Popen's"
    assert lines[1] == "to stderr", "stderr on the same pipe"
    assert status == 7 and proc.poll() == 7


def test_a_forked_rank_fails_and_dies_as_a_fresh_one_does(server):
    lines, status = _run(server.popen(_argv("raise"), dict(os.environ)))
    assert status == 1 and lines[-1] == "RuntimeError: the job broke" and "Traceback" in "\n".join(lines)
    proc = server.popen(_argv("wait"), dict(os.environ))
    proc.stdout.readline()
    os.killpg(proc.pid, signal.SIGTERM)  # as the agent stops a job
    assert proc.wait(10) == -signal.SIGTERM
    waiting = server.popen(_argv("wait"), dict(os.environ))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(0.2)
    finally:  # not left sleeping its minute after the test (the server does not end its ranks)
        os.killpg(waiting.pid, signal.SIGKILL)
        waiting.wait(10)


def test_ranks_are_forked_from_what_the_server_imported_once(server, modules):
    for _ in range(3):
        assert _run(server.popen(_argv(), dict(os.environ)))[1] == 0
    assert modules.read_text().splitlines() == ["imported"], "imported by the server alone, not by each rank"
    fresh = subprocess.run(_argv(), capture_output=True, env=dict(os.environ))
    assert fresh.returncode == 0 and modules.read_text().splitlines() == ["imported"] * 2


def test_a_forked_rank_resolves_an_address_without_importing_anything(server):
    """getaddrinfo imports the IDNA codec the first time a process calls it (about 2 ms of CPU):
    a fork server that has not imported it pays that in every rank that connects anywhere."""
    lines, status = _run(server.popen(_argv("resolve"), dict(os.environ)))
    assert status == 0 and json.loads(lines[-1]) == [], lines
    fresh = subprocess.run(_argv("resolve"), capture_output=True, text=True, env=dict(os.environ))
    assert "encodings.idna" in json.loads(fresh.stdout.splitlines()[-1]), "a fresh interpreter imports it: the test shows something"


def test_the_first_rank_starts_fresh_and_starts_the_server_for_the_next(modules):
    forks = ForkServer(("fs_prog",))
    try:
        first = forks.popen(_argv(), dict(os.environ))
        assert isinstance(first, subprocess.Popen), "no server yet: the rank does not wait for one"
        assert _run(first)[1] == 0
        assert forks.ready(10), "the first rank started the server"
        later = forks.popen(_argv(), dict(os.environ))
        assert isinstance(later, ForkedProcess) and _run(later)[1] == 0
        assert modules.read_text().splitlines() == ["imported"] * 2, "the fresh rank, then the server once"
    finally:
        forks.close()


def test_an_agent_that_starts_no_rank_starts_no_server(modules):
    forks = ForkServer(("fs_prog",))
    assert forks.popen([sys.executable, "-c", "pass"], dict(os.environ)).wait(10) == 0
    assert forks._proc is None and not forks.ready(0)


def test_what_the_server_does_not_fork_is_started_fresh(server):
    other = server.popen([sys.executable, "-c", "print('plain')"], dict(os.environ))
    assert isinstance(other, subprocess.Popen) and _run(other) == (["plain"], 0)
    elsewhere = server.popen(["/bin/sh", "-c", "echo shell"], dict(os.environ))
    assert isinstance(elsewhere, subprocess.Popen) and _run(elsewhere) == (["shell"], 0)


def test_job_control_follows_and_stops_a_forked_rank(server, tmp_path):
    jobs = JobControl(str(tmp_path / "logs"), popen=server.popen)
    started = jobs.start(_argv("steps"), {"rank": 0})
    assert jobs.wait_step(3, 10)["reached"]
    assert [s for s, _ in jobs.steps()] == [1, 2, 3]
    status = jobs.stop(timeout_s=5)
    assert not status["running"] and status["returncode"] == -signal.SIGTERM and status["pid"] == started["pid"]
    assert "to stderr" in (tmp_path / "logs" / "rank0.log").read_text()


def test_a_rank_is_started_fresh_once_the_server_has_gone(server):
    server._proc.kill()
    with server._replied:  # its end read by the agent's side
        assert server._replied.wait_for(lambda: server._gone, 5)
    proc = server.popen(_argv(), dict(os.environ))
    assert isinstance(proc, subprocess.Popen) and _run(proc)[1] == 0
