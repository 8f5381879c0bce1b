"""A bench in use: its lock, its emulators (where instruments are emulated), its drivers, its
timeline. Opening restores the baseline cross-connects; closing restores them again, whatever
happened in between."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from lumion_hil.harness.backends import load_backend
from lumion_hil.harness.binding import open_driver
from lumion_hil.harness.config import Bench
from lumion_hil.harness.config_instruments import MeterInstrument, SwitchInstrument
from lumion_hil.harness.config_topology import Detector
from lumion_hil.harness.errors import HarnessError
from lumion_hil.harness.interrupts import INTERRUPTS, critical, shield
from lumion_hil.harness.lock import BenchLock
from lumion_hil.harness.places import PLACE_ENV, wanted_from_place
from lumion_hil.harness.safety import GuardedSwitch
from lumion_hil.harness.timeline import Timeline
from lumion_hil.instruments.threads import at_once
from lumion_hil.instruments.backend import BenchBackend
from lumion_hil.instruments.gpu_host.client import AgentClient, local_agent_argv, ssh_agent_argv
from lumion_hil.instruments.gpu_host.replies import JobStarted
from lumion_hil.instruments.protocols import OutOfRange

log = logging.getLogger("lumion_hil")


def _named(step: Callable[[], object]) -> str:
    """A clean-up step as a log line names it: a function's name, a partial's with its arguments."""
    if isinstance(step, functools.partial):
        return f"{_named(step.func)}({', '.join(map(str, step.args))})"
    return getattr(step, "__name__", None) or repr(step)


def _all_at_once(action, calls: list[tuple]) -> None:
    """Run ``action(*args)`` for each args in parallel threads; every call runs even if another
    fails, and the first failure is raised once all have ended."""
    errors = [e for e in at_once({i: (lambda a=args: action(*a)) for i, args in enumerate(calls)}).values()
              if isinstance(e, Exception)]
    if errors:
        raise errors[0]


@dataclass
class BenchSession:
    bench: Bench
    timeline: Timeline = field(default_factory=Timeline)
    switch: GuardedSwitch | None = None
    meters: dict[str, Any] = field(default_factory=dict)
    drivers: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, AgentClient] = field(default_factory=dict)
    backend: BenchBackend | None = None  # emulated world, served world, real bench (instruments/backend.py)
    resources: dict[str, str] = field(default_factory=dict)
    _lock: BenchLock | None = None

    @property
    def world(self):
        """The emulated physical world (ground truth), or None on a real bench."""
        return self.backend.world if self.backend is not None else None

    def _started_backend(self) -> BenchBackend:
        """The backend, which :meth:`open` starts before anything asks it."""
        if self.backend is None:
            raise HarnessError(f"bench {self.bench.name!r}: its session has no backend (not opened)")
        return self.backend

    def _opened_switch(self) -> GuardedSwitch:
        """The bench's switch, which :meth:`open` opens before anything reads it."""
        if self.switch is None:
            raise HarnessError(f"bench {self.bench.name!r}: its session has no switch (not opened)")
        return self.switch

    @classmethod
    def open(cls, bench: Bench, *, restore: bool = True) -> "BenchSession":
        session = cls(bench)
        try:
            session._open(restore)
        except BaseException:
            session.close(restore=False)
            raise
        return session

    def _open(self, restore: bool) -> None:
        unresolved = wanted_from_place(self.bench)
        if unresolved:
            raise HarnessError(f"bench {self.bench.name!r}: {', '.join(unresolved)} take their address from the bench's "
                             "labgrid place, and this run holds none: run it with `lumion-hil run` (which reserves "
                             "and acquires the place) or give the addresses")
        if self.bench.place is not None and not os.environ.get(PLACE_ENV):
            raise HarnessError(f"bench {self.bench.name!r} is a labgrid place: run it with `lumion-hil run`, which "
                             "reserves and acquires the place (two runs never share it)")
        if not self.bench.all_emulated and self.bench.place is None:
            # A bench with a labgrid place is guarded by its acquisition (lumion-hil run), across machines.
            self._lock = BenchLock.for_bench(self.bench).acquire()
        self.backend = load_backend(self.bench).start()
        for name, spec in self.bench.instruments.items():
            resource = self.backend.resources[name] if spec.emulated else spec.resource
            self.resources[name] = resource
            driver = open_driver(name, spec, resource, opc_timeout_s=self.bench.waits.opc_s)
            self.drivers[name] = driver
            # Every instrument command runs to its reply: an interrupt waits for it (harness/interrupts.py).
            recorded = self.timeline.recorded(driver, name, guard=critical)
            if isinstance(spec, SwitchInstrument) and name == self.bench.topology.switch:
                self.switch = GuardedSwitch(recorded, self.bench.safety.protected_ports, self.bench.safety.baseline,
                                            owned_ports=self.bench.safety.owned_ports)
            elif isinstance(spec, MeterInstrument):
                self.meters[name] = recorded
        for host in self.bench.topology.hosts:
            self.hosts[host.name] = AgentClient(host.name, self._agent_argv(host), timeout_s=self.bench.waits.opc_s)
        if restore:
            self.restore_baseline()

    def _agent_argv(self, host) -> list[str]:
        argv = self._started_backend().agent_argv(host)
        if argv is not None:
            return argv
        if host.address == "local":
            return local_agent_argv(host.python)
        return ssh_agent_argv(host.address, host.python)

    def job_command(self, ranks: list[str]) -> list[str]:
        """The job's argv template for these ranks: the bench's own command, or on an emulated
        bench without one, the emulated training job."""
        job = self.bench.job
        if job is None:
            raise ValueError(f"bench {self.bench.name!r} has no job section")
        if job.command:
            return list(job.command)
        argv = self._started_backend().job_argv(job, ranks)
        if argv is not None:
            return argv
        raise ValueError(f"bench {self.bench.name!r}: job.command is empty and its hosts are not emulated")

    def use_light_job(self, light: bool = True) -> str:
        """Run the backend's light job from here on where it has more than one (the failure
        sequences restart the job hundreds of times); returns :meth:`job_kind`."""
        self._started_backend().light_job = light
        return self.job_kind()

    def job_kind(self) -> str:
        """What the job this session starts is, in words: the bench's own command, or the
        backend's job (for the run record)."""
        job = self.bench.job
        if job is not None and job.command:
            return f"the bench's job.command ({' '.join(job.command[:3])} ...)"
        return self._started_backend().job_kind(job)

    def fabric_env(self, host_name: str, fabric: str = "optical") -> dict[str, str]:
        """How a job or nccl-tests on this host is told which network to use, as NCCL is:
        NCCL_SOCKET_IFNAME names the host's optical NICs, or the electrical rack's interface."""
        if fabric == "electrical":
            if self.bench.electrical is None:
                raise ValueError(f"bench {self.bench.name!r} has no electrical section: no electrical rack to run on")
            return {"NCCL_SOCKET_IFNAME": self.bench.electrical.interface,
                    **self._started_backend().fabric_env(self.bench.host(host_name), fabric)}
        if fabric != "optical":
            raise ValueError(f"unknown fabric {fabric!r}: optical or electrical")
        host = self.bench.host(host_name)
        return {"NCCL_SOCKET_IFNAME": ",".join(n.interface or n.name for n in host.nics),
                **self._started_backend().fabric_env(host, fabric)}

    def start_job(self, ranks: list[str], fabric: str = "optical",
                  only: list[str] | None = None) -> dict[str, JobStarted]:
        """Start every rank of the job on its host (rank 0 is the master), on the optical
        circuits or on the electrical rack: all hosts at once, as a launcher would. ``only``:
        start the ranks on these hosts only (the others of the map are someone else's concern)."""
        job = self.bench.job
        command = self.job_command(ranks)
        master = self.bench.host(ranks[0])
        started: dict[str, JobStarted] = {}
        assert job is not None  # job_command raised otherwise

        def start(rank: int, host_name: str) -> None:
            fields = {"rank": rank, "world_size": len(ranks), "gpu": 0, "master_port": job.master_port,
                      "master_addr": self._started_backend().master_address(master),
                      "heartbeat": f"{job.heartbeat_dir}/rank{rank}.jsonl"}
            started[host_name] = self.hosts[host_name].start_job(command, fields, self.fabric_env(host_name, fabric))

        _all_at_once(start, [(rank, host) for rank, host in enumerate(ranks) if only is None or host in only])
        return {host: started[host] for host in ranks if host in started}

    def fresh_job(self, ranks: list[str], fabric: str = "optical") -> dict[str, JobStarted]:
        """The job stopped everywhere, the baseline restored, and the job started on ``ranks``."""
        self.stop_job()
        self.restore_baseline()
        return self.start_job(ranks, fabric)

    def nccl_tests_command(self, collective: str, ranks: list[str], fabric: str = "optical",
                           sizes: tuple[int, int] | None = None,
                           library: str | None = None) -> tuple[list[str], dict[str, str]]:
        """argv and environment to run one nccl-tests program over ``ranks`` from the first
        one's host: the bench's launcher and binaries, or on an emulated host the emulated ones
        (of ``library``, one of the backend's ``collective_libraries()``; None: its first)."""
        settings = self.bench.nccl_tests
        lead = self.bench.host(ranks[0])
        env = self.fabric_env(ranks[0], fabric)
        backend = self._started_backend()
        library = library or backend.collective_libraries()[0]
        emulated = backend.nccl_tests_folder(lead, library)
        if emulated is not None:
            folder, launcher = emulated, []
            env["LUMION_HIL_RANKS"] = ",".join(ranks)  # what mpirun -H would tell the real programs
        else:
            folder = settings.path
            launcher = [a.replace("{world_size}", str(len(ranks))).replace("{hosts}", ",".join(
                self.bench.host(r).address.split("@")[-1] for r in ranks)) for a in settings.launcher]
        low, high = sizes or (settings.min_bytes, settings.max_bytes)
        binary = f"{folder.rstrip('/')}/{collective}_perf" if folder else f"{collective}_perf"
        argv = launcher + [binary, "-b", str(low), "-e", str(high), "-f", str(settings.step_factor), "-g", "1",
                           "-n", str(settings.iters), "-w", str(settings.warmup_iters), "-c", str(settings.check)]
        return argv, env

    def stop_job(self) -> None:
        """Stop the job on every host, all at once."""
        _all_at_once(lambda host: host.stop_job(timeout_s=INTERRUPTS.wait_s(10.0)),
                     [(h,) for h in self.hosts.values()])

    def detector_dbm(self, detector: Detector) -> "float | OutOfRange":
        """Optical power at the port a detector watches, corrected for its tap loss."""
        with self.timeline.span("detector.read", detector=detector.name):
            if detector.instrument == self.bench.topology.switch:
                reading = self._opened_switch().port_power_dbm([detector.port])[detector.port]
            else:
                reading = self.meters[detector.instrument].read_dbm(detector.channel)
        return reading + detector.tap_loss_db if isinstance(reading, float) else reading

    def received_dbm(self, detector: Detector) -> "float | OutOfRange":
        """The light at the receiver behind the detector's port, as the detector reads it."""
        return self.bench.at_receiver_dbm(detector.port, self.detector_dbm(detector))

    def received_dbms(self, detectors: list[Detector]) -> dict[str, "float | OutOfRange"]:
        """:meth:`received_dbm` of several detectors, by name: the switch's own monitors in one
        query (as its power-monitor command takes a list of ports), meters' channels each."""
        switch = self.bench.topology.switch
        monitors = [d for d in detectors if d.instrument == switch]
        out: dict[str, float | OutOfRange] = {}
        if monitors:
            with self.timeline.span("detector.read", detector=",".join(d.name for d in monitors)):
                readings = self._opened_switch().port_power_dbm(sorted({d.port for d in monitors}))
            for d in monitors:
                reading = readings[d.port]
                out[d.name] = self.bench.at_receiver_dbm(
                    d.port, reading + d.tap_loss_db if isinstance(reading, float) else reading)
        for d in detectors:
            if d.instrument != switch:
                out[d.name] = self.received_dbm(d)
        return out

    def restore_baseline(self, *, verify: bool = False) -> None:
        """Back to the baseline cross-connects, as one uninterruptible step; with ``verify``,
        read the switch back and raise if it is not there."""
        if self.switch is None:
            return
        with critical(), self.timeline.span("safety.restore_baseline"):
            self.switch.restore_baseline()
            if verify:
                self.switch.verify_baseline()

    def close(self, *, restore: bool = True) -> None:
        """Leave the bench safe: baseline restored, drivers closed, emulators stopped, lock freed.
        Every step runs even if an earlier one fails; the first failure is raised at the end."""
        steps: list[Callable[[], object]] = [self.stop_job]  # jobs first: nothing drives traffic while rewiring
        if restore:
            steps.append(lambda: self.restore_baseline(verify=True))
        steps += [d.close for d in self.drivers.values()]

        def leave(h: AgentClient) -> Callable[[], object]:
            # A second Ctrl-C shortens the wait for agents to leave (they are killed instead).
            return lambda: h.close(timeout_s=INTERRUPTS.wait_s(10.0))

        steps += [leave(h) for h in self.hosts.values()]
        if self.backend is not None:
            steps.append(self.backend.stop)
        if self._lock is not None:
            steps.append(self._lock.release)
        try:
            with shield():  # an interrupt now must not cut the clean-up short
                self._every_step(steps)
        finally:
            self.drivers.clear()
            self.hosts.clear()

    def put_back(self, *repairs: Callable[[], object]) -> None:
        """After a story that broke something: the job stopped on every host, each of ``repairs``
        (a fault's repair) made, and the baseline restored. Every step runs even if an earlier
        one fails (an agent that is gone cannot stop its job, and the switch must still go
        back); the first failure is raised at the end."""
        self._every_step([self.stop_job, *repairs, self.restore_baseline])

    def _every_step(self, steps: list[Callable[[], object]]) -> None:
        """Run every step of a clean-up, even past a failing one (logged); raise the first failure."""
        failure: Exception | None = None
        for step in steps:
            try:
                step()
            except Exception as exc:  # keep going: the rest of the clean-up still matters
                log.error("bench %s: clean-up step %s failed: %s", self.bench.name, _named(step), exc)
                failure = failure or exc
        if failure is not None:
            raise failure

    def __enter__(self) -> "BenchSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
