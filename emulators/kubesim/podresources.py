"""Kubelet's pod-resources API (``v1.PodResourcesLister``), emulated over the admission checkpoint.

Matches kubelet (reference/device-plugin-landscape.md §1.6, kubelet-api-fields.md §2):

- ``List`` reports every active pod: the admitted ones and the one under admission (kubelet adds a
  pod to its pod manager before admitting it); per pod its sidecars and app containers
  (run-to-completion init containers are left out), each with the devices kubelet gave it so far.
- Devices come one ``ContainerDevices`` per device and NUMA node, with the NUMA node the plugin
  advertised when the device was allocated; a device without topology comes once, without topology.
- ``GetAllocatableResources`` reports the healthy devices the same way.
- ``Get`` of an unknown pod fails with a plain Go error, which gRPC delivers as UNKNOWN.
- One token bucket (100 QPS, burst 10) guards every method; a request over it gets
  RESOURCE_EXHAUSTED "rejected by rate limit".
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc

from deviceplugin.api import podresources_grpc
from deviceplugin.api import podresources_pb2 as pr
from kubesim.admission import Admission, ContainerAllocation

#: Kubelet's pod-resources rate limit.
POD_RESOURCES_QPS = 100.0
POD_RESOURCES_BURST = 10
RATE_LIMITED = "rejected by rate limit"

#: Resource -> healthy device ID -> NUMA nodes.
Allocatable = Mapping[str, Mapping[str, tuple[int, ...]]]


class TokenBucket:
    """golang.org/x/time/rate's ``Allow``: starts full with `burst` tokens, refills `rate` per second."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


@dataclass(frozen=True)
class PodResourcesCalls:
    """Requests that reached the pod-resources socket."""

    #: Method name ("List", "GetAllocatableResources", "Get") -> requests, rejected ones included.
    by_method: Mapping[str, int]
    #: Requests the rate limit turned away.
    rejected: int

    @property
    def total(self) -> int:
        return sum(self.by_method.values())


class CallCounter:
    """Counts requests across servers, so they survive a kubelet restart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_method: Counter[str] = Counter()
        self._rejected = 0

    def count(self, method: str, allowed: bool) -> None:
        with self._lock:
            self._by_method[method] += 1
            self._rejected += not allowed

    def snapshot(self) -> PodResourcesCalls:
        with self._lock:
            return PodResourcesCalls(dict(self._by_method), self._rejected)


class PodResourcesService(podresources_grpc.PodResourcesListerServicer):
    """The servicer; `admissions` and `allocatable` read the emulator's current state."""

    def __init__(
        self,
        admissions: Callable[[], Sequence[Admission]],
        allocatable: Callable[[], Allocatable],
        limiter: TokenBucket,
        counter: CallCounter,
        refused: Callable[[], bool] = lambda: False,
    ) -> None:
        self._admissions = admissions
        self._allocatable = allocatable
        self._limiter = limiter
        self._counter = counter
        self._refused = refused  # a fault the test switched on: answer as if over the limit

    def _gate(self, method: str, context: grpc.ServicerContext) -> None:
        allowed = not self._refused() and self._limiter.allow()
        self._counter.count(method, allowed)
        if not allowed:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        self._gate("List", context)
        return pr.ListPodResourcesResponse(
            pod_resources=[_pod(admission) for admission in self._admissions()]
        )

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._gate("GetAllocatableResources", context)
        devices = [
            entry
            for resource, topology in self._allocatable().items()
            for device, nodes in topology.items()
            for entry in _device_entries(resource, device, nodes)
        ]
        return pr.AllocatableResourcesResponse(devices=devices)

    def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        self._gate("Get", context)
        for admission in self._admissions():
            if (admission.pod.name, admission.pod.namespace) == (request.pod_name, request.pod_namespace):
                return pr.GetPodResourcesResponse(pod_resources=_pod(admission))
        context.abort(
            grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )
        raise AssertionError("unreachable: abort raises")


def _pod(admission: Admission) -> pr.PodResources:
    containers = [
        pr.ContainerResources(
            name=container.name,
            devices=list(
                _container_devices(
                    entry for entry in admission.allocations if entry.container == container.name
                )
            ),
        )
        for container in admission.pod.long_running
    ]
    return pr.PodResources(name=admission.pod.name, namespace=admission.pod.namespace, containers=containers)


def _container_devices(allocations: Iterable[ContainerAllocation]) -> Iterator[pr.ContainerDevices]:
    for entry in allocations:
        for device in entry.device_ids:
            yield from _device_entries(entry.resource, device, entry.topology.get(device, ()))


def _device_entries(resource: str, device: str, nodes: Sequence[int]) -> list[pr.ContainerDevices]:
    if not nodes:
        return [pr.ContainerDevices(resource_name=resource, device_ids=[device])]
    return [
        pr.ContainerDevices(
            resource_name=resource,
            device_ids=[device],
            topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]),
        )
        for node in nodes
    ]
