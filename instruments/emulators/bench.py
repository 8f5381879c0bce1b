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
        from instruments.emulators.scpi import TcpScpiServer

        if spec.model == "polatis":
            from instruments.emulators.polatis import PolatisEmulator

            device = PolatisEmulator(name, spec, self.world, seed=seed)
            return device, TcpScpiServer(device)
        raise ValueError(f"{name}: no emulator for model {spec.model!r} yet")

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def __enter__(self) -> "EmulatedBench":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
