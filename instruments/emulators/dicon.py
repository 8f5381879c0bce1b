"""Emulated DiCon-style serial matrix switch, on a pseudo-terminal that pyserial opens like a
real port. ``X1 CH <in> <out>`` moves a mirror and keeps the switch busy until it settles (the
switch handles one line at a time, so the next answer comes after); ``X1 CH? <in>`` answers the
output (0: parked); ``X1 CH * 0`` parks all; ``*IDN?``. Anything else answers ``ERR`` (assumed:
the public command set does not say how errors are reported)."""

from __future__ import annotations

import re
import time

from instruments.emulators.world import WorldError


class DiconEmulator:
    def __init__(self, name: str, spec, world, seed: int = 1):
        self.name = name
        self.world = world
        self.ingress_count = spec.ports[0]
        self.identity = f"DiCon,MX-{spec.ports[0]}x{spec.ports[1]}-EMU,EMU{seed:05d},1.0"
        self.faults: dict[str, float | None] = {}  # see instruments/emulators/scpi.py FAULTS

    def _settle(self) -> None:
        remaining = self.world.switch_busy_until_ns() - self.world.now_ns()
        if remaining > 0:
            time.sleep(remaining / 1e9)  # busy while the mirror moves

    def power_on(self) -> None:
        """After a power loss every mirror is parked (assumption: a MEMS matrix holds no position
        without power)."""
        self.world.disconnect(None)

    def handle_line(self, line: str) -> str | None:
        text = line.strip()
        if "busy" in self.faults and not text.endswith("?"):
            return "ERR"
        if text.upper() == "*IDN?":
            return self.identity
        m = re.fullmatch(r"X1\s+CH\?\s+(\d+)", text, re.IGNORECASE)
        if m:
            ingress = int(m.group(1))
            if ingress not in self.world.ingress_ports:
                return "ERR"
            egress = self.world.connections().get(ingress)
            return str(egress - self.ingress_count) if egress else "0"
        if re.fullmatch(r"X1\s+CH\s+\*\s+0", text, re.IGNORECASE):
            self.world.disconnect(None)
            return None
        m = re.fullmatch(r"X1\s+CH\s+(\d+)\s+(\d+)", text, re.IGNORECASE)
        if m:
            ingress, out = int(m.group(1)), int(m.group(2))
            try:
                current = self.world.connections().get(ingress)
                if current is not None and current != out + self.ingress_count:
                    self.world.disconnect([(ingress, current)])
                if out:
                    self.world.connect([(ingress, out + self.ingress_count)])
            except WorldError:
                return "ERR"
            self._settle()
            return None
        if text.upper() == "REBOOT":
            return None
        return "ERR"
