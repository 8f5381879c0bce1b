"""Emulated HUBER+SUHNER Polatis optical circuit switch: its SCPI set over the world, as the
shared instrument reference and third-party drivers and scripts for it use it (short and long
forms, any case, trailing semicolons, ``;*OPC?`` on the same line, CR LF line ends).

Assumed where the reference is silent, and said so:
- a connection whose ingress or egress is in use is refused with -221 "Settings conflict";
- ``:oxc:swit:conn:port?`` of an unconnected port answers an empty line (a script written
  against an N-OST-24x24 says "no connection returns an empty string": tests/replay);
- ``*RST`` removes every connection, clears the error queue and re-enables every port (a
  third-party driver documents "resets the instrument and disconnects all connections");
- disconnection takes no switching time (the beam leaves the output as it starts to move);
- ``:oxc:boot:mode`` is DARK (no connections after power comes back), RESTore or AUTosave
  (the connections before the loss come back; the default here);
- ``:oxc:swit:port:stat?`` without a list answers every port, ingress first;
- ``:syst:comm:netw:addr?`` answers ``key="value"`` pairs, the form a published client library
  parses (devicecontrol-polatis); the key names are assumed.
"""

from __future__ import annotations

import random
import time

from typing import Any

from lumion_hil.instruments.emulators.scpi import (
    DATA_OUT_OF_RANGE,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    PARAMETER_NOT_ALLOWED,
    SETTINGS_CONFLICT,
    ScpiDevice,
    ScpiError,
    choice,
    format_channel_list,
    no_args,
    parse_channel_list,
    split_top_level,
)
from lumion_hil.instruments.emulators.world import World, WorldError

_WORLD_ERRORS = {"range": DATA_OUT_OF_RANGE, "conflict": SETTINGS_CONFLICT, "argument": ILLEGAL_PARAMETER}


class PolatisEmulator(ScpiDevice):
    def __init__(self, name: str, spec: Any, world: World, seed: int = 1):
        super().__init__(name, command_latency_s=world.scaled_ns(spec.emulation.command_latency_s) / 1e9)
        self.spec = spec
        self.world = world
        self._rng = random.Random(seed)
        self.boot_mode = "AUTosave"
        n_in, n_out = spec.emulation.reported_ports or spec.ports
        product = spec.emulation.product_code or f"N-VST-{n_in}x{n_out}-HU1-EMU"
        self.identity = f"Polatis,{product},EMU{seed:05d},6.5.2.18"
        c = self.command
        c("*IDN?", lambda a: self.identity)
        c("*RST", self._reset)
        c("*OPC?", self._opc)
        c(":OXC:SWITch:SIZE?", lambda a: no_args(a) or f"{n_in},{n_out}")
        c(":OXC:SWITch:CONNect:ADD", self._add)
        c(":OXC:SWITch:CONNect:SUBtract", self._sub)
        c(":OXC:SWITch:CONNect:ONLY", self._only)
        c(":OXC:SWITch:DISConnect:ALL", self._disconnect_all)
        c(":OXC:SWITch:CONNect:STATe?", self._state)
        c(":OXC:SWITch:CONNect:PORT?", self._port)
        c(":OXC:SWITch:PORT:STATe?", self._port_state)
        c(":OXC:SWITch:PORT:DISable", lambda a: self._set_ports(a, "D"))
        c(":OXC:SWITch:PORT:ENABle", lambda a: self._set_ports(a, "E"))
        c(":OXC:BOOT:MODE", lambda a: setattr(self, "boot_mode", choice(a, "DARK", "RESTore", "AUTosave")))
        c(":OXC:BOOT:MODE?", lambda a: {"DARK": "DARK", "RESTore": "REST", "AUTosave": "AUT"}[self.boot_mode])
        c(":SYSTem:COMMunicate:NETWork:ADDRess?",
          lambda a: no_args(a) or 'IPADDR="127.0.0.1" NETMASK="255.0.0.0" GATEWAY="0.0.0.0" DHCP="OFF"')
        if spec.power_monitors:
            c(":PMONitor:POWer?", self._power)

    def power_on(self) -> None:
        """After a power loss: the error queue empty; connections as the boot mode says."""
        super().power_on()
        if getattr(self, "boot_mode", "AUTosave") == "DARK":
            self.world.disconnect(None)

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
        no_args(args)
        self.clear_errors()
        self.world.disconnect(None)
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
        args = args.strip().strip("\"'")
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
        return ""

    def _port_state(self, args: str) -> str:
        ports = self._ports(args) if args.strip() else list(self.world.ingress_ports) + list(self.world.egress_ports)
        return "(" + ",".join(self.world.port_state(p) for p in ports) + ")"

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
