"""The world's light (:class:`LightMixin`): the switch's port states, extra losses and
transmitters over time, and from them the power and wavelength at any port at any instant."""

from __future__ import annotations

import math

from lumion_hil.instruments.emulators.world_core import WorldCore
from lumion_hil.instruments.emulators.world_types import Circuit, History, WorldError


class LightMixin(WorldCore):
    """Ports, losses and sources, and the light they let through."""

    # -- ports, losses and sources --------------------------------------------------------------

    def set_port_state(self, port: int, state: str, t_ns: int | None = None) -> None:
        """'E' enabled, 'D' disabled (shutter closed), 'F' failed."""
        if port not in self.ingress_ports and port not in self.egress_ports:
            raise WorldError("range", f"{port} is not a port of the switch")
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._port_state.setdefault(port, History("E")).set(t, state)
            self._touch(port)
            self.record(t, "port.state", str(port), state=state)

    def port_state(self, port: int, t_ns: int | None = None) -> str:
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            hist = self._port_state.get(port)
            return hist.at(t) if hist else "E"

    def set_extra_loss(self, port: int, loss_db: float, t_ns: int | None = None) -> None:
        """Extra loss on the fibre at a switch port (a bend, a dirty connector; inf is a cut)."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._extra_loss.setdefault(port, History(0.0)).set(t, loss_db)
            self._touch(port)
            self.record(t, "loss", str(port), extra_db=loss_db)

    def set_source(self, ingress: int, on: bool, t_ns: int | None = None) -> None:
        """Switch a transmitter's laser on or off (a host powering down, say)."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            self._source_on.setdefault(ingress, History(True)).set(t, on)
            self._touch(ingress)
            self.record(t, "source", str(ingress), on=on)

    def set_transmitter(self, host: str, nic: str, on: bool) -> int:
        """A host turns one NIC's transmitter off or on (its laser: what a host's agent does for
        the fibre walk); the light goes out, or comes back, at the port its fibre really lands on."""
        spec, _ = self._nic(host, nic)
        t = self.now_ns()
        self.set_source(spec.tx_port, bool(on), t)
        return t

    def _extra(self, port: int, t: int) -> float:
        hist = self._extra_loss.get(port)
        return (hist.at(t) if hist else 0.0) + self.port_loss_db.get(port, 0.0)

    # -- light ----------------------------------------------------------------------------------

    def port_power_dbm(self, port: int, t_ns: int | None = None) -> float | None:
        """Optical power at a switch port at instant t, or None when it is dark.

        Ingress: what arrives from the transmitter. Egress: what leaves the switch towards the
        receiver, after the switch's insertion loss and the connectors."""
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            if port in self.ingress_ports:
                return self._ingress_power(port, t)
            if port not in self.egress_ports or self.port_state(port, t) != "E":
                return None
            circuit = self._lit_into(port, t)
            if circuit is None:
                return self._crosstalk_dbm(port, t)
            if self.port_state(circuit.ingress, t) != "E":
                return None
            arriving = self._ingress_power(circuit.ingress, t)
            if arriving is None:
                return None
            power = arriving - self.insertion_loss_db - self.connection_loss_db.get((circuit.ingress, port), 0.0) \
                - self.connector_loss_db - self._extra(port, t)
            return None if math.isinf(power) else power

    def _lit_into(self, egress: int, t: int) -> Circuit | None:
        """The circuit lighting an egress port at t. The newest first, and no further back than
        the newest made by t: an egress carries one circuit at a time, so every earlier one was
        removed before that one was made (a port dark now is not looked at through its whole
        history, which grows with every story a run tells)."""
        for c in reversed(self._by_egress.get(egress, ())):
            if c.lit_at(t):
                return c
            if c.commanded_ns <= t:
                return None
        return None

    def _crosstalk_dbm(self, egress: int, t: int) -> float | None:
        """A dark egress port's leak from every lit path, ``crosstalk_db`` down (a defect)."""
        if self.crosstalk_db is None:
            return None
        leaking = [self._ingress_power(c.ingress, t) for c in self._circuits_at(t) if c.lit_at(t)]
        total_mw = sum(10 ** (p / 10) for p in leaking if p is not None)
        if total_mw <= 0:
            return None
        power = 10 * math.log10(total_mw) + self.crosstalk_db - self.insertion_loss_db - self._extra(egress, t)
        return None if math.isinf(power) else power

    def _ingress_power(self, port: int, t: int) -> float | None:
        source = self.sources.get(port)
        if source is None:
            return None
        on = self._source_on.get(port)
        if on is not None and not on.at(t):
            return None
        power = source.launch_dbm - source.tx_fibre_loss_db - self._extra(port, t)
        return None if math.isinf(power) else power

    def received_dbm(self, egress: int, t_ns: int | None = None) -> float | None:
        """Power at the receiver fed by an egress port (after its receive fibre)."""
        power = self.port_power_dbm(egress, t_ns)
        sink = self.sinks.get(egress)
        if power is None or sink is None:
            return power
        return power - sink.rx_fibre_loss_db

    def wavelength_at(self, port: int, t_ns: int | None = None) -> float | None:
        """Wavelength of the light at a port (None when dark)."""
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            if port in self.sources:
                return self.sources[port].wavelength_nm
            circuit = self._lit_into(port, t)
            return self.sources[circuit.ingress].wavelength_nm if circuit and circuit.ingress in self.sources else None

    def mean_power_mw(self, port: int, t0_ns: int, t1_ns: int, samples: int = 32) -> float:
        """Mean optical power over [t0, t1] in mW (what an averaging detector integrates);
        dark counts as zero."""
        if t1_ns <= t0_ns:
            power = self.port_power_dbm(port, t0_ns)
            return 0.0 if power is None else 10 ** (power / 10)
        step = (t1_ns - t0_ns) / samples
        total = 0.0
        for i in range(samples):
            power = self.port_power_dbm(port, int(t0_ns + (i + 0.5) * step))
            total += 0.0 if power is None else 10 ** (power / 10)
        return total / samples

    def light_changes(self, port: int, since_ns: int) -> list[int]:
        """Instants after ``since_ns`` at which the light at a port may change (known so far)."""
        with self.lock:
            out: set[int] = set()
            for c in self._by_ingress.get(port, []) + self._by_egress.get(port, []):
                out.update(x for x in (c.lit_ns, c.removed_ns) if x is not None and x > since_ns)
            return sorted(out)
