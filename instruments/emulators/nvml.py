"""A fake of the pynvml module for emulated hosts, backed by the world (through the world
service). It raises the real ``pynvml.NVMLError`` subclasses, so the agent's real NVML code is
what gets tested. Constants (``NVML_*``, ``nvmlEventType*``) are pynvml's own."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pynvml


@dataclass
class _Handle:
    index: int


@dataclass
class _PciInfo:
    busId: str


@dataclass
class _EventData:
    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class FakeNvml:
    """The host's GPUs as the world has them. Every query of the device count reads them from
    the world; the per-device reads that follow it in the same thread read that answer (the
    agent's NVML code starts every query, health or devices, with the count), so that one
    health query is one question to the world, not one per field."""

    def __init__(self, world, host: str):
        self.world = world  # a WorldClient
        self.host = host
        self._read = threading.local()  # .gpus: this thread's last read of the world
        self._initialised = False
        self._seen_events = 0
        self._registered: set[int] = set()

    def __getattr__(self, name: str):
        value = getattr(pynvml, name)
        if callable(value) and not isinstance(value, type):
            raise AttributeError(f"the emulated NVML has no {name}")
        return value

    def _gpus(self) -> list[dict]:
        self._read.gpus = self.world.call("gpus", host=self.host)
        return self._read.gpus

    def _gpu(self, handle: _Handle) -> dict:
        if not self._initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpus = getattr(self._read, "gpus", None)
        if gpus is None:
            gpus = self._gpus()
        if not 0 <= handle.index < len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[handle.index]
        if gpu["failed"] and gpu["xid"] == 79:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:
        self._initialised = True

    def nvmlShutdown(self) -> None:
        self._initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "emulated"

    def nvmlDeviceGetCount(self) -> int:
        if not self._initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not self._initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpus = getattr(self._read, "gpus", None)
        if not 0 <= index < len(gpus if gpus is not None else self._gpus()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle) -> str:
        return self._gpu(handle)["uuid"]

    def nvmlDeviceGetName(self, handle) -> str:
        return self._gpu(handle)["name"]

    def nvmlDeviceGetPciInfo_v3(self, handle) -> _PciInfo:
        return _PciInfo(self._gpu(handle)["pci_bus_id"])

    def nvmlDeviceGetTemperatureV(self, handle, sensor, version=None) -> int:
        return int(self._gpu(handle)["temperature_c"])

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return int(self._gpu(handle)["power_w"] * 1000)

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type) -> int:
        gpu = self._gpu(handle)
        return gpu["ecc_dbe"] if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0

    def nvmlDeviceGetRetiredPages(self, handle, cause) -> list[int]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # Ada GPUs remap rows instead

    def nvmlDeviceGetRemappedRows(self, handle) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle)
        return (0, gpu["retired_pages"], 0, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle) -> int:
        self._gpu(handle)
        return 0

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set) -> None:
        self._gpu(handle)
        self._registered.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int) -> _EventData:
        reply = self.world.call("wait_gpu_event", host=self.host, after=self._seen_events, timeout_s=timeout_ms / 1000)
        if reply["seq"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        self._seen_events = reply["seq"] + 1
        return _EventData(_Handle(reply["index"]), pynvml.nvmlEventTypeXidCriticalError, reply["xid"])
