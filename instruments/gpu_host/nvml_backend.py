"""GPU devices, health and XID events through NVML (nvidia-ml-py, imported as ``pynvml``).

The module is passed in: the real ``pynvml`` on a GPU host, or the emulated host's fake, which
raises the real ``pynvml.NVMLError`` subclasses, so this code's error handling is what runs in
both. Without a driver the backend reports a clear "NVML not available" state instead of failing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pynvml


class NvmlUnavailable(Exception):
    pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlGpus:
    def __init__(self, nvml: Any = pynvml, clock_ns=time.monotonic_ns):
        self.nvml = nvml
        self.clock_ns = clock_ns
        self.unavailable_reason: str | None = None
        self._events = None
        self._event_lock = threading.Lock()
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.unavailable_reason = f"NVML not available: {type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def _require(self) -> None:
        if self.unavailable_reason:
            raise NvmlUnavailable(self.unavailable_reason)

    def status(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.unavailable_reason}
        try:
            driver = _text(self.nvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            driver = None
        return {"available": True, "driver": driver, "count": self.nvml.nvmlDeviceGetCount()}

    def devices(self) -> list[dict]:
        self._require()
        out = []
        for index in range(self.nvml.nvmlDeviceGetCount()):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                out.append({"index": index, "uuid": _text(self.nvml.nvmlDeviceGetUUID(handle)),
                            "name": _text(self.nvml.nvmlDeviceGetName(handle)),
                            "pci_bus_id": _text(self.nvml.nvmlDeviceGetPciInfo_v3(handle).busId)})
            except pynvml.NVMLError_GpuIsLost:
                out.append({"index": index, "lost": True})
        return out

    def health(self) -> list[dict]:
        """Per device: temperature, power, ECC, retired pages or remapped rows, clock event
        reasons. A field the device does not support is None; a lost GPU says so."""
        self._require()
        out = []
        for index in range(self.nvml.nvmlDeviceGetCount()):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            entry: dict[str, Any] = {"index": index}
            try:
                entry["uuid"] = _text(self.nvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError_GpuIsLost:
                out.append({**entry, "lost": True, "reason": "GPU is lost (fell off the bus)"})
                continue
            entry["lost"] = False
            entry["temperature_c"] = self._maybe(lambda: self._temperature(handle))
            entry["power_w"] = self._maybe(lambda: self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            entry["ecc_uncorrected_volatile"] = self._maybe(lambda: self.nvml.nvmlDeviceGetTotalEccErrors(
                handle, self.nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.nvml.NVML_VOLATILE_ECC))
            entry["retired_pages_dbe"] = self._maybe(lambda: len(self.nvml.nvmlDeviceGetRetiredPages(
                handle, self.nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)))
            entry["remapped_rows"] = self._maybe(lambda: dict(zip(
                ("correctable", "uncorrectable", "pending", "failure"), self.nvml.nvmlDeviceGetRemappedRows(handle))))
            entry["clock_event_reasons"] = self._maybe(lambda: self.nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
            out.append(entry)
        return out

    def _temperature(self, handle) -> float:
        try:
            return self.nvml.nvmlDeviceGetTemperatureV(handle, self.nvml.NVML_TEMPERATURE_GPU)
        except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, AttributeError):
            return self.nvml.nvmlDeviceGetTemperature(handle, self.nvml.NVML_TEMPERATURE_GPU)  # older drivers

    @staticmethod
    def _maybe(read):
        try:
            return read()
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission):
            return None

    def _event_set(self):
        with self._event_lock:
            if self._events is None:
                events = self.nvml.nvmlEventSetCreate()
                self._registered = []  # (handle, index, uuid): a lost GPU can no longer say who it was
                for index in range(self.nvml.nvmlDeviceGetCount()):
                    handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                    self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, events)
                    self._registered.append((handle, index, _text(self.nvml.nvmlDeviceGetUUID(handle))))
                self._events = events
            return self._events

    def wait_xid(self, timeout_s: float) -> dict | None:
        """Block until an XID critical error (event-driven: NVML's event wait). None on timeout."""
        self._require()
        events = self._event_set()
        try:
            data = self.nvml.nvmlEventSetWait_v2(events, int(timeout_s * 1000))
        except pynvml.NVMLError_Timeout:
            return None
        t_ns = self.clock_ns()
        index, uuid = next(((i, u) for h, i, u in self._registered if _same_handle(h, data.device)), (None, None))
        return {"xid": int(data.eventData), "index": index, "uuid": uuid, "t_ns": t_ns}


def _same_handle(a, b) -> bool:
    if a == b:
        return True
    try:  # pynvml handles are ctypes pointers: equal when they point at the same device
        import ctypes

        return ctypes.addressof(a.contents) == ctypes.addressof(b.contents)
    except (AttributeError, TypeError, ValueError):
        return False
