"""NvmlBackend's MIG calls against a stand-in `pynvml` that keeps GPU and compute instances as the
driver does (the hardware boundary, and the only double here). Its profile ids and placements are
NVIDIA's for an A100 40GB (`nvidia-smi mig -lgip` / `-lgipp`), written out here rather than taken
from `deviceplugin.gpu.mig`, so a wrong table there shows as a failed create."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml as real_nvml
import pytest

from deviceplugin.fit.model import MigGroup, MigInstance
from deviceplugin.gpu.base import MigBusy, MigError
from deviceplugin.gpu.nvml import NvmlBackend
from tests.gpu.test_nvml import (
    GIB,
    IN_USE,
    INSUFFICIENT_RESOURCES,
    MIG_OFF,
    MIG_ON,
    NOT_FOUND,
    NOT_SUPPORTED,
    UNKNOWN,
    UUIDS,
    NVMLError,
    StandInGpu,
    StandInNvml,
)

A100_40 = "NVIDIA A100-SXM4-40GB"
# profile enum -> (profile id, placement starts, span, memory MiB), A100 40GB
PROFILES = {
    real_nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, (0, 1, 2, 3, 4, 5, 6), 1, 4864),
    real_nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, (0, 1, 2, 3, 4, 5, 6), 1, 4864),
    real_nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, (0, 2, 4, 6), 2, 9856),
    real_nvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, (0, 2, 4), 2, 9856),
    real_nvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, (0, 4), 4, 19968),
    real_nvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, (0,), 4, 19968),
    real_nvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, (0,), 8, 40192),
}
BY_ID = {profile_id: (starts, span, memory) for profile_id, starts, span, memory in PROFILES.values()}


@dataclass(eq=False)
class ComputeInstance:
    gi: GpuInstance
    id: int
    processes: list[int] = field(default_factory=list)

    @property
    def uuid(self) -> str:
        return f"MIG-{self.gi.id:08d}-0000-0000-0000-{self.id:012d}"


@dataclass(eq=False)
class GpuInstance:
    gpu: StandInGpu
    id: int
    profile_id: int
    start: int
    computes: dict[int, ComputeInstance] = field(default_factory=dict)


class MigNvml(StandInNvml):
    NVML_ERROR_NOT_FOUND = NOT_FOUND
    NVML_ERROR_INVALID_ARGUMENT = real_nvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = real_nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = real_nvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: list[StandInGpu]) -> None:
        super().__init__(gpus)
        self.instances: dict[int, GpuInstance] = {}  # one MIG card: gpus[0]
        self.fail_create_after: int | None = None
        self.compute_profiles: list[int] = []
        for name in dir(real_nvml):
            if name.startswith(("NVML_GPU_INSTANCE_PROFILE_", "NVML_COMPUTE_INSTANCE_PROFILE_")):
                setattr(self, name, getattr(real_nvml, name))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, gpu: StandInGpu, profile: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", gpu)
        if profile not in PROFILES:
            raise NVMLError(NOT_SUPPORTED)
        return SimpleNamespace(id=PROFILES[profile][0], memorySizeMB=PROFILES[profile][3])

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, gpu: StandInGpu, profile_id: int, placement: Any
    ) -> GpuInstance:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", gpu)
        if self.fail_create_after is not None:
            if self.fail_create_after == 0:
                raise NVMLError(UNKNOWN)
            self.fail_create_after -= 1
        start, size = placement.contents.start, placement.contents.size
        starts, span, _ = BY_ID[profile_id]
        taken = {
            cell
            for gi in self.instances.values()
            for cell in range(gi.start, gi.start + BY_ID[gi.profile_id][1])
        }
        if start not in starts or size != span or taken & set(range(start, start + span)):
            raise NVMLError(INSUFFICIENT_RESOURCES)
        gi_id = next(n for n in range(1, 15) if n not in self.instances)
        self.instances[gi_id] = GpuInstance(gpu, gi_id, profile_id, start)
        return self.instances[gi_id]

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: GpuInstance, profile: int, engine: int
    ) -> SimpleNamespace:
        assert engine == real_nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        self.compute_profiles.append(profile)
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: GpuInstance, profile_id: int) -> ComputeInstance:
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        ci = ComputeInstance(gi, len(gi.computes))
        gi.computes[ci.id] = ci
        return ci

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: StandInGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: StandInGpu, index: int) -> ComputeInstance:
        devices = [
            ci for gi in sorted(self.instances.values(), key=lambda gi: gi.id) for ci in gi.computes.values()
        ]
        if index >= len(devices):
            raise NVMLError(NOT_FOUND)
        return devices[index]

    def nvmlDeviceGetGpuInstanceId(self, ci: ComputeInstance) -> int:
        return ci.gi.id

    def nvmlDeviceGetComputeInstanceId(self, ci: ComputeInstance) -> int:
        return ci.id

    def nvmlDeviceGetGpuInstanceById(self, gpu: StandInGpu, gi_id: int) -> GpuInstance:
        if gi_id not in self.instances:
            raise NVMLError(NOT_FOUND)
        return self.instances[gi_id]

    def nvmlGpuInstanceGetInfo(self, gi: GpuInstance) -> SimpleNamespace:
        placement = SimpleNamespace(start=gi.start, size=BY_ID[gi.profile_id][1])
        return SimpleNamespace(id=gi.id, profileId=gi.profile_id, placement=placement)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: GpuInstance, ci_id: int) -> ComputeInstance:
        return gi.computes[ci_id]

    def nvmlDeviceGetComputeRunningProcesses(self, ci: ComputeInstance) -> list[int]:
        return ci.processes

    def nvmlComputeInstanceDestroy(self, ci: ComputeInstance) -> None:
        self._enter("nvmlComputeInstanceDestroy")
        if ci.processes:
            raise NVMLError(IN_USE)
        del ci.gi.computes[ci.id]

    def nvmlGpuInstanceDestroy(self, gi: GpuInstance) -> None:
        self._enter("nvmlGpuInstanceDestroy")
        if gi.computes:
            raise NVMLError(IN_USE)
        del self.instances[gi.id]

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return handle.uuid if isinstance(handle, ComputeInstance) else super().nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        if isinstance(handle, ComputeInstance):
            return SimpleNamespace(total=BY_ID[handle.gi.profile_id][2] * 2**20)
        return super().nvmlDeviceGetMemoryInfo(handle)


def group(*instances: tuple[str, int]) -> MigGroup:
    return MigGroup("g", tuple(MigInstance(name, 0, count) for name, count in instances))


@pytest.fixture
def nvml() -> MigNvml:
    return MigNvml(
        [
            StandInGpu(UUIDS[0], name=A100_40, memory_total=40 * GIB, mig_mode=(MIG_ON, MIG_ON)),
            StandInGpu(UUIDS[1], name=A100_40, memory_total=40 * GIB),
        ]
    )


@pytest.fixture
def backend(nvml: MigNvml, tmp_path: Path) -> NvmlBackend:
    return NvmlBackend(nvml, tmp_path)


def placed(devices: tuple[Any, ...]) -> list[tuple[str, int]]:
    return [(device.profile, device.start) for device in devices]


def test_mig_mode(nvml: MigNvml, backend: NvmlBackend) -> None:
    assert backend.mig_enabled(UUIDS[0]) is True
    assert backend.mig_enabled(UUIDS[1]) is False
    nvml.gpus[1].mig_mode = (MIG_OFF, MIG_ON)  # pending until the GPU resets
    assert backend.mig_enabled(UUIDS[1]) is False
    nvml.gpus[1].failures["nvmlDeviceGetMigMode"] = NOT_SUPPORTED
    assert backend.mig_enabled(UUIDS[1]) is False
    with pytest.raises(MigError, match=f"^GPU {UUIDS[1]} is not in MIG mode$"):
        backend.mig_devices(UUIDS[1])


def test_partition_creates_at_nvidias_placements_in_slot_order(nvml: MigNvml, backend: NvmlBackend) -> None:
    devices = backend.partition(UUIDS[0], group(("1g.5gb", 1), ("2g.10gb", 3)))
    assert placed(devices) == [("1g.5gb", 6), ("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4)]
    assert [d.memory_mib for d in devices] == [4864, 9856, 9856, 9856]
    assert [d.uuid for d in devices] == [nvml.instances[d.gpu_instance].computes[0].uuid for d in devices]
    # one full compute instance each: a 1-slice CI for the 1g, a 2-slice one for each 2g
    assert sorted(nvml.compute_profiles) == [
        real_nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        *[real_nvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE] * 3,
    ]


def test_every_table_profile_is_created_where_the_driver_allows(backend: NvmlBackend) -> None:
    for each in (group(("3g.20gb", 2)), group(("4g.20gb", 1), ("1g.10gb", 2)), group(("7g.40gb", 1))):
        assert [d.profile for d in backend.partition(UUIDS[0], each)] == [
            i.name for i in each.instances for _ in range(i.count)
        ]
        backend.clear_mig(UUIDS[0])


def test_failed_create_destroys_what_was_created(nvml: MigNvml, backend: NvmlBackend) -> None:
    nvml.fail_create_after = 2
    with pytest.raises(
        MigError, match=r"creating a 2g\.10gb GPU instance at slice 4 on GPU .* failed: Unknown Error$"
    ):
        backend.partition(UUIDS[0], group(("2g.10gb", 3)))
    assert nvml.instances == {}
    assert backend.mig_devices(UUIDS[0]) == ()


def test_list_and_match_an_operators_partition(nvml: MigNvml, backend: NvmlBackend) -> None:
    backend.partition(UUIDS[0], group(("3g.20gb", 2)))
    devices = backend.mig_devices(UUIDS[0])
    assert placed(devices) == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert all(d.uuid.startswith("MIG-") for d in devices)
    found = backend.match_mig(
        UUIDS[0], [group(("7g.40gb", 1)), MigGroup("halves", (MigInstance("3g.20gb", 0, 2),))]
    )
    assert found is not None and found.group == "halves" and found.devices == devices
    assert backend.match_mig(UUIDS[0], [group(("7g.40gb", 1))]) is None


def test_busy_device_refuses_clearing(nvml: MigNvml, backend: NvmlBackend) -> None:
    devices = backend.partition(UUIDS[0], group(("3g.20gb", 2)))
    nvml.instances[devices[1].gpu_instance].computes[0].processes.append(4242)
    with pytest.raises(
        MigBusy, match=f"MIG device {devices[1].uuid} .* runs processes; no instance was destroyed"
    ):
        backend.clear_mig(UUIDS[0])
    assert backend.mig_devices(UUIDS[0]) == devices
    assert "nvmlComputeInstanceDestroy" not in nvml.calls


def test_clear_destroys_compute_then_gpu_instances(nvml: MigNvml, backend: NvmlBackend) -> None:
    backend.partition(UUIDS[0], group(("2g.10gb", 3), ("1g.5gb", 1)))
    nvml.calls.clear()
    backend.clear_mig(UUIDS[0])
    assert nvml.instances == {}
    destroys = [call for call in nvml.calls if call.endswith("Destroy")]
    assert destroys == ["nvmlComputeInstanceDestroy"] * 4 + ["nvmlGpuInstanceDestroy"] * 4


def test_driver_error_text_reaches_the_user(nvml: MigNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].failures["nvmlDeviceGetGpuInstanceProfileInfo"] = UNKNOWN
    with pytest.raises(
        MigError, match=f"^GPU {UUIDS[0]}: nvmlDeviceGetGpuInstanceProfileInfo failed: Unknown Error$"
    ):
        backend.mig_devices(UUIDS[0])


def test_unsupported_model(nvml: MigNvml, backend: NvmlBackend) -> None:
    nvml.gpus[0].name = "NVIDIA A10"
    with pytest.raises(MigError, match="dynamic MIG does not know the NVIDIA A10"):
        backend.partition(UUIDS[0], group(("1g.5gb", 1)))


def test_placement_is_passed_by_pointer() -> None:
    """pynvml hands the placement straight to the C call, which takes a pointer."""
    placement = real_nvml.c_nvmlGpuInstancePlacement_t(4, 2)
    pointer = ctypes.pointer(placement)
    assert (pointer.contents.start, pointer.contents.size) == (4, 2)
