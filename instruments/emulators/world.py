"""The emulated bench's one physical world.

Emulated instruments are views of it: the switch emulator changes cross-connects, a meter reads
the power arriving at the port it taps, a host sees its links. Everything the world holds is a
history over time (``perf_counter_ns``, the same clock the harness times with), so any view can
ask "what was the light at port 18 at instant t" and the world also knows the true time of every
physical event: the ground truth the harness's measurements are checked against.

The world is one object in parts, each a mixin over :class:`~.world_core.WorldCore` (its state,
clock and event log) in a module of its own: the switch (world_switch.py), ports, losses,
sources and the light (world_light.py), the GPUs (world_gpus.py), the NIC links and the changes
the world makes on its own (world_links.py), the fabrics and the migration baseline
(world_fabrics.py); its values are in world_types.py.
"""

from __future__ import annotations

from lumion_hil.instruments.emulators.world_core import WorldCore, as_wired
from lumion_hil.instruments.emulators.world_fabrics import FabricMixin
from lumion_hil.instruments.emulators.world_gpus import GpuMixin
from lumion_hil.instruments.emulators.world_light import LightMixin
from lumion_hil.instruments.emulators.world_links import LinkMixin
from lumion_hil.instruments.emulators.world_switch import SwitchMixin
from lumion_hil.instruments.emulators.world_types import LINK_STATES, Circuit, GpuState, WorldError, WorldEvent

__all__ = ["LINK_STATES", "Circuit", "GpuState", "World", "WorldCore", "WorldError", "WorldEvent", "as_wired"]


class World(FabricMixin, LinkMixin, LightMixin, SwitchMixin, GpuMixin, WorldCore):
    """Light, loss and switch state of the whole emulated bench, over time."""

    def heal(self) -> None:
        """Every fault undone: failed GPUs repaired, ports enabled, extra losses gone (the
        defects of the bench, its damaged connectors, stay)."""
        with self.lock:
            t = self.now_ns()
            for (host, index), gpu in self.gpus.items():
                if gpu.failed_ns is not None:
                    self.repair_gpu(host, index)
            for port, hist in self._port_state.items():
                if hist.at(t) != "E":
                    self.set_port_state(port, "E", t)
            for port, hist in self._extra_loss.items():
                if hist.at(t) != 0.0:
                    self.set_extra_loss(port, 0.0, t)
