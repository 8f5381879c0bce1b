"""The switch as the harness hands it out: protected ports are never switched, whoever asks; on a
switch shared with other benches (``safety.owned_ports``, from a labgrid place's ``ports`` tag),
neither is any port that is not the bench's own, whatever the other bench is doing."""

from __future__ import annotations

from typing import Iterable, cast

from lumion_hil.harness.errors import SafetyError
from lumion_hil.harness.timeline import unrecorded
from lumion_hil.instruments.protocols import NotSupported, OpticalSwitch, Pairs, PortShutters, as_pairs


class GuardedSwitch(OpticalSwitch):
    """Wraps any OpticalSwitch; refuses every change that touches a protected port, or a port
    that is not the bench's own (``owned_ports``; None: every port is)."""

    def __init__(self, switch: OpticalSwitch, protected_ports: Iterable[int], baseline: Pairs = (),
                 owned_ports: Iterable[int] | None = None):
        self._switch = switch
        self.name = switch.name
        self.protected_ports = frozenset(protected_ports)
        self.owned_ports = None if owned_ports is None else frozenset(owned_ports)
        self.baseline = as_pairs(baseline)

    def _off_limits(self, port: int) -> bool:
        return port in self.protected_ports or (self.owned_ports is not None and port not in self.owned_ports)

    def may_switch(self, port: int) -> bool:
        """Whether this bench may switch ``port`` (neither protected nor another bench's)."""
        return not self._off_limits(port)

    def _refuse_protected(self, what: str, ports: Iterable[int]) -> None:
        ports = set(ports)
        touched = sorted(ports & self.protected_ports)
        if touched:
            raise SafetyError(f"{self.name}: refused to {what}: port(s) {touched} are protected and never switched")
        foreign = sorted(p for p in ports if self._off_limits(p))
        if foreign:
            raise SafetyError(f"{self.name}: refused to {what}: port(s) {foreign} are not this bench's own (the "
                              "switch is shared; the place's ports tag says which are)")

    def identify(self):
        return self._switch.identify()

    def size(self):
        return self._switch.size()

    def connections(self):
        return self._switch.connections()

    def connect(self, pairs: Pairs) -> None:
        items = as_pairs(pairs)
        self._refuse_protected(f"connect {items}", [p for pair in items for p in pair])
        self._switch.connect(items)

    def disconnect(self, pairs: Pairs) -> None:
        items = as_pairs(pairs)
        self._refuse_protected(f"disconnect {items}", [p for pair in items for p in pair])
        self._switch.disconnect(items)

    def disconnect_all(self) -> None:
        """Every connection except those on protected ports."""
        self.disconnect(self._unprotected(self.connections().items()))

    def replace_all(self, pairs: Pairs) -> None:
        """Make ``pairs`` this bench's only cross-connects, from one reading of the switch: the
        circuits on protected ports, or on another bench's (which that bench may be changing
        right now), are left alone whatever they are."""
        items = as_pairs(pairs)
        self._refuse_protected(f"connect {items}", [p for pair in items for p in pair])
        current = set(self.connections().items())
        keep = [pair for pair in current if any(self._off_limits(p) for p in pair)]
        blocked = [(pair, kept) for pair in items if pair not in keep for kept in keep if set(pair) & set(kept)]
        if blocked:
            listed = "; ".join(f"{want} needs a port of {kept}" for want, kept in blocked)
            raise SafetyError(f"{self.name}: cannot make {items}: a circuit on a protected port, or on another "
                              f"bench's, stands in the way ({listed}). Those are never switched: clear it by hand")
        wanted = set(items)
        remove = sorted(current - wanted - set(keep))
        if remove:
            self.disconnect(remove)
        add = sorted(wanted - current)
        if add:
            self.connect(add)

    def restore_baseline(self) -> None:
        """Back to the bench's baseline cross-connects, leaving protected ports as they are."""
        self.replace_all(self.baseline)

    def verify_baseline(self) -> None:
        """Read the switch back: the baseline, and nothing else but protected ports' circuits."""
        now = set(self.connections().items())
        wanted = set(self.baseline)
        extra = sorted(p for p in now - wanted if not any(self._off_limits(x) for x in p))
        missing = sorted(wanted - now)
        if extra or missing:
            raise SafetyError(f"{self.name}: not at its baseline after restoring it: missing {missing}, extra {extra}")

    def _unprotected(self, pairs) -> list[tuple[int, int]]:
        return [pair for pair in pairs if not any(self._off_limits(p) for p in pair)]

    def port_states(self, ports):
        return self._switch.port_states(ports)

    @property
    def has_power_monitors(self) -> bool:
        return self._switch.has_power_monitors

    def port_power_dbm(self, ports):
        return self._switch.port_power_dbm(ports)

    @property
    def has_port_shutters(self) -> bool:
        """The wrapped switch can turn a port's light off and on (PortShutters)."""
        inner = unrecorded(self._switch)
        return inner.has_port_shutters if isinstance(inner, GuardedSwitch) else isinstance(inner, PortShutters)

    def _shutters(self, what: str) -> PortShutters:
        if not self.has_port_shutters:
            raise NotSupported(self.name, what, "this switch cannot turn a port's light off and on")
        return cast(PortShutters, self._switch)  # the recorded view of one

    def enable_ports(self, ports: Iterable[int]) -> None:
        ports = list(ports)
        self._refuse_protected(f"enable ports {ports}", ports)
        self._shutters("enable ports").enable_ports(ports)

    def disable_ports(self, ports: Iterable[int]) -> None:
        ports = list(ports)
        self._refuse_protected(f"disable ports {ports}", ports)
        self._shutters("disable ports").disable_ports(ports)

    def close(self) -> None:
        self._switch.close()
