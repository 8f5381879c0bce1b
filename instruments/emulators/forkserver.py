"""Ranks of the emulated jobs started from an already-imported parent, as multiprocessing's
forkserver and Android's zygote start theirs: an emulated host's agent asks its fork server for
``python -m MODULE ARGS`` and gets a forked copy of a process that has imported MODULE once,
instead of a fresh interpreter that imports it again. A restarted rank then costs a fork and its
own work, not an interpreter's start-up and imports (about 50 ms of CPU for the emulated job,
twice that for the ring job and numpy), which is what most of a failure sequence cost.

To the agent a forked rank is a process like any other (:class:`ForkedProcess`, the part of
:class:`subprocess.Popen` that instruments/gpu_host/jobs.py uses): its own pid, session and
process group (``start_new_session``), its stdout and stderr on the agent's pipe, stdin from
/dev/null, the environment and working folder it was given, its exit status as Popen reports it
(negative for a signal). The agent signals it and reads its output as before; only its start
differs. The program runs as ``python -m`` runs it: as ``__main__`` with ``sys.argv`` set, its
exit status from ``sys.exit`` or 1 with the traceback for an uncaught exception.

The server is one single-threaded process per agent (a fork of a threaded process could inherit
a lock held by another thread), started beside the agent; it imports a module the first time a
rank of it is asked for, so a host never imports what its bench does not run. It forks only
programs of its own interpreter and of the modules it was given (``modules``); anything else is
started by the agent as before. When the agent goes, the server goes (its ranks, in sessions of
their own, are the agent's to end, as before).

Protocol, on a Unix socket pair (SOCK_SEQPACKET, one message a packet): the agent sends
``{"argv": [...], "env": {...}, "cwd": "..."}`` with the pipe's write end attached (SCM_RIGHTS);
the server answers ``{"pid": N}`` or ``{"error": "..."}``, and later ``{"exited": N, "status": S}``
as each rank ends (waited for through a pidfd: no polling, no signal handler)."""

from __future__ import annotations

import array
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
from typing import Sequence

_MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def _receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors it carried; (None, []) once the other side has gone."""
    data, ancdata, _flags, _addr = sock.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(4 * 4))
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)


class ForkedProcess:
    """A rank the fork server started: what the agent's job control uses of Popen."""

    def __init__(self, server: "ForkServer", pid: int, stdout):
        self._server, self.pid, self.stdout = server, pid, stdout
        self.args: list[str] | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _exited(self, status: int) -> None:
        self.returncode = status
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            assert timeout is not None  # a wait without one returns only once the rank has ended
            raise subprocess.TimeoutExpired(self.args or [str(self.pid)], timeout)
        assert self.returncode is not None  # set before _ended
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """The agent's side. :meth:`popen` starts a rank: forked once the server is up and has
    imported the rank's module, else (the first rank, or one the server does not fork) as a
    fresh process, as before; the first rank of a module it forks starts the server, which
    imports that module meanwhile. A start never waits for the server, and an agent that never
    starts a rank never starts one."""

    def __init__(self, modules: tuple[str, ...]):
        self.modules = tuple(modules)
        self._lock = threading.Lock()  # one spawn at a time: its reply is the next non-exit message
        self._reply: list = []
        self._replied = threading.Condition()
        self._procs: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits read before the spawn that made them had returned
        self._ready = threading.Event()  # the server is up, its modules imported
        self._gone = False
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

    def start(self, preload: tuple[str, ...] = ()) -> "ForkServer":
        """Start the server's process (if it is not), importing ``preload`` first."""
        with self._lock:
            if self._sock is None:
                self._start(preload)
        return self

    def ready(self, timeout_s: float) -> bool:
        """Until the server is up and has imported what it was started with."""
        return self._ready.wait(timeout_s)

    def _start(self, preload: tuple[str, ...]) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        modules = [arg for module in preload for arg in ("--preload", module)]
        # (its stdout is not the agent's: that is the agent's line to the harness)
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, "--fd", str(theirs.fileno()), *modules],
                                      pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        threading.Thread(target=self._read, args=(self._sock,), daemon=True, name="fork-server").start()

    def forks(self, argv: list[str]) -> bool:
        """Whether this server starts ``argv`` (``python -m MODULE ...`` of one of its modules)."""
        return (not self._gone and len(argv) >= 3 and argv[1] == "-m" and argv[2] in self.modules
                and os.path.realpath(argv[0]) == os.path.realpath(sys.executable))

    def popen(self, argv: list[str], env: dict, cwd: str | None = None):
        """Start ``argv`` as a rank: forked where this server can and is ready, else a fresh
        process (starting the server for the next ones); both in a session of their own, output
        on one pipe."""
        if self.forks(argv):
            if self._ready.is_set():
                try:
                    return self.spawn(argv, env, cwd)
                except OSError:
                    pass  # the server is gone: start it the ordinary way
            else:
                self.start(preload=(argv[2],))
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True)

    def spawn(self, argv: list[str], env: dict, cwd: str | None = None) -> ForkedProcess:
        read, write = os.pipe()
        try:
            with self._lock:
                if self._sock is None:
                    raise BrokenPipeError("the fork server was not started")
                _send(self._sock, {"argv": argv, "env": env, "cwd": cwd or os.getcwd()}, (write,))
                os.close(write)
                write = -1
                with self._replied:
                    while not self._reply and not self._gone:
                        self._replied.wait()
                    if not self._reply:
                        raise BrokenPipeError("the fork server has gone")
                    reply = self._reply.pop(0)
                if "error" in reply:
                    raise OSError(reply["error"])
                proc = ForkedProcess(self, reply["pid"], os.fdopen(read, "rb"))
                read = -1
                proc.args = argv
                with self._replied:
                    self._procs[proc.pid] = proc
                    early = self._early.pop(proc.pid, None)
                if early is not None:
                    proc._exited(early)
                    self._reap(self._sock, proc.pid)
                return proc
        finally:
            for fd in (read, write):
                if fd >= 0:
                    os.close(fd)

    @staticmethod
    def _reap(sock: socket.socket, pid: int) -> None:
        """The rank's end is known here: the server may now let its pid go (until then it is
        held, as Popen holds a child's until it is waited for, so no signal meant for the rank
        can reach another process that took its number)."""
        try:
            _send(sock, {"reap": pid})
        except OSError:
            pass  # the server has gone (and its ranks with it)

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                message, fds = _receive(sock)
            except OSError:
                message, fds = None, []
            for fd in fds:
                os.close(fd)
            if message is None:
                with self._replied:
                    self._gone = True
                    self._replied.notify_all()
                self._ready.clear()
                return
            if "ready" in message:
                self._ready.set()
                continue
            if "exited" in message:
                with self._replied:
                    proc = self._procs.pop(message["exited"], None)
                    if proc is None:
                        self._early[message["exited"]] = message["status"]
                if proc is not None:
                    proc._exited(message["status"])
                    self._reap(sock, proc.pid)
            else:
                with self._replied:
                    self._reply.append(message)
                    self._replied.notify_all()

    def close(self) -> None:
        if self._sock is None:
            return
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        assert self._proc is not None  # started with the socket
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()


