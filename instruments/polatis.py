"""HUBER+SUHNER Polatis optical circuit switch over raw SCPI (TCP port 5025).

Command set: shared instrument reference. Ingress ports are 1..N, egress N+1..N+M.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from lumion_hil.instruments.protocols import (
    Identity,
    InstrumentError,
    InstrumentIOError,
    OpticalSwitch,
    Pairs,
    PortState,
    as_pairs,
)
from lumion_hil.instruments.scpi import ScpiInstrument, parse_identity, query

_CHANNEL_LIST = re.compile(r"\(@([\d,\s]*)\)")


def channel_list(ports: Iterable[int]) -> str:
    return "(@" + ",".join(str(int(p)) for p in ports) + ")"


def parse_channel_lists(reply: str) -> list[list[int]]:
    lists = _CHANNEL_LIST.findall(reply)
    if not lists or _CHANNEL_LIST.sub("", reply).strip(" ,"):
        raise ValueError("expected channel lists like (@1,2),(@17,18)")
    return [[int(p) for p in items.split(",") if p.strip()] for items in lists]


def parse_connections(reply: str) -> dict[int, int]:
    lists = parse_channel_lists(reply)
    if len(lists) != 2 or len(lists[0]) != len(lists[1]):
        raise ValueError("expected two channel lists of equal length")
    return dict(zip(lists[0], lists[1]))


def parse_size(reply: str) -> tuple[int, int]:
    n_in, n_out = (int(x) for x in reply.split(","))
    return n_in, n_out


def parse_parenthesised(reply: str) -> list[str]:
    m = re.fullmatch(r"\s*\(([^()]*)\)\s*", reply)
    if not m:
        raise ValueError("expected a parenthesised list")
    return [x.strip() for x in m.group(1).split(",")] if m.group(1).strip() else []


class PolatisSwitch(ScpiInstrument, OpticalSwitch):
    error_query = ":SYST:ERR:ALL?"
    error_query_returns_all = True

    identity = query("*IDN?", parse_identity, "vendor, model, serial, firmware")
    port_counts = query(":OXC:SWIT:SIZE?", parse_size, "(ingress count, egress count)")
    connection_map = query(":OXC:SWIT:CONN:STAT?", parse_connections, "current cross-connects")

    def __init__(self, session, *, power_monitors: bool = False, opc_timeout_s: float = 10.0):
        super().__init__(session, opc_timeout_s=opc_timeout_s)
        self._power_monitors = power_monitors

    def identify(self) -> Identity:
        return self.identity

    def size(self) -> tuple[int, int]:
        return self.port_counts

    def connections(self) -> dict[int, int]:
        return self.connection_map

    def connected_to(self, port: int) -> int | None:
        # Unconnected: an empty reply (some firmware: 0); some firmware quotes the number.
        peer = self.ask(f":OXC:SWIT:CONN:PORT? {int(port)}", lambda r: int(r.strip().strip("\"'") or 0))
        return peer or None

    def _pairs_command(self, header: str, pairs: Pairs) -> str:
        items = as_pairs(pairs)
        return f"{header} {channel_list(i for i, _ in items)},{channel_list(e for _, e in items)}"

    def _switch(self, command: str, remaining: Callable[[dict[int, int]], list], header: str | None = None) -> None:
        """Send a switch command and wait for it. If the exchange fails (no reply, connection
        lost, garbled), nothing says whether the switch moved: read it back, and send again only
        what the read-back shows is still to do, once. A refusal is never sent again."""
        try:
            self.send_and_wait(command)
            return
        except InstrumentIOError as failed:
            first = failed
        try:
            todo = remaining(self.connections())
        except InstrumentError as exc:
            raise InstrumentIOError(self.name, command, f"{first.reason}; the state could not be read back "
                                    f"({exc.reason})", first.reply) from None
        if not todo:
            return  # it was done before the exchange failed
        again = self._pairs_command(header, todo) if header else command
        try:
            self.send_and_wait(again)
        except InstrumentError as exc:
            raise type(exc)(self.name, again, f"sent again after reading back that {todo} was not done "
                            f"({first.reason}): {exc.reason}", exc.reply) from None

    def connect(self, pairs: Pairs) -> None:
        items = as_pairs(pairs)
        if items:
            self._switch(self._pairs_command(":OXC:SWIT:CONN:ADD", items),
                         lambda now: [(i, e) for i, e in items if now.get(i) != e], ":OXC:SWIT:CONN:ADD")

    def disconnect(self, pairs: Pairs) -> None:
        items = as_pairs(pairs)
        if items:
            self._switch(self._pairs_command(":OXC:SWIT:CONN:SUB", items),
                         lambda now: [(i, e) for i, e in items if now.get(i) == e], ":OXC:SWIT:CONN:SUB")

    def disconnect_all(self) -> None:
        self._switch(":OXC:SWIT:DISC:ALL", lambda now: sorted(now.items()))

    def port_states(self, ports: Iterable[int]) -> dict[int, PortState]:
        ports = list(ports)

        def parse(reply: str) -> list[PortState]:
            states = [PortState(s) for s in parse_parenthesised(reply)]
            if len(states) != len(ports):
                raise ValueError(f"asked for {len(ports)} port states, got {len(states)}")
            return states

        return dict(zip(ports, self.ask(f":OXC:SWIT:PORT:STAT? {channel_list(ports)}", parse)))

    def enable_ports(self, ports: Iterable[int]) -> None:
        self.send(f":OXC:SWIT:PORT:ENAB {channel_list(ports)}")

    def disable_ports(self, ports: Iterable[int]) -> None:
        self.send(f":OXC:SWIT:PORT:DIS {channel_list(ports)}")

    @property
    def has_power_monitors(self) -> bool:
        return self._power_monitors

    def probe_power_monitors(self) -> bool:
        """Whether this unit has power monitors, asked of it: a monitor query answered beside
        ``*OPC?`` on one line (a unit without them answers only the ``*OPC?``, and queues an
        error, cleared here)."""
        reply = self.ask(":PMON:POW? (@1);*OPC?")
        self.clear_status()
        return "(" in reply

    def port_power_dbm(self, ports: Iterable[int]) -> dict[int, float]:
        if not self._power_monitors:
            return super().port_power_dbm(ports)
        ports = list(ports)
        command = f":PMON:POW? {channel_list(ports)}"

        def parse(reply: str) -> list[float]:
            values = [float(x) for x in parse_parenthesised(reply)]
            if len(values) != len(ports):
                raise ValueError(f"asked for {len(ports)} ports, got {len(values)} readings")
            return values

        return dict(zip(ports, self.ask(command, parse)))
