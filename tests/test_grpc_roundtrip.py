"""Every kubelet RPC over a real gRPC server on a Unix socket, using the generated stubs.

The servicers here are test doubles for kubelet (Registration, PodResourcesLister)
and for a plugin (DevicePlugin). They record what they received so both sides
of each call can be checked, and an interceptor records the method paths the
server actually saw on the wire.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from deviceplugin.api import (
    HEALTHY,
    UNHEALTHY,
    VERSION,
    deviceplugin_grpc,
    deviceplugin_pb2,
    podresources_grpc,
    podresources_pb2,
)
from kubesim.scratch import short_temp_root
from tests.test_proto import EXPECTED_METHODS

RPC_TIMEOUT_S = 10.0

dp = deviceplugin_pb2
pr = podresources_pb2

# The generated *_pb2_grpc modules carry no annotations. Calling them through these typed
# names keeps the tests clean whether or not mypy runs with disallow_untyped_calls.
RegistrationStub: Callable[[grpc.Channel], Any] = deviceplugin_grpc.RegistrationStub
DevicePluginStub: Callable[[grpc.Channel], Any] = deviceplugin_grpc.DevicePluginStub
PodResourcesListerStub: Callable[[grpc.Channel], Any] = podresources_grpc.PodResourcesListerStub
add_registration: Callable[[Any, grpc.Server], None] = deviceplugin_grpc.add_RegistrationServicer_to_server
add_device_plugin: Callable[[Any, grpc.Server], None] = deviceplugin_grpc.add_DevicePluginServicer_to_server
add_pod_resources: Callable[[Any, grpc.Server], None] = (
    podresources_grpc.add_PodResourcesListerServicer_to_server
)


class MethodRecorder(grpc.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """Remembers the full method name of every call the server receives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._methods: list[str] = []

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        with self._lock:
            self._methods.append(handler_call_details.method)
        return continuation(handler_call_details)

    @property
    def methods(self) -> list[str]:
        with self._lock:
            return list(self._methods)


