"""The emulated bench: builds the world from a bench file and serves an emulator for every
instrument marked ``emulated``, each on its real transport."""

from __future__ import annotations

from typing import TYPE_CHECKING

from instruments.emulators.world import World

if TYPE_CHECKING:
    from harness.config import Bench


class EmulatedBench:
    """Start with :meth:`start`, read ``resources`` (instrument name -> address), :meth:`stop`."""

    def __init__(self, bench: "Bench"):
        self.bench = bench
        self.world = World(bench)
        self.emulators: dict[str, object] = {}
        self.servers: dict[str, object] = {}
        self.resources: dict[str, str] = {}

    def start(self) -> "EmulatedBench":
        try:
            for index, (name, spec) in enumerate(self.bench.instruments.items()):
                if not spec.emulated:
                    continue
                device, server = self._serve(name, spec, seed=self.bench.emulator.seed + index)
                self.emulators[name] = device
                self.servers[name] = server.start()
                self.resources[name] = server.resource
        except BaseException:
            self.stop()
            raise
        return self

    def _serve(self, name: str, spec, seed: int):
        """The emulator for a model, on the transport its real instrument uses (the USB meter
        excepted: served on TCP, see its emulator)."""
        from instruments.emulators.scpi import PtyLineServer, TcpScpiServer

        if spec.model == "polatis":
            from instruments.emulators.polatis import PolatisEmulator

            device = PolatisEmulator(name, spec, self.world, seed=seed)
            return device, TcpScpiServer(device)
        if spec.model == "keysight-n77xx":
            from instruments.emulators.keysight_n77xx import KeysightN77xxEmulator

            device = KeysightN77xxEmulator(name, spec, self.world, self.bench, seed=seed)
            return device, TcpScpiServer(device)
        if spec.model == "thorlabs-pm100":
            from instruments.emulators.thorlabs_pm100 import ThorlabsPM100Emulator

            device = ThorlabsPM100Emulator(name, spec, self.world, self.bench, seed=seed)
            return device, TcpScpiServer(device)
        if spec.model == "dicon-matrix":
            from instruments.emulators.dicon import DiconEmulator

            device = DiconEmulator(name, spec, self.world, seed=seed)
            return device, PtyLineServer(device.handle_line, name, eol=b"\n")
        raise ValueError(f"{name}: no emulator for model {spec.model!r}")

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def __enter__(self) -> "EmulatedBench":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
