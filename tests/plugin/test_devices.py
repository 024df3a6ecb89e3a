"""Device IDs per strategy, the byte encoding of ListAndWatch, sizes and the memory factor (SPEC §2)."""

from __future__ import annotations

import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.plugin.devices import (
    MESSAGE_BUDGET,
    RESOURCES,
    DeviceList,
    FactorError,
    Layout,
    Resource,
    check_layout,
    device_count,
    message_size,
    smallest_factor,
)

UUID = "GPU-6a2f1e0c-91b7-4c1e-8a3d-5f0e2b7c9d41"


def gpu(index: int, memory: int = 10989, numa: int | None = None, uuid: str | None = None) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid or f"GPU-{index:08d}-0000-4000-8000-000000000000",
        model="Fake GPU",
        memory_mib=memory,
        numa=numa,
    )


def decode(message: bytes) -> list[tuple[str, str, list[int] | None]]:
    devices = pb.ListAndWatchResponse.FromString(message).devices
    return [
        (d.ID, d.health, [n.ID for n in d.topology.nodes] if d.HasField("topology") else None)
        for d in devices
    ]


def reference(message: bytes) -> bytes:
    """What protobuf itself serializes for the same devices."""
    return pb.ListAndWatchResponse(
        devices=pb.ListAndWatchResponse.FromString(message).devices
    ).SerializeToString()


def test_resources_per_strategy() -> None:
    assert [(r.name, r.socket) for r in RESOURCES["share"]] == [("volcano.sh/gpu-memory", "volcano.sock")]
    assert [(r.name, r.socket) for r in RESOURCES["number"]] == [("volcano.sh/gpu-number", "volcano.sock")]
    assert [(r.name, r.socket) for r in RESOURCES["vgpu"]] == [
        ("volcano.sh/vgpu-number", "nvidia-vgpu-number.sock"),
        ("volcano.sh/vgpu-memory", "nvidia-vgpu-memory.sock"),
        ("volcano.sh/vgpu-cores", "nvidia-vgpu-cores.sock"),
    ]


def test_share_ids_are_index_and_unit_per_gpu_memory() -> None:
    gpus = (gpu(0, 3), gpu(1, 12))  # each GPU advertises its own memory
    message = DeviceList(RESOURCES["share"][0], gpus, Layout()).message({g.uuid: True for g in gpus})
    ids = [entry[0] for entry in decode(message)]
    assert ids == ["0-0", "0-1", "0-2", *[f"1-{j}" for j in range(12)]]
    assert {entry[1] for entry in decode(message)} == {"Healthy"}
    assert all(entry[2] is None for entry in decode(message))  # no NUMA on shared memory units


def test_share_memory_factor_divides_each_gpu() -> None:
    gpus = (gpu(0, 10989), gpu(1, 4000))
    resource = RESOURCES["share"][0]
    assert [device_count(resource, g, Layout(factor=100)) for g in gpus] == [109, 40]


def test_number_ids_are_uuids_with_numa() -> None:
    gpus = (gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=None))
    message = DeviceList(RESOURCES["number"][0], gpus, Layout()).message({g.uuid: g.index != 1 for g in gpus})
    assert decode(message) == [
        (gpus[0].uuid, "Healthy", [0]),
        (gpus[1].uuid, "Unhealthy", [1]),
        (gpus[2].uuid, "Healthy", None),
    ]


def test_vgpu_ids() -> None:
    one = (gpu(0, 2000, uuid=UUID),)
    layout = Layout(factor=1000, split_count=3)
    number, memory, cores = (DeviceList(r, one, layout).message({UUID: True}) for r in RESOURCES["vgpu"])
    assert [e[0] for e in decode(number)] == [f"{UUID}-0", f"{UUID}-1", f"{UUID}-2"]
    assert [e[0] for e in decode(memory)] == [f"{UUID}-memory-0", f"{UUID}-memory-1"]
    assert [e[0] for e in decode(cores)] == [f"{UUID}-core-{i}" for i in range(100)]


