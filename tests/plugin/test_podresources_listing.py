"""`Listing.holds_any`: whether kubelet shows a container holding devices of given resources (a
new node's first start skips the ledger rebuild when it shows none)."""

from __future__ import annotations

from deviceplugin.api import podresources_pb2 as pr
from deviceplugin.plugin.podresources import Listing

MEM, NUMBER = "volcano.sh/gpu-memory", "volcano.sh/gpu-number"


def listing(*entries: tuple[str, tuple[str, ...]]) -> Listing:
    """One pod, one container holding (resource, device IDs) per entry."""
    devices = [pr.ContainerDevices(resource_name=resource, device_ids=ids) for resource, ids in entries]
    container = pr.ContainerResources(name="main", devices=devices)
    return Listing(
        pr.ListPodResourcesResponse(
            pod_resources=[pr.PodResources(name="p", namespace="ml", containers=[container])]
        )
    )


def test_a_container_holding_one_of_the_resources_counts() -> None:
    assert listing((MEM, ("GPU-0-1",))).holds_any([MEM])
    assert listing(("nvidia.com/gpu", ("GPU-9",)), (NUMBER, ("GPU-0-0",))).holds_any([MEM, NUMBER])


def test_other_resources_and_empty_entries_do_not() -> None:
    assert not listing(("nvidia.com/gpu", ("GPU-9",))).holds_any([MEM, NUMBER])
    assert not listing((MEM, ())).holds_any([MEM])
    assert not Listing(pr.ListPodResourcesResponse()).holds_any([MEM])
