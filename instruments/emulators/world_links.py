"""The world's NIC links (:class:`LinkMixin`): each goes dark -> light -> locked -> up
(flapping first where its host's emulation says so), following the light at its receiver; and
the changes the world makes on its own, with no command, that a wait is woken at."""

from __future__ import annotations

import bisect

from lumion_hil.instruments.emulators.world_light import LightMixin


class LinkMixin(LightMixin):
    """NIC link states over time, from the light at each receiver."""

    # -- NIC links: dark -> light -> locked -> up, following the light at the receiver ----------

    def _instants(self, rx_port: int, t: int | None = None, after: int | None = None) -> list[int]:
        """Every instant in (after, t] (either end open when None) at which the light reaching
        ``rx_port`` may have changed: its circuits coming and going, and anything at their
        ingress or at the port. Only the history inside the window is read."""
        lo = -1 if after is None else after
        out = {0} if lo < 0 else set()
        ports = {rx_port}
        for c in reversed(self._by_egress.get(rx_port, ())):
            ports.add(c.ingress)
            out.update(x for x in (c.commanded_ns, c.lit_ns, c.removed_ns) if x is not None and x > lo)
            if c.commanded_ns <= lo and c.removed_ns is not None and c.removed_ns <= lo:
                break  # one egress carries one circuit at a time: every earlier one ended before this one
        for histories in (self._extra_loss, self._port_state, self._source_on):
            for port in ports:
                hist = histories.get(port)
                if hist is not None:
                    times = hist._times
                    out.update(x for x in times[bisect.bisect_right(times, lo):] if x >= 0)
        return sorted(x for x in out if t is None or x <= t)

    def _receiving(self, rx_port: int, t: int) -> bool:
        power = self.received_dbm(rx_port, t)
        return power is not None and power >= self.sinks[rx_port].sensitivity_dbm

    def _receiving_since(self, rx_port: int, t: int) -> tuple[bool, int]:
        """Whether the receiver has light at t, and since when. Kept until the light's history
        changes or the next planned instant comes (it is asked for every link, every step)."""
        version = self._version_of(rx_port)
        cached = self._since_cache.get(rx_port)
        if cached is not None and cached[0] == version and cached[1] <= t < cached[2]:
            return cached[3], cached[4]
        upcoming = next(iter(self._instants(rx_port, after=t)), 2**63)
        receiving = self._receiving(rx_port, t)
        since, hi, width, done = 0, t, 2**30, False
        while not done:  # walk back through ever wider windows until the state differs
            lo = hi - width if hi - width > 0 else None
            for inst in reversed(self._instants(rx_port, hi, after=lo)):
                if inst > t:
                    continue
                if self._receiving(rx_port, inst) != receiving:
                    done = True
                    break
                since = inst
            if lo is None:
                break
            hi, width = lo, width * 2
        self._since_cache[rx_port] = (version, t, upcoming, receiving, since)
        return receiving, since

    def _bringup(self, emu) -> tuple[int, int, int, int]:
        """(lock, up, hold, flaps) in ns: a flapping link comes up for ``hold`` (as long as a lock
        and bring-up: assumption), drops, and relocks, ``flaps`` times before it stays up."""
        lock_ns, up_ns = self.scaled_ns(emu.lock_time_s), self.scaled_ns(emu.link_up_time_s)
        return lock_ns, up_ns, lock_ns + up_ns, emu.link_flaps

    def _schedule(self, since: int, emu) -> list[tuple[int, str]]:
        """The (instant, state) a link goes through once light arrives at ``since``."""
        lock_ns, up_ns, hold_ns, flaps = self._bringup(emu)
        out, start = [], since
        for _ in range(flaps):
            out += [(start, "light"), (start + lock_ns, "locked"), (start + lock_ns + up_ns, "up")]
            start += lock_ns + up_ns + hold_ns
        return out + [(start, "light"), (start + lock_ns, "locked"), (start + lock_ns + up_ns, "up")]

    def link_state(self, host: str, nic: str, t_ns: int | None = None) -> tuple[str, int]:
        """(state, since_ns): the NIC's link state at t and when that state began."""
        t = self.now_ns() if t_ns is None else t_ns
        spec, emu = self._nic(host, nic)
        with self.lock:
            receiving, since = self._receiving_since(spec.rx_port, t)
            if not receiving:
                return "dark", since
            current = ("light", since)
            for instant, state in self._schedule(since, emu):
                if instant > t:
                    break
                current = (state, instant)
            return current[0], current[1]

    def link_transitions(self, host: str, nic: str, t_ns: int | None = None) -> list[tuple[int, str]]:
        """Every (instant, state) the link went through, up to t."""
        with self.lock:
            return list(self._history(host, nic, t_ns))

    def _history(self, host: str, nic: str, t_ns: int | None = None) -> list[tuple[int, str]]:
        """:meth:`link_transitions`, the world's own list (callers copy what they hand out).
        What was worked out for an earlier t is kept and only the time since is examined, the
        list extended in place (history is made at the present, never inserted into the past)."""
        t = self.now_ns() if t_ns is None else t_ns
        spec, emu = self._nic(host, nic)
        with self.lock:
            upto, out = self._transitions.get((host, nic), (-1, []))
            if t < upto:
                upto, out = -1, []  # asked about the past: work it out afresh
            elif t > self.now_ns():
                out = list(out)  # asked about the future: worked out, not kept
            lock_ns, up_ns, hold_ns, flaps = self._bringup(emu)
            reach = (flaps + 1) * (lock_ns + up_ns + hold_ns)  # how far after a light change it still acts
            candidates = set(self._instants(spec.rx_port, t, after=None if upto < 0 else upto - reach))
            for inst in list(candidates):
                candidates.update(x for x, _ in self._schedule(inst, emu) if x <= t)
            for inst in sorted(c for c in candidates if c > upto):
                state, since = self.link_state(host, nic, inst)
                if not out or out[-1][1] != state:
                    out.append((since, state))
            if t <= self.now_ns():
                self._transitions[(host, nic)] = (t, out)
            return out

    def carrier_counters(self, host: str, nic: str, t_ns: int | None = None) -> dict[str, int]:
        spec, _ = self._nic(host, nic)
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns  # (under the lock: see optical_fabric)
            # Kept while the light at the receiver is as it was and no change is due: a host
            # reads its counters with every look at its links.
            version = self._version_of(spec.rx_port)
            cached = self._counters.get((host, nic))
            if t_ns is None and cached is not None and cached[0] == version and cached[1] <= t < cached[2]:
                return dict(cached[3])
            history = self._history(host, nic, t)
            # Counted on from where the last count of this same list ended (a link's history
            # grows with every story a run tells: counting it whole at every look cost more
            # with every story).
            counted, n, ups, downs = self._counted.get((host, nic), (None, 0, 0, 0))
            if counted is not history or n > len(history):
                n, ups, downs = 0, 0, 0
            for i in range(n, len(history)):
                before = history[i - 1][1] if i else "dark"
                state = history[i][1]
                ups += state == "up" and before != "up"
                downs += before == "up" and state != "up"
            self._counted[(host, nic)] = (history, len(history), ups, downs)
            counters = {"carrier_up_count": ups, "carrier_down_count": downs, "carrier_changes": ups + downs}
            if t_ns is None:
                upcoming = self.next_link_change_ns(host, nic, t)
                self._counters[(host, nic)] = (version, t, 2**63 if upcoming is None else upcoming, counters)
            return dict(counters)

    def next_link_change_ns(self, host: str, nic: str, t_ns: int | None = None) -> int | None:
        """The next instant the link state may change on its own (lock, up, a flap, or a
        settling beam)."""
        t = self.now_ns() if t_ns is None else t_ns
        spec, emu = self._nic(host, nic)
        with self.lock:
            candidates = []
            for c in reversed(self._by_egress.get(spec.rx_port, ())):
                if c.lit_ns > t:
                    candidates.append(c.lit_ns)
                if c.commanded_ns <= t:
                    break  # every earlier circuit on this port was removed before this one was made
            receiving, since = self._receiving_since(spec.rx_port, t)
            if receiving:
                candidates += [x for x, _ in self._schedule(since, emu) if x > t][:1]
        return min(candidates) if candidates else None

    # -- changes the world makes on its own ------------------------------------------------------

    def next_change_ns(self, t_ns: int | None = None) -> int | None:
        """The next instant the world changes on its own, with no command: a beam settling, a
        link locking, coming up or flapping."""
        with self.lock:
            t = self.now_ns() if t_ns is None else t_ns
            # Kept while the light is as it was: from the instant it was worked out until the
            # change it found, nothing else happens on its own (every stalled rank asks it).
            kept = self._next_change
            if kept is not None and kept[0] == self._light_version and kept[1] <= t < kept[2]:
                return kept[3]
            instants = [self.next_link_change_ns(h.name, n.name, t) for h, n in self.bench.nic_ports()]
            nxt = min((x for x in instants if x is not None), default=None)
            if t >= self._changed_ns:  # (an instant before the last change is worked out, never kept)
                self._next_change = (self._light_version, t, 2**63 if nxt is None else nxt, nxt)
            return nxt

    def wait_for_change(self, timeout_s: float, since_ns: int | None = None) -> None:
        """Until something changes: a command, a fault, or a change the world makes on its own
        (woken at its instant, not at the timeout). ``since_ns``: when the caller last looked;
        a change since then, one it may have missed, ends the wait at once."""
        with self.lock:
            now = self.now_ns()
            since = now if since_ns is None else since_ns
            nxt = self.next_change_ns(since)
            if self._changed_ns > since or (nxt is not None and nxt <= now):
                return
            if nxt is not None:
                timeout_s = min(timeout_s, max(0.0, (nxt - now) / 1e9) + 5e-5)
            self.changed.wait(timeout_s)