@pytest.mark.parametrize("resource", [*RESOURCES["share"], *RESOURCES["number"], *RESOURCES["vgpu"]])
def test_every_advertised_id_maps_back_to_its_gpu(resource: Resource) -> None:
    gpus = (gpu(0, 2500), gpu(1, 1200), gpu(10, 300))
    devices = DeviceList(resource, gpus, Layout(factor=100, split_count=3))
    advertised = decode(devices.message({g.uuid: True for g in gpus}))
    for device_id, _, _ in advertised:
        owner = devices.gpu_of(device_id)
        assert owner is not None and device_id.startswith((f"{owner.index}-", owner.uuid)), device_id


@pytest.mark.parametrize(
    "device_id",
    ["0-25", "0-07", "0-+7", "0- 7", "0-٣", "2-0", "1-0-0", "0", "", "-1", "0-", "GPU-unknown-0", "1-12"],
)
def test_ids_never_advertised_belong_to_no_gpu(device_id: str) -> None:
    gpus = (gpu(0, 2500), gpu(1, 1200), gpu(10, 300))
    devices = DeviceList(RESOURCES["share"][0], gpus, Layout(factor=100))
    assert devices.gpu_of(device_id) is None


@pytest.mark.parametrize("resource", [*RESOURCES["share"], *RESOURCES["number"], *RESOURCES["vgpu"]])
def test_id_prefixes_select_exactly_the_ids_of_the_chosen_gpus(resource: Resource) -> None:
    gpus = (gpu(0, 2500), gpu(1, 1200), gpu(10, 300))
    devices = DeviceList(resource, gpus, Layout(factor=100, split_count=3))
    advertised = [entry[0] for entry in decode(devices.message({g.uuid: True for g in gpus}))]
    prefixes = devices.id_prefixes([1])
    chosen = [device_id for device_id in advertised if device_id.startswith(prefixes)]
    assert chosen and all(devices.gpu_of(device_id) == gpus[1] for device_id in chosen)
    assert len(chosen) == sum(1 for device_id in advertised if devices.gpu_of(device_id) == gpus[1])


def test_uuid_ids_map_only_whole_uuids() -> None:
    devices = DeviceList(RESOURCES["number"][0], (gpu(0), gpu(1)), Layout())
    assert devices.gpu_of(gpu(1).uuid) == gpu(1)
    assert devices.gpu_of(gpu(1).uuid + "-0") is None
    assert devices.gpu_of(gpu(1).uuid[:-1]) is None


@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
@pytest.mark.parametrize("healthy", [True, False])
def test_bytes_equal_protobuf_serialization_and_computed_size(strategy: str, healthy: bool) -> None:
    gpus = (gpu(0, 12345, numa=0), gpu(1, 999, numa=1), gpu(12, 101, numa=130))
    layout = Layout(factor=3, split_count=12)
    for resource in RESOURCES[strategy]:  # type: ignore[index]
        message = DeviceList(resource, gpus, layout).message({g.uuid: healthy for g in gpus})
        assert message == reference(message)
        assert len(message) == message_size(resource, gpus, layout, healthy=healthy)


def test_unhealthy_flips_every_id_of_that_gpu_and_is_the_worst_case_size() -> None:
    gpus = (gpu(0, 100), gpu(1, 100))
    devices = DeviceList(RESOURCES["share"][0], gpus, Layout())
    message = devices.message({gpus[0].uuid: True, gpus[1].uuid: False})
    health = {(device_id.split("-")[0], state) for device_id, state, _ in decode(message)}
    assert health == {("0", "Healthy"), ("1", "Unhealthy")}
    assert len(message) < message_size(devices.resource, gpus, devices.layout)  # all Unhealthy is longest


def test_unchanged_health_returns_the_cached_message() -> None:
    gpus = (gpu(0, 1000), gpu(1, 1000))
    devices = DeviceList(RESOURCES["share"][0], gpus, Layout())
    healthy = {g.uuid: True for g in gpus}
    first = devices.message(healthy)
    assert devices.message(dict(healthy)) is first
    flipped = devices.message({gpus[0].uuid: False, gpus[1].uuid: True})
    assert flipped is not first
    assert devices.message(healthy) == first


