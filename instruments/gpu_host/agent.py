"""The GPU host agent: runs on each GPU host and answers requests on stdin/stdout, one JSON
object a line (instruments/gpu_host/wire.py), so the harness reaches it as a local subprocess or
through ``ssh host python3 -m lumion_hil.agent``: no daemon, no open port.

Every reply carries the agent's monotonic clock (``clock_ns``), so the harness can place host
events on its own timeline with a measured offset and uncertainty. Requests run concurrently
(a wait for an XID does not hold up a health query); replies carry the request's id.

    python3 -m lumion_hil.agent         # real host: NVML, /sys/class/net (also: lumion-hil-agent)

An emulated host runs the same agent with emulated NVML and links
(``python -m lumion_hil.instruments.emulators.agent --world HOST:PORT --host NAME``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from lumion_hil.instruments.gpu_host import wire
from lumion_hil.instruments.threads import WORKERS
from lumion_hil.instruments.gpu_host.jobs import JobControl
from lumion_hil.instruments.backend import AGENT_FAULTS
from lumion_hil.instruments.gpu_host.links import SysfsLinks
from lumion_hil.instruments.gpu_host.nvml_backend import NvmlGpus

VERSION = 1


class Agent:
    def __init__(self, gpus: NvmlGpus, links, jobs: JobControl, clock_ns, backend: str,
                 faults: dict[str, float | None] | None = None):
        self.gpus, self.links, self.jobs = gpus, links, jobs
        self.clock_ns = clock_ns
        self.backend = backend
        self._out_lock = threading.Lock()
        self._stop = threading.Event()
        # Faults exist only on an emulated host (None: a real one, where nobody can set them).
        self.faults = faults

    # -- requests ---------------------------------------------------------------------------------

    def rpc_hello(self) -> dict:
        return {"version": VERSION, "hostname": socket.gethostname(), "pid": os.getpid(), "backend": self.backend,
                "nvml": self.gpus.status(), "interfaces": self.links.interfaces()}

    def rpc_clock(self) -> dict:
        return {}

    def rpc_devices(self) -> list:
        return self.gpus.devices()

    def rpc_health(self) -> list:
        return self.gpus.health()

    def rpc_wait_xid(self, timeout_s: float) -> dict | None:
        return self.gpus.wait_xid(timeout_s)

    def rpc_links(self) -> list:
        return self.links.states()

    def rpc_link(self, interface: str) -> dict:
        return self.links.state(interface)

    def rpc_wait_link(self, interface: str, up: bool, timeout_s: float) -> dict:
        return self.links.wait(interface, up, timeout_s)

    def rpc_transmitter(self, interface: str, on: bool) -> dict:
        """Turn an interface's transmitter off or on (the fibre walk); any left off are turned
        on again when the harness's session ends."""
        return self.links.set_transmitter(interface, bool(on))

    def rpc_job_start(self, command: list, fields: dict, env: dict | None = None) -> dict:
        return self.jobs.start(command, fields, env)

    def rpc_job_stop(self, timeout_s: float = 10.0) -> dict:
        return self.jobs.stop(timeout_s)

    def rpc_job_status(self) -> dict:
        return self.jobs.status()

    def rpc_job_wait_step(self, step: int, timeout_s: float) -> dict:
        return self.jobs.wait_step(step, timeout_s)

    def rpc_job_steps(self, after_step: int = 0) -> list:
        return self.jobs.steps(after_step)

    def rpc_job_events(self, event: str | None = None) -> list:
        return self.jobs.events(event)

    def rpc_job_wait_event(self, event: str, timeout_s: float) -> dict:
        return self.jobs.wait_event(event, timeout_s)

    def rpc_nccl_run(self, argv: list, timeout_s: float = 600.0, env: dict | None = None) -> dict:
        """Run nccl-tests (argv as a list: the launcher, if any, then the binary and its flags),
        never through a shell. Returns its exit status and output; the harness parses it."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv is a non-empty list of strings")
        started = self.clock_ns()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise ValueError(f"no such program {argv[0]!r} on this host (nccl_tests.path in the bench file)") from None
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"{argv[0]} ran past {timeout_s:g} s; output so far: "
                               f"{(exc.stdout or b'')[-300:]!r}") from None
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-4000:],
                "started_ns": started, "ended_ns": self.clock_ns()}

    def rpc_bye(self) -> None:
        self._stop.set()

    def rpc_fault(self, name: str, value: float | None = None) -> dict:
        """Emulated hosts only: switch on one of AGENT_FAULTS (the reply to this request is sent)."""
        if self.faults is None:
            raise ValueError("faults can be set only on an emulated host's agent")
        if name not in AGENT_FAULTS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(AGENT_FAULTS)}")
        self.faults[name] = value
        return dict(self.faults)

    def rpc_clear_faults(self) -> dict:
        if self.faults is None:
            raise ValueError("faults can be set only on an emulated host's agent")
        self.faults.clear()
        return {}

    # -- loop ------------------------------------------------------------------------------------

    def _reply(self, message: dict, faulty: bool = True) -> None:
        faults = self.faults if faulty and self.faults else {}
        if "stall" in faults:
            return
        if "errors" in faults:
            message = {"id": message.get("id"), "ok": False,
                       "error": {"type": "DeviceError", "message": "emulated fault: the host failed the request"}}
        if "delay" in faults:
            time.sleep(faults["delay"] if faults["delay"] is not None else 30.0)
        message["clock_ns"] = self.clock_ns()
        data = wire.encode(message)
        if "garbage" in faults:
            data = b"\x7f#!garbage?%\n"
        if "partial" in faults:
            data = data[: len(data) // 2]
        with self._out_lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

    def _handle(self, request: dict) -> None:
        rid = request.get("id")
        faulty = request.get("method") not in ("fault", "clear_faults")  # a test can always clear them
        try:
            method = getattr(self, f"rpc_{request['method']}", None)
            if method is None:
                raise LookupError(f"unknown method {request['method']!r}")
            self._reply({"id": rid, "ok": True, "result": method(**request.get("params", {}))}, faulty)
        except Exception as exc:
            self._reply({"id": rid, "ok": False, "error": {"type": type(exc).__name__, "message": str(exc)}}, faulty)
            if not isinstance(exc, (LookupError, ValueError, TypeError)):
                traceback.print_exc(file=sys.stderr)

    def serve(self) -> None:
        try:
            for line in sys.stdin.buffer:
                if not line.strip():
                    continue
                try:
                    request = wire.decode(line)
                except ValueError as exc:
                    self._reply({"id": None, "ok": False, "error": {"type": "BadRequest", "message": str(exc)}})
                    continue
                if self.faults and request.get("method") not in ("fault", "clear_faults"):
                    if "power_loss" in self.faults:  # everything on the host dies at once
                        self.jobs.kill()
                        os._exit(137)
                    if "drop" in self.faults:  # the session ends; the agent leaves as it does on EOF
                        break
                WORKERS.submit(self._handle, request)  # each request answered on its own (kept) thread
                if request.get("method") == "bye":
                    break
        finally:
            self.jobs.stop(timeout_s=5)  # the harness is gone: leave no job running
            self.links.restore_transmitters()  # nor a transmitter dark


def parser(prog: str = "python -m lumion_hil.agent") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sysfs", default="/sys/class/net", help="where NIC state is read (real host)")
    parser.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "lumion-hil-agent"),
                        help="where the job's output is kept, rank<N>.log (default: %(default)s)")
    parser.add_argument("--clock-offset-ns", type=int, default=0,
                        help="add this to every clock reading (tests of the harness's clock mapping)")
    return parser


def clock_with_offset(offset: int):
    def clock_ns() -> int:
        return time.monotonic_ns() + offset

    return clock_ns


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    clock_ns = clock_with_offset(args.clock_offset_ns)
    Agent(NvmlGpus(clock_ns=clock_ns), SysfsLinks(args.sysfs, clock_ns),
          JobControl(args.log_dir, clock_ns, args.clock_offset_ns), clock_ns, "nvml").serve()


if __name__ == "__main__":
    main()
