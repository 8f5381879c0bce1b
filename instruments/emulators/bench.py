"""The emulated bench's backends (instruments/backend.py): :class:`EmulatedBench` builds the
world from a bench file in this process and serves an emulator for every instrument marked
``emulated``, each on its real transport; :class:`ServedWorld` is a bench whose world another
process serves (``lumion-hil emulate``), reached as a lab reaches a real bench plus the faults
no lab can make by hand. Both read the bench's settings as given (the bench file's shape);
they import nothing from the harness."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lumion_hil.instruments import registry
from lumion_hil.instruments.backend import INSTRUMENT_FAULTS, BenchBackend, Fault, FaultKind
from lumion_hil.instruments.emulators.world import World

if TYPE_CHECKING:
    from lumion_hil.instruments.emulators.world_client import WorldClient
    from lumion_hil.instruments.emulators.world_service import WorldService


class _Emulator(Protocol):
    """An emulated instrument, as the bench sees it: the faults it is made to show."""

    faults: dict[str, float | None]


class _Server(Protocol):
    """What serves an emulator on its transport."""

    def stop(self) -> None: ...


class _LineServer(_Server, Protocol):
    """A transport that can lose the instrument's power (scpi_transports.py)."""

    def power_loss(self, down_s: float = 1.0) -> None: ...


def _nic(bench, fault: Fault):
    return next(n for n in bench.host(fault.host).nics if n.name == fault.nic)


