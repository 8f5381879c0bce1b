"""Emulated HUBER+SUHNER Polatis optical circuit switch: its SCPI set over the world, as the
shared instrument reference and third-party drivers and scripts for it use it (short and long
forms, any case, trailing semicolons, ``;*OPC?`` on the same line, CR LF line ends).

The command set is transcribed in manuals/polatis.yaml (every command with its parameters,
ranges and state here; the Polatis SCPI manual itself was not found, so it is read from the
published drivers named there). What the emulated switch cannot do is refused with an error,
never silently accepted: :meth:`refuse` lists those commands.

Assumed where the reference is silent, and said so:
- a connection whose ingress or egress is in use is refused with -221 "Settings conflict";
- ``:oxc:swit:conn:sub`` of a pair that is not connected is refused with -221 likewise; with one
  of the two lists empty (``(@1,2,3),(@)``, a form a published driver's comments give) every
  connection of the listed ports is removed, and a listed port that has none is left as it is;
- ``:oxc:swit:conn:add`` and ``:only`` take an optional third ``<mode>`` argument in a published
  driver's comments, whose values no source gives: any mode is refused with -224;
- ``:oxc:swit:conn:port?`` of an unconnected port answers an empty line (a script written
  against an N-OST-24x24 says "no connection returns an empty string": tests/replay);
- ``*RST`` removes every connection, clears the error queue and re-enables every port (a
  third-party driver documents "resets the instrument and disconnects all connections");
- disconnection takes no switching time (the beam leaves the output as it starts to move);
- ``:oxc:boot:mode`` is DARK (no connections after power comes back), RESTore or AUTosave
  (the connections before the loss come back; the default here);
- ``:oxc:swit:port:stat?`` without a list answers every port, ingress first;
- ``:syst:comm:netw:addr?`` answers ``key="value"`` pairs with the keys a published client's
  comments give from the manual (``IP``, ``Gateway``, ``Mask``, ``Broadcast``); the emulated
  switch has one management interface on the bench's loopback address, so ``NETWork2`` answers
  -241 "Hardware missing" and setting an address is refused with -221.
"""

from __future__ import annotations

import random

from typing import Any

from lumion_hil.instruments.emulators.scpi import ScpiDevice
from lumion_hil.instruments.emulators.scpi_grammar import (
    DATA_OUT_OF_RANGE,
    HARDWARE_MISSING,
    HEADER_SUFFIX_OUT_OF_RANGE,
    ILLEGAL_PARAMETER,
    MISSING_PARAMETER,
    PARAMETER_NOT_ALLOWED,
    SETTINGS_CONFLICT,
    ScpiError,
    choice,
    format_channel_list,
    no_args,
    parse_channel_list,
    split_top_level,
)
from lumion_hil.instruments.emulators.world import World, WorldError

_WORLD_ERRORS = {"range": DATA_OUT_OF_RANGE, "conflict": SETTINGS_CONFLICT, "argument": ILLEGAL_PARAMETER}
ADDRESS_FIXED = (SETTINGS_CONFLICT[0], "Settings conflict; the address is the bench's")
ONE_INTERFACE = (HARDWARE_MISSING[0], "Hardware missing; one management interface")


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
        c(":OXC:BOOT:MODE?", lambda a: no_args(a) or {"DARK": "DARK", "RESTore": "REST", "AUTosave": "AUT"}[self.boot_mode])
        c(":SYSTem:COMMunicate:NETWork[n]:ADDRess?", self._address)
        if spec.power_monitors:
            c(":PMONitor:POWer?", self._power)
        else:  # a model without monitors (an I-OST, say): the command is there, the hardware not
            self.refuse(":PMONitor:POWer?", HARDWARE_MISSING)
        self.refuse(":SYSTem:COMMunicate:NETWork[n]:ADDRess", ADDRESS_FIXED)

    def power_on(self) -> None:
        """After a power loss: the error queue empty; connections as the boot mode says."""
        super().power_on()
        if getattr(self, "boot_mode", "AUTosave") == "DARK":
            self.world.disconnect(None)

    # -- what the emulated switch refuses ---------------------------------------------------------

    # -- helpers --------------------------------------------------------------------------------

    def _lists(self, args: str) -> tuple[list[int], list[int]]:
        """``<ingress list>,<egress list>[,<mode>]``: the two lists; a mode is refused."""
        parts = [s for s in split_top_level(args, ",") if s.strip()]
        if len(parts) < 2:
            raise ScpiError(*MISSING_PARAMETER)
        if len(parts) > 2:
            raise ScpiError(*ILLEGAL_PARAMETER)  # <mode>: its values are in no source read
        return parse_channel_list(parts[0]), parse_channel_list(parts[1])

    def _pairs(self, args: str) -> list[tuple[int, int]]:
        ins, outs = self._lists(args)
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
        self.world.wait_settled()
        return "1"

    def _add(self, args: str) -> None:
        self._world(self.world.connect, self._pairs(args))

    def _sub(self, args: str) -> None:
        ins, outs = self._lists(args)
        if ins and outs:
            if len(ins) != len(outs):
                raise ScpiError(*ILLEGAL_PARAMETER)
            return self._world(self.world.disconnect, list(zip(ins, outs)))
        # One list empty: every connection of the ports listed in the other goes.
        valid = self.world.ingress_ports if ins else self.world.egress_ports
        listed = ins or outs
        if any(p not in valid for p in listed):
            raise ScpiError(*DATA_OUT_OF_RANGE)
        side = 0 if ins else 1
        doomed = [pair for pair in self.world.connections().items() if pair[side] in listed]
        if doomed:
            self._world(self.world.disconnect, doomed)

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

    def _address(self, args: str, interface: int = 1) -> str:
        no_args(args)
        if interface == 2:
            raise ScpiError(*ONE_INTERFACE)
        if interface != 1:
            raise ScpiError(*HEADER_SUFFIX_OUT_OF_RANGE)
        return 'IP="127.0.0.1" Gateway="0.0.0.0" Mask="255.0.0.0" Broadcast="127.255.255.255"'

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
