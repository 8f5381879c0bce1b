"""Emulated HUBER+SUHNER Polatis optical circuit switch: its SCPI set over the world.

Command set from the shared instrument reference. Assumed where the reference is silent:
- a connection whose ingress or egress is in use is refused with -221 "Settings conflict"
  (the driver removes before it adds);
- ``:oxc:swit:conn:port?`` of an unconnected port answers ``0``;
- ``*RST`` clears the error queue and re-enables every port but keeps the cross-connects, so a
  reset never drops light on a bench;
- disconnection takes no switching time (the beam leaves the output as it starts to move).
"""

from __future__ import annotations

import random
import time

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the emulators read the bench's settings; they import nothing from harness
    from harness.config import SwitchInstrument
from instruments.emulators.scpi import (
    DATA_OUT_OF_RANGE,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    PARAMETER_NOT_ALLOWED,
    SETTINGS_CONFLICT,
    ScpiDevice,
    ScpiError,
    format_channel_list,
    parse_channel_list,
    split_top_level,
)
from instruments.emulators.world import World, WorldError

_WORLD_ERRORS = {"range": DATA_OUT_OF_RANGE, "conflict": SETTINGS_CONFLICT, "argument": ILLEGAL_PARAMETER}


class PolatisEmulator(ScpiDevice):
    def __init__(self, name: str, spec: "SwitchInstrument", world: World, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.spec = spec
        self.world = world
        self._rng = random.Random(seed)
        n_in, n_out = spec.emulation.reported_ports or spec.ports
        self.identity = f"Polatis,N-VST-{n_in}x{n_out}-HU1-EMU,EMU{seed:05d},6.5.2.18"
        self.command("*IDN?", lambda a: self.identity)
        self.command("*RST", self._reset)
        self.command("*OPC?", self._opc)
        self.command(":OXC:SWITch:SIZE?", lambda a: f"{n_in},{n_out}")
        self.command(":OXC:SWITch:CONNect:ADD", self._add)
        self.command(":OXC:SWITch:CONNect:SUBtract", self._sub)
        self.command(":OXC:SWITch:CONNect:ONLY", self._only)
        self.command(":OXC:SWITch:DISConnect:ALL", self._disconnect_all)
        self.command(":OXC:SWITch:CONNect:STATe?", self._state)
        self.command(":OXC:SWITch:CONNect:PORT?", self._port)
        self.command(":OXC:SWITch:PORT:STATe?", self._port_state)
        self.command(":OXC:SWITch:PORT:DISable", lambda a: self._set_ports(a, "D"))
        self.command(":OXC:SWITch:PORT:ENABle", lambda a: self._set_ports(a, "E"))
        if spec.power_monitors:
            self.command(":PMONitor:POWer?", self._power)

    # -- helpers --------------------------------------------------------------------------------

    def _pairs(self, args: str) -> list[tuple[int, int]]:
        lists = [s for s in split_top_level(args, ",") if s.strip()]
        if len(lists) != 2:
            raise ScpiError(*MISSING_PARAMETER)
        ins, outs = parse_channel_list(lists[0]), parse_channel_list(lists[1])
        if len(ins) != len(outs):
            raise ScpiError(*ILLEGAL_PARAMETER)
        return list(zip(ins, outs))

    def _ports(self, args: str) -> list[int]:
        if not args:
            raise ScpiError(*MISSING_PARAMETER)
        ports = parse_channel_list(args)
        for p in ports:
            if p not in self.world.ingress_ports and p not in self.world.egress_ports:
                raise ScpiError(*DATA_OUT_OF_RANGE)
        return ports

    def _world(self, action, *args):
        try:
            return action(*args)
        except WorldError as exc:
            raise ScpiError(*_WORLD_ERRORS[exc.kind]) from None

    # -- commands -------------------------------------------------------------------------------

    def _reset(self, args: str) -> None:
        self.clear_errors()
        for port in list(self.world.ingress_ports) + list(self.world.egress_ports):
            if self.world.port_state(port) != "E":
                self.world.set_port_state(port, "E")

    def _opc(self, args: str) -> str:
        # Answer only once every pending beam has settled: the completion signal a driver waits on.
        while True:
            remaining_ns = self.world.switch_busy_until_ns() - self.world.now_ns()
            if remaining_ns <= 0:
                return "1"
            time.sleep(min(remaining_ns / 1e9, 0.05))

    def _add(self, args: str) -> None:
        self._world(self.world.connect, self._pairs(args))

    def _sub(self, args: str) -> None:
        self._world(self.world.disconnect, self._pairs(args))

    def _only(self, args: str) -> None:
        self._world(self.world.replace_all, self._pairs(args))

    def _disconnect_all(self, args: str) -> None:
        if args:
            raise ScpiError(*PARAMETER_NOT_ALLOWED)
        self.world.disconnect(None)

    def _state(self, args: str) -> str:
        conns = self.world.connections()
        return f"{format_channel_list(conns.keys())},{format_channel_list(conns.values())}"

    def _port(self, args: str) -> str:
        if not args.strip().isdigit():
            raise ScpiError(*MISSING_PARAMETER if not args.strip() else ILLEGAL_PARAMETER)
        port = int(args)
        if port not in self.world.ingress_ports and port not in self.world.egress_ports:
            raise ScpiError(*DATA_OUT_OF_RANGE)
        for ingress, egress in self.world.connections().items():
            if port == ingress:
                return str(egress)
            if port == egress:
                return str(ingress)
        return "0"

    def _port_state(self, args: str) -> str:
        return "(" + ",".join(self.world.port_state(p) for p in self._ports(args)) + ")"

    def _set_ports(self, args: str, state: str) -> None:
        for port in self._ports(args):
            self.world.set_port_state(port, state)

    def _power(self, args: str) -> str:
        t = self.world.now_ns()
        readings = []
        for port in self._ports(args):
            power = self.world.port_power_dbm(port, t)
            if power is None:
                power = self.spec.emulation.monitor_floor_dbm
            power += self._rng.gauss(0.0, self.spec.emulation.monitor_noise_db)
            readings.append(f"{power:.2f}")
        return "(" + ",".join(readings) + ")"
