"""The real GPUs, through NVML (`pynvml` from nvidia-ml-py).

The module object is injected so that tests can hand in a stand-in with the same names; error
codes are always read from that object (`NVML_ERROR_*`), never hard-coded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from deviceplugin.gpu.base import (
    BackendError,
    EnumerationError,
    GpuInfo,
    Inventory,
    WaitError,
    XidEvent,
)
from deviceplugin.logs import get_log

log = get_log(__name__)

_SYSFS = Path("/sys")
_MIB = 2**20


class _QueryFailed(Exception):
    """A per-GPU NVML query failed; the message names the call and NVML's error text."""


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str since 11.x, older versions bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def sysfs_bus_id(nvml_bus_id: str) -> str | None:
    """`00000000:3B:00.0` (NVML) → `0000:3b:00.0` (sysfs); None when the id is not of that form."""
    domain, sep, rest = nvml_bus_id.partition(":")
    try:
        domain_number = int(domain, 16)
    except ValueError:
        return None
    return f"{domain_number:04x}:{rest.lower()}" if sep and rest else None


class NvmlBackend:
    """GPUs as NVML reports them. `probe` may run in any thread while one thread waits for events."""

    def __init__(self, nvml: Any = pynvml, sysfs: Path = _SYSFS) -> None:
        self._nvml = nvml
        self._sysfs = sysfs
        self._error: type[Exception] = nvml.NVMLError
        # Held across the event wait so that close() never frees the event set under a waiter.
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._registered: set[str] = set()
        self._closed = False
        try:
            nvml.nvmlInit()
        except self._error as err:
            raise BackendError(f"NVML init failed: {err}") from err

    # --- inventory -----------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._error as err:
            raise BackendError(f"nvmlDeviceGetCount failed: {err}") from err
        gpus: list[GpuInfo] = []
        errors: list[EnumerationError] = []
        for index in range(count):
            try:
                gpus.append(self._describe(index))
            except _QueryFailed as err:
                errors.append(EnumerationError(index, str(err)))
        return Inventory(tuple(gpus), tuple(errors))

    def _describe(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = self._query(nvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._query(nvml.nvmlDeviceGetUUID, handle))
        model = _text(self._query(nvml.nvmlDeviceGetName, handle))
        memory_mib = self._query(nvml.nvmlDeviceGetMemoryInfo, handle).total // _MIB
        mig_enabled = self._mig_enabled(handle)
        pci = self._optional(index, nvml.nvmlDeviceGetPciInfo, handle)
        pci_bus_id = None if pci is None else _text(pci.busId)
        return GpuInfo(
            index=index,
            uuid=uuid,
            model=model,
            memory_mib=memory_mib,
            minor=self._optional(index, nvml.nvmlDeviceGetMinorNumber, handle),
            pci_bus_id=pci_bus_id,
            numa=None if pci_bus_id is None else self._numa_node(pci_bus_id),
            mig_enabled=mig_enabled,
        )

    def _query(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._error as err:
            raise _QueryFailed(f"{call.__name__} failed: {err}") from err

    def _optional(self, index: int, call: Callable[..., Any], *args: Any) -> Any:
        """A query whose failure only leaves a detail unknown."""
        try:
            return call(*args)
        except self._error as err:
            log.warning(
                "NVML query failed; value left unknown", gpu=index, call=call.__name__, error=str(err)
            )
            return None

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._error as err:
            if self._code(err) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return False
            # Guessing "not MIG" could hand out a partitioned GPU whole; leave the GPU out instead.
            raise _QueryFailed(f"nvmlDeviceGetMigMode failed: {err}") from err
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def _numa_node(self, pci_bus_id: str) -> int | None:
        device = sysfs_bus_id(pci_bus_id)
        if device is None:
            return None
        try:
            node = int((self._sysfs / "bus" / "pci" / "devices" / device / "numa_node").read_text())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None  # -1: the platform has no NUMA affinity for it

    # --- health --------------------------------------------------------------------------------

    def watch(self, uuids: tuple[str, ...]) -> dict[str, str]:
        with self._lock:
            if self._event_set is None:
                try:
                    self._event_set = self._nvml.nvmlEventSetCreate()
                except self._error as err:
                    return dict.fromkeys(uuids, f"nvmlEventSetCreate failed: {err}")
            problems: dict[str, str] = {}
            for uuid in uuids:
                if uuid in self._registered:
                    continue
                problem = self._register(uuid)
                if problem is None:
                    self._registered.add(uuid)
                else:
                    problems[uuid] = problem
            return problems

    def _register(self, uuid: str) -> str | None:
        nvml = self._nvml
        # The ECC types ride along as NVIDIA's plugin registers them; only Xid events are acted on.
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        try:
            handle = self._query(nvml.nvmlDeviceGetHandleByUUID, uuid)
            mask = wanted & self._query(nvml.nvmlDeviceGetSupportedEventTypes, handle)
            if not mask & nvml.nvmlEventTypeXidCriticalError:
                log.warning("GPU does not report Xid events; health checks cannot see it", uuid=uuid)
                return None
            self._query(nvml.nvmlDeviceRegisterEvents, handle, mask, self._event_set)
        except _QueryFailed as err:
            if self._code(err.__cause__) == nvml.NVML_ERROR_NOT_SUPPORTED:
                # Old GPUs cannot deliver events at all; fencing them would make them unusable.
                log.warning("GPU does not support NVML events; it stays healthy", uuid=uuid, error=str(err))
                return None
            return str(err)
        return None

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        with self._lock:
            if self._event_set is not None:
                return self._wait(self._event_set, timeout_s)
            closed = self._closed
        if not closed:
            time.sleep(max(timeout_s, 0.0))  # nothing watched yet: a quiet wait
        return None

    def _wait(self, event_set: Any, timeout_s: float) -> XidEvent | None:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(event_set, max(0, int(timeout_s * 1000)))
        except self._error as err:
            if self._code(err) == nvml.NVML_ERROR_TIMEOUT:
                return None
            raise WaitError(f"NVML event wait failed: {err}") from err
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            log.debug("non-Xid NVML event ignored", event_type=hex(data.eventType))
            return None
        return XidEvent(self._event_uuid(data.device), int(data.eventData))

    def _event_uuid(self, handle: Any) -> str | None:
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._error as err:
            log.warning("cannot read the UUID of the GPU behind an Xid event", error=str(err))
            return None

    def probe(self, uuid: str) -> bool:
        try:
            self._nvml.nvmlDeviceGetMemoryInfo(self._nvml.nvmlDeviceGetHandleByUUID(uuid))
        except self._error:
            return False
        return True

    def close(self) -> None:
        """Free the event set and shut NVML down; waits for an event wait in progress to end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._event_set is not None:
                self._release(self._nvml.nvmlEventSetFree, self._event_set)
                self._event_set = None
            self._release(self._nvml.nvmlShutdown)

    def _release(self, call: Callable[..., Any], *args: Any) -> None:
        # Shutting down goes on regardless; a failure here only deserves a log line.
        try:
            call(*args)
        except self._error as err:
            log.warning("NVML cleanup failed", call=call.__name__, error=str(err))

    @staticmethod
    def _code(err: BaseException | None) -> int | None:
        return getattr(err, "value", None)