def test_gpu_missing_from_health_is_unhealthy() -> None:
    devices = DeviceList(RESOURCES["number"][0], (gpu(0),), Layout())
    assert decode(devices.message({}))[0][1] == "Unhealthy"


H200 = tuple(gpu(i, 143771, numa=i // 4, uuid=f"GPU-{i:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b") for i in range(8))


@pytest.mark.parametrize(("strategy", "factor"), [("share", 7), ("vgpu", 21)])
def test_auto_factor_for_eight_h200(strategy: str, factor: int) -> None:
    resources = RESOURCES[strategy]  # type: ignore[index]
    assert smallest_factor(resources, H200, 10) == factor
    for resource in resources:
        assert message_size(resource, H200, Layout(factor, 10)) <= MESSAGE_BUDGET
    assert any(message_size(r, H200, Layout(factor - 1, 10)) > MESSAGE_BUDGET for r in resources)


def test_too_small_factor_is_refused_naming_the_one_that_fits() -> None:
    with pytest.raises(FactorError) as caught:
        check_layout(RESOURCES["share"], H200, Layout(factor=1))
    message = str(caught.value)
    assert (
        "volcano.sh/gpu-memory: with --gpu-memory-factor=1 the device list would be 25,564,984 bytes"
        in message
    )
    assert "use --gpu-memory-factor=7 or more, or --gpu-memory-factor=auto" in message


def test_documented_overflow_of_volcano_devices_is_caught() -> None:
    """volcano-vgpu#99: 8 x H20 at one device per MiB is 23,264,648 B with 7-char IDs (healthy)."""
    h20 = tuple(gpu(i, 143771) for i in range(8))
    assert message_size(RESOURCES["share"][0], h20, Layout(), healthy=True) > 4 * 1024 * 1024


def test_factor_larger_than_a_gpu_is_refused() -> None:
    with pytest.raises(FactorError, match=r"--gpu-memory-factor=20000 is larger than GPU 0's 10989 MiB"):
        check_layout(RESOURCES["share"], (gpu(0),), Layout(factor=20000))


def test_split_count_over_budget_is_refused() -> None:
    many = tuple(gpu(i, 1000) for i in range(64))
    with pytest.raises(FactorError, match="lower --vgpu-split-count"):
        check_layout(RESOURCES["vgpu"], many, Layout(factor=1000, split_count=2000))


def test_number_mode_needs_no_factor() -> None:
    check_layout(RESOURCES["number"], H200, Layout(factor=1))  # one ID per GPU: no error


def test_vgpu_scaling_sets_memory_and_core_ids_as_hami_does() -> None:
    """HAMi's deviceMemoryScaling / deviceCoreScaling: int(MiB x scaling) / factor memory units
    and int(100 x scaling) cores per GPU; the share strategy's IDs ignore them."""
    layout = Layout(factor=4, split_count=3, memory_scaling=1.8, core_scaling=1.5)
    number, memory, cores = RESOURCES["vgpu"]
    card = gpu(0, 16384)
    assert [device_count(r, card, layout) for r in (number, memory, cores)] == [3, 29491 // 4, 150]
    assert device_count(RESOURCES["share"][0], card, layout) == 16384 // 4


def test_auto_factor_counts_oversubscribed_memory() -> None:
    scaled = smallest_factor(RESOURCES["vgpu"], H200, 10, memory_scaling=2.0)
    assert scaled > smallest_factor(RESOURCES["vgpu"], H200, 10)
    check_layout(RESOURCES["vgpu"], H200, Layout(scaled, 10, memory_scaling=2.0))
    with pytest.raises(FactorError, match=f"use --gpu-memory-factor={scaled} or more"):
        check_layout(RESOURCES["vgpu"], H200, Layout(scaled - 1, 10, memory_scaling=2.0))


def test_scaling_below_one_that_leaves_no_memory_is_refused() -> None:
    with pytest.raises(FactorError, match=r"--gpu-memory-factor=1000 is larger than GPU 0's 549 MiB"):
        check_layout(RESOURCES["vgpu"], (gpu(0),), Layout(factor=1000, memory_scaling=0.05))
