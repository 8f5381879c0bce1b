"""Start one program on many hosts at once over plain ssh, as ``mpirun -H h0,h1,h2`` would:

    python -m lumion_hil.instruments.emulators.launch --ssh-config FILE \\
        --hosts root@198.18.7.1,root@198.18.7.2 [--env K=V ...] [--timeout S] -- PROGRAM ARGS...

Rank i runs ``env LUMION_HIL_RANK=i LUMION_HIL_WORLD_SIZE=n K=V ... PROGRAM ARGS`` on the i-th
host, under a small Python wrapper that ends the program (and whatever it started) when its ssh
session ends: the launcher ends a rank by closing that session, and a launcher that dies takes
its ranks with it.
"""

from __future__ import annotations

import argparse
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

# Runs on each host (any python3): the program in a process group of its own, sent SIGTERM and
# then SIGKILL when stdin (the ssh session) closes or the wrapper is signalled; whatever the
# program left behind is killed when it exits. Exits with the program's status (128+N for
# signal N), 127 if it cannot be started.
WRAPPER = """\
import os, signal, subprocess, sys, threading
try:
    p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, start_new_session=True)
except OSError as e:
    sys.exit(print("launch:", sys.argv[1] + ":", e.strerror, file=sys.stderr) or 127)
def kill(sig):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
def end():
    kill(signal.SIGTERM)
    try:
        p.wait(3)
    except subprocess.TimeoutExpired:
        kill(signal.SIGKILL)
def watch():
    while os.read(0, 4096):
        pass
    end()
threading.Thread(target=watch, daemon=True).start()
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, lambda *_: kill(signal.SIGTERM))
code = p.wait()
kill(signal.SIGKILL)
sys.exit(code if code >= 0 else 128 - code)
"""

END_GRACE_S = 5.0  # a rank whose session was closed must be gone by then (the wrapper waits 3 s)
TIMED_OUT = 124  # as timeout(1)

USAGE = ("python -m lumion_hil.instruments.emulators.launch --ssh-config FILE --hosts DEST,DEST,... "
         "[--env K=V]... [--timeout S] [--python PY] -- PROGRAM [ARGS...]")


class _Signalled(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lumion_hil.instruments.emulators.launch", usage=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start PROGRAM on every host at once through ssh, one rank per host (rank i on the i-th "
                    "of --hosts),\nwith LUMION_HIL_RANK and LUMION_HIL_WORLD_SIZE in its environment.",
        epilog="Output: rank 0's stdout is this program's stdout (other ranks' stdout is dropped); every rank's "
               "stderr\ncomes out on stderr, each line prefixed with [rank N].\n\n"
               "Ending: waits for every rank and exits 0, or with the status of the first rank that fails (255: "
               "ssh\nitself failed). When a rank fails, at --timeout (exit 124), or on SIGTERM/SIGINT (exit "
               "128+N), every\nother rank is ended: its ssh session is closed, and the wrapper on its host kills "
               "the program\n(SIGTERM, then SIGKILL after 3 s) and everything it started. The wrapper needs "
               "--python on each host.")
    p.add_argument("--ssh-config", required=True, metavar="FILE", help="ssh_config for `ssh -F` (keys, known hosts)")
    p.add_argument("--hosts", required=True, metavar="DEST,...", help="ssh destinations (user@address), one per rank")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set in every rank's environment")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="end every rank after this long (exit 124)")
    p.add_argument("--python", default="python3", metavar="PY", help="the hosts' python for the wrapper (python3)")
    return p


def remote_command(program: list[str], rank: int, world_size: int, env: list[str], python: str = "python3") -> str:
    """The shell line ssh runs on rank ``rank``'s host."""
    return shlex.join(["env", f"LUMION_HIL_RANK={rank}", f"LUMION_HIL_WORLD_SIZE={world_size}", *env,
                       python, "-c", WRAPPER, *program])


def _forward_stderr(rank: int, stream, lock: threading.Lock) -> None:
    prefix = f"[rank {rank}] ".encode()
    for line in stream:
        with lock:
            sys.stderr.buffer.write(prefix + line + (b"" if line.endswith(b"\n") else b"\n"))
            sys.stderr.buffer.flush()


def _say(message: str) -> None:
    print(f"launch: {message}", file=sys.stderr, flush=True)


def _status(code: int) -> int:
    return code if code >= 0 else 128 - code


def _end(procs: list[subprocess.Popen]) -> None:
    """Close every rank's session (its stdin first, so the wrapper ends the program cleanly)."""
    for proc in procs:
        assert proc.stdin is not None  # every rank is started with stdin=PIPE
        try:
            proc.stdin.close()
        except OSError:
            pass
    deadline = time.monotonic() + END_GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # the connection closes: the wrapper sees its stdin end all the same
            proc.wait()


def launch(ssh_config: str, hosts: list[str], program: list[str], env: Sequence[str] = (),
           timeout_s: float | None = None, python: str = "python3") -> int:
    """Run ``program`` on every host; the exit status (see the module's help)."""
    def on_signal(signum, _frame):
        raise _Signalled(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    procs: list[subprocess.Popen] = []
    readers = []
    done: queue.Queue = queue.Queue()
    lock = threading.Lock()
    status = 0
    try:
        for rank, host in enumerate(hosts):
            argv = ["ssh", "-F", ssh_config, host, remote_command(program, rank, len(hosts), list(env), python)]
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=None if rank == 0 else subprocess.DEVNULL,
                                        stderr=subprocess.PIPE,
                                        start_new_session=True)  # Ctrl-C reaches the launcher, which ends the ranks
            except OSError as exc:
                _say(f"cannot start ssh for rank {rank}: {exc.strerror or exc}")
                status = 127
                break
            procs.append(proc)
            readers.append(threading.Thread(target=_forward_stderr, args=(rank, proc.stderr, lock), daemon=True))
            readers[-1].start()
            threading.Thread(target=lambda r=rank, p=proc: done.put((r, p.wait())), daemon=True).start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        waiting = len(procs) if status == 0 else 0  # ssh could not be started: end those that were
        for _ in range(waiting):
            try:
                rank, code = done.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _say(f"timed out after {timeout_s:g} s; ending every rank")
                status = TIMED_OUT
                break
            if code != 0:
                readers[rank].join(timeout=1)  # its last words first
                status = _status(code)
                why = " (ssh failed: host unreachable or session lost)" if code == 255 else ""
                _say(f"rank {rank} ({hosts[rank]}) exited with status {status}{why}; ending the other ranks")
                break
    except _Signalled as sig:
        _say(f"got {signal.Signals(sig.signum).name}; ending every rank")
        status = 128 + sig.signum
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # the ranks are being ended: let that finish
        _end(procs)
        for reader in readers:
            reader.join(timeout=1)
        for s, handler in old.items():
            signal.signal(s, handler)
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    program = argv[split + 1:]
    if not program:
        p.error("give the program to run after --")
    hosts = [h for h in args.hosts.split(",") if h]
    if not hosts:
        p.error("--hosts: no host given")
    for item in args.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item, re.S):
            p.error(f"--env {item!r}: not NAME=VALUE")
    return launch(args.ssh_config, hosts, program, args.env, args.timeout, args.python)


if __name__ == "__main__":
    sys.exit(main())
