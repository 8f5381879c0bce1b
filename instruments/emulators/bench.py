"""The emulated bench: builds the world from a bench file and serves an emulator for every
instrument marked ``emulated``, each on its real transport."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from lumion_hil.instruments.emulators.world import World

if TYPE_CHECKING:
    from lumion_hil.harness.config import Bench


class EmulatedBench:
    """Start with :meth:`start`, read ``resources`` (instrument name -> address), :meth:`stop`."""

    def __init__(self, bench: "Bench"):
        self.bench = bench
        self.world = World(bench)
        self.emulators: dict[str, object] = {}
        self.servers: dict[str, object] = {}
        self.resources: dict[str, str] = {}
        self.world_service = None

    def start(self) -> "EmulatedBench":
        try:
            if any(h.emulated for h in self.bench.topology.hosts):
                from lumion_hil.instruments.emulators.world_service import WorldService

                self.world_service = WorldService(self.world).start()
            for index, (name, spec) in enumerate(self.bench.instruments.items()):
                if not spec.emulated:
                    continue
                device, server = self._serve(name, spec, seed=self.bench.emulator.seed + index)
                self.emulators[name] = device
                self.servers[name] = server.start()
                self.resources[name] = server.resource
                for fault in spec.emulation.faults:
                    self.set_fault(name, fault)
        except BaseException:
            self.stop()
            raise
        return self

    def _serve(self, name: str, spec, seed: int):
        """The emulator for a model, on the transport its real instrument uses (the USB meter
        excepted: served on TCP, see its emulator)."""
        from lumion_hil.instruments.emulators.scpi import PtyLineServer, TcpScpiServer

        if spec.model == "polatis":
            from lumion_hil.instruments.emulators.polatis import PolatisEmulator

            device = PolatisEmulator(name, spec, self.world, seed=seed)
            return device, TcpScpiServer(device)
        if spec.model == "keysight-n77xx":
            from lumion_hil.instruments.emulators.keysight_n77xx import KeysightN77xxEmulator

            device = KeysightN77xxEmulator(name, spec, self.world, self.bench, seed=seed)
            return device, TcpScpiServer(device)
        if spec.model == "thorlabs-pm100":
            from lumion_hil.instruments.emulators.thorlabs_pm100 import ThorlabsPM100Emulator

            device = ThorlabsPM100Emulator(name, spec, self.world, self.bench, seed=seed)
            return device, TcpScpiServer(device)
        if spec.model == "dicon-matrix":
            from lumion_hil.instruments.emulators.dicon import DiconEmulator

            device = DiconEmulator(name, spec, self.world, seed=seed)
            return device, PtyLineServer(device.handle_line, name, eol=b"\r\n", faults=device.faults,
                                         power_on=device.power_on, any_eol=True)
        raise ValueError(f"{name}: no emulator for model {spec.model!r}")

    @property
    def nccl_tests_path(self) -> str:
        """Where the emulated hosts' nccl-tests programs are."""
        return str(nccl_tests_folder(self.world_service.address))

    def set_fault(self, instrument: str, fault: str) -> None:
        """Switch a fault on in an emulated instrument: ``stall``, ``delay=30``, ``power_loss=2``
        (see instruments/emulators/scpi.py FAULTS). ``power_loss`` happens once, now: the call
        returns with the power off, and it comes back on its own."""
        from lumion_hil.instruments.emulators.scpi import FAULTS

        name, _, value = fault.partition("=")
        if instrument not in self.emulators:
            raise ValueError(f"no emulated instrument {instrument!r}; emulated: {', '.join(self.emulators) or 'none'}")
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
        number = float(value) if value else None
        if name == "power_loss":
            self.servers[instrument].power_loss(number if number is not None else 1.0)
            return
        self.emulators[instrument].faults[name] = number

    def clear_faults(self, instrument: str) -> None:
        self.emulators[instrument].faults.clear()

    def agent_argv(self, host_name: str, *extra: str) -> list[str]:
        """How to start the agent of an emulated host: the real agent program, its NVML, links
        and job served by this world."""
        return agent_argv(self.world_service.address, self.bench.host(host_name), *extra)

    def job_argv(self, ranks: list[str]) -> list[str]:
        return job_argv(self.world_service.address, self.bench.job, ranks)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        if self.world_service is not None:
            self.world_service.stop()
            self.world_service = None

    def __enter__(self) -> "EmulatedBench":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def agent_argv(world_address: str, host, *extra: str) -> list[str]:
    """The agent of an emulated host served by the world at ``world_address``."""
    interfaces = ",".join(f"{n.interface or n.name}={n.name}" for n in host.nics)
    latency = ["--notify-latency-s", str(host.emulation.agent_latency_s)] if host.emulation.agent_latency_s else []
    faults = [f"--fault={fault}" for fault in host.emulation.faults]
    return [sys.executable, "-m", "lumion_hil.instruments.gpu_host.agent", "--world", world_address,
            "--host", host.name, "--interfaces", interfaces, *latency, *faults, *extra]


def nccl_tests_folder(world_address: str) -> Path:
    """A folder of emulated nccl-tests executables for the world at ``world_address``."""
    from lumion_hil.instruments.emulators.nccl_tests import install

    folder = Path(tempfile.gettempdir()) / "lumion-hil-nccl-tests" / world_address.replace(":", "-")
    return install(folder, world_address)


def job_argv(world_address: str, job, ranks: list[str]) -> list[str]:
    """The emulated training job's command template (one rank; {rank} filled by the agent)."""
    return [sys.executable, "-m", "lumion_hil.instruments.gpu_host.emulated_job", "--world", world_address,
            "--ranks", ",".join(ranks), "--rank", "{rank}", "--gradient-bytes", str(job.gradient_bytes),
            "--compute-time-s", str(job.compute_time_s), "--startup-time-s", str(job.startup_time_s),
            "--batch", str(job.batch_per_rank)]


def served_bench(bench, emulated: "EmulatedBench") -> dict:
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