class Scratch:
    """A folder of a backend's own files (the emulated hosts' job logs, the nccl-tests programs),
    made in the temp dir when first needed and removed by :meth:`remove` (the backend's stop),
    so that nothing of a run is left in the temp dir and two runs never share a file."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix=self.prefix))
        return self._path

    def remove(self) -> None:
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


class EmulatedBench(BenchBackend):
    """Start with :meth:`start`, read ``resources`` (instrument name -> address), :meth:`stop`.
    Its world makes every fault but a killed process (which goes through the host's agent, as
    on any bench) and holds the ground truth."""

    kind = "emulated"
    real_traffic = False  # the cost model's figures
    #: where the world's service listens for the hosts' agents and jobs
    world_service_host = "127.0.0.1"

    def __init__(self, bench: Any):
        super().__init__(bench)
        self._world = World(bench)
        self.emulators: dict[str, _Emulator] = {}
        self.servers: dict[str, _LineServer] = {}
        self.vxi11: dict[str, _Server] = {}  # the instruments also served over VXI-11 (vxi11.py)
        self.world_service: WorldService | None = None
        self.files = Scratch("lumion-hil-bench-")  # the emulated hosts' job logs, the nccl-tests programs

    @property
    def world(self) -> World:
        return self._world

    @world.setter
    def world(self, world) -> None:  # a test may hide it, to see the bench as a real one
        self._world = world

    def start(self) -> "EmulatedBench":
        try:
            if any(h.emulated for h in self.bench.topology.hosts):
                from lumion_hil.instruments.emulators.world_service import WorldService

                self.world_service = WorldService(self.world, self.world_service_host).start()
            for index, (name, spec) in enumerate(self.bench.instruments.items()):
                if not spec.emulated:
                    continue
                device, server = self._serve(name, spec, seed=self.bench.emulator.seed + index)
                self.emulators[name] = device
                self.servers[name] = server.start()
                self.resources[name] = server.resource
                if registry.model(spec.model).transport is registry.Transport.VXI11:
                    # the LAN transport its maker's tools address it by, too
                    from lumion_hil.instruments.emulators.vxi11 import Vxi11Server

                    self.vxi11[name] = Vxi11Server(device, host=f"127.0.0.{2 + len(self.vxi11)}").start()
                for fault in spec.emulation.faults:
                    self.set_fault(name, fault)
        except BaseException:
            self.stop()
            raise
        return self

    def _serve(self, name: str, spec, seed: int):
        """The emulator of the instrument's model (its registry entry), on the transport its
        real instrument uses (the USB meter excepted: served on TCP, see its emulator). A
        meter's emulator is given the bench too: its detectors say where its light comes from."""
        from lumion_hil.instruments.emulators.scpi_transports import PtyLineServer, TcpScpiServer

        entry = registry.model(spec.model, instrument=name)
        emulator = entry.emulator_class()
        if entry.kind is registry.Kind.POWER_METER:
            device = emulator(name, spec, self.world, self.bench, seed=seed)
        else:
            device = emulator(name, spec, self.world, seed=seed)
        if entry.transport is registry.Transport.SERIAL:  # a line protocol: its lines, its power
            return device, PtyLineServer(device.handle_line, name, eol=b"\r\n", faults=device.faults,
                                         power_on=device.power_on, any_eol=True)
        return device, TcpScpiServer(device)

    @property
    def nccl_tests_path(self) -> str:
        """Where the emulated hosts' nccl-tests programs are."""
        return str(nccl_tests_folder(self._world_address(), self.files.path))

    def nccl_tests_folder(self, host, library: str = "nccl-tests") -> str | None:
        return self.nccl_tests_path if host.emulated and self.world_service is not None else None

    def local_address(self, host) -> bool:
        return host.emulated or super().local_address(host)

    def can_inject(self, kind: str) -> tuple[bool, str]:
        if self._world is None or kind == FaultKind.PROCESS_KILL:
            return super().can_inject(kind)
        return True, "emulated: made in the world"

    def inject(self, fault: Fault) -> int:
        world = self._world
        if fault.kind == FaultKind.GPU_FAILURE:
            return world.fail_gpu(fault.host, 0, fault.xid).t_ns
        nic = _nic(self.bench, fault)
        t = world.now_ns()
        if fault.kind == FaultKind.FIBRE_CUT:
            world.set_extra_loss(nic.rx_port, float("inf"), t)
        elif fault.kind == FaultKind.TRANSCEIVER_DEGRADATION:
            world.set_extra_loss(nic.tx_port, fault.loss_db, t)
        elif fault.kind == FaultKind.SWITCH_PORT_FAILURE:
            world.set_port_state(nic.rx_port, "F", t)
        return t

    def repair(self, fault: Fault) -> None:
        world = self._world
        if fault.kind == FaultKind.GPU_FAILURE:
            world.repair_gpu(fault.host, 0)
        elif fault.kind in (FaultKind.FIBRE_CUT, FaultKind.TRANSCEIVER_DEGRADATION):
            nic = _nic(self.bench, fault)
            world.set_extra_loss(nic.rx_port if fault.kind == FaultKind.FIBRE_CUT else nic.tx_port, 0.0)
        elif fault.kind == FaultKind.SWITCH_PORT_FAILURE:
            world.set_port_state(_nic(self.bench, fault).rx_port, "E")

    def set_fault(self, instrument: str, fault: str) -> None:
        """Switch a fault on in an emulated instrument: ``stall``, ``delay=30``, ``power_loss=2``
        (see instruments/backend.py INSTRUMENT_FAULTS). ``power_loss`` happens once, now: the
        call returns with the power off, and it comes back on its own."""
        name, _, value = fault.partition("=")
        if instrument not in self.emulators:
            raise ValueError(f"no emulated instrument {instrument!r}; emulated: {', '.join(self.emulators) or 'none'}")
        if name not in INSTRUMENT_FAULTS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(INSTRUMENT_FAULTS)}")
        number = float(value) if value else None
        if name == "power_loss":
            self.servers[instrument].power_loss(number if number is not None else 1.0)
            return
        self.emulators[instrument].faults[name] = number

    def clear_faults(self, instrument: str) -> None:
        self.emulators[instrument].faults.clear()

    def agent_argv(self, host, *extra: str) -> list[str] | None:
        """How to start the agent of an emulated host (a host or its name): the real agent
        program, its NVML, links and job served by this world. None for a host not emulated."""
        host = self.bench.host(host) if isinstance(host, str) else host
        world = self._world_address() if host.emulated else host.world_address
        return agent_argv(world, host, *extra, logs=self.files.path) if world else None

    def _world_address(self) -> str:
        """The address of the world's service, which the bench has once started with a host emulated."""
        if self.world_service is None:
            raise RuntimeError(f"bench {self.bench.name!r}: no world service (not started, or no host emulated)")
        return self.world_service.address

    def job_argv(self, job, ranks: list[str]) -> list[str] | None:
        if self.world_service is None:
            return None
        return job_argv(self.world_service.address, job, ranks, self.bench.deadlines.io_allowance_s)

    def reserved_rack_job_argv(self, job, ranks: list[str]) -> list[str] | None:
        """The emulated job for every rank of the reserved rack in one process (the rack is a
        model: it has no agents of its own)."""
        if self.world_service is None:
            return None
        return job_argv(self.world_service.address, job, ranks, self.bench.deadlines.io_allowance_s) + ["--all-ranks-here"]

    def served_bench(self) -> dict:
        """The bench as data, pointing at what this serves (see :func:`served_bench`)."""
        return served_bench(self.bench, self)

    def stop(self) -> None:
        for server in [*self.servers.values(), *self.vxi11.values()]:
            server.stop()
        self.servers.clear()
        self.vxi11.clear()
        if self.world_service is not None:
            self.world_service.stop()
            self.world_service = None
        self.files.remove()



