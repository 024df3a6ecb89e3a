"""The real GPUs, through NVML (`pynvml` from nvidia-ml-py).

MIG is a thin mapping of the backend's operations onto NVML's GPU- and compute-instance calls;
the placements, slot order and all-or-nothing creation are `deviceplugin.gpu.mig`'s.

The module object is injected so that tests can hand in a stand-in with the same names; error
codes are always read from that object (`NVML_ERROR_*`), never hard-coded.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml

from deviceplugin.gpu import mig
from deviceplugin.gpu.base import (
    BackendError,
    EnumerationError,
    GpuInfo,
    Inventory,
    MigBusy,
    MigDevice,
    MigError,
    MigMatch,
    WaitError,
    XidEvent,
)
from deviceplugin.gpu.nvml_topology import NvmlTopology

if TYPE_CHECKING:
    from deviceplugin.fit.model import MigGroup
    from deviceplugin.fit.topology import Topology
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

    def topology(self, gpus: Sequence[GpuInfo]) -> Topology:
        """NVLinks, PCIe ancestors and NUMA nodes (`deviceplugin.gpu.nvml_topology`)."""
        return NvmlTopology(self._nvml).read(gpus)

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

    # --- MIG -----------------------------------------------------------------------------------

    def mig_enabled(self, uuid: str) -> bool:
        handle = self._mig_call(uuid, self._nvml.nvmlDeviceGetHandleByUUID, uuid)
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._error as err:
            if self._code(err) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return False
            raise MigError(f"GPU {uuid}: nvmlDeviceGetMigMode failed: {err}") from err
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, uuid: str) -> tuple[MigDevice, ...]:
        handle, model = self._mig_card(uuid)
        return tuple(device for device, _ in self._listing(uuid, handle, model))

    def partition(self, uuid: str, group: MigGroup) -> tuple[MigDevice, ...]:
        handle, model = self._mig_card(uuid)
        held = self._listing(uuid, handle, model)
        if held:
            raise MigError(
                f"GPU {uuid} already holds {mig.layout(d.profile for d, _ in held)}; "
                "its instances must be destroyed before it takes another geometry"
            )
        steps = mig.plan(model, group)
        ids = {
            profile.name: profile_id for profile_id, profile in self._profile_ids(uuid, handle, model).items()
        }
        mig.create_all(
            steps,
            lambda profile, start: self._create(uuid, handle, ids, profile, start),
            lambda created: self._destroy(uuid, *created),
        )
        return mig.slot_order([device for device, _ in self._listing(uuid, handle, model)], group)

    def clear_mig(self, uuid: str) -> None:
        nvml = self._nvml
        handle, model = self._mig_card(uuid)
        listing = self._listing(uuid, handle, model)
        for device, mig_handle in listing:
            if self._mig_call(uuid, nvml.nvmlDeviceGetComputeRunningProcesses, mig_handle):
                raise MigBusy(
                    f"GPU {uuid}: MIG device {device.uuid} ({device.profile}, GPU instance "
                    f"{device.gpu_instance}) runs processes; no instance was destroyed",
                    device,
                )
        # Every compute instance first: a GPU instance is destroyed only once it holds none.
        instances = {}
        for device, _ in listing:
            gpu_instance = self._mig_call(
                uuid, nvml.nvmlDeviceGetGpuInstanceById, handle, device.gpu_instance
            )
            compute = self._mig_call(
                uuid, nvml.nvmlGpuInstanceGetComputeInstanceById, gpu_instance, device.compute_instance
            )
            self._mig_call(uuid, nvml.nvmlComputeInstanceDestroy, compute)
            instances[device.gpu_instance] = gpu_instance
        for gpu_instance in instances.values():
            self._mig_call(uuid, nvml.nvmlGpuInstanceDestroy, gpu_instance)

    def match_mig(self, uuid: str, groups: Sequence[MigGroup]) -> MigMatch | None:
        return mig.match_group(self.mig_devices(uuid), groups)

    def _mig_call(self, uuid: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._error as err:
            raise MigError(f"GPU {uuid}: {call.__name__} failed: {err}") from err

    def _mig_card(self, uuid: str) -> tuple[Any, mig.MigModel]:
        """The card's handle and profile table; MigError unless it is in MIG mode and known."""
        nvml = self._nvml
        if not self.mig_enabled(uuid):
            raise MigError(f"GPU {uuid} is not in MIG mode")
        handle = self._mig_call(uuid, nvml.nvmlDeviceGetHandleByUUID, uuid)
        name = _text(self._mig_call(uuid, nvml.nvmlDeviceGetName, handle))
        memory_mib = self._mig_call(uuid, nvml.nvmlDeviceGetMemoryInfo, handle).total // _MIB
        return handle, mig.require_model(name, memory_mib)

    def _profile_ids(self, uuid: str, handle: Any, model: mig.MigModel) -> dict[int, mig.MigProfile]:
        """The driver's profile id of each profile in the table (the ids differ between models)."""
        nvml = self._nvml
        ids: dict[int, mig.MigProfile] = {}
        for profile in model.profiles:
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, getattr(nvml, profile.nvml_profile))
            except self._error as err:
                if self._code(err) in {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}:
                    continue  # a profile this driver does not offer (+me before R470, for one)
                raise MigError(f"GPU {uuid}: nvmlDeviceGetGpuInstanceProfileInfo failed: {err}") from err
            ids[info.id] = profile
        return ids

    def _listing(self, uuid: str, handle: Any, model: mig.MigModel) -> list[tuple[MigDevice, Any]]:
        """The card's MIG devices by placement start, each with its NVML handle."""
        nvml = self._nvml
        profiles = self._profile_ids(uuid, handle, model)
        found: list[tuple[MigDevice, Any]] = []
        for index in range(self._mig_call(uuid, nvml.nvmlDeviceGetMaxMigDeviceCount, handle)):
            try:
                mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except self._error as err:
                if self._code(err) == nvml.NVML_ERROR_NOT_FOUND:
                    continue  # no MIG device at this index
                raise MigError(f"GPU {uuid}: nvmlDeviceGetMigDeviceHandleByIndex failed: {err}") from err
            gpu_instance = self._mig_call(uuid, nvml.nvmlDeviceGetGpuInstanceId, mig_handle)
            info = self._mig_call(
                uuid,
                nvml.nvmlGpuInstanceGetInfo,
                self._mig_call(uuid, nvml.nvmlDeviceGetGpuInstanceById, handle, gpu_instance),
            )
            profile = profiles.get(info.profileId)
            device = MigDevice(
                gpu_instance=gpu_instance,
                compute_instance=self._mig_call(uuid, nvml.nvmlDeviceGetComputeInstanceId, mig_handle),
                profile=profile.name if profile else f"profile id {info.profileId}",
                start=info.placement.start,
                memory_mib=self._mig_call(uuid, nvml.nvmlDeviceGetMemoryInfo, mig_handle).total // _MIB,
                uuid=_text(self._mig_call(uuid, nvml.nvmlDeviceGetUUID, mig_handle)),
            )
            found.append((device, mig_handle))
        return sorted(found, key=lambda item: item[0].start)

    def _create(
        self, uuid: str, handle: Any, ids: dict[str, int], profile: mig.MigProfile, start: int
    ) -> tuple[Any, Any]:
        """A GPU instance at its placement and its one full compute instance: (GI, CI) handles."""
        nvml = self._nvml
        where = f"creating a {profile.name} GPU instance at slice {start} on GPU {uuid} failed"
        if profile.name not in ids:
            raise MigError(f"{where}: the driver does not offer that profile")
        placement = nvml.c_nvmlGpuInstancePlacement_t(start, profile.span)
        try:
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, ids[profile.name], ctypes.pointer(placement)
            )
        except self._error as err:
            raise MigError(f"{where}: {err}") from err
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance,
                getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{profile.slices}_SLICE"),
                nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            compute = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, info.id)
        except self._error as err:
            self._destroy(uuid, gpu_instance, None)
            raise MigError(f"{where}: its compute instance: {err}") from err
        return gpu_instance, compute

    def _destroy(self, uuid: str, gpu_instance: Any, compute: Any) -> None:
        if compute is not None:
            self._mig_call(uuid, self._nvml.nvmlComputeInstanceDestroy, compute)
        self._mig_call(uuid, self._nvml.nvmlGpuInstanceDestroy, gpu_instance)

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
