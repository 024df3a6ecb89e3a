"""NvmlBackend against a stand-in `pynvml` module: the hardware boundary, and the only double here.

The stand-in has the real module's names; its constants are copied from the real `pynvml`, so the
codes the backend compares against stay those of the installed nvidia-ml-py.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml as real_nvml
import pytest

from deviceplugin.gpu.base import BackendError, EnumerationError, GpuInfo, WaitError, XidEvent
from deviceplugin.gpu.nvml import NvmlBackend, sysfs_bus_id
from tests.kube.waiting import wait_for

XID = real_nvml.nvmlEventTypeXidCriticalError
DBE = real_nvml.nvmlEventTypeDoubleBitEccError
SBE = real_nvml.nvmlEventTypeSingleBitEccError
NOT_SUPPORTED = real_nvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = real_nvml.NVML_ERROR_NOT_FOUND
TIMEOUT = real_nvml.NVML_ERROR_TIMEOUT
GPU_IS_LOST = real_nvml.NVML_ERROR_GPU_IS_LOST
DRIVER_NOT_LOADED = real_nvml.NVML_ERROR_DRIVER_NOT_LOADED
UNKNOWN = real_nvml.NVML_ERROR_UNKNOWN
INSUFFICIENT_RESOURCES = real_nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
IN_USE = real_nvml.NVML_ERROR_IN_USE
MIG_ON = real_nvml.NVML_DEVICE_MIG_ENABLE
MIG_OFF = real_nvml.NVML_DEVICE_MIG_DISABLE
ERROR_TEXT = {
    NOT_SUPPORTED: "Not Supported",
    NOT_FOUND: "Not Found",
    TIMEOUT: "Timeout",
    GPU_IS_LOST: "GPU is lost",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    UNKNOWN: "Unknown Error",
    INSUFFICIENT_RESOURCES: "Insufficient Resources",
    IN_USE: "In use by another client",
}
UUIDS = [f"GPU-0000000{n}-aaaa-bbbb-cccc-dddddddddddd" for n in range(3)]
A100 = "NVIDIA A100-SXM4-80GB"
GIB = 2**30


class NVMLError(Exception):
    """Like pynvml's: carries the NVML return code in `.value`."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return ERROR_TEXT[self.value]


@dataclass
class StandInGpu:
    uuid: str | bytes
    name: str | bytes = A100
    memory_total: int = 80 * GIB
    minor: int = 0
    bus_id: str | bytes = "00000000:3B:00.0"
    mig_mode: tuple[int, int] = (MIG_OFF, MIG_OFF)
    supported_events: int = XID | DBE | SBE
    failures: dict[str, int] = field(default_factory=dict)  # pynvml function name → NVML code it fails with


@dataclass
class Event:
    device: StandInGpu
    event_type: int
    data: int = 0


