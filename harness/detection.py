"""Detection: the watchers of a running job, event-driven where the source allows (NVML XID
events, carrier changes through netlink, the job's exit) and sampling where it does not (the
light at a receiver, read by meters). Each watcher runs in a thread of its own until it
reports; the first report wakes the controller."""

from __future__ import annotations

import threading

from lumion_hil.harness.recovery_model import Detection, DetectionKind
from lumion_hil.harness.spares import host_lost
from lumion_hil.instruments.threads import WORKERS
from lumion_hil.instruments.protocols import InstrumentError

WATCH_WINDOW_S = 0.25  # how long each watcher's event wait lasts before it checks for disarm
# XIDs after which the GPU cannot go on: 79 fell off the bus, 48 double-bit ECC, 74 NVLink error,
# 94/95 contained/uncontained ECC (NVIDIA's XID catalogue). Application XIDs (13, 31, 43) are not.
FATAL_XIDS = (79, 48, 74, 94, 95)
# Several watchers may fire for one fault (an XID and then the job's exit): the most telling
# one that came first is what happened.
_TELLING: dict[str, int] = {DetectionKind.XID: 0, DetectionKind.LINK_DOWN: 1, DetectionKind.MARGIN_LOW: 2,
            DetectionKind.AGENT_LOST: 3, DetectionKind.JOB_EXIT: 4}


class Watchers:
    def __init__(self, session):
        self.session = session
        self.bench = session.bench
        self.timeline = session.timeline
        self._detected: list[Detection] = []
        self._found = threading.Event()
        self._stop = threading.Event()
        self._threads: list = []  # the watchers' futures (instruments/threads.py: WORKERS)

    def arm(self, ranks: list[str], circuits: dict[int, int]) -> None:
        """Watch the job on ``ranks``, running on ``circuits`` (ingress -> egress)."""
        # A new stop signal for each arming: watchers of an earlier one finish their current
        # wait on their own (never joined: disarming must not wait out their windows) and can
        # no longer report into this one.
        self._stop = threading.Event()
        self._found.clear()
        self._detected.clear()
        connected_rx = set(circuits.values())
        # Each host's XIDs from before drained first, the hosts at once: arming ends before the
        # fault is made, so that its XID is news to the watchers, as it always was.
        for drained in [WORKERS.submit(self._drain_xids, self._stop, self.session.hosts[h], h) for h in ranks]:
            drained.result()
        for host_name in ranks:
            agent = self.session.hosts[host_name]
            self._watch(self._watch_xid, agent, host_name)
            self._watch(self._watch_job, agent, host_name)
            for nic in self.bench.host(host_name).nics:
                if nic.rx_port in connected_rx:
                    self._watch(self._watch_link, agent, host_name, nic.interface or nic.name, nic.name)
        watched = [(h, n, det) for h in ranks for n in self.bench.host(h).nics if n.rx_port in connected_rx
                   for det in self.bench.detectors_for_port(n.rx_port)[:1]]
        if watched:
            self._watch(self._watch_margin, None, None, watched)

    def wait(self, timeout_s: float) -> Detection | None:
        """The first failure seen since ``arm`` (None if none within the timeout)."""
        return self.first() if self._found.wait(timeout_s) else None

    def first(self) -> Detection:
        return min(self._detected, key=lambda d: (d.t_ns, _TELLING.get(d.kind, 9)))

    def stop(self) -> None:
        """Stop watching. The watchers end after their current wait (at most a watch window);
        nothing waits for them here."""
        self._stop.set()
        self._threads = [t for t in self._threads if not t.done()]

    # -- the watchers ----------------------------------------------------------------------------

    def _watch(self, target, agent, host: str | None, *args) -> None:
        """Run ``target(stop, agent, host, *args)`` in a thread of its own until it reports."""
        self._threads.append(WORKERS.submit(self._guarded, target, self._stop, agent, host, *args))

    def _guarded(self, target, stop: threading.Event, agent, host: str | None, *args) -> None:
        while not stop.is_set():
            try:
                target(stop, agent, host, *args)
                return
            except InstrumentError as exc:
                if agent is not None and agent.alive:
                    continue  # a slow reply (a loaded host): not a failure; watch on
                if host is not None:  # an agent that is gone is itself a failure of that host
                    self._report(Detection(DetectionKind.AGENT_LOST, host, self.timeline.clock(),
                                           detail={"error": str(exc)}), stop)
                return
            except Exception:
                if stop.is_set():  # stopped while a reading was under way (the session closing): no news
                    return
                raise

    def _report(self, detection: Detection, stop: threading.Event) -> None:
        if stop.is_set() or stop is not self._stop:
            return  # after detection, the recovery's own actions (stopping the job) are no news
        self._detected.append(detection)
        self._found.set()

    def _drain_xids(self, stop, agent, host: str) -> None:
        """NVML keeps events until someone waits for them: an XID from before arming (a GPU that
        has since been replaced, say) is history, unless the GPU is lost now."""
        stale = None
        for _ in range(1000):
            event = agent.wait_xid(0)
            if event is None:
                break
            stale = event if event.xid in FATAL_XIDS else stale
        if stale is not None and host_lost(self.session, host):
            self._report(Detection(DetectionKind.XID, host, stale.t_ns, stale.uncertainty_ns, stale.as_dict()), stop)

    def _watch_xid(self, stop, agent, host: str) -> None:
        while not stop.is_set():
            event = agent.wait_xid(WATCH_WINDOW_S)
            if event is not None and event.xid in FATAL_XIDS:
                self._report(Detection(DetectionKind.XID, host, event.t_ns, event.uncertainty_ns, event.as_dict()), stop)
                return

    def _watch_link(self, stop, agent, host: str, interface: str, nic: str) -> None:
        while not stop.is_set():
            state = agent.wait_link(interface, up=False, timeout_s=WATCH_WINDOW_S)
            if not state.timed_out:  # detected when the host saw it
                self._report(Detection(DetectionKind.LINK_DOWN, host, state.t_ns, state.uncertainty_ns,
                                       {"nic": nic, **state.as_dict()}), stop)
                return

    def _watch_job(self, stop, agent, host: str) -> None:
        while not stop.is_set():
            status = agent.wait_step(10**12, WATCH_WINDOW_S)
            if status.ended:
                self._report(Detection(DetectionKind.JOB_EXIT, host, self.timeline.clock(), 0,
                                       {"returncode": status.returncode, "last_lines": status.last_lines}), stop)
                return

    def _watch_margin(self, stop, _agent, _host, watched: list) -> None:
        """Light fading on a circuit the job runs on (a transmitter degrading, a connector getting
        dirty): below sensitivity + margin it is a failure to act on before the link drops."""
        floor = self.bench.limits.light_floor_dbm
        every = max(0.005, WATCH_WINDOW_S * self.bench.time_scale)
        while not stop.is_set():
            readings = self.session.received_dbms([det for _, _, det in watched])  # the switch's monitors at once
            for host, nic, det in watched:
                received = readings[det.name]
                if isinstance(received, float) and received < floor:
                    self._report(Detection(DetectionKind.MARGIN_LOW, host, self.timeline.clock(), 0,
                                           {"nic": nic.name, "received_dbm": round(received, 2), "floor_dbm": floor}),
                                 stop)
                    return
            stop.wait(every)  # a meter has no event to wait on: sample it
