"""The world's switch (:class:`SwitchMixin`): cross-connects made and removed over time, each
beam settling after its switching time, and protected ports switched recorded as violations."""

from __future__ import annotations

import random
import time
from typing import Iterable

from lumion_hil.instruments.emulators.world_core import WorldCore
from lumion_hil.instruments.emulators.world_types import Circuit, WorldError, WorldEvent


class SwitchMixin(WorldCore):
    """The switch's cross-connects, over time."""

    def live_circuits(self, t_ns: int | None = None) -> list[Circuit]:
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            return sorted((c for c in self._circuits_at(t) if c.live_at(t)), key=lambda c: c.ingress)

    def connections(self, t_ns: int | None = None) -> dict[int, int]:
        return {c.ingress: c.egress for c in self.live_circuits(t_ns)}

    def switch_busy_until_ns(self) -> int:
        with self.lock:
            return self._busy_until_ns

    def wait_settled(self) -> int:
        """Block until every beam commanded so far has settled (the switch's own busy-until
        instant, ground truth); returns that instant."""
        while (remaining := self.switch_busy_until_ns() - self.now_ns()) > 0:
            time.sleep(min(remaining / 1e9, 0.05))  # looked at again: a command may queue more beams
        return self.switch_busy_until_ns()

    def connect(self, pairs: Iterable[tuple[int, int]], t_ns: int | None = None) -> int:
        """Start moving beams for each (ingress, egress). Returns when the last one settles.

        Connections settle one after another, ``switching_time_s`` each (a beam-steering
        switch's controller moves one beam pair at a time: assumption from "about 50 ms per
        connection"), each drawing its own time where ``switching_jitter_s`` spreads it. A
        pair that already exists is left as it is."""
        pairs = list(pairs)
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            live = {c.ingress: c for c in self.live_circuits(t)}
            egress_used = {c.egress: c for c in live.values()}
            self._check_pairs(pairs)
            new = []
            for ingress, egress in pairs:
                existing = live.get(ingress)
                if existing is not None and existing.egress == egress:
                    continue
                if existing is not None:
                    raise WorldError("conflict", f"ingress {ingress} is already connected to {existing.egress}")
                if egress in egress_used:
                    raise WorldError("conflict", f"egress {egress} is already connected to {egress_used[egress].ingress}")
                new.append((ingress, egress))
            start = max(t, self._busy_until_ns)
            self.record(t, "switch.command", "connect", pairs=new)
            lit = start
            for ingress, egress in new:
                moving = lit
                lit += self._switching_ns(ingress, egress) + (self.multi_connection_extra_ns if len(new) > 1 else 0)
                circuit = Circuit(ingress, egress, t, lit, moving_ns=moving)
                self.circuits.append(circuit)
                self._touch(egress)
                self._by_egress.setdefault(egress, []).append(circuit)
                self._by_ingress.setdefault(ingress, []).append(circuit)
                self._current[ingress] = circuit
                self._last_change_ns = max(self._last_change_ns, t)
                self.events.append(WorldEvent(lit, "circuit.lit", f"{ingress}->{egress}",
                                               {"ingress": ingress, "egress": egress}))
                self._busy_until_ns = lit
                self._note_protected(t, ingress, egress)
            self._notify()
            return max(self._busy_until_ns, t)

    def _switching_ns(self, ingress: int, egress: int) -> int:
        """One connection's switching time: switching_time_s, spread by switching_jitter_s. The
        n-th making of a pair draws from (seed, pair, n): two benches of one seed draw alike for
        the same connection, whatever else each did in between (common random numbers)."""
        if not self.switching_jitter_ns:
            return self.switching_time_ns
        n = self._connections_made.get((ingress, egress), 0)
        self._connections_made[(ingress, egress)] = n + 1
        draw = random.Random(f"{self._switching_seed}/{ingress}-{egress}/{n}").gauss(0.0, 1.0)
        return max(0, int(self.switching_time_ns + draw * self.switching_jitter_ns))

    def disconnect(self, pairs: Iterable[tuple[int, int]] | None = None, t_ns: int | None = None) -> None:
        """Remove the given (ingress, egress) connections, or all of them. Light is lost at once:
        the beam leaves the output as soon as it starts to move."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            live = self.live_circuits(t)
            if pairs is None:
                chosen = live
            else:
                wanted = list(pairs)
                self._check_pairs(wanted)
                by_pair = {(c.ingress, c.egress): c for c in live}
                missing = [p for p in wanted if p not in by_pair]
                if missing:
                    raise WorldError("conflict", f"not connected: {', '.join(f'{i}->{e}' for i, e in missing)}")
                chosen = [by_pair[p] for p in wanted]
            for c in chosen:
                c.removed_ns = t
                self._touch(c.egress)
                if self._current.get(c.ingress) is c:
                    del self._current[c.ingress]
                self._last_change_ns = max(self._last_change_ns, t)
                was_lit = c.lit_ns <= t
                if not was_lit:  # removed while its beam was still moving
                    self.events = [e for e in self.events
                                   if not (e.kind == "circuit.lit" and e.subject == f"{c.ingress}->{c.egress}"
                                           and e.t_ns == c.lit_ns)]
                self.events.append(WorldEvent(t, "circuit.dark", f"{c.ingress}->{c.egress}",
                                               {"ingress": c.ingress, "egress": c.egress, "was_lit": was_lit}))
                self._note_protected(t, c.ingress, c.egress)
            self.record(t, "switch.command", "disconnect", pairs=[(c.ingress, c.egress) for c in chosen])

    def replace_all(self, pairs: Iterable[tuple[int, int]], t_ns: int | None = None) -> int:
        """Make the given connections the only ones; unchanged ones are not touched."""
        pairs = list(pairs)
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._check_pairs(pairs)
            wanted = set(pairs)
            current = {(c.ingress, c.egress) for c in self.live_circuits(t)}
            stale = current - wanted
            if stale:
                self.disconnect(sorted(stale), t)
            return self.connect(sorted(wanted - current), t)

    def _check_pairs(self, pairs: list[tuple[int, int]]) -> None:
        ins = [i for i, _ in pairs]
        outs = [e for _, e in pairs]
        for port in ins:
            if port not in self.ingress_ports:
                raise WorldError("range", f"{port} is not an ingress port")
        for port in outs:
            if port not in self.egress_ports:
                raise WorldError("range", f"{port} is not an egress port")
        if len(set(ins)) != len(ins) or len(set(outs)) != len(outs):
            raise WorldError("argument", "a port appears twice in one request")

    def _note_protected(self, t: int, *ports: int) -> None:
        touched = sorted(set(ports) & self.protected_ports)
        if touched:
            violation = WorldEvent(t, "safety.violation", "protected port switched", {"ports": touched})
            self.events.append(violation)
            self.violations.append(violation)