# -- the server ------------------------------------------------------------------------------------


def _child(sock: socket.socket, selector, request: dict, out: int) -> None:
    """In the forked rank: become ``python -m MODULE ARGS`` and never return."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        selector.close()
        sock.close()
        os.closerange(3, 1 << 16)  # nothing of the server's (nor another rank's pipe) stays open
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = request["argv"]
        module = argv[2]
        # Standard streams as a fresh interpreter makes them on a pipe (block-buffered, or
        # unbuffered with PYTHONUNBUFFERED, as the environment given says).
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1 if unbuffered else -1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        sys.argv = [module, *argv[3:]]
        sys.modules.pop(module, None)  # run afresh as __main__; what it imports stays imported
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        for thread in threading.enumerate():  # as an interpreter does at exit: its threads first
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    finally:
        os._exit(code & 0xFF)


def serve(fd: int, preload: Sequence[str] = ()) -> None:
    """The server's loop: a request forks a rank; a rank's pidfd tells of its end."""
    sock = socket.socket(fileno=fd)
    if not hasattr(os, "pidfd_open"):
        return  # (Linux 5.3 and Python 3.9 on): the agent starts its ranks as fresh processes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the agent's to act on, not ours
    # What a rank imports on first use, once here rather than in every fork: a rank connecting to
    # anything resolves its address, and getaddrinfo imports the IDNA codec (with stringprep and
    # unicodedata) the first time a process calls it: about 2 ms of CPU in each forked rank.
    importlib.import_module("encodings.idna")
    for module in preload:  # what this host's ranks will run, imported before they are asked for
        try:
            importlib.import_module(module)
        except Exception:
            pass  # its ranks, asked for, will say why
    _send(sock, {"ready": True})
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pidfd -> pid, while it runs
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    request, fds = _receive(sock)
                except OSError:
                    request, fds = None, []
                if request is None:
                    return  # the agent has gone
                if "reap" in request:  # the agent knows the rank ended: its pid may go
                    try:
                        os.waitpid(request["reap"], 0)
                    except ChildProcessError:
                        pass
                    continue
                out = fds[0] if fds else None
                for extra in fds[1:]:
                    os.close(extra)
                try:
                    if out is None:
                        raise OSError("no output pipe was given")
                    importlib.import_module(request["argv"][2])  # once: later ranks of it are forked ready
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(sock, selector, request, out)
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = pid
                    selector.register(pidfd, selectors.EVENT_READ)
                    _send(sock, {"pid": pid})
                except Exception as exc:
                    _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
                finally:
                    if out is not None:
                        os.close(out)
            else:  # a rank ended: its status told, its pid held until the agent has it (WNOWAIT)
                pidfd = key.fd
                pid = children.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                assert info is not None  # None only with WNOHANG
                code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                _send(sock, {"exited": pid, "status": code})


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="the agent's end of the socket pair")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE", help="import it at once")
    args = parser.parse_args()
    serve(args.fd, args.preload)


if __name__ == "__main__":
    main()
