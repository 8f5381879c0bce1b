"""The world's GPUs (:class:`GpuMixin`): failures (XIDs), repairs, and silent data corruption."""

from __future__ import annotations

from lumion_hil.instruments.emulators.world_core import WorldCore
from lumion_hil.instruments.emulators.world_types import WorldEvent


class GpuMixin(WorldCore):
    """The bench's GPUs failing and being repaired."""

    def fail_gpu(self, host: str, index: int = 0, xid: int = 79, t_ns: int | None = None) -> WorldEvent:
        """A GPU fails (XID 79: fell off the bus; 48: double-bit ECC; 13/31/43: application)."""
        with self.lock:
            gpu = self.gpus[(host, index)]
            t = self.now_ns() if t_ns is None else t_ns
            if xid in (79, 48):
                gpu.failed_ns = gpu.failed_ns or t
            if xid == 48:
                gpu.ecc_dbe += 1
                gpu.retired_pages += 1
            gpu.xid = xid
            event = WorldEvent(t, "gpu.xid", f"{host}/{index}", {"host": host, "index": index, "xid": xid,
                                                                  "uuid": gpu.uuid})
            self.events.append(event)
            self.gpu_events.append(event)
            self._notify()
            waiting = self._gpu_waits.get(host)
            if waiting is not None:
                waiting.notify_all()
            return event

    def repair_gpu(self, host: str, index: int = 0) -> None:
        """A replaced or reset GPU: healthy again from now on."""
        with self.lock:
            gpu = self.gpus[(host, index)]
            gpu.failed_ns = gpu.xid = None
            self.record(self.now_ns(), "gpu.repaired", f"{host}/{index}")

    def gpu_failed(self, host: str, index: int = 0, t_ns: int | None = None) -> bool:
        t = self.now_ns() if t_ns is None else t_ns
        with self.lock:
            gpu = self.gpus[(host, index)]
            return gpu.failed_ns is not None and gpu.failed_ns <= t

    def corrupts_data(self, host: str) -> bool:
        """A GPU that computes wrong results without reporting an error (silent data corruption)."""
        return host in self.hosts and self.hosts[host].emulation.silent_data_corruption

    def host_failed(self, host: str, t_ns: int | None = None) -> bool:
        return any(self.gpu_failed(h, i, t_ns) for (h, i) in self.gpus if h == host)