class Received:
    """Thread-safe log of the requests a servicer saw, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[str, Message]] = []

    def add(self, rpc: str, request: Message) -> None:
        with self._lock:
            self._items.append((rpc, request))

    def get(self, rpc: str) -> list[Message]:
        with self._lock:
            return [request for name, request in self._items if name == rpc]


# --------------------------------------------------------------------------- servicers


class FakeRegistration(deviceplugin_grpc.RegistrationServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        self.received.add("Register", request)
        if request.version != VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        return dp.Empty()


def _device(device_id: str, health: str, numa: int | None) -> dp.Device:
    device = dp.Device(ID=device_id, health=health)
    if numa is not None:
        device.topology.nodes.add(ID=numa)
    return device


# Three snapshots the plugin streams: initial list, one device turning unhealthy, one removed.
LIST_AND_WATCH_SNAPSHOTS: list[list[dp.Device]] = [
    [
        _device("GPU-aaaa-0", HEALTHY, 0),
        _device("GPU-aaaa-1", HEALTHY, 1),
        _device("GPU-bbbb-0", HEALTHY, None),
    ],
    [
        _device("GPU-aaaa-0", HEALTHY, 0),
        _device("GPU-aaaa-1", UNHEALTHY, 1),
        _device("GPU-bbbb-0", HEALTHY, None),
    ],
    [_device("GPU-aaaa-0", HEALTHY, 0), _device("GPU-bbbb-0", HEALTHY, None)],
]


class FakeDevicePlugin(deviceplugin_grpc.DevicePluginServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        self.received.add("GetDevicePluginOptions", request)
        return dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        self.received.add("ListAndWatch", request)
        for snapshot in LIST_AND_WATCH_SNAPSHOTS:
            yield dp.ListAndWatchResponse(devices=snapshot)

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        self.received.add("GetPreferredAllocation", request)
        response = dp.PreferredAllocationResponse()
        for container in request.container_requests:
            chosen = list(container.must_include_deviceIDs)
            for device_id in sorted(container.available_deviceIDs):
                if len(chosen) >= container.allocation_size:
                    break
                if device_id not in chosen:
                    chosen.append(device_id)
            response.container_responses.add(deviceIDs=chosen)
        return response

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        self.received.add("Allocate", request)
        response = dp.AllocateResponse()
        for index, container in enumerate(request.container_requests):
            ids = ",".join(container.devices_ids)
            out = response.container_responses.add()
            out.envs["NVIDIA_VISIBLE_DEVICES"] = ids
            out.envs["GPU_INDEX"] = str(index)
            out.mounts.add(container_path="/usr/local/vgpu", host_path="/opt/vgpu", read_only=True)
            out.mounts.add(container_path="/tmp/vgpu", host_path=f"/tmp/vgpu/{index}", read_only=False)
            out.devices.add(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")
            out.devices.add(container_path="/dev/nvidiactl", host_path="/dev/nvidiactl", permissions="rwm")
            out.annotations["volcano.sh/gpu-ids"] = ids
            for device_id in container.devices_ids:
                out.cdi_devices.add(name=f"nvidia.com/gpu={device_id}")
        return response

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        self.received.add("PreStartContainer", request)
        return dp.PreStartContainerResponse()


def _topology(*nodes: int) -> pr.TopologyInfo:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=node) for node in nodes])


def _pod(name: str, namespace: str) -> pr.PodResources:
    shared = pr.ClaimResource(
        cdi_devices=[pr.CDIDevice(name="gpu.example.com/gpu=gpu-1")],
        driver_name="gpu.example.com",
        pool_name="node-a",
        device_name="gpu-1",
        share_id="7d3c9e52-share",
    )
    exclusive = pr.ClaimResource(driver_name="gpu.example.com", pool_name="node-a", device_name="gpu-2")
    empty_share = pr.ClaimResource(
        driver_name="gpu.example.com", pool_name="node-a", device_name="gpu-3", share_id=""
    )
    return pr.PodResources(
        name=name,
        namespace=namespace,
        cpu_ids=[4, 5],
        memory=[pr.ContainerMemory(memory_type="hugepages-2Mi", size=2 * 1024 * 1024, topology=_topology(0))],
        containers=[
            pr.ContainerResources(
                name="main",
                devices=[
                    pr.ContainerDevices(
                        resource_name="volcano.sh/gpu-memory",
                        device_ids=["GPU-aaaa-0", "GPU-aaaa-1"],
                        topology=_topology(0, 1),
                    )
                ],
                cpu_ids=[2, 3],
                memory=[pr.ContainerMemory(memory_type="memory", size=1 << 30, topology=_topology(1))],
                dynamic_resources=[
                    pr.DynamicResource(
                        claim_name="gpu-claim",
                        claim_namespace=namespace,
                        claim_resources=[shared, exclusive, empty_share],
                    )
                ],
            ),
            pr.ContainerResources(name="sidecar"),
        ],
    )


class FakePodResources(podresources_grpc.PodResourcesListerServicer):
    def __init__(self, received: Received) -> None:
        self.received = received
        self.pods = [_pod("trainer-0", "ml"), _pod("trainer-1", "ml")]

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        self.received.add("List", request)
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self.received.add("GetAllocatableResources", request)
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(
                    resource_name="volcano.sh/gpu-memory", device_ids=["GPU-aaaa-0"], topology=_topology(0)
                ),
                pr.ContainerDevices(
                    resource_name="volcano.sh/gpu-memory", device_ids=["GPU-aaaa-1"], topology=_topology(1)
                ),
            ],
            cpu_ids=list(range(8)),
            memory=[pr.ContainerMemory(memory_type="memory", size=64 << 30, topology=_topology(0, 1))],
        )

    def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        self.received.add("Get", request)
        for pod in self.pods:
            if (pod.name, pod.namespace) == (request.pod_name, request.pod_namespace):
                return pr.GetPodResourcesResponse(pod_resources=pod)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable: abort raises")


# --------------------------------------------------------------------------- server plumbing


@dataclass
class Served:
    address: str
    recorder: MethodRecorder
    received: Received
    pod_resources: FakePodResources


@contextmanager
def serve(
    options: list[tuple[str, Any]] | None = None,
    plugin: Callable[[Received], FakeDevicePlugin] = FakeDevicePlugin,
) -> Iterator[Served]:
    """Run all three services on a fresh Unix socket; tear everything down on exit."""
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    socket_dir = tempfile.mkdtemp(prefix="dp-", dir=short_temp_root())
    executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpc-test")
    recorder = MethodRecorder()
    received = Received()
    server = grpc.server(executor, interceptors=[recorder], options=options or [])
    try:
        pod_resources = FakePodResources(received)
        add_registration(FakeRegistration(received), server)
        add_device_plugin(plugin(received), server)
        add_pod_resources(pod_resources, server)
        address = f"unix://{socket_dir}/test.sock"
        assert server.add_insecure_port(address) != 0
        server.start()
        yield Served(address, recorder, received, pod_resources)
    finally:
        server.stop(grace=None).wait(timeout=5)
        executor.shutdown(wait=True)
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def served() -> Iterator[Served]:
    with serve() as running:
        yield running


@pytest.fixture
def channel(served: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.address) as chan:
        yield chan


# --------------------------------------------------------------------------- device plugin API


def test_register(served: Served, channel: grpc.Channel) -> None:
    stub = RegistrationStub(channel)
    request = dp.RegisterRequest(
        version=VERSION,
        endpoint="volcano-gpu-memory.sock",
        resource_name="volcano.sh/gpu-memory",
        options=dp.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
    )
    reply = stub.Register(request, timeout=RPC_TIMEOUT_S)
    assert isinstance(reply, dp.Empty)
    (seen,) = served.received.get("Register")
    assert seen == request
    assert isinstance(seen, dp.RegisterRequest)
    assert seen.options.get_preferred_allocation_available
    assert not seen.options.pre_start_required
    assert seen.HasField("options")

    with pytest.raises(grpc.RpcError) as error:
        stub.Register(dp.RegisterRequest(version="v1alpha"), timeout=RPC_TIMEOUT_S)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert served.recorder.methods == ["/v1beta1.Registration/Register"] * 2


def test_get_device_plugin_options(served: Served, channel: grpc.Channel) -> None:
    stub = DevicePluginStub(channel)
    options = stub.GetDevicePluginOptions(dp.Empty(), timeout=RPC_TIMEOUT_S)
    assert options == dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
    assert served.received.get("GetDevicePluginOptions") == [dp.Empty()]


def test_list_and_watch_streams_snapshots_then_ends(served: Served, channel: grpc.Channel) -> None:
    stub = DevicePluginStub(channel)
    responses = list(stub.ListAndWatch(dp.Empty(), timeout=RPC_TIMEOUT_S))
    assert len(responses) == 3
    assert [list(r.devices) for r in responses] == LIST_AND_WATCH_SNAPSHOTS
    first = responses[0].devices
    assert [d.ID for d in first] == ["GPU-aaaa-0", "GPU-aaaa-1", "GPU-bbbb-0"]
    assert [n.ID for n in first[1].topology.nodes] == [1]
    # NUMA node 0 is not on the wire, but the TopologyInfo with one node still is.
    assert first[0].HasField("topology") and [n.ID for n in first[0].topology.nodes] == [0]
    assert not first[2].HasField("topology")
    assert responses[1].devices[1].health == UNHEALTHY
    assert served.recorder.methods == ["/v1beta1.DevicePlugin/ListAndWatch"]


def test_get_preferred_allocation(served: Served, channel: grpc.Channel) -> None:
    stub = DevicePluginStub(channel)
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-b-3", "GPU-a-0", "GPU-a-1", "GPU-a-2"],
                must_include_deviceIDs=["GPU-b-3"],
                allocation_size=3,
            ),
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=["GPU-c-0"], allocation_size=1),
        ]
    )
    response = stub.GetPreferredAllocation(request, timeout=RPC_TIMEOUT_S)
    assert [list(c.deviceIDs) for c in response.container_responses] == [
        ["GPU-b-3", "GPU-a-0", "GPU-a-1"],
        ["GPU-c-0"],
    ]
    (seen,) = served.received.get("GetPreferredAllocation")
    assert seen == request
    assert isinstance(seen, dp.PreferredAllocationRequest)
    assert seen.container_requests[0].allocation_size == 3
    assert list(seen.container_requests[0].must_include_deviceIDs) == ["GPU-b-3"]


def test_allocate(served: Served, channel: grpc.Channel) -> None:
    stub = DevicePluginStub(channel)
    request = dp.AllocateRequest(
        container_requests=[
            dp.ContainerAllocateRequest(devices_ids=["GPU-a-0", "GPU-a-1"]),
            dp.ContainerAllocateRequest(devices_ids=["GPU-b-7"]),
        ]
    )
    response = stub.Allocate(request, timeout=RPC_TIMEOUT_S)
    assert served.received.get("Allocate") == [request]
    assert len(response.container_responses) == 2
    first, second = response.container_responses
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a-0,GPU-a-1", "GPU_INDEX": "0"}
    assert dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b-7", "GPU_INDEX": "1"}
    assert [(m.container_path, m.host_path, m.read_only) for m in second.mounts] == [
        ("/usr/local/vgpu", "/opt/vgpu", True),
        ("/tmp/vgpu", "/tmp/vgpu/1", False),
    ]
    assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw"),
        ("/dev/nvidiactl", "/dev/nvidiactl", "rwm"),
    ]
    assert dict(first.annotations) == {"volcano.sh/gpu-ids": "GPU-a-0,GPU-a-1"}
    assert [c.name for c in first.cdi_devices] == ["nvidia.com/gpu=GPU-a-0", "nvidia.com/gpu=GPU-a-1"]
    assert [c.name for c in second.cdi_devices] == ["nvidia.com/gpu=GPU-b-7"]
    assert served.recorder.methods == ["/v1beta1.DevicePlugin/Allocate"]


def test_pre_start_container(served: Served, channel: grpc.Channel) -> None:
    stub = DevicePluginStub(channel)
    request = dp.PreStartContainerRequest(devices_ids=["GPU-a-0", "GPU-a-1"])
    response = stub.PreStartContainer(request, timeout=RPC_TIMEOUT_S)
    assert response == dp.PreStartContainerResponse()
    (seen,) = served.received.get("PreStartContainer")
    assert isinstance(seen, dp.PreStartContainerRequest)
    assert list(seen.devices_ids) == ["GPU-a-0", "GPU-a-1"]


# --------------------------------------------------------------------------- pod-resources API


def _share_ids(pod: pr.PodResources) -> list[str | None]:
    claims = pod.containers[0].dynamic_resources[0].claim_resources
    return [c.share_id if c.HasField("share_id") else None for c in claims]


def test_pod_resources_list(served: Served, channel: grpc.Channel) -> None:
    stub = PodResourcesListerStub(channel)
    response = stub.List(pr.ListPodResourcesRequest(), timeout=RPC_TIMEOUT_S)
    assert list(response.pod_resources) == served.pod_resources.pods
    pod = response.pod_resources[0]
    assert (pod.name, pod.namespace) == ("trainer-0", "ml")
    assert list(pod.cpu_ids) == [4, 5]
    assert pod.memory[0].size == 2 * 1024 * 1024
    main, sidecar = pod.containers
    assert (main.name, sidecar.name) == ("main", "sidecar")
    assert list(main.devices[0].device_ids) == ["GPU-aaaa-0", "GPU-aaaa-1"]
    assert [n.ID for n in main.devices[0].topology.nodes] == [0, 1]
    assert list(main.cpu_ids) == [2, 3]
    assert main.memory[0].size == 1 << 30
    claim = main.dynamic_resources[0]
    assert (claim.claim_name, claim.claim_namespace) == ("gpu-claim", "ml")
    assert [c.device_name for c in claim.claim_resources] == ["gpu-1", "gpu-2", "gpu-3"]
    assert [c.name for c in claim.claim_resources[0].cdi_devices] == ["gpu.example.com/gpu=gpu-1"]
    # Set, unset, and set-to-empty are three different things on the wire.
    assert _share_ids(pod) == ["7d3c9e52-share", None, ""]
    assert not sidecar.devices and not sidecar.dynamic_resources
    assert served.received.get("List") == [pr.ListPodResourcesRequest()]


def test_pod_resources_get_allocatable(served: Served, channel: grpc.Channel) -> None:
    stub = PodResourcesListerStub(channel)
    response = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=RPC_TIMEOUT_S)
    assert [
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in response.devices
    ] == [
        ("volcano.sh/gpu-memory", ["GPU-aaaa-0"], [0]),
        ("volcano.sh/gpu-memory", ["GPU-aaaa-1"], [1]),
    ]
    assert list(response.cpu_ids) == list(range(8))
    assert response.memory[0].size == 64 << 30
    assert served.received.get("GetAllocatableResources") == [pr.AllocatableResourcesRequest()]


def test_pod_resources_get(served: Served, channel: grpc.Channel) -> None:
    stub = PodResourcesListerStub(channel)
    request = pr.GetPodResourcesRequest(pod_name="trainer-1", pod_namespace="ml")
    response = stub.Get(request, timeout=RPC_TIMEOUT_S)
    assert response.HasField("pod_resources")
    assert response.pod_resources == served.pod_resources.pods[1]
    assert _share_ids(response.pod_resources) == ["7d3c9e52-share", None, ""]

    with pytest.raises(grpc.RpcError) as error:
        stub.Get(pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"), timeout=RPC_TIMEOUT_S)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "ml/nope" in error.value.details()
    assert served.received.get("Get") == [
        request,
        pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"),
    ]


# --------------------------------------------------------------------------- method names on the wire


def test_every_rpc_uses_the_kubelet_method_names(served: Served, channel: grpc.Channel) -> None:
    registration = RegistrationStub(channel)
    plugin = DevicePluginStub(channel)
    lister = PodResourcesListerStub(channel)
    registration.Register(dp.RegisterRequest(version=VERSION, endpoint="p.sock", resource_name="a/b"))
    plugin.GetDevicePluginOptions(dp.Empty(), timeout=RPC_TIMEOUT_S)
    assert len(list(plugin.ListAndWatch(dp.Empty(), timeout=RPC_TIMEOUT_S))) == 3
    plugin.GetPreferredAllocation(
        dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(available_deviceIDs=["x"], allocation_size=1)
            ]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    plugin.Allocate(
        dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["x"])]),
        timeout=RPC_TIMEOUT_S,
    )
    plugin.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["x"]), timeout=RPC_TIMEOUT_S)
    lister.List(pr.ListPodResourcesRequest(), timeout=RPC_TIMEOUT_S)
    lister.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=RPC_TIMEOUT_S)
    lister.Get(pr.GetPodResourcesRequest(pod_name="trainer-0", pod_namespace="ml"), timeout=RPC_TIMEOUT_S)
    assert served.recorder.methods == EXPECTED_METHODS


# --------------------------------------------------------------------------- message size limits

# kubelet hands every available device ID to GetPreferredAllocation / Allocate; with
# thousands of fine-grained IDs that exceeds gRPC's default 4 MiB receive limit.
BIG_SERVER_OPTIONS: list[tuple[str, Any]] = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
# 120,000 IDs of 54 characters: 56 bytes each on the wire, about 6.4 MiB in all.
BIG_ID_COUNT = 120_000


class CountingDevicePlugin(FakeDevicePlugin):
    """Answers Allocate with just the number of IDs received, so the reply stays small."""

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        self.received.add("Allocate", request)
        response = dp.AllocateResponse()
        for container in request.container_requests:
            response.container_responses.add(envs={"DEVICE_IDS_RECEIVED": str(len(container.devices_ids))})
        return response


def _big_allocate_request() -> dp.AllocateRequest:
    ids = [f"GPU-8c1b7a1e-2f3d-4c5b-9a6e-0123456789ab-memory-{n:06d}" for n in range(BIG_ID_COUNT)]
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    assert 6 * 1024 * 1024 <= request.ByteSize() <= 7 * 1024 * 1024
    return request


def test_big_allocate_accepted_with_raised_receive_limit() -> None:
    request = _big_allocate_request()
    with (
        serve(BIG_SERVER_OPTIONS, plugin=CountingDevicePlugin) as running,
        grpc.insecure_channel(running.address) as chan,
    ):
        stub = DevicePluginStub(chan)
        response = stub.Allocate(request, timeout=RPC_TIMEOUT_S)
        assert dict(response.container_responses[0].envs) == {"DEVICE_IDS_RECEIVED": str(BIG_ID_COUNT)}
        (seen,) = running.received.get("Allocate")
        assert seen == request


def test_big_allocate_rejected_by_default_limit() -> None:
    request = _big_allocate_request()
    with serve(plugin=CountingDevicePlugin) as running, grpc.insecure_channel(running.address) as chan:
        stub = DevicePluginStub(chan)
        with pytest.raises(grpc.RpcError) as error:
            stub.Allocate(request, timeout=RPC_TIMEOUT_S)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert running.received.get("Allocate") == []
