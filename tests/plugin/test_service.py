"""The DevicePlugin service over a real Unix socket: options, ListAndWatch behaviour, limits."""

from __future__ import annotations

import queue
import stat
import threading
from collections.abc import Iterator

import grpc
import pytest

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout
from deviceplugin.plugin.server import PluginServer
from deviceplugin.plugin.service import DevicePluginService
from kubesim.scratch import scratch_dir

GPUS = (
    GpuInfo(index=0, uuid="GPU-0000", model="Fake GPU", memory_mib=100, numa=0),
    GpuInfo(index=1, uuid="GPU-1111", model="Fake GPU", memory_mib=100, numa=1),
)


@pytest.fixture
def served() -> Iterator[tuple[PluginServer, HealthState, grpc.Channel]]:
    with scratch_dir("dpsvc") as directory:
        health = HealthState(tuple(g.uuid for g in GPUS))
        service = DevicePluginService(DeviceList(RESOURCES["number"][0], GPUS, Layout()), health)
        server = PluginServer(service, directory)
        server.start()
        channel = grpc.insecure_channel(f"unix://{server.path}")
        yield server, health, channel
        channel.close()
        server.stop()


def stub(channel: grpc.Channel) -> deviceplugin_grpc.DevicePluginStub:
    return deviceplugin_grpc.DevicePluginStub(channel)


def test_options_and_socket_mode(served: tuple[PluginServer, HealthState, grpc.Channel]) -> None:
    server, _, channel = served
    options = stub(channel).GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert options.get_preferred_allocation_available and not options.pre_start_required
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    assert stub(channel).PreStartContainer(
        pb.PreStartContainerRequest(devices_ids=["GPU-0000"]), timeout=5
    ) == (pb.PreStartContainerResponse())


def test_list_and_watch_sends_on_connect_and_on_every_health_change(
    served: tuple[PluginServer, HealthState, grpc.Channel],
) -> None:
    _, health, channel = served
    call = stub(channel).ListAndWatch(pb.Empty())
    received: queue.Queue[pb.ListAndWatchResponse] = queue.Queue()

    def read() -> None:
        try:
            for message in call:
                received.put(message)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.CANCELLED

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def next_health() -> dict[str, str]:
        return {d.ID: d.health for d in received.get(timeout=5).devices}

    assert next_health() == {"GPU-0000": "Healthy", "GPU-1111": "Healthy"}
    health.set(("GPU-1111",), healthy=False, reason="test")
    assert next_health() == {"GPU-0000": "Healthy", "GPU-1111": "Unhealthy"}
    health.set(("GPU-1111",), healthy=False, reason="again")  # no change: nothing is sent
    health.wake()
    health.set(("GPU-1111",), healthy=True, reason="recovered")
    assert next_health() == {"GPU-0000": "Healthy", "GPU-1111": "Healthy"}
    assert received.empty()
    call.cancel()
    reader.join(5)


def test_allocation_is_not_served_yet_even_for_huge_requests(
    served: tuple[PluginServer, HealthState, grpc.Channel],
) -> None:
    _, _, channel = served
    ids = [f"GPU-{n:036d}-memory-{n}" for n in range(120_000)]  # ~7 MiB: past gRPC's 4 MiB default
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=1)
        ]
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).GetPreferredAllocation(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED  # received in full, not RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest()]), timeout=5
        )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "volcano.sh/gpu-number" in (caught.value.details() or "")


def test_stop_ends_open_streams_and_removes_the_socket(
    served: tuple[PluginServer, HealthState, grpc.Channel],
) -> None:
    server, _, channel = served
    call = stub(channel).ListAndWatch(pb.Empty())
    assert next(iter(call)).devices
    server.stop()
    assert list(call) == []  # the stream ends cleanly: kubelet sees the plugin go away
    assert not server.path.exists()
    assert not server.serving()
