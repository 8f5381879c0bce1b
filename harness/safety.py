"""The switch as the harness hands it out: protected ports are never switched, whoever asks."""

from __future__ import annotations

from typing import Iterable

from lumion_hil.harness.errors import SafetyError
from lumion_hil.instruments.protocols import OpticalSwitch, Pairs, as_pairs


class GuardedSwitch(OpticalSwitch):
    """Wraps any OpticalSwitch; refuses every change that touches a protected port."""

    def __init__(self, switch: OpticalSwitch, protected_ports: Iterable[int], baseline: Pairs = ()):
        self._switch = switch
        self.name = switch.name
        self.protected_ports = frozenset(protected_ports)
        self.baseline = as_pairs(baseline)

    def _refuse_protected(self, what: str, ports: Iterable[int]) -> None:
        touched = sorted(set(ports) & self.protected_ports)
        if touched:
            raise SafetyError(f"{self.name}: refused to {what}: port(s) {touched} are protected and never switched")

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
        items = as_pairs(pairs)
        self._refuse_protected(f"connect {items}", [p for pair in items for p in pair])
        current = self.connections().items()
        keep = [pair for pair in current if set(pair) & self.protected_ports]
        blocked = [(pair, kept) for pair in items if pair not in keep for kept in keep if set(pair) & set(kept)]
        if blocked:
            listed = "; ".join(f"{want} needs a port of {kept}" for want, kept in blocked)
            raise SafetyError(f"{self.name}: cannot make {items}: a circuit on a protected port stands in the way "
                              f"({listed}). Protected ports are never switched: clear it by hand")
        OpticalSwitch.replace_all(self, items + keep)

    def restore_baseline(self) -> None:
        """Back to the bench's baseline cross-connects, leaving protected ports as they are."""
        self.replace_all(self.baseline)

    def verify_baseline(self) -> None:
        """Read the switch back: the baseline, and nothing else but protected ports' circuits."""
        now = set(self.connections().items())
        wanted = set(self.baseline)
        extra = sorted(p for p in now - wanted if not set(p) & self.protected_ports)
        missing = sorted(wanted - now)
        if extra or missing:
            raise SafetyError(f"{self.name}: not at its baseline after restoring it: missing {missing}, extra {extra}")

    def _unprotected(self, pairs) -> list[tuple[int, int]]:
        return [pair for pair in pairs if not set(pair) & self.protected_ports]

    def port_states(self, ports):
        return self._switch.port_states(ports)

    @property
    def has_power_monitors(self) -> bool:
        return self._switch.has_power_monitors

    def port_power_dbm(self, ports):
        return self._switch.port_power_dbm(ports)

    def enable_ports(self, ports: Iterable[int]) -> None:
        ports = list(ports)
        self._refuse_protected(f"enable ports {ports}", ports)
        self._switch.enable_ports(ports)

    def disable_ports(self, ports: Iterable[int]) -> None:
        ports = list(ports)
        self._refuse_protected(f"disable ports {ports}", ports)
        self._switch.disable_ports(ports)

    def close(self) -> None:
        self._switch.close()