class ServedWorld(BenchBackend):
    """A bench whose emulated world another process serves (hosts at ``world:HOST:PORT``, as
    ``lumion-hil emulate --bench-out`` writes them): its instruments are reached as real ones,
    and its world makes the faults no lab can make by hand (a GPU failing, a light fading)."""

    kind = "served"
    real_traffic = False

    def __init__(self, bench: Any):
        super().__init__(bench)
        self.address = next((h.world_address for h in bench.topology.hosts if h.world_address), None)
        self._client: WorldClient | None = None
        self.files = Scratch("lumion-hil-served-")  # the agents' job logs, the nccl-tests programs

    def stop(self) -> None:
        self.files.remove()

    @property
    def client(self) -> WorldClient:
        if self._client is None:
            from lumion_hil.instruments.emulators.world_client import WorldClient

            if self.address is None:
                raise ValueError(f"bench {self.bench.name!r}: no host is served by a world (world:HOST:PORT)")
            self._client = WorldClient(self.address)
        return self._client

    def agent_argv(self, host) -> list[str] | None:
        return agent_argv(host.world_address, host, logs=self.files.path) if host.world_address else None

    def job_argv(self, job, ranks: list[str]) -> list[str] | None:
        world = self.bench.host(ranks[0]).world_address
        return job_argv(world, job, ranks, self.bench.deadlines.io_allowance_s) if world else None

    def reserved_rack_job_argv(self, job, ranks: list[str]) -> list[str] | None:
        return job_argv(self.address, job, ranks, self.bench.deadlines.io_allowance_s) + ["--all-ranks-here"] \
            if self.address else None

    def nccl_tests_folder(self, host, library: str = "nccl-tests") -> str | None:
        return str(nccl_tests_folder(host.world_address, self.files.path)) if host.world_address else None

    def local_address(self, host) -> bool:
        return bool(host.world_address) or super().local_address(host)

    def can_inject(self, kind: str) -> tuple[bool, str]:
        if kind in (FaultKind.GPU_FAILURE, FaultKind.TRANSCEIVER_DEGRADATION):
            return True, "served emulated bench: made in its world"
        return super().can_inject(kind)

    def inject(self, fault: Fault) -> int:
        # The served world runs on this machine's monotonic clock, as the harness does.
        if fault.kind == FaultKind.GPU_FAILURE:
            return self.client.call("fail_gpu", host=fault.host, index=0, xid=fault.xid)
        return self.client.call("set_extra_loss", port=_nic(self.bench, fault).tx_port, loss_db=fault.loss_db)

    def repair(self, fault: Fault) -> None:
        if fault.kind == FaultKind.GPU_FAILURE:
            self.client.call("repair_gpu", host=fault.host, index=0)
        elif fault.kind == FaultKind.TRANSCEIVER_DEGRADATION:
            self.client.call("set_extra_loss", port=_nic(self.bench, fault).tx_port, loss_db=0.0)


def agent_argv(world_address: str, host, *extra: str, logs: Path | None = None) -> list[str]:
    """The agent of an emulated host served by the world at ``world_address``; its jobs' logs
    in ``logs``/jobs/<host> (else the agent's default)."""
    interfaces = ",".join(f"{n.interface or n.name}={n.name}" for n in host.nics)
    latency = ["--notify-latency-s", str(host.emulation.agent_latency_s)] if host.emulation.agent_latency_s else []
    if host.emulation.management_latency_s:
        latency += ["--management-latency-s", str(host.emulation.management_latency_s)]
    faults = [f"--fault={fault}" for fault in host.emulation.faults]
    log_dir = ["--log-dir", str(logs / "jobs" / host.name)] if logs is not None else []
    return [sys.executable, "-m", "lumion_hil.instruments.emulators.agent", "--world", world_address,
            "--host", host.name, "--interfaces", interfaces, *latency, *faults, *log_dir, *extra]


def nccl_tests_folder(world_address: str, under: Path) -> Path:
    """A folder (in ``under``) of emulated nccl-tests executables for the world at ``world_address``."""
    from lumion_hil.instruments.emulators.nccl_tests import install

    return install(under / "nccl-tests" / world_address.replace(":", "-"), world_address)


def job_argv(world_address: str, job, ranks: list[str], allowance_s: float = 0.0) -> list[str]:
    """The emulated training job's command template (one rank; {rank} filled by the agent);
    ``allowance_s``: the bench's I/O allowance, what its collectives wait beyond the NCCL timeout
    at a scaled time for peers that are only late (job.py)."""
    return [sys.executable, "-m", "lumion_hil.instruments.emulators.job", "--world", world_address,
            "--ranks", ",".join(ranks), "--rank", "{rank}", "--gradient-bytes", str(job.gradient_bytes),
            "--compute-time-s", str(job.compute_time_s), "--startup-time-s", str(job.startup_time_s),
            "--batch", str(job.batch_per_rank), "--master-port", str(job.master_port),
            "--nccl-timeout-s", str(job.nccl_timeout_s), "--late-peer-allowance-s", str(allowance_s)]


def served_bench(bench, emulated: EmulatedBench) -> dict:
    """The bench as data, pointing at what ``emulated`` serves: instruments at their served
    addresses, emulated hosts at ``world:HOST:PORT``. Runs against it treat it as a real bench."""
    data = bench.model_dump(mode="json")
    data["name"] = f"{bench.name}-served"
    for name, resource in emulated.resources.items():
        data["instruments"][name]["resource"] = resource
    if emulated.world_service is not None:
        for host in data["topology"]["hosts"]:
            if host["address"] == "emulated":
                host["address"] = f"world:{emulated.world_service.address}"
    return data