class StandInNvml:
    """The part of `pynvml` the backend uses, answering from `gpus` and a script of wait results."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = TIMEOUT
    NVML_ERROR_GPU_IS_LOST = GPU_IS_LOST
    NVML_DEVICE_MIG_ENABLE = MIG_ON
    NVML_DEVICE_MIG_DISABLE = MIG_OFF
    nvmlEventTypeXidCriticalError = XID
    nvmlEventTypeDoubleBitEccError = DBE
    nvmlEventTypeSingleBitEccError = SBE

    def __init__(self, gpus: list[StandInGpu], failures: dict[str, int] | None = None) -> None:
        self.gpus = gpus
        self.failures = failures or {}  # module-level calls: name → code
        self.calls: list[str] = []
        self.wait_results: deque[Event | int] = deque()  # an int is an error code to raise
        self.wait_timeouts: list[int] = []
        self.wait_delay_s = 0.0
        self.waiting = False
        self.freed_while_waiting: bool | None = None
        self.registered: dict[str, int] = {}

    def _enter(self, name: str, gpu: StandInGpu | None = None) -> None:
        self.calls.append(name)
        code = (gpu.failures if gpu else self.failures).get(name)
        if code is not None:
            raise NVMLError(code)

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StandInGpu:
        self._enter("nvmlDeviceGetHandleByIndex", self.gpus[index])
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> StandInGpu:
        for gpu in self.gpus:
            if gpu.uuid in {uuid, uuid.encode()}:
                self._enter("nvmlDeviceGetHandleByUUID", gpu)
                return gpu
        raise NVMLError(NOT_FOUND)

    def nvmlDeviceGetUUID(self, gpu: StandInGpu) -> str | bytes:
        self._enter("nvmlDeviceGetUUID", gpu)
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: StandInGpu) -> str | bytes:
        self._enter("nvmlDeviceGetName", gpu)
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, gpu: StandInGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", gpu)
        return SimpleNamespace(total=gpu.memory_total, free=gpu.memory_total, used=0)

    def nvmlDeviceGetMinorNumber(self, gpu: StandInGpu) -> int:
        self._enter("nvmlDeviceGetMinorNumber", gpu)
        return gpu.minor

    def nvmlDeviceGetPciInfo(self, gpu: StandInGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", gpu)
        return SimpleNamespace(busId=gpu.bus_id)

    def nvmlDeviceGetMigMode(self, gpu: StandInGpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", gpu)
        return list(gpu.mig_mode)

    def nvmlEventSetCreate(self) -> str:
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        assert event_set == "event-set"
        self.freed_while_waiting = self.waiting
        self._enter("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, gpu: StandInGpu) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", gpu)
        return gpu.supported_events

    def nvmlDeviceRegisterEvents(self, gpu: StandInGpu, mask: int, event_set: str) -> None:
        assert event_set == "event-set"
        self._enter("nvmlDeviceRegisterEvents", gpu)
        self.registered[str(gpu.uuid)] = mask

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert event_set == "event-set"
        self._enter("nvmlEventSetWait_v2")
        self.wait_timeouts.append(timeout_ms)
        self.waiting = True
        time.sleep(self.wait_delay_s)
        self.waiting = False
        if not self.wait_results:
            raise NVMLError(TIMEOUT)
        result = self.wait_results.popleft()
        if isinstance(result, int):
            raise NVMLError(result)
        no_instance = 0xFFFFFFFF
        return SimpleNamespace(
            device=result.device,
            eventType=result.event_type,
            eventData=result.data,
            gpuInstanceId=no_instance,
            computeInstanceId=no_instance,
        )


def three_gpus() -> list[StandInGpu]:
    return [StandInGpu(uuid, minor=n, bus_id=f"00000000:{0x3B + n:02X}:00.0") for n, uuid in enumerate(UUIDS)]


@pytest.fixture
def nvml() -> StandInNvml:
    return StandInNvml(three_gpus())


@pytest.fixture
def backend(nvml: StandInNvml, tmp_path: Path) -> NvmlBackend:
    return NvmlBackend(nvml, tmp_path)


def write_numa(sysfs: Path, device: str, content: str) -> None:
    directory = sysfs / "bus" / "pci" / "devices" / device
    directory.mkdir(parents=True)
    (directory / "numa_node").write_text(content)


# --- init ------------------------------------------------------------------------------------


def test_init_failure_is_a_backend_error(tmp_path: Path) -> None:
    nvml = StandInNvml([], failures={"nvmlInit": DRIVER_NOT_LOADED})
    with pytest.raises(BackendError, match=r"^NVML init failed: Driver Not Loaded$"):
        NvmlBackend(nvml, tmp_path)


# --- inventory -------------------------------------------------------------------------------


def test_inventory(backend: NvmlBackend) -> None:
    assert backend.inventory().gpus == tuple(
        GpuInfo(n, uuid, A100, 81920, n, f"00000000:{0x3B + n:02X}:00.0", None, False)
        for n, uuid in enumerate(UUIDS)
    )


@pytest.mark.parametrize(
    "call",
    ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo"],
)
def test_inventory_reports_a_failing_gpu_and_returns_the_others(
    nvml: StandInNvml, backend: NvmlBackend, call: str
) -> None:
    nvml.gpus[1].failures[call] = UNKNOWN
    inventory = backend.inventory()
    assert [gpu.uuid for gpu in inventory.gpus] == [UUIDS[0], UUIDS[2]]
    assert inventory.errors == (EnumerationError(1, f"{call} failed: Unknown Error"),)


def test_inventory_count_failure_is_a_backend_error(nvml: StandInNvml, backend: NvmlBackend) -> None:
    nvml.failures["nvmlDeviceGetCount"] = UNKNOWN
    with pytest.raises(BackendError, match="nvmlDeviceGetCount failed: Unknown Error"):
        backend.inventory()


def test_memory_is_rounded_down_to_whole_mib(nvml: StandInNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].memory_total = 143771 * 2**20 + 2**20 - 1
    assert backend.inventory().gpus[0].memory_mib == 143771


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_bytes_and_str_answers_give_str(tmp_path: Path, as_bytes: bool) -> None:
    def text(value: str) -> str | bytes:
        return value.encode() if as_bytes else value

    nvml = StandInNvml(
        [StandInGpu(text(UUIDS[0]), name=text("NVIDIA H200"), bus_id=text("00000000:1A:00.0"))]
    )
    write_numa(tmp_path, "0000:1a:00.0", "1\n")
    (gpu,) = NvmlBackend(nvml, tmp_path).inventory().gpus
    assert (gpu.uuid, gpu.model, gpu.pci_bus_id, gpu.numa) == (UUIDS[0], "NVIDIA H200", "00000000:1A:00.0", 1)


@pytest.mark.parametrize(
    ("bus_id", "device", "content", "numa"),
    [
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", "0\n", 0, id="node-0"),
        pytest.param("00000000:AF:00.0", "0000:af:00.0", "1\n", 1, id="node-1"),
        pytest.param("00000001:3B:00.0", "0001:3b:00.0", "3", 3, id="domain-1"),
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", "-1\n", None, id="no-affinity"),
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", "garbage", None, id="unreadable-value"),
        pytest.param("00000000:3B:00.0", None, "", None, id="missing-file"),
        pytest.param("not-a-bus-id", None, "", None, id="odd-bus-id"),
    ],
)
def test_numa_node_from_sysfs(
    tmp_path: Path, bus_id: str, device: str | None, content: str, numa: int | None
) -> None:
    if device is not None:
        write_numa(tmp_path, device, content)
    nvml = StandInNvml([StandInGpu(UUIDS[0], bus_id=bus_id)])
    assert NvmlBackend(nvml, tmp_path).inventory().gpus[0].numa == numa


@pytest.mark.parametrize(
    ("nvml_form", "sysfs_form"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),  # the legacy 4-digit field
        ("00010000:01:00.0", "10000:01:00.0"),  # sysfs prints wide domains in full
        ("zz:01:00.0", None),
        ("00000000", None),
        ("", None),
    ],
)
def test_sysfs_bus_id(nvml_form: str, sysfs_form: str | None) -> None:
    assert sysfs_bus_id(nvml_form) == sysfs_form


def test_minor_and_pci_failures_leave_them_unknown(
    nvml: StandInNvml, backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.gpus[0].failures = {"nvmlDeviceGetMinorNumber": NOT_SUPPORTED, "nvmlDeviceGetPciInfo": UNKNOWN}
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.nvml"):
        gpu = backend.inventory().gpus[0]
    assert (gpu.uuid, gpu.minor, gpu.pci_bus_id, gpu.numa) == (UUIDS[0], None, None, None)
    assert len(caplog.records) == 2


@pytest.mark.parametrize(
    ("mig_mode", "enabled"),
    [
        pytest.param((MIG_ON, MIG_ON), True, id="enabled"),
        pytest.param((MIG_OFF, MIG_OFF), False, id="disabled"),
        pytest.param((MIG_OFF, MIG_ON), False, id="pending-enable"),
        pytest.param((MIG_ON, MIG_OFF), True, id="pending-disable"),
    ],
)
def test_mig_mode_is_the_current_mode(
    nvml: StandInNvml, backend: NvmlBackend, mig_mode: tuple[int, int], enabled: bool
) -> None:
    nvml.gpus[0].mig_mode = mig_mode
    assert backend.inventory().gpus[0].mig_enabled is enabled


def test_mig_not_supported_means_disabled(nvml: StandInNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].failures["nvmlDeviceGetMigMode"] = NOT_SUPPORTED
    assert backend.inventory().gpus[0].mig_enabled is False


def test_mig_query_failure_leaves_the_gpu_out(nvml: StandInNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].failures["nvmlDeviceGetMigMode"] = UNKNOWN
    inventory = backend.inventory()
    assert [gpu.index for gpu in inventory.gpus] == [1, 2]
    assert inventory.errors == (EnumerationError(0, "nvmlDeviceGetMigMode failed: Unknown Error"),)


# --- watch -----------------------------------------------------------------------------------


def test_watch_registers_xid_and_ecc_masked_by_support(nvml: StandInNvml, backend: NvmlBackend) -> None:
    nvml.gpus[1].supported_events = XID | real_nvml.nvmlEventTypePState
    assert backend.watch(tuple(UUIDS)) == {}
    assert nvml.registered == {UUIDS[0]: XID | DBE | SBE, UUIDS[1]: XID, UUIDS[2]: XID | DBE | SBE}
    assert nvml.calls.count("nvmlEventSetCreate") == 1


@pytest.mark.parametrize(
    ("failures", "supported"),
    [
        pytest.param({"nvmlDeviceRegisterEvents": NOT_SUPPORTED}, XID, id="register-not-supported"),
        pytest.param({"nvmlDeviceGetSupportedEventTypes": NOT_SUPPORTED}, XID, id="query-not-supported"),
        pytest.param({}, SBE | DBE, id="no-xid-events"),
    ],
)
def test_watch_gpu_without_event_support_stays_healthy(
    nvml: StandInNvml,
    backend: NvmlBackend,
    caplog: pytest.LogCaptureFixture,
    failures: dict[str, int],
    supported: int,
) -> None:
    nvml.gpus[0].failures = failures
    nvml.gpus[0].supported_events = supported
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.nvml"):
        assert backend.watch((UUIDS[0],)) == {}
    assert UUIDS[0] not in nvml.registered
    assert [record.__dict__["fields"]["uuid"] for record in caplog.records] == [UUIDS[0]]


@pytest.mark.parametrize(
    ("call", "code", "problem"),
    [
        ("nvmlDeviceRegisterEvents", UNKNOWN, "nvmlDeviceRegisterEvents failed: Unknown Error"),
        ("nvmlDeviceGetHandleByUUID", GPU_IS_LOST, "nvmlDeviceGetHandleByUUID failed: GPU is lost"),
        (
            "nvmlDeviceGetSupportedEventTypes",
            UNKNOWN,
            "nvmlDeviceGetSupportedEventTypes failed: Unknown Error",
        ),
    ],
)
def test_watch_failure_is_a_problem(
    nvml: StandInNvml, backend: NvmlBackend, call: str, code: int, problem: str
) -> None:
    nvml.gpus[2].failures[call] = code
    assert backend.watch(tuple(UUIDS)) == {UUIDS[2]: problem}
    assert set(nvml.registered) == {UUIDS[0], UUIDS[1]}


def test_watch_unknown_uuid_is_a_problem(backend: NvmlBackend) -> None:
    stranger = "GPU-99999999-aaaa-bbbb-cccc-dddddddddddd"
    assert backend.watch((stranger,)) == {stranger: "nvmlDeviceGetHandleByUUID failed: Not Found"}


def test_watch_event_set_failure_makes_every_gpu_a_problem(nvml: StandInNvml, backend: NvmlBackend) -> None:
    nvml.failures["nvmlEventSetCreate"] = UNKNOWN
    assert backend.watch(tuple(UUIDS)) == dict.fromkeys(UUIDS, "nvmlEventSetCreate failed: Unknown Error")


def test_watch_again_registers_only_new_gpus(nvml: StandInNvml, backend: NvmlBackend) -> None:
    assert backend.watch((UUIDS[0],)) == {}
    assert backend.watch((UUIDS[0], UUIDS[1])) == {}
    assert nvml.calls.count("nvmlDeviceRegisterEvents") == 2
    assert nvml.calls.count("nvmlEventSetCreate") == 1


# --- wait_event ------------------------------------------------------------------------------


@pytest.fixture
def watching(nvml: StandInNvml, backend: NvmlBackend) -> NvmlBackend:
    assert backend.watch(tuple(UUIDS)) == {}
    return backend


def test_wait_timeout_is_none(nvml: StandInNvml, watching: NvmlBackend) -> None:
    assert watching.wait_event(0.25) is None
    assert nvml.wait_timeouts == [250]


def test_wait_xid_event(nvml: StandInNvml, watching: NvmlBackend) -> None:
    nvml.wait_results.append(Event(nvml.gpus[1], XID, 79))
    assert watching.wait_event(1) == XidEvent(UUIDS[1], 79)


def test_wait_xid_event_with_bytes_uuid(tmp_path: Path) -> None:
    nvml = StandInNvml([StandInGpu(UUIDS[0].encode())])
    backend = NvmlBackend(nvml, tmp_path)
    backend.watch((UUIDS[0],))
    nvml.wait_results.append(Event(nvml.gpus[0], XID, 48))
    assert backend.wait_event(1) == XidEvent(UUIDS[0], 48)


@pytest.mark.parametrize("event_type", [DBE, SBE], ids=["double-bit", "single-bit"])
def test_wait_ecc_event_is_nothing(nvml: StandInNvml, watching: NvmlBackend, event_type: int) -> None:
    nvml.wait_results.append(Event(nvml.gpus[0], event_type, 1))
    assert watching.wait_event(1) is None
    assert len(nvml.wait_timeouts) == 1  # did not wait again past the caller's timeout


def test_wait_unreadable_uuid_gives_unknown_device(nvml: StandInNvml, watching: NvmlBackend) -> None:
    nvml.gpus[2].failures["nvmlDeviceGetUUID"] = GPU_IS_LOST
    nvml.wait_results.append(Event(nvml.gpus[2], XID, 79))
    assert watching.wait_event(1) == XidEvent(None, 79)


@pytest.mark.parametrize(("code", "text"), [(GPU_IS_LOST, "GPU is lost"), (UNKNOWN, "Unknown Error")])
def test_wait_failure_is_a_wait_error(nvml: StandInNvml, watching: NvmlBackend, code: int, text: str) -> None:
    nvml.wait_results.append(code)
    with pytest.raises(WaitError, match=f"^NVML event wait failed: {text}$"):
        watching.wait_event(1)


def test_wait_before_watch_is_a_quiet_wait(nvml: StandInNvml, backend: NvmlBackend) -> None:
    assert backend.wait_event(0.05) is None
    assert "nvmlEventSetWait_v2" not in nvml.calls


def test_wait_after_close_returns_at_once(nvml: StandInNvml, watching: NvmlBackend) -> None:
    watching.close()
    got: list[XidEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(watching.wait_event(3600)), daemon=True)
    waiter.start()
    assert wait_for(lambda: not waiter.is_alive())  # not at the end of its hour
    assert got == [None]
    assert "nvmlEventSetWait_v2" not in nvml.calls


# --- probe -----------------------------------------------------------------------------------


def test_probe_answers(backend: NvmlBackend) -> None:
    assert backend.probe(UUIDS[0])


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByUUID", "nvmlDeviceGetMemoryInfo"])
def test_probe_failure(nvml: StandInNvml, backend: NvmlBackend, call: str) -> None:
    nvml.gpus[0].failures[call] = GPU_IS_LOST
    assert not backend.probe(UUIDS[0])
    assert backend.probe(UUIDS[1])


def test_probe_unknown_gpu(backend: NvmlBackend) -> None:
    assert not backend.probe("GPU-99999999-aaaa-bbbb-cccc-dddddddddddd")


# --- close -----------------------------------------------------------------------------------


def test_close_is_idempotent(nvml: StandInNvml, watching: NvmlBackend) -> None:
    watching.close()
    watching.close()
    assert nvml.calls.count("nvmlEventSetFree") == 1
    assert nvml.calls.count("nvmlShutdown") == 1


def test_close_without_watch_only_shuts_down(nvml: StandInNvml, backend: NvmlBackend) -> None:
    backend.close()
    assert "nvmlEventSetFree" not in nvml.calls
    assert nvml.calls.count("nvmlShutdown") == 1


def test_close_failures_are_logged_not_raised(
    nvml: StandInNvml, watching: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.failures.update(nvmlEventSetFree=UNKNOWN, nvmlShutdown=UNKNOWN)
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.nvml"):
        watching.close()
    assert [record.__dict__["fields"]["call"] for record in caplog.records] == [
        "nvmlEventSetFree",
        "nvmlShutdown",
    ]


def test_close_waits_for_a_wait_in_progress(nvml: StandInNvml, watching: NvmlBackend) -> None:
    nvml.wait_delay_s = 0.2
    waiter = threading.Thread(target=watching.wait_event, args=(1,))
    waiter.start()
    assert wait_for(lambda: "nvmlEventSetWait_v2" in nvml.calls), "the waiter never reached the wait"
    watching.close()
    waiter.join()
    assert nvml.freed_while_waiting is False
