"""GetPreferredAllocation over gRPC (a real Unix socket) on a node that knows how its GPUs connect:
a container the scheduler did not pin gets the best-linked GPUs (docs/topology.md), the
must-include devices' GPUs kept; a pinned one still gets the scheduler's GPUs; memory-unit
resources and nodes without a topology keep kubelet's order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit.topology import Topology, parse_link
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.plugin.allocate import PodAllocator
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout
from deviceplugin.plugin.gpushare import GpushareAllocator
from deviceplugin.plugin.server import PluginServer
from deviceplugin.plugin.service import DevicePluginService
from deviceplugin.plugin.vgpu import VgpuAllocator
from kubesim.apiserver import ApiServerEmulator
from kubesim.scratch import scratch_dir
from tests.kube.waiting import WAIT_S, wait_for
from tests.plugin.rig import NODE, NUM, Rig, close_rig, make_rig

EIGHT = tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="Fake GPU", memory_mib=40960) for i in range(8))
NVLINKED = frozenset({2, 3, 6, 7})


def quad() -> Topology:
    """GPUs 2, 3, 6, 7 NVLinked; otherwise NODE within a socket (0-3, 4-7), SYS across."""

    def link(a: int, b: int) -> str:
        if {a, b} <= NVLINKED:
            return "NV4"
        return "NODE" if a // 4 == b // 4 else "SYS"

    return Topology.build(range(8), [g // 4 for g in range(8)], lambda a, b: parse_link(link(a, b)))


def pairs() -> Topology:
    """Four GPUs NVLinked in pairs (0,3) and (1,2), the rest through the host bridge."""
    return Topology.build(
        range(4), [0] * 4, lambda a, b: parse_link("NV4" if {a, b} in ({0, 3}, {1, 2}) else "PHB")
    )


@contextlib.contextmanager
def serve(allocator: PodAllocator[Any]) -> Iterator[deviceplugin_grpc.DevicePluginStub]:
    with scratch_dir("dptopo") as directory:
        server = PluginServer(DevicePluginService(allocator.devices, allocator.health, allocator), directory)
        server.start()
        channel = grpc.insecure_channel(f"unix://{server.path}")
        try:
            yield deviceplugin_grpc.DevicePluginStub(channel)
        finally:
            channel.close()
            server.stop()


def preferred(
    stub: deviceplugin_grpc.DevicePluginStub, available: list[str], size: int, must: list[str] | None = None
) -> list[str]:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
            )
        ]
    )
    reply = stub.GetPreferredAllocation(request, timeout=10)
    return list(reply.container_responses[0].deviceIDs)


@pytest.fixture
def number(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[Rig]:
    rig = make_rig(tmp_path, apiserver, "number", gpus=EIGHT)
    yield rig
    close_rig(rig)


# How long GetPreferredAllocation waits for a pod that never comes (the unpinned cases): it waits
# as Allocate does, in case the node's watch brings the pod after kubelet admitted it.
NO_POD_WAIT_S = 0.2


def number_allocator(
    rig: Rig, topology: Topology | None, timeout_s: float = NO_POD_WAIT_S
) -> GpushareAllocator:
    return GpushareAllocator(
        rig.allocator.devices,
        rig.health,
        rig.pods,
        rig.ledger,
        rig.events,
        node_name=NODE,
        topology=topology,
        timeout_s=timeout_s,
    )


UUIDS = [gpu.uuid for gpu in EIGHT]


def test_an_unpinned_gpu_number_container_gets_the_nvlinked_quad(number: Rig) -> None:
    with serve(number_allocator(number, quad())) as stub:
        assert sorted(preferred(stub, UUIDS, 4)) == ["GPU-2", "GPU-3", "GPU-6", "GPU-7"]
        # GPU 6 must be included: the rest of its quad comes with it. GPU 4 (no NVLink): the
        # rest of its socket, not kubelet's next (0, 1, 2 across the sockets).
        assert preferred(stub, UUIDS, 4, must=["GPU-6"]) == ["GPU-6", "GPU-2", "GPU-3", "GPU-7"]
        assert preferred(stub, UUIDS, 4, must=["GPU-4"]) == ["GPU-4", "GPU-5", "GPU-6", "GPU-7"]
        # Only what kubelet offers is chosen from: with GPU 7 taken, the three left of the quad.
        offered = [uuid for uuid in UUIDS if uuid != "GPU-7"]
        assert sorted(preferred(stub, offered, 3)) == ["GPU-2", "GPU-3", "GPU-6"]
    with serve(number_allocator(number, None)) as stub:
        assert preferred(stub, UUIDS, 4) == UUIDS[:4]  # no topology: kubelet's order


def test_a_pinned_container_still_gets_the_schedulers_gpus(number: Rig) -> None:
    number.pod("placed", [("main", 4)], gpu_index="0,1,4,5", resource=NUM)
    with serve(number_allocator(number, quad())) as stub:
        assert sorted(preferred(stub, UUIDS, 4)) == ["GPU-0", "GPU-1", "GPU-4", "GPU-5"]


def test_a_pinned_pod_that_reaches_the_cache_after_kubelet_asks_still_gets_the_schedulers_gpus(
    number: Rig,
) -> None:
    """Kubelet may admit a pod before this node's watch shows it: the call waits for the pod, as
    Allocate does, rather than steering kubelet to the best-linked GPUs the scheduler did not pick."""
    allocator = number_allocator(number, quad(), timeout_s=WAIT_S)
    with serve(allocator) as stub:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=UUIDS, allocation_size=4)
            ]
        )
        answer = stub.GetPreferredAllocation.future(request, timeout=2 * WAIT_S)
        assert wait_for(lambda: allocator.stats.waiting().get(NUM, 0) == 1)  # the call waits for a pod
        number.pod("late", [("main", 4)], gpu_index="0,1,4,5", resource=NUM)
        chosen = answer.result().container_responses[0].deviceIDs
    assert sorted(chosen) == ["GPU-0", "GPU-1", "GPU-4", "GPU-5"]


def test_a_pod_without_the_schedulers_choice_gets_the_best_linked_gpus(number: Rig) -> None:
    number.pod("default-scheduled", [("main", 2)], gpu_index=None, predicate_time=None, resource=NUM)
    with serve(number_allocator(number, quad())) as stub:
        assert preferred(stub, UUIDS, 2) == ["GPU-2", "GPU-3"]


@pytest.fixture
def vgpu(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[Rig]:
    rig = make_rig(tmp_path, apiserver, "vgpu", gpus=EIGHT[:4])
    yield rig
    close_rig(rig)


def vgpu_allocator(rig: Rig, resource: int) -> VgpuAllocator:
    assert isinstance(rig.allocator, VgpuAllocator)
    devices = DeviceList(RESOURCES["vgpu"][resource], EIGHT[:4], Layout(split_count=4))
    return VgpuAllocator(
        devices,
        rig.health,
        rig.pods,
        rig.ledger,
        rig.events,
        hook_path=rig.allocator.hook,
        node_name=NODE,
        topology=pairs(),
        timeout_s=NO_POD_WAIT_S,
    )


def test_unpinned_vgpus_go_one_per_gpu_onto_an_nvlinked_pair(vgpu: Rig) -> None:
    slots = [f"GPU-{g}-{n}" for g in range(4) for n in range(4)]
    with serve(vgpu_allocator(vgpu, 0)) as stub:
        assert preferred(stub, slots, 2) == ["GPU-0-0", "GPU-3-0"]
        assert preferred(stub, slots, 2, must=["GPU-2-1"]) == ["GPU-2-1", "GPU-1-0"]
        assert preferred(stub, slots, 5) == slots[:5]  # five GPUs: not one per GPU, kubelet's order
    memory = [f"GPU-{g}-memory-{n}" for g in range(4) for n in range(3)]
    with serve(vgpu_allocator(vgpu, 1)) as stub:
        assert preferred(stub, memory, 2) == memory[:2]  # memory units: no GPU set to choose
