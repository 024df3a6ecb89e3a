"""Which containers own a devices-to-allocate slot (Volcano's `ExtractResourceRequest` selection)."""

from __future__ import annotations

from deviceplugin.fit import VgpuConfig, parse_vgpu_requests
from deviceplugin.fit.vgpu_slots import SlotOwner, vgpu_slot_owners
from tests.fit.builders import CORES, MEM, NUM, PCT, container, pod

SHAPES = pod(
    "shapes",
    [
        container("cpu"),
        container("cores", {CORES: "30"}),
        container("percentage", {PCT: "50"}),
        container("memory-in-requests", {CORES: "10"}, {MEM: "1000"}),
        container("memory", {MEM: "1000"}),
        container("memory-percentage", {MEM: "1000", PCT: "50"}),
        container("count-zero", {NUM: "0", MEM: "10"}),
        container("count", {NUM: "2", CORES: "300"}),
    ],
    init_containers=[container("init", {NUM: "1", MEM: "100"})],
)


def test_owners_are_app_containers_limiting_count_or_memory() -> None:
    assert vgpu_slot_owners(SHAPES) == [
        SlotOwner("memory", by_count=False),
        SlotOwner("memory-percentage", by_count=False),
        SlotOwner("count-zero", by_count=True),
        SlotOwner("count", by_count=True),
    ]


def test_owners_are_the_containers_volcanos_request_reader_returns() -> None:
    """The same containers as the library's Volcano reader, with and without a percentage name."""
    for config in (VgpuConfig(), VgpuConfig(percentage_resource=PCT)):
        expected = [request.name for request in parse_vgpu_requests(SHAPES, config, compat="volcano")]
        assert [owner.name for owner in vgpu_slot_owners(SHAPES, config)] == expected


def test_configured_resource_names() -> None:
    config = VgpuConfig(count_resource="example.com/gpu", memory_resource="example.com/gpu-mem")
    shaped = pod("p", [container("a", {NUM: "1"}), container("b", {"example.com/gpu-mem": "5"})])
    assert vgpu_slot_owners(shaped, config) == [SlotOwner("b", by_count=False)]
